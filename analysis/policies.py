"""Building the compared policies by name, predictor-based ones included.

Baselines and BR-0 come straight from the registry. Names that need a fitted predictor (the
``brh-*`` rows) are fitted on the leading ``train_fraction`` of the trace. Every policy is
simulated on the rest, whichever policies are compared, so a row never depends on its
neighbours (``train_fraction=0``: no split, for policies without predictors).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from balanceroute.core.policies.base import Policy
from balanceroute.core.policies.variants import (
    ALL_POLICY_NAMES,
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
    """``factory(name)`` builds a fresh policy; ``test_workload`` is what to simulate.

    ``params`` maps a policy name to keyword parameters for it (``--params FILE``)."""

    test_workload: Workload
    train_workload: Workload | None
    num_replicas: int
    seed: int
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __call__(self, name: str) -> Policy:
        if name in SOLVER_POLICY_NAMES:
            from balanceroute.solvers.base import modules_available

            if not modules_available("ortools"):
                raise ValueError(f"policy {name!r} needs the solvers extra: "
                                 "pip install 'balanceroute[solvers]'")
            from balanceroute.solvers.policies import SOLVER_POLICIES

            return SOLVER_POLICIES[name](self.test_workload)  # type: ignore[no-any-return]
        return build_policy(name, train=self.train_workload, test=self.test_workload,
                            num_replicas=self.num_replicas, seed=self.seed,
                            **dict(self.params.get(name, {})))


def make_factory(
    workload: Workload,
    *,
    num_replicas: int,
    seed: int,
    train_fraction: float = 0.5,
    params: Mapping[str, Mapping[str, Any]] | None = None,
) -> PolicyFactory:
    """A factory on ``workload`` split into train (the leading ``train_fraction``) and test;
    ``train_fraction=0`` simulates the whole workload and builds no predictor-based policy."""
    if train_fraction == 0.0:
        return PolicyFactory(workload, None, num_replicas, seed, dict(params or {}))
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"--train-fraction {train_fraction:g} must be in (0, 1)")
    train, test = split_workload(workload, train_fraction)
    return PolicyFactory(test, train, num_replicas, seed, dict(params or {}))
