"""The train/test split behind every compared row, and the factory that builds rows on it.

Names, builders, training needs and extras are the catalogue's (``balanceroute/catalogue.py``).
Rows that fit a predictor fit it on the leading ``train_fraction`` of the trace; every policy is
simulated on the rest, whichever policies are compared, so a row never depends on its
neighbours (``train_fraction=0``: no split, for policies without predictors).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from balanceroute.catalogue import build_policy
from balanceroute.core.policies.base import Policy
from balanceroute.core.predictors.base import split_workload
from balanceroute.core.workloads.base import Workload

__all__ = ["PolicyFactory", "make_factory"]


@dataclass(slots=True)
class PolicyFactory:
    """``factory(name)`` builds a fresh policy; ``test_workload`` is what to simulate.

    ``params`` maps a policy name to keyword parameters for it (``--params FILE``)."""

    test_workload: Workload
    train_workload: Workload | None
    seed: int
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __call__(self, name: str) -> Policy:
        return build_policy(name, self.params.get(name, {}), train=self.train_workload,
                            test=self.test_workload, seed=self.seed)


def make_factory(
    workload: Workload,
    *,
    seed: int,
    train_fraction: float = 0.5,
    params: Mapping[str, Mapping[str, Any]] | None = None,
) -> PolicyFactory:
    """A factory on ``workload`` split into train (the leading ``train_fraction``) and test;
    ``train_fraction=0`` simulates the whole workload and builds no predictor-based policy."""
    if train_fraction == 0.0:
        return PolicyFactory(workload, None, seed, dict(params or {}))
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"--train-fraction {train_fraction:g} must be in (0, 1)")
    train, test = split_workload(workload, train_fraction)
    return PolicyFactory(test, train, seed, dict(params or {}))
