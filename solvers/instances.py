"""Problem instances for the exact oracles, with validation and JSON round-trips.

A :class:`TickInstance` is one scheduling tick (loads, free slots, pool); a
:class:`ClairvoyantInstance` is a whole multi-step episode with known arrivals and output lengths.
Both are frozen, validated on construction (``ValueError`` naming the field) and serialise to a
small JSON document (``{"kind": "tick" | "clairvoyant", ...}``) so instances can be shared.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

__all__ = ["ClairvoyantInstance", "TickInstance", "load_instance", "save_instance"]

TickObjective = Literal["f_score", "imbalance"]
ClairvoyantObjective = Literal["imbalance", "step_time"]


def _int_array(name: str, value: Any, *, minimum: int) -> NDArray[np.int64]:
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D list of integers, got shape {arr.shape}")
    if arr.size and not np.all(np.isfinite(arr.astype(np.float64))):
        raise ValueError(f"{name} must be finite")
    if arr.size and not np.array_equal(arr, np.round(arr)):
        raise ValueError(f"{name} must hold integers")
    arr = arr.astype(np.int64)
    if arr.size and arr.min() < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {int(arr.min())}")
    arr.setflags(write=False)
    return arr


def _float_array(name: str, value: Any, ndim: int) -> NDArray[np.float64]:
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite")
    arr = arr.copy()
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class TickInstance:
    """One scheduling tick: the decision :func:`~balanceroute.core.two_stage.two_stage_assign`
    makes.

    ``proj_loads`` (G, H+1): projected loads L̂_g(h) (BR-0: the current loads, H = 0);
    ``free_slots`` (G,); ``prompt_len`` (P,) the pool's s_i; ``d`` (H+1,) discounts (default all ones); ``alpha``,
    ``beta``: the horizon score F_g(Δ) = α(1ᵀd)Δ − β((Δ·1 − m_g)_+)ᵀd with start-of-tick margins
    m_g(h) = M̂(h) − L̂_g(h). ``objective``: ``"f_score"`` maximises Σ_g F_g(Δ_g) (the paper's
    tick objective); ``"imbalance"`` minimises the post-tick I(L + Δ) = G·max_g(L_g + Δ_g) −
    Σ_g(L_g + Δ_g) on the h = 0 loads. ``count``: how many requests must be assigned (default
    ``min(Σ free, P)``: work-conserving); ``work_conserving=False`` makes it "at most".
    ``wait`` (P,) seconds and ``num_active`` (G,) are only used to replay online policies (the
    pool deadline; JSQ's active counts).
    """

    proj_loads: NDArray[np.float64]
    free_slots: NDArray[np.int64]
    prompt_len: NDArray[np.int64]
    d: Any = None  # (H+1,) float array after validation
    alpha: float = 1.0
    beta: Any = None  # float after validation (default G)
    objective: TickObjective = "f_score"
    count: int | None = None
    work_conserving: bool = True
    wait: Any = None  # (P,) float array after validation
    num_active: Any = None  # (G,) int array after validation
    name: str = ""

    def __post_init__(self) -> None:
        loads = _float_array("proj_loads", self.proj_loads, 2)
        if loads.shape[0] < 1 or loads.shape[1] < 1:
            raise ValueError(f"proj_loads must be (G, H+1) with G >= 1, got shape {loads.shape}")
        if loads.min() < 0:
            raise ValueError("proj_loads must be >= 0")
        g, h1 = loads.shape
        free = _int_array("free_slots", self.free_slots, minimum=0)
        if free.shape != (g,):
            raise ValueError(f"free_slots has shape {free.shape}, expected ({g},) (one per replica)")
        sizes = _int_array("prompt_len", self.prompt_len, minimum=1)
        d = _float_array("d", np.ones(h1) if self.d is None else self.d, 1)
        if d.shape != (h1,):
            raise ValueError(f"d has shape {d.shape}, expected ({h1},) to match proj_loads")
        if d.min() <= 0:
            raise ValueError("d (discounts) must be > 0")
        beta = float(g if self.beta is None else self.beta)
        if not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"alpha={self.alpha!r} must be a finite number >= 0")
        if not (math.isfinite(beta) and beta >= 0):
            raise ValueError(f"beta={beta!r} must be a finite number >= 0")
        if self.objective not in ("f_score", "imbalance"):
            raise ValueError(f"objective={self.objective!r} must be 'f_score' or 'imbalance'")
        most = min(int(free.sum()), sizes.shape[0])
        if self.count is not None and not 0 <= self.count <= most:
            raise ValueError(
                f"count={self.count} is infeasible: at most min(free slots {int(free.sum())}, "
                f"pool {sizes.shape[0]}) = {most} requests can be assigned"
            )
        wait = np.zeros(sizes.shape[0]) if self.wait is None else _float_array("wait", self.wait, 1)
        if wait.shape != sizes.shape:
            raise ValueError(f"wait has shape {wait.shape}, expected {sizes.shape}")
        active = np.zeros(g, dtype=np.int64) if self.num_active is None else _int_array(
            "num_active", self.num_active, minimum=0)
        if active.shape != (g,):
            raise ValueError(f"num_active has shape {active.shape}, expected ({g},)")
        for name, value in (("proj_loads", loads), ("free_slots", free), ("prompt_len", sizes),
                            ("d", d), ("beta", beta), ("wait", wait), ("num_active", active)):
            object.__setattr__(self, name, value)

    @classmethod
    def br0(cls, loads: Any, free_slots: Any, prompt_len: Any, **kw: Any) -> TickInstance:
        """A BR-0 tick: H = 0, d = (1,), α = 1, β = G on the current ``loads`` (G,)."""
        loads = np.asarray(loads, dtype=np.float64)
        return cls(proj_loads=loads[:, None], free_slots=free_slots, prompt_len=prompt_len, **kw)

    @property
    def num_replicas(self) -> int:
        """G."""
        return int(self.proj_loads.shape[0])

    @property
    def pool_size(self) -> int:
        """P."""
        return int(self.prompt_len.shape[0])

    @property
    def loads(self) -> NDArray[np.float64]:
        """Current loads L_g = L̂_g(0)."""
        return self.proj_loads[:, 0]

    @property
    def margins(self) -> NDArray[np.float64]:
        """Start-of-tick margins m_g(h) = M̂(h) − L̂_g(h), shape (G, H+1)."""
        return self.proj_loads.max(axis=0) - self.proj_loads

    @property
    def required(self) -> tuple[int, int]:
        """(fewest, most) requests an assignment may place."""
        most = min(int(self.free_slots.sum()), self.pool_size)
        if self.count is not None:
            return self.count, self.count
        return (most, most) if self.work_conserving else (0, most)

    @property
    def sense(self) -> Literal["max", "min"]:
        """``"max"`` for the F objective, ``"min"`` for post-tick imbalance."""
        return "max" if self.objective == "f_score" else "min"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``kind = "tick"``)."""
        out: dict[str, Any] = {"kind": "tick"}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.tolist() if isinstance(value, np.ndarray) else value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TickInstance:
        """Inverse of :meth:`to_json`; unknown keys are an error."""
        return cls(**_fields_of(cls, data, "tick"))


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ClairvoyantInstance:
    """A multi-step episode known in advance: the clairvoyant (offline) routing problem.

    Request i (``prompt_len`` s_i, ``output_len`` o_i, ``release`` r_i: the decode step from
    which it may start) is started at some step t_i ≥ r_i on some replica g_i, for life; at steps
    k = t_i … t_i + o_i − 1 it holds one of g_i's ``slots`` and contributes s_i + (k − t_i) to
    L_{g_i}(k) — exactly the dynamics of ``core.simulator``. Every request must finish by
    ``horizon`` (decode steps; ``None``: the list-scheduling bound, long enough for any
    work-conserving schedule). ``objective``: ``"imbalance"`` minimises Σ_k I(k);
    ``"step_time"`` minimises Σ_k τ(k) = Σ_{busy k} (``step_b`` + ``step_a``·M(k)).
    ``work_conserving``: a released request may wait only while every slot is busy (as every
    online policy does); ``False`` relaxes this. ``step`` = q coarsens the model: one model step is
    q decode steps, starts are multiples of q (see ``papers/formulations.md``); q = 1 is exact.
    """

    num_replicas: int
    slots: int
    prompt_len: NDArray[np.int64]
    output_len: NDArray[np.int64]
    release: Any = None  # (n,) int array after validation (default zeros)
    horizon: int | None = None
    step: int = 1
    objective: ClairvoyantObjective = "imbalance"
    step_b: float = 0.030
    step_a: float = 2.0e-7
    work_conserving: bool = True
    name: str = ""

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError(f"num_replicas={self.num_replicas} must be >= 1")
        if self.slots < 1:
            raise ValueError(f"slots={self.slots} must be >= 1")
        if self.step < 1:
            raise ValueError(f"step={self.step} must be >= 1 (decode steps per model step)")
        s = _int_array("prompt_len", self.prompt_len, minimum=1)
        o = _int_array("output_len", self.output_len, minimum=1)
        if s.shape[0] < 1:
            raise ValueError("the instance has no requests")
        if o.shape != s.shape:
            raise ValueError(f"output_len has shape {o.shape}, expected {s.shape}")
        r = np.zeros_like(s) if self.release is None else _int_array("release", self.release, minimum=0)
        if r.shape != s.shape:
            raise ValueError(f"release has shape {r.shape}, expected {s.shape}")
        if self.objective not in ("imbalance", "step_time"):
            raise ValueError(f"objective={self.objective!r} must be 'imbalance' or 'step_time'")
        for key in ("step_b", "step_a"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{key}={value!r} must be a finite number >= 0")
        for name, value in (("prompt_len", s), ("output_len", o), ("release", r)):
            object.__setattr__(self, name, value)
        if self.horizon is not None:
            if self.horizon < 1:
                raise ValueError(f"horizon={self.horizon} must be >= 1")
            q, t_model = self.step, self.model_horizon
            late = np.flatnonzero(-(-r // q) + (-(-o // q)) > t_model)
            if late.size:
                i = int(late[0])
                raise ValueError(
                    f"request {i} (release {int(r[i])}, output {int(o[i])}) cannot finish within "
                    f"horizon={self.horizon} decode steps (step={q}); raise the horizon"
                )
            work = int((-(-o // q)).sum())
            if work > self.num_replicas * self.slots * t_model:
                raise ValueError(
                    f"infeasible: the requests need {work} slot-steps but G·B·horizon is only "
                    f"{self.num_replicas * self.slots * t_model}; raise the horizon"
                )

    @property
    def num_requests(self) -> int:
        """n."""
        return int(self.prompt_len.shape[0])

    @property
    def model_horizon(self) -> int:
        """T' in model steps (q decode steps each): the given horizon rounded up, or the
        list-scheduling bound r'_max + ⌊Σ o'_i / (G·B)⌋ + o'_max, which no work-conserving
        schedule exceeds (o'_i = ⌈o_i/q⌉, r'_i = ⌈r_i/q⌉)."""
        q = self.step
        if self.horizon is not None:
            return -(-self.horizon // q)
        o = -(-self.output_len // q)
        r = -(-self.release // q)
        return int(r.max() + o.sum() // (self.num_replicas * self.slots) + o.max())

    @property
    def life_loads(self) -> NDArray[np.int64]:
        """C_i = o_i·s_i + o_i(o_i−1)/2 = Σ_{a<o_i} (s_i + a), shape (n,): request i's load
        summed over its life (its token-steps; exact integers)."""
        s, o = self.prompt_len, self.output_len
        return o * s + o * (o - 1) // 2

    @property
    def total_load(self) -> int:
        """C = Σ_i C_i (:attr:`life_loads`): every request's token-steps, whatever the schedule."""
        return int(self.life_loads.sum())

    @property
    def sense(self) -> Literal["min"]:
        """Both clairvoyant objectives are minimised."""
        return "min"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``kind = "clairvoyant"``)."""
        out: dict[str, Any] = {"kind": "clairvoyant"}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.tolist() if isinstance(value, np.ndarray) else value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClairvoyantInstance:
        """Inverse of :meth:`to_json`; unknown keys are an error."""
        return cls(**_fields_of(cls, data, "clairvoyant"))


def _fields_of(cls: type, data: dict[str, Any], kind: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"a {kind} instance must be a JSON object")
    data = dict(data)
    found = data.pop("kind", kind)
    if found != kind:
        raise ValueError(f"expected a {kind!r} instance, got kind={found!r}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown {kind} instance field(s): {', '.join(unknown)}")
    return data


def load_instance(path: str | Path) -> TickInstance | ClairvoyantInstance:
    """Read one instance from a JSON file (its ``kind`` picks the class)."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    kind = data.get("kind") if isinstance(data, dict) else None
    cls: Any = {"tick": TickInstance, "clairvoyant": ClairvoyantInstance}.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"{path}: 'kind' must be 'tick' or 'clairvoyant', got {kind!r}")
    try:
        return cls.from_json(data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None


def save_instance(instance: TickInstance | ClairvoyantInstance, path: str | Path) -> None:
    """Write ``instance`` as indented JSON."""
    Path(path).write_text(json.dumps(instance.to_json(), indent=1) + "\n")
