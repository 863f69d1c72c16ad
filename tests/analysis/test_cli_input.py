"""Bad invocations end with one clear line and exit status 2, never a traceback; setups that
make no sense are warned about; a policy's row does not depend on its neighbours."""

from __future__ import annotations

import io
import json

import pytest

from balanceroute.cli import main
from balanceroute.core.dynamics import StepModel
from balanceroute.core.limits import Limits
from balanceroute.progress import progress

SMALL = ["--workload", "azure-2024-long", "--requests", "600", "-G", "2", "-B", "8", "-q"]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _trace(tmp_path, rows: list[str], name: str = "t.csv") -> str:
    path = tmp_path / name
    path.write_text("input_length,output_length\n" + "\n".join(rows) + "\n")
    return str(path)


@pytest.mark.parametrize("row, message", [
    ("10,1000000000", "output_len 1,000,000,000 exceeds the sanity limit max_tokens"),
    ("10,1e12", "output_len 1,000,000,000,000 exceeds the sanity limit max_tokens"),
    ("10,99999999999999999999999", "t.csv:2: field output_length: 99999999999999999999999 is out of range"),
    ("1000000000000,10", "prompt_len 1,000,000,000,000 exceeds the sanity limit max_tokens"),
])
def test_absurd_lengths_are_one_line_errors(tmp_path, capsys, row, message) -> None:
    trace = _trace(tmp_path, [row, "20,30"])
    code, out, err = run(["simulate", "--workload", trace, "-q"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_a_raised_limit_admits_the_request(tmp_path, capsys) -> None:
    trace = _trace(tmp_path, ["10,3000000", "20,30", "5,5", "7,7"])
    code, _, err = run(["simulate", "--workload", trace, "-G", "1", "-B", "1", "-q",
                        "--limit", "max_tokens=4000000", "--train-fraction", "0.25"], capsys)
    assert code == 0, err


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--replicas", "100000000"], "--replicas = 100,000,000 exceeds the sanity limit max_replicas = 4,096"),
    (["simulate", "--slots", "10000000"], "max_slots"),
    (["simulate", "--requests", "1000000000"], "max_requests"),
    (["simulate", "--policy", ""], "--policy '' names no policy"),
    (["simulate", "--policy", "br0,jsq"], "--policy takes one policy"),
    (["compare", "--policies", ""], "--policies '' names no policy"),
    (["compare", "--policies", ","], "--policies ',' names no policy"),
    (["compare", "--policies", "br0,,jsq"], "empty name between commas"),
    (["compare", "--policies", "br0,jsq,br0"], "names 'br0' more than once"),
    (["compare", "--policies", "br0,nope"], "unknown policy 'nope'"),
    (["simulate", "--step-model", "b=0.03,b=0.04"], "b given twice"),
    (["simulate", "--json", "--csv", "-"], "--json and --csv - both write to stdout"),
    (["simulate", "--limit", "max_tokens"], "expected KEY=N"),
    (["simulate", "--limit", "max_tokens=1", "--limit", "max_tokens=2"], "max_tokens given twice"),
    (["simulate", "--limit", "nonsense=3"], "expected KEY=N with KEY one of"),
    (["simulate", "--train-fraction", "1.5"], "--train-fraction 1.5 must be in (0, 1)"),
    (["simulate", "--params", "does-not-exist.json"], "--params does-not-exist.json: no such file"),
    (["tune", "--replicas", "100000000"], "max_replicas"),
])
def test_bad_flags_are_one_line_errors(capsys, argv, message) -> None:
    code, out, err = run([*argv, "--requests", "200"] if "--requests" not in argv else argv, capsys)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


