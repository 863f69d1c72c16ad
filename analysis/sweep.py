"""Experiment grids: declared cells, a content-addressed cache, local-process and Ray backends.

An experiment is a list of :class:`Cell` s. :func:`run_grid` runs the cells that are not cached
yet — in this process (``jobs=1``), on a local process pool (``backend="local"``, the default) or
on a Ray cluster (``backend="ray"``) — and returns every cell's rows, sorted by cell, so the same
grid gives the same table whatever the backend or the order in which cells finished. A cell's
result is cached under ``<cache_dir>/<experiment>/<key>.json`` where ``key`` hashes every field
of the cell (and :data:`CACHE_VERSION`), so re-runs skip finished cells.

Each cell is run by a *kind* runner (``RUNNERS`` in :mod:`balanceroute.analysis.experiments`);
the runner must be deterministic given the cell (seeds come from the cell) for everything it
writes except wall-clock timings.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import math
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "CACHE_VERSION",
    "Cell",
    "CellOutcome",
    "GridResult",
    "RunByKind",
    "Runner",
    "read_csv",
    "run_grid",
    "write_csv",
]

CACHE_VERSION = "1"
"""Bumped when a runner's output changes meaning, so old cache entries stop matching."""

Backend = Literal["local", "ray"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """One point of a grid: what to run and with which settings.

    ``kind`` selects the runner (``simulate``, ``tick_timing``, ``tick_gap``, ...);
    ``group``: the policies a multi-policy cell compares (optimality gaps); ``options``: kind-specific settings as sorted ``(name, value)`` pairs (JSON
    scalars), written to the CSV as their own columns. The step model is τ = b + max_g(a·L_g +
    c·n_g) (``step_b``, ``step_a``, ``step_c``). ``code``: a fingerprint of the source the
    result depends on (part of the key, so editing that code re-runs the cell).
    """

    experiment: str
    kind: str = "simulate"
    workload: str = ""
    policy: str = ""
    replicas: int = 8
    slots: int = 64
    requests: int | None = None
    seed: int = 0
    step_b: float = 0.030
    step_a: float = 2.0e-7
    step_c: float = 0.0
    pool_size: int | None = None
    min_output: int | None = None
    train_fraction: float = 0.5
    group: tuple[str, ...] = ()
    options: tuple[tuple[str, Any], ...] = ()
    code: str = ""

    def __post_init__(self) -> None:
        if not self.experiment:
            raise ValueError(f"{self.experiment=} must be a non-empty name")
        if self.replicas < 1 or self.slots < 1:
            raise ValueError(f"{self.replicas=} and {self.slots=} must be >= 1")
        object.__setattr__(self, "group", tuple(self.group))
        object.__setattr__(self, "options", tuple(sorted((str(k), v) for k, v in self.options)))

    def option(self, name: str, default: Any = None) -> Any:
        """The value of option ``name`` (``default`` if unset)."""
        return dict(self.options).get(name, default)

    def fields(self) -> dict[str, Any]:
        """The cell as flat CSV columns: ``group`` joined by ``+``, options as columns."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("group", "options")}
        out["group"] = "+".join(self.group)
        out.update(dict(self.options))
        return out

    @property
    def key(self) -> str:
        """A stable hash of every field (and :data:`CACHE_VERSION`): the cache file name."""
        blob = json.dumps({"v": CACHE_VERSION, **asdict(self)}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:20]

    def sort_key(self) -> tuple:
        """Orders cells by their fields (``None`` before numbers) for a deterministic table."""
        return tuple(_sortable(getattr(self, f.name)) for f in fields(self))


def _sortable(value: Any) -> tuple:
    if value is None:
        return (0, 0, "")
    if isinstance(value, (bool, int, float)):
        return (1, float(value), "")
    return (2, 0, repr(value))


@dataclass(slots=True)
class CellOutcome:
    """What running one cell produced: its rows, or the error text; wall seconds."""

    cell: Cell
    rows: list[dict[str, Any]]
    elapsed_s: float
    cached: bool = False
    error: str | None = None


@dataclass(slots=True)
class GridResult:
    """Rows of every successful cell (sorted by cell), how many cells ran and how many came from
    the cache, and the failures (cell, error text)."""

    rows: list[dict[str, Any]]
    executed: int
    cached: int
    errors: list[tuple[Cell, str]] = field(default_factory=list)


Runner = Callable[[Cell], list[dict[str, Any]]]
"""A cell's runner: the cell → its rows."""


@dataclass(frozen=True, slots=True)
class RunByKind:
    """A runner that runs each cell with ``runners[cell.kind]``; every row starts with the
    cell's fields. Picklable (module-level runners), so it crosses process and Ray workers."""

    runners: Mapping[str, Runner]

    def __call__(self, cell: Cell) -> list[dict[str, Any]]:
        try:
            runner = self.runners[cell.kind]
        except KeyError:
            raise ValueError(f"unknown cell kind {cell.kind!r}; valid: {', '.join(self.runners)}") from None
        base = cell.fields()
        return [{k: _plain(v) for k, v in {**base, **row}.items()} for row in runner(cell)]


def _plain(value: Any) -> Any:
    """Python scalars only (numpy scalars unwrapped, sequences joined), so fresh and cached rows
    are identical."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, (list, tuple)):
        return "+".join(map(str, value))
    return value


def _guarded(runner: Callable[[Cell], list[dict[str, Any]]], cell: Cell) -> CellOutcome:
    start = time.perf_counter()
    try:
        rows = runner(cell)
    except Exception:  # one failing cell must not sink the grid; the caller reports it
        return CellOutcome(cell, [], time.perf_counter() - start, error=traceback.format_exc())
    return CellOutcome(cell, rows, time.perf_counter() - start)


def _cache_path(cache_dir: Path, cell: Cell) -> Path:
    return cache_dir / cell.experiment / f"{cell.key}.json"


def _load_cached(cache_dir: Path, cell: Cell) -> CellOutcome | None:
    path = _cache_path(cache_dir, cell)
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if data.get("key") != cell.key:
        return None
    return CellOutcome(cell, data["rows"], float(data.get("elapsed_s", 0.0)), cached=True)


def _store(cache_dir: Path, outcome: CellOutcome) -> None:
    path = _cache_path(cache_dir, outcome.cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"key": outcome.cell.key, "cell": outcome.cell.fields(),
                               "elapsed_s": outcome.elapsed_s, "rows": outcome.rows},
                              default=str))
    tmp.replace(path)


def run_grid(
    cells: Sequence[Cell],
    runner: Runner,
    *,
    backend: Backend = "local",
    jobs: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    use_cache: bool = True,
    address: str | None = None,
    cost: Callable[[Cell], float] | None = None,
    on_done: Callable[[CellOutcome], None] | None = None,
) -> GridResult:
    """Run ``cells`` with ``runner`` (e.g. a :class:`RunByKind` over the experiments' runners)
    and collect their rows.

    Cached cells (``use_cache``) are not run; the others run on ``backend`` with ``jobs``
    workers (default: the CPU count; ``jobs=1`` with the local backend runs in this process),
    most expensive first by ``cost(cell)`` if given, and are written to the cache (also when
    ``use_cache`` is False, which refreshes it). ``address``: an existing Ray cluster
    (``"auto"`` or ``"ray://host:port"``); without it a local Ray instance with ``jobs`` CPUs is
    started and shut down. ``on_done`` is called once per cell, cached ones included.
    """
    if backend not in ("local", "ray"):
        raise ValueError(f"{backend=} must be 'local' or 'ray'")
    jobs = jobs or os.cpu_count() or 1
    if jobs < 1:
        raise ValueError(f"{jobs=} must be >= 1")
    unique = list(dict.fromkeys(cells))
    cache = Path(cache_dir) if cache_dir is not None else None
    outcomes: list[CellOutcome] = []
    pending: list[Cell] = []
    for cell in unique:
        hit = _load_cached(cache, cell) if (cache is not None and use_cache) else None
        if hit is None:
            pending.append(cell)
        else:
            outcomes.append(hit)
            if on_done is not None:
                on_done(hit)
    if cost is not None:
        pending.sort(key=cost, reverse=True)

    def finished(outcome: CellOutcome) -> None:
        if outcome.error is None and cache is not None:
            _store(cache, outcome)
        outcomes.append(outcome)
        if on_done is not None:
            on_done(outcome)

    if pending:
        if backend == "ray":
            _run_ray(pending, runner, jobs, address, finished)
        elif jobs == 1 or len(pending) == 1:
            for cell in pending:
                finished(_guarded(runner, cell))
        else:
            _run_processes(pending, runner, jobs, finished)

    order = {cell: i for i, cell in enumerate(sorted(unique, key=Cell.sort_key))}
    good = sorted((o for o in outcomes if o.error is None), key=lambda o: order[o.cell])
    return GridResult(
        rows=[row for o in good for row in o.rows],
        executed=sum(not o.cached for o in outcomes),
        cached=sum(o.cached for o in outcomes),
        errors=[(o.cell, o.error) for o in outcomes if o.error is not None],
    )


def _run_processes(cells: Sequence[Cell], runner: Callable, jobs: int,
                   finished: Callable[[CellOutcome], None]) -> None:
    # spawn: workers start clean (no inherited threads or Ray state) on every platform
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(cells)), mp_context=ctx) as pool:
        futures = {pool.submit(_guarded, runner, cell): cell for cell in cells}
        todo = set(futures)
        while todo:
            done, todo = wait(todo, return_when=FIRST_COMPLETED)
            for fut in done:
                finished(fut.result())


def _run_ray(cells: Sequence[Cell], runner: Callable, jobs: int, address: str | None,
             finished: Callable[[CellOutcome], None]) -> None:
    import ray  # the optional `dist` extra

    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        else:
            ray.init(num_cpus=jobs, include_dashboard=False, logging_level=logging.ERROR,
                     log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(_guarded)
        refs = [remote.remote(runner, cell) for cell in cells]
        todo = list(refs)
        while todo:
            done, todo = ray.wait(todo, num_returns=1)
            for ref in done:
                finished(ray.get(ref))
    finally:
        if started:
            ray.shutdown()


def write_csv(rows: Iterable[dict[str, Any]], path: str | os.PathLike) -> Path:
    """Write ``rows`` as a CSV whose columns are the union of the rows' keys in first-seen
    order (missing values empty, NaN as ``nan``); returns the path."""
    rows = list(rows)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, restval="", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_value(v) for k, v in row.items()})
    return out


def _csv_value(value: Any) -> Any:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return "+".join(map(str, value))
    return value


def read_csv(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a CSV written by :func:`write_csv`, with numbers parsed back (``""`` → None)."""
    with Path(path).open(newline="") as fh:
        return [{k: _parse(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def _parse(text: str | None) -> Any:
    if text is None or text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text
