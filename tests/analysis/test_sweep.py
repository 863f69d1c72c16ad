"""The grid runner: cell keys, the cache, CSV round trips, local processes and Ray agree."""

from __future__ import annotations

import math

import pytest

from balanceroute.analysis.experiments import code_fingerprint, run_cell, source_code
from balanceroute.analysis.sweep import Cell, read_csv, run_grid, write_csv

CALLS: list[Cell] = []


def _fake_runner(cell: Cell) -> list[dict]:
    """A cheap deterministic runner (counts its calls in this process)."""
    CALLS.append(cell)
    return [{**cell.fields(), "value": cell.seed * 10 + cell.replicas, "nan": math.nan}]


def _failing_runner(cell: Cell) -> list[dict]:
    if cell.seed == 1:
        raise RuntimeError("boom")
    return _fake_runner(cell)


def _tiny_grid() -> list[Cell]:
    return [Cell(experiment="tiny", workload="azure-conv-2023", policy=p, replicas=4, slots=8,
                 requests=300, seed=s)
            for p in ("random", "br0") for s in (0, 1)]


def test_cell_key_is_stable_and_sensitive():
    a = Cell(experiment="e", policy="br0", options=(("b", 2), ("a", 1)))
    b = Cell(experiment="e", policy="br0", options=(("a", 1), ("b", 2)))
    assert a == b and a.key == b.key  # options are sorted
    assert Cell(experiment="e", policy="br0", seed=1).key != Cell(experiment="e", policy="br0").key
    assert Cell(experiment="e", step_a=1e-7).key != Cell(experiment="e").key
    assert a.fields()["a"] == 1 and a.fields()["group"] == ""
    with pytest.raises(ValueError):
        Cell(experiment="")


def test_code_fingerprints_ignore_docstrings_and_comments():
    base = 'X = 1\n"""X\'s doc."""\n\n\ndef f(a):\n    """Doc."""\n    return a + X  # note\n'
    same = ('X = 1\n\n\ndef f(a):\n    """Another doc,\n    over two lines."""\n    # a comment\n'
            '    return (a\n            + X)\n')
    assert source_code(base) == source_code(same)
    assert source_code(base) != source_code(base.replace("a + X", "a - X"))
    assert source_code(base) != source_code(base.replace("X = 1", "X = 2"))
    assert source_code(base) != source_code(base.replace('"""Doc."""', "print()"))
    # a body that was only a docstring is an empty body, not a syntax error
    assert source_code('def g():\n    """Only a doc."""\n') == source_code("def g():\n    pass\n")
    prints = {code_fingerprint(part) for part in ("base", "brh", "solvers")}
    assert len(prints) == 3 and all(len(p) == 12 for p in prints)


def test_code_fingerprints_read_the_code_as_python_3_11_writes_its_syntax_tree():
    """A fingerprint is the same on every supported Python, so the committed results' provenance
    and the cells' cache hold on 3.12 and 3.13 too: 3.13's ast.dump leaves empty fields out,
    3.12 adds ``type_params`` and an empty part to some f-string format specs. The tree of this
    snippet as 3.11 dumps it (checked on 3.11, 3.12 and 3.13; on 3.13 it fails with a plain
    ``ast.dump``, on 3.12 without dropping the empty f-string part)."""
    snippet = 'class A:\n    """doc"""\n\n    def f(self, width: int) -> str:\n        return f"{self!r:<{width}}"\n'
    assert source_code(snippet).decode() == (
        "Module(body=[ClassDef(name='A', bases=[], keywords=[], body=[FunctionDef(name='f', "
        "args=arguments(posonlyargs=[], args=[arg(arg='self'), arg(arg='width', annotation=Name("
        "id='int', ctx=Load()))], kwonlyargs=[], kw_defaults=[], defaults=[]), body=[Return("
        "value=JoinedStr(values=[FormattedValue(value=Name(id='self', ctx=Load()), conversion=114, "
        "format_spec=JoinedStr(values=[Constant(value='<'), FormattedValue(value=Name(id='width', "
        "ctx=Load()), conversion=-1)]))]))], decorator_list=[], returns=Name(id='str', ctx=Load()))], "
        "decorator_list=[])], type_ignores=[])")


