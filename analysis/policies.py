"""Building the compared policies by name, predictor-based ones included.

Baselines and BR-0 come straight from the registry. Names that need a fitted predictor (the
``brh-*`` rows) are fitted on the leading ``train_fraction`` of the trace and simulated on the rest;
when any such name is compared, every policy runs on that same held-out part.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from balanceroute.core.policies import get_policy, policy_names
from balanceroute.core.policies.base import Policy
from balanceroute.core.workloads.base import Workload

__all__ = ["PolicyFactory", "all_policy_names", "make_factory"]


def all_policy_names() -> list[str]:
    """Every name ``compare`` accepts: the registry plus predictor-bound variants."""
    return policy_names()


@dataclass(slots=True)
class PolicyFactory:
    """``factory(name)`` builds a fresh policy; ``test_workload`` is what to simulate."""

    test_workload: Workload
    train_workload: Workload | None
    num_replicas: int
    seed: int

    def __call__(self, name: str) -> Policy:
        return get_policy(name, seed=self.seed)


def make_factory(
    workload: Workload,
    *,
    num_replicas: int,
    seed: int,
    train_fraction: float = 0.5,
    names: Sequence[str] | None = None,
) -> PolicyFactory:
    """A factory for ``names`` on ``workload`` (split into train/test only when needed)."""
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"{train_fraction=} must be in (0, 1)")
    return PolicyFactory(workload, None, num_replicas, seed)
