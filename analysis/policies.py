"""Building the compared policies by name, predictor-based ones included.

Baselines and BR-0 come straight from the registry. Names that need a fitted predictor (the
``brh-*`` rows) are fitted on the leading ``train_fraction`` of the trace and simulated on the rest;
when any such name is compared, every policy runs on that same held-out part, so the rows of one
table always share one workload.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from balanceroute.core.policies.base import Policy
from balanceroute.core.policies.variants import (
    ALL_POLICY_NAMES,
    BRH_VARIANTS,
    accepted_policy_names,
    build_policy,
)
from balanceroute.core.predictors.base import split_workload
from balanceroute.core.workloads.base import Workload

__all__ = [
    "PolicyFactory", "all_policy_names", "default_policy_names", "make_factory", "missing_extras",
]


#: Default rows that need an optional extra, and the module that extra provides.
NEEDS_EXTRA = {"brh-learned": ("torch", "learned")}


def default_policy_names() -> list[str]:
    """The rows of ``compare`` when ``--policies`` is not given (the paper's Table 1), less the
    ones whose extra is not installed (see :func:`missing_extras`)."""
    skipped = missing_extras()
    return [n for n in ALL_POLICY_NAMES if n not in skipped]


def missing_extras() -> dict[str, str]:
    """Default rows left out because their extra is missing: name → extra to install."""
    from importlib.util import find_spec

    return {name: extra for name, (module, extra) in NEEDS_EXTRA.items() if find_spec(module) is None}


#: Non-default rows run by exact models (``solvers/policies.py``, needs the ``solvers`` extra).
SOLVER_POLICY_NAMES = ("exact-tick", "mpc")


def all_policy_names() -> list[str]:
    """Every name ``compare`` accepts: the registry, predictor-bound variants and the exact
    policies (``exact-tick``, ``mpc``: small runs only)."""
    return [*accepted_policy_names(), *SOLVER_POLICY_NAMES]


@dataclass(slots=True)
class PolicyFactory:
    """``factory(name)`` builds a fresh policy; ``test_workload`` is what to simulate."""

    test_workload: Workload
    train_workload: Workload | None
    num_replicas: int
    seed: int

    def __call__(self, name: str) -> Policy:
        if name in SOLVER_POLICY_NAMES:
            from balanceroute.solvers.base import modules_available

            if not modules_available("ortools"):
                raise ValueError(f"policy {name!r} needs the solvers extra: "
                                 "pip install 'balanceroute[solvers]'")
            from balanceroute.solvers.policies import SOLVER_POLICIES

            return SOLVER_POLICIES[name](self.test_workload)  # type: ignore[no-any-return]
        return build_policy(name, train=self.train_workload, test=self.test_workload,
                            num_replicas=self.num_replicas, seed=self.seed)


def make_factory(
    workload: Workload,
    *,
    num_replicas: int,
    seed: int,
    train_fraction: float = 0.5,
    names: Sequence[str] | None = None,
) -> PolicyFactory:
    """A factory for ``names`` on ``workload``: split into train/test when any name needs a
    predictor (``names=None`` means the default rows, which do)."""
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"{train_fraction=} must be in (0, 1)")
    names = default_policy_names() if names is None else list(names)
    if any(n in BRH_VARIANTS for n in names):
        train, test = split_workload(workload, train_fraction)
        return PolicyFactory(test, train, num_replicas, seed)
    return PolicyFactory(workload, None, num_replicas, seed)
