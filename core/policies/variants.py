"""The compared policy rows, predictor-bound BR-H variants included, built by name.

``brh-<predictor>`` is :class:`~.brh.BRHPolicy` with that predictor fitted on a training
workload and bound to the test workload's request ids; every other name comes from the
registry (:func:`~balanceroute.core.policies.get_policy`).
"""

from __future__ import annotations

from typing import Any

from ..predictors import fit_predictor
from ..workloads.base import Workload
from . import BASELINES, get_policy
from .base import Policy
from .bfio import BFIOPolicy
from .brh import BRHPolicy

__all__ = ["ALL_POLICY_NAMES", "BRH_VARIANTS", "accepted_policy_names", "build_policy"]

BRH_VARIANTS: dict[str, str] = {
    "brh-survival": "survival",
    "brh-exact": "exact_match",
    "brh-learned": "learned",
    "brh-oracle": "oracle",
    "brh-noise": "noise",
}
"""``brh-*`` policy name → predictor name (``core.predictors.PREDICTORS``)."""

ALL_POLICY_NAMES: tuple[str, ...] = (
    *BASELINES, "bfio-h0", "bfio", "br0", "brh-survival", "brh-exact", "brh-learned", "brh-oracle",
)
"""The rows of ``balanceroute compare`` by default: the paper's Table 1 order, with the prior art
BF-IO (``bfio-h0``; ``bfio`` with exact output lengths, its simulator's default) after the
baselines."""

BFIO_PREDICTOR = "oracle"
"""The forecast ``bfio`` runs on: its authors' simulator uses the true output lengths."""


def accepted_policy_names() -> list[str]:
    """Every name :func:`build_policy` accepts: the default rows, the bare registry names
    (``brh`` = no predictor) and ``brh-noise`` (the robustness check)."""
    from . import policy_names

    names = list(ALL_POLICY_NAMES)
    names += [n for n in (*policy_names(), *BRH_VARIANTS) if n not in names]
    return names


def build_policy(
    name: str,
    *,
    train: Workload | None,
    test: Workload,
    num_replicas: int,
    seed: int = 0,
    predictor_params: dict[str, Any] | None = None,
    **params: Any,
) -> Policy:
    """Build the policy ``name`` for a run on ``test``.

    ``brh-*``: the predictor is fitted on ``train`` (``ValueError`` if it is ``None``) for the
    policy's horizon and the policy is bound to ``test``'s rows; ``params`` go to
    :class:`BRHPolicy` (horizon, gamma, alpha, beta, s_greedy, r_max, deadline_s, gate) and
    ``predictor_params`` to the predictor's ``fit`` (e.g. ``steps`` of the learned model).
    Other names: ``get_policy(name, seed=seed, **params)``. ``num_replicas`` is G, for
    G-dependent defaults (none at present: β defaults to G inside the policy).
    """
    del num_replicas
    if name in BRH_VARIANTS:
        if train is None:
            raise ValueError(f"policy {name!r} needs a training workload to fit its predictor")
        horizon = int(params.get("horizon", BRHPolicy().horizon))
        predictor = fit_predictor(
            BRH_VARIANTS[name], train, horizon=max(horizon, 1), seed=seed, **(predictor_params or {})
        )
        try:
            policy = BRHPolicy(predictor=predictor, name=name, **params)
        except TypeError as exc:
            raise ValueError(f"policy {name!r}: {exc}") from None
        return policy.bind(test)
    if name == "bfio":
        if train is None:
            raise ValueError("policy 'bfio' needs a training workload to fit its predictor")
        horizon = int(params.get("horizon", BFIOPolicy().horizon))
        predictor = fit_predictor(BFIO_PREDICTOR, train, horizon=max(horizon, 1), seed=seed)
        try:
            return BFIOPolicy(predictor=predictor, **params).bind(test)
        except TypeError as exc:
            raise ValueError(f"policy 'bfio': {exc}") from None
    if name == "brh":
        try:
            return BRHPolicy(**params).bind(test)
        except TypeError as exc:
            raise ValueError(f"policy 'brh': {exc}") from None
    if name not in accepted_policy_names():
        raise ValueError(f"unknown policy {name!r}; valid: {', '.join(accepted_policy_names())}")
    return get_policy(name, seed=seed, **params)
