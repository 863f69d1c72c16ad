"""Policy comparison on one workload: the paper's Table 1 as records and as a text table."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict

from balanceroute.core.policies import BASELINES, get_policy
from balanceroute.core.policies.base import Policy
from balanceroute.core.simulator import SimConfig, SimResult, simulate
from balanceroute.core.workloads.base import Workload

__all__ = ["TABLE_COLUMNS", "add_gains", "compare_policies", "format_table"]

PolicyFactory = Callable[[str], Policy]

#: (record key, header, format) of the Table-1-shaped text table.
TABLE_COLUMNS = (
    ("policy", "policy", "{}"),
    ("mean_imbalance", "mean imbalance (tokens)", "{:,.0f}"),
    ("tpot_ms_p95", "TPOT P95 (ms)", "{:.1f}"),
    ("throughput_loaded_tok_s", "throughput (tok/s)", "{:,.0f}"),
    ("throughput_tok_s", "incl. drain (tok/s)", "{:,.0f}"),
    ("gain_vs_best_baseline_pct", "gain vs best baseline", "{:+.1f}%"),
)


def compare_policies(
    workload: Workload,
    names: Sequence[str],
    config: SimConfig,
    *,
    seed: int = 0,
    factory: PolicyFactory | None = None,
    on_policy: Callable[[str], None] | None = None,
    progress: Callable[[int], None] | None = None,
    on_result: Callable[[SimResult], None] | None = None,
    reference: Sequence[str] = (),
) -> list[dict]:
    """Simulate every policy in ``names`` on the same workload, cluster and seed.

    ``factory(name)`` builds a policy (default: ``get_policy(name, seed=seed)``). Returns one
    record per policy: its name, the workload and cluster settings and every metric of
    :class:`~balanceroute.core.simulator.SimResult`, plus ``gain_vs_best_baseline_pct``.
    ``reference`` names baselines simulated only for the gain (no row of their own), so that
    a row's gain does not depend on which other rows are compared.
    """
    build = factory or (lambda name: get_policy(name, seed=seed))
    policies = {name: build(name) for name in names}  # fail on a bad name before running
    records, extra = [], {}
    for name in [*names, *reference]:
        if on_policy is not None:
            on_policy(name)
        policy = policies[name] if name in policies else build(name)
        result = simulate(workload, policy, config, progress=progress)
        if name not in names:
            extra[name] = result.metrics[GAIN_KEY]
            continue
        if on_result is not None:
            on_result(result)
        records.append(
            {
                "policy": name,
                "workload": workload.name,
                "replicas": config.num_replicas,
                "slots": config.slots,
                "mode": config.mode,
                "pool_size": config.pool_target,
                "seed": seed,
                "step_model": ",".join(f"{k}={v:g}" for k, v in asdict(config.step_model).items()),
                **result.metrics,
            }
        )
    return add_gains(records, reference=extra)


GAIN_KEY = "throughput_loaded_tok_s"


def add_gains(records: list[dict], baselines: Iterable[str] = BASELINES,
              reference: dict[str, float] | None = None) -> list[dict]:
    """Set ``gain_vs_best_baseline_pct`` = loaded-phase throughput gain over the baseline with the
    highest loaded-phase throughput among the compared ones and the ``reference`` throughputs
    (baseline name → loaded throughput; NaN when there is no baseline at all).

    The loaded phase is what a saturated deployment runs in; the whole-run figure also counts
    the drain after the last assignment, which is set by the longest request left (SimResult)."""
    wanted = set(baselines)
    base = [r[GAIN_KEY] for r in records if r["policy"] in wanted]
    base += [v for k, v in (reference or {}).items() if k in wanted]
    best = max(base) if base else math.nan
    for r in records:
        r["gain_vs_best_baseline_pct"] = 100.0 * (r[GAIN_KEY] / best - 1.0)
    return records


def format_table(records: Sequence[dict]) -> str:
    """A plain-text table with the columns of the paper's Table 1."""
    header = [h for _, h, _ in TABLE_COLUMNS]
    rows = [
        [
            "n/a" if isinstance(r[key], float) and math.isnan(r[key]) else fmt.format(r[key])
            for key, _, fmt in TABLE_COLUMNS
        ]
        for r in records
    ]
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    return "\n".join(lines)
