"""Routing policies and their name registry.

``get_policy("br0", s_greedy=7)`` builds one; a wrong name is answered with the valid ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import FifoPolicy, Policy
from .bfio import BFIOPolicy, bfio_h0, bfio_h0_lease
from .br0 import BR0Policy
from .brh import BRHPolicy
from .jsq import JSQPolicy
from .least_load import LeastLoadPolicy
from .power_of_two import PowerOfTwoPolicy
from .random_choice import RandomPolicy
from .round_robin import RoundRobinPolicy

__all__ = ["BASELINES", "POLICIES", "SEEDED", "FifoPolicy", "Policy", "get_policy", "policy_names"]

POLICIES: dict[str, Callable[..., Policy]] = {
    "random": RandomPolicy,
    "round_robin": RoundRobinPolicy,
    "power_of_two": PowerOfTwoPolicy,
    "jsq": JSQPolicy,
    "least_load": LeastLoadPolicy,
    "br0": BR0Policy,
    "brh": BRHPolicy,
    "bfio-h0": bfio_h0,
    "bfio-h0-lease": bfio_h0_lease,
    "bfio": BFIOPolicy,
}

#: The policies the paper compares against (the "best baseline" of its Table 1).
BASELINES = ("random", "round_robin", "power_of_two", "jsq", "least_load")

#: The policies that draw random numbers: the only ones ``get_policy`` passes ``seed`` to.
SEEDED = frozenset({"random", "power_of_two"})


def policy_names() -> list[str]:
    """Registered policy names, in registration order."""
    return list(POLICIES)


def get_policy(name: str, **params: Any) -> Policy:
    """Build the policy registered as ``name`` with ``params``.

    ``seed`` is passed only to the policies in :data:`SEEDED` (the others are deterministic).
    Building by name with training data, extras and the proxy's knobs is
    ``balanceroute.catalogue.build_policy``.
    Raises ``ValueError`` listing the valid names for an unknown one, and the policy's own
    message for bad parameters.
    """
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; valid: {', '.join(POLICIES)}") from None
    if name not in SEEDED:
        params.pop("seed", None)
    try:
        return factory(**params)
    except TypeError as exc:
        raise ValueError(f"policy {name!r}: {exc}") from None
