"""The policy catalogue: every policy name the package knows, how to build it, whether it needs
training data and which extra it needs.

The proxy, the CLI, the experiments and the tables read this one table; :func:`build_policy` is
the one way to build a policy by name. It lives in the package root because two of its rows
(``exact-tick``, ``mpc``) are exact models from ``balanceroute.solvers``, which ``core`` may not
import. The policy classes themselves are registered in ``core/policies/__init__.py``
(``get_policy``), the plain constructor registry this table builds on.

Rows: the paper's baselines, BF-IO (``bfio-h0``; ``bfio-h0-lease`` with BR-0's pool deadline at
the KV lease; ``bfio`` with exact output lengths, its simulator's default), BR-0, BR-H bare (``brh``, no predictor) and with a predictor fitted on
the training split (``brh-<predictor>``), and the exact policies (small runs only).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from balanceroute.core.policies import get_policy
from balanceroute.core.policies.base import Policy
from balanceroute.core.workloads.base import Workload

__all__ = ["CATALOGUE", "BuildInputs", "PolicyEntry", "available_names", "build_policy", "default_names",
           "missing_extras", "policy_entry"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildInputs:
    """What a simulation gives a builder: the training split (``None`` without one), the test
    workload the policy is bound to, the seed, the policy's parameters and its predictor's."""

    name: str
    predictor: str | None
    train: Workload | None
    test: Workload | None
    seed: int
    params: Mapping[str, Any]
    predictor_params: Mapping[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyEntry:
    """One catalogue row.

    ``build(inputs)`` makes the policy for a simulation. ``predictor``: the predictor
    (``core.predictors.PREDICTORS``) it fits on the training split, if any. ``online``: the proxy can run it (a registry policy, nothing bound to a
    workload; it is then built by ``get_policy`` — ``bfio`` without a predictor). ``extra`` /
    ``module``: the pip extra it needs and the module that extra provides. ``deadline`` /
    ``ttft_slo``: it takes ``deadline_s`` (the proxy sets it from the KV lease) / ``ttft_slo_s``.
    ``default``: a row of ``compare`` without ``--policies`` (the paper's Table 1 and BF-IO).
    ``learner``: online, the row's predictor is this one, learnt from the proxy's own finished
    requests instead of fitted on a training split (``brh-survival``: ``OnlineSurvival``)."""

    build: Callable[[BuildInputs], Policy]
    predictor: str | None = None
    online: bool = False
    extra: str | None = None
    module: str | None = None
    deadline: bool = False
    ttft_slo: bool = False
    default: bool = False
    learner: Callable[[], Any] | None = None

    @property
    def training(self) -> bool:
        """Whether it needs a training workload (to fit its predictor)."""
        return self.predictor is not None


def _registry(inputs: BuildInputs) -> Policy:
    return get_policy(inputs.name, seed=inputs.seed, **inputs.params)


def _predictor(inputs: BuildInputs, horizon: int) -> Any:
    from balanceroute.core.predictors import fit_predictor

    if inputs.train is None:
        raise ValueError(f"policy {inputs.name!r} needs a training workload to fit its predictor")
    return fit_predictor(inputs.predictor, inputs.train, horizon=max(horizon, 1), seed=inputs.seed,
                         **inputs.predictor_params)


def _bound(policy: Any, inputs: BuildInputs) -> Policy:
    return policy.bind(inputs.test) if inputs.test is not None else policy


def _brh(inputs: BuildInputs) -> Policy:
    """BR-H with the row's predictor fitted for the policy's horizon (none for bare ``brh``),
    bound to the test workload's rows; the parameters go to :class:`BRHPolicy`."""
    from balanceroute.core.policies.brh import BRHPolicy

    params = dict(inputs.params)
    if inputs.predictor is not None:
        horizon = int(params.get("horizon", BRHPolicy().horizon))
        params.update(predictor=_predictor(inputs, horizon), name=inputs.name)
    return _bound(_construct(BRHPolicy, inputs.name, params), inputs)


def _bfio(inputs: BuildInputs) -> Policy:
    """BF-IO on the forecast of its authors' simulator: the true output lengths (``oracle``)."""
    from balanceroute.core.policies.bfio import BFIOPolicy

    horizon = int(inputs.params.get("horizon", BFIOPolicy().horizon))
    predictor = _predictor(inputs, horizon)
    return _bound(_construct(BFIOPolicy, inputs.name, {**inputs.params, "predictor": predictor}),
                  inputs)


def _solver(inputs: BuildInputs) -> Policy:
    from balanceroute.solvers.policies import ExactTickPolicy, MPCPolicy

    if inputs.name == "exact-tick":
        return _construct(ExactTickPolicy, inputs.name, dict(inputs.params))
    return _bound(_construct(MPCPolicy, inputs.name, dict(inputs.params)), inputs)


def _online_survival() -> Any:
    from balanceroute.core.predictors import OnlineSurvival

    return OnlineSurvival()


def _construct(cls: Callable[..., Any], name: str, params: dict[str, Any]) -> Any:
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"policy {name!r}: {exc}") from None