def test_cache_skips_finished_cells(tmp_path):
    cells = [Cell(experiment="c", replicas=g, seed=s) for g in (2, 4) for s in (0, 1)]
    CALLS.clear()
    first = run_grid(cells, _fake_runner, jobs=1, cache_dir=tmp_path)
    assert first.executed == 4 and first.cached == 0 and len(CALLS) == 4
    CALLS.clear()
    second = run_grid(list(reversed(cells)), _fake_runner, jobs=1, cache_dir=tmp_path)
    assert second.executed == 0 and second.cached == 4 and CALLS == []
    assert [r["value"] for r in second.rows] == [r["value"] for r in first.rows]
    assert math.isnan(second.rows[0]["nan"])
    third = run_grid(cells, _fake_runner, jobs=1, cache_dir=tmp_path, use_cache=False)
    assert third.executed == 4
    # a new cell runs, the old ones come from the cache
    more = run_grid([*cells, Cell(experiment="c", replicas=8)], _fake_runner, jobs=1,
                    cache_dir=tmp_path)
    assert (more.executed, more.cached) == (1, 4)


def test_failures_are_reported_and_not_cached(tmp_path):
    cells = [Cell(experiment="f", seed=s) for s in (0, 1)]
    result = run_grid(cells, _failing_runner, jobs=1, cache_dir=tmp_path)
    assert len(result.rows) == 1 and len(result.errors) == 1
    assert "boom" in result.errors[0][1]
    again = run_grid(cells, _failing_runner, jobs=1, cache_dir=tmp_path)
    assert (again.executed, again.cached) == (1, 1)


def test_csv_round_trip(tmp_path):
    rows = [{"a": 1, "b": 0.1, "c": "x", "d": None, "e": math.nan},
            {"a": 2, "b": 1e-7, "c": "y", "f": True}]
    path = write_csv(rows, tmp_path / "t.csv")
    back = read_csv(path)
    assert list(back[0]) == ["a", "b", "c", "d", "e", "f"]
    assert back[0]["a"] == 1 and back[0]["b"] == 0.1 and back[0]["d"] is None
    assert math.isnan(back[0]["e"]) and back[1]["b"] == 1e-7 and back[1]["f"] is True


def test_simulate_cell_schema():
    rows = run_cell(_tiny_grid()[0])
    assert len(rows) == 1
    row = rows[0]
    for key in ("experiment", "kind", "workload", "policy", "replicas", "slots", "seed",
                "step_b", "step_a", "group", "test_requests", "mean_imbalance", "tpot_ms_p95",
                "throughput_tok_s", "throughput_loaded_tok_s", "envelope_mean",
                "load_std_mean", "load_gap_mean"):
        assert key in row, key
    assert row["test_requests"] == 150  # the leading half is the (predictors') training part
    # the load gap is I/G on the sampled steps: same order as the mean imbalance / G
    assert row["load_gap_mean"] > 0 and row["mean_imbalance"] > 0
    assert all(not hasattr(v, "dtype") for v in row.values())


def test_local_processes_match_in_process(tmp_path):
    cells = _tiny_grid()
    serial = run_grid(cells, run_cell, jobs=1)
    pooled = run_grid(cells, run_cell, jobs=2)
    write_csv(serial.rows, tmp_path / "a.csv")
    write_csv(pooled.rows, tmp_path / "b.csv")
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()
    assert pooled.executed == 4 and not pooled.errors


def test_ray_backend_matches_local(tmp_path):
    ray = pytest.importorskip("ray", reason="the `dist` extra (ray) is not installed")
    cells = _tiny_grid()
    local = run_grid(cells, run_cell, jobs=1)
    try:
        remote = run_grid(cells, run_cell, backend="ray", jobs=2)
    finally:
        if ray.is_initialized():  # run_grid shuts down the instance it started
            ray.shutdown()
    assert not ray.is_initialized()
    assert not remote.errors and remote.executed == 4
    write_csv(local.rows, tmp_path / "local.csv")
    write_csv(remote.rows, tmp_path / "ray.csv")
    assert (tmp_path / "local.csv").read_text() == (tmp_path / "ray.csv").read_text()