@pytest.mark.parametrize("names, message", [
    ("nope", "unknown policy 'nope'"),
    ("br0,random", "'random' not a matrix row; rows: jsq,"),
    ("br0,,jsq", "empty name between commas"),
])
def test_quality_rows_are_checked_before_anything_runs(capsys, names, message) -> None:
    code, out, err = run(["quality", "--policies", names], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_nonsense_setups_are_warned_about(capsys) -> None:
    code, _, err = run(["simulate", "--requests", "40", "--rate-scale", "2", "--prefill-delay", "1",
                        "-q"], capsys)
    assert code == 0
    assert "--rate-scale applies to --mode open_loop and is ignored in saturated mode" in err
    assert "--prefill-delay applies to --mode open_loop" in err
    assert "20 simulated requests for G*B = 512 slots: the cluster never fills" in err


def test_no_warning_for_a_sensible_run(capsys) -> None:
    code, _, err = run(["simulate", *SMALL], capsys)
    assert code == 0 and err == ""


def test_a_row_does_not_depend_on_its_neighbours(capsys) -> None:
    rows = {}
    for policies in ("br0", "jsq,br0,least_load,brh-oracle,brh-survival"):
        code, out, err = run(["compare", *SMALL, "--policies", policies, "--json"], capsys)
        assert code == 0, err
        rows[policies] = next(r for r in json.loads(out) if r["policy"] == "br0")
    assert rows["br0"] == rows["jsq,br0,least_load,brh-oracle,brh-survival"]
    assert rows["br0"]["workload"] == "azure-2024-long[300:]"  # the held-out half, always


def test_tune_writes_params_that_compare_takes(tmp_path, capsys) -> None:
    path = tmp_path / "brh.json"
    code, out, err = run(["tune", "--workload", "azure-2024-long", "--requests", "800", "-G", "2",
                          "-B", "8", "--trials", "2", "-q", "--write-params", str(path)], capsys)
    assert code == 0, err
    doc = json.loads(path.read_text())
    assert doc["policy"] == "brh-survival" and set(doc["params"]) == {"horizon", "gamma", "beta", "s_greedy"}
    assert doc["provenance"]["workload"] == "azure-2024-long[:400]"  # tuned on the training half
    code, out, err = run(["compare", *SMALL, "--policies", "br0,brh-survival", "--params", str(path),
                          "--json"], capsys)
    assert code == 0, err
    # a parameter the policy does not take is refused by name, before anything runs
    doc["params"]["bogus"] = 1
    path.write_text(json.dumps(doc))
    code, _, err = run(["compare", *SMALL, "--policies", "brh-survival", "--params", str(path)], capsys)
    assert code == 2 and "bogus" in err and err.count("\n") == 1
    code, _, err = run(["compare", *SMALL, "--policies", "br0", "--params", str(path)], capsys)
    assert code == 2 and "is for 'brh-survival', which is not among the simulated policies" in err
    path.write_text('{"policy": "br0"}')
    code, _, err = run(["simulate", *SMALL, "--params", str(path)], capsys)
    assert code == 2 and "not a parameter file" in err


def test_limits_parse() -> None:
    assert Limits.parse(["max_tokens=5", "max_replicas=7"]) == Limits(max_tokens=5, max_replicas=7)
    assert Limits.parse(None) == Limits()
    with pytest.raises(ValueError, match="must be an integer >= 1"):
        Limits.parse(["max_pool=0"])


def test_step_model_parse() -> None:
    assert StepModel.parse("b=0.04, a=1e-7") == StepModel(b=0.04, a=1e-7)
    with pytest.raises(ValueError, match="a given twice"):
        StepModel.parse("a=1e-7,a=2e-7")


def test_progress_without_a_terminal_is_plain_log_lines() -> None:
    stream = io.StringIO()
    with progress(4, "reproduce", "cells", stream=stream, interval_s=0.0, tty=False) as bar:
        bar.set_postfix_str("table1 br0 G=8")
        for _ in range(4):
            bar.update()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert lines[0] == "reproduce: 0/4 cells (0 %), 0s elapsed"  # at once
    assert lines[1].startswith("reproduce: 1/4 cells (25 %), ") and lines[1].endswith("[table1 br0 G=8]")
    assert "left" in lines[1] and lines[-1].startswith("reproduce: 4/4 cells (100 %)")


def test_progress_guesses_no_time_left_before_one_percent() -> None:
    stream = io.StringIO()
    with progress(12_000, "simulating", "req", stream=stream, interval_s=0.0, tty=False) as bar:
        bar.update(1)  # e.g. the first request after a predictor fit: no rate to speak of yet
        bar.update(118)
        bar.update(1)
    first, second, third = stream.getvalue().splitlines()[1:4]
    assert "left" not in first and "left" not in second and "left" in third


def test_quiet_progress_prints_nothing() -> None:
    stream = io.StringIO()
    with progress(3, "tuning", "runs", stream=stream, interval_s=0.0, tty=False, quiet=True) as bar:
        bar.update(3)
    assert stream.getvalue() == ""