_BASELINE = PolicyEntry(build=_registry, online=True, default=True)
_BRH: dict[str, Any] = {"build": _brh, "deadline": True, "ttft_slo": True}

CATALOGUE: dict[str, PolicyEntry] = {
    "random": _BASELINE,
    "round_robin": _BASELINE,
    "power_of_two": _BASELINE,
    "jsq": _BASELINE,
    "least_load": _BASELINE,
    "bfio-h0": PolicyEntry(build=_registry, online=True, deadline=True, default=True),
    "bfio-h0-lease": PolicyEntry(build=_registry, online=True, deadline=True),
    "bfio": PolicyEntry(build=_bfio, predictor="oracle", online=True, deadline=True, default=True),
    "br0": PolicyEntry(build=_registry, online=True, deadline=True, ttft_slo=True, default=True),
    "brh-survival": PolicyEntry(predictor="survival", default=True, online=True,
                                learner=_online_survival, **_BRH),
    "brh-exact": PolicyEntry(predictor="exact_match", default=True, **_BRH),
    "brh-learned": PolicyEntry(predictor="learned", default=True, extra="learned", module="torch",
                               **_BRH),
    "brh-oracle": PolicyEntry(predictor="oracle", default=True, **_BRH),
    "brh": PolicyEntry(online=True, **_BRH),
    "brh-noise": PolicyEntry(predictor="noise", **_BRH),
    "exact-tick": PolicyEntry(build=_solver, extra="solvers", module="ortools"),
    "mpc": PolicyEntry(build=_solver, extra="solvers", module="ortools"),
}
"""Policy name → :class:`PolicyEntry`, in the order of ``compare``'s rows; the baselines are
``core.policies.BASELINES``."""


def policy_entry(name: str, *, online: bool = False) -> PolicyEntry:
    """The row of ``name`` (``online``: among the ones the proxy can run); ``ValueError``
    listing the valid names otherwise."""
    entry = CATALOGUE.get(name)
    if entry is None or (online and not entry.online):
        valid = [n for n, e in CATALOGUE.items() if e.online or not online]
        raise ValueError(f"unknown policy {name!r}; valid: {', '.join(valid)}")
    return entry


def build_policy(
    name: str,
    params: Mapping[str, Any] | None = None,
    *,
    train: Workload | None = None,
    test: Workload | None = None,
    seed: int = 0,
    predictor_params: Mapping[str, Any] | None = None,
    online: bool = False,
) -> Policy:
    """Build the policy ``name`` with ``params``.

    For a simulation on ``test`` (``online=False``): predictor-based rows fit on ``train``
    (``ValueError`` if it is ``None``; ``predictor_params`` go to the predictor's ``fit``, e.g.
    ``steps`` of the learned model) and are bound to ``test``'s rows; the seed reaches the
    policies that draw random numbers and the predictors. ``online=True`` (the proxy): the
    registry policy, nothing fitted or bound — or, for a row with a ``learner``, the row with
    that predictor, empty until the proxy feeds it. A missing extra is a ``ValueError`` naming
    it."""
    entry = policy_entry(name, online=online)
    if entry.module is not None and importlib.util.find_spec(entry.module) is None:
        raise ValueError(f"policy {name!r} needs the {entry.extra} extra: "
                         f"pip install '.[{entry.extra}]' in a clone of the repository")
    if online and entry.learner is None:
        return get_policy(name, **dict(params or {}))
    if online:
        return entry.build(BuildInputs(
            name=name, predictor=None, train=None, test=None, seed=seed, predictor_params={},
            params={**dict(params or {}), "predictor": entry.learner(), "name": name}))
    return entry.build(BuildInputs(name=name, predictor=entry.predictor, train=train, test=test, seed=seed,
                                   params=dict(params or {}),
                                   predictor_params=dict(predictor_params or {})))


def default_names() -> list[str]:
    """The default rows (:attr:`PolicyEntry.default`) whose extra is installed."""
    skipped = missing_extras()
    return [n for n, e in CATALOGUE.items() if e.default and n not in skipped]


def available_names() -> list[str]:
    """Every name whose extra is installed here."""
    return [n for n, e in CATALOGUE.items()
            if e.module is None or importlib.util.find_spec(e.module) is not None]


def missing_extras() -> dict[str, str]:
    """Default rows left out because their extra is missing: name → extra to install."""
    return {n: e.extra for n, e in CATALOGUE.items()
            if e.default and e.extra is not None and e.module is not None and importlib.util.find_spec(e.module) is None}

