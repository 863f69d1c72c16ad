"""The build step that ships the numba kernels compiled: everything else is in pyproject.toml.

A regular (not editable) build compiles the kernels into numba's cache inside the package it
builds (``balanceroute/core/__pycache__``), so ``pip install .`` leaves the first run nothing
to compile. numba keeps such a cache entry valid by content, not by place: an entry is used
only for the same source text (a hash of each file), the same numba and Python versions and the
same CPU name and features; anything else compiles afresh, as on an empty cache. A wheel built
on one machine and installed on another therefore loads the kernels when the CPUs match and
compiles them when they do not, never runs code compiled for another CPU.

``BALANCEROUTE_BUILD_WARM=0`` builds without the compiled kernels (a smaller wheel, the first
run compiles). Editable installs skip this step: ``make install`` warms the source tree with
``python -m balanceroute.warm`` instead. A failed warm-up never fails the build: it says so and
the first run compiles.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWarm(build_py):
    """``build_py``, then the numba kernels compiled into the built package's cache."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False) or os.environ.get("BALANCEROUTE_BUILD_WARM", "1") == "0":
            return
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}  # the in-tree cache
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        code = ("import sys; sys.path.insert(0, sys.argv[1]); "
                "from balanceroute.warm import main; sys.exit(main())")
        t0 = time.monotonic()
        print("balanceroute: compiling the numba kernels into the package (about 30 s; "
              "BALANCEROUTE_BUILD_WARM=0 skips it)", file=sys.stderr, flush=True)
        try:
            done = subprocess.run([sys.executable, "-c", code, os.path.abspath(self.build_lib)],
                                  env=env, cwd=os.path.abspath(self.build_lib), capture_output=True,
                                  text=True, timeout=1800)
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"balanceroute: kernels not compiled at build ({exc}); the first run compiles them",
                  file=sys.stderr)
            return
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            print("balanceroute: kernels not compiled at build; the first run compiles them:\n  "
                  + "\n  ".join(tail), file=sys.stderr)
            return
        print(f"balanceroute: {done.stdout.strip()} ({time.monotonic() - t0:.0f} s)", file=sys.stderr)


setup(cmdclass={"build_py": BuildPyWarm})
