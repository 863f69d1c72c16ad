"""Hypothesis profiles for the suite.

``fixed`` (what ``make test`` and ``.ci/run`` use): every property test draws the same
examples on every run (``derandomize``, seeded by the test's name) and keeps no example
database, so a red run is reproducible and a green one cannot turn red by chance. Tests that set
their own ``@settings`` inherit this and override only what they name (``max_examples``).
Neither profile has a per-example ``deadline``: no test depends on wall-clock speed.

``explore`` (``make test-explore``, or ``pytest --hypothesis-profile explore``): fresh random
draws on every run, failures kept in ``.hypothesis/`` and replayed first next time. Run it when
a change moves a default or a premise (a fixed draw may miss the examples it breaks); a failure
it finds prints the example and a ``@reproduce_failure`` blob, to pin as a worked example.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase

# deadline=None: no test depends on wall-clock speed (a first call that compiles, or a busy box,
# would otherwise fail Hypothesis's 200 ms per-example deadline); speed lives in benchmarks/
settings.register_profile("fixed", derandomize=True, database=None, print_blob=True, deadline=None)
settings.register_profile("explore", derandomize=False, print_blob=True, deadline=None,
                          database=DirectoryBasedExampleDatabase(".hypothesis/examples"))
settings.load_profile("fixed")
