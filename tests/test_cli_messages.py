"""Every command's user errors: one line naming the flag (not the Python field), output paths
checked before any work, no traceback when stdout is a closed pipe."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from balanceroute.cli import main
from balanceroute.cli_checks import flag_error, output_dir, output_file


def one_line(capsys) -> str:
    out, err = capsys.readouterr()
    assert err.startswith("balanceroute: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "self." not in err, err
    return err


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--replicas", "0"], "--replicas=0 must be >= 1"),
    (["simulate", "-B", "0"], "--slots=0 must be >= 1"),
    (["simulate", "--pool-size", "0"], "--pool-size=0 must be >= 1"),
    (["simulate", "--mode", "open_loop", "--rate-scale", "0"], "--rate-scale=0.0 must be > 0"),
    (["compare", "--policies", "br0", "--replicas", "0"], "--replicas=0 must be >= 1"),
    (["emulate", "--replicas", "0"], "--replicas=0 must be >= 1"),
    (["emulate", "--time-scale", "0"], "--time-scale=0.0 must be > 0"),
    (["loadgen", "--url", "nonsense"], "--url='nonsense' must be"),
    (["loadgen", "--url", "http://127.0.0.1:1", "--concurrency", "0"], "--concurrency=0 must be >= 1"),
    (["tune", "--trials", "0"], "--trials=0 must be >= 1"),
    (["serve", "--kv-dialect", "none", "--decode", "http://127.0.0.1:1", "--host", "192.0.2.1", "--port", "0"],
     "--host 192.0.2.1 --port 0: cannot listen on 192.0.2.1:0"),
])
def test_validation_errors_name_the_flag(capsys, argv, message) -> None:
    assert main([*argv, "--requests", "50"] if argv[0] not in ("emulate", "serve") else argv) == 2
    assert message in one_line(capsys)


@pytest.fixture
def no_work(monkeypatch):
    """Any simulation or solver run fails the test: the checks must come first."""
    import balanceroute.analysis.compare as compare
    import balanceroute.solvers.gap as gap

    def boom(*args, **kwargs):
        raise AssertionError("the run started before the output path was checked")

    monkeypatch.setattr(compare, "compare_policies", boom)
    monkeypatch.setattr(gap, "tick_gap_rows", boom)
    monkeypatch.setattr(gap, "clairvoyant_gap_rows", boom)


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--series", "{tmp}"], "--series {tmp}: is a directory"),
    (["simulate", "--csv", "{tmp}"], "--csv {tmp}: is a directory"),
    (["compare", "--policies", "br0", "--csv", "{tmp}/missing/out.csv"], "the directory {tmp}/missing does not exist"),
    (["simulate", "--series", "{tmp}/file.txt/x.csv"], "{tmp}/file.txt is not a directory"),
    (["tune", "--write-params", "{tmp}"], "--write-params {tmp}: is a directory"),
    (["gap", "--csv", "{tmp}", "--quiet"], "--csv {tmp}: is a directory"),
    (["gap", "--save", "{tmp}/file.txt", "--quiet"], "--save {tmp}/file.txt: exists and is not a directory"),
    (["emulate", "--write-proxy-config", "{tmp}"], "--write-proxy-config {tmp}: is a directory"),
    (["reproduce", "--out", "{tmp}/file.txt", "--quick"], "--out {tmp}/file.txt: exists and is not a directory"),
])
def test_output_paths_are_checked_before_any_work(tmp_path, capsys, no_work, argv, message) -> None:
    (tmp_path / "file.txt").write_text("x")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    assert message.replace("{tmp}", str(tmp_path)) in one_line(capsys)


def test_the_checks_themselves(tmp_path) -> None:
    output_file(None, "--x")
    output_file("-", "--x")
    output_file(tmp_path / "new.csv", "--x")
    output_dir(tmp_path / "a" / "b", "--x")  # created later, under a writable ancestor
    with pytest.raises(ValueError, match="--x .*: is a directory"):
        output_file(tmp_path, "--x")
    if os.geteuid() != 0:  # root may write anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(ValueError, match="not writable"):
            output_file(ro / "x.csv", "--x")
    assert str(flag_error(ValueError("self.num_replicas=0 must be >= 1"), {"num_replicas": "--replicas"})) == (
        "--replicas=0 must be >= 1")
    assert str(flag_error(ValueError("self.mode='x' must be ..."), {})) == "mode='x' must be ..."


def _closed_pipe(argv: list[str]) -> tuple[int, str]:
    """Run the CLI with its stdout a pipe whose reader has already gone (``... | head``)."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "balanceroute.cli", *argv], stdout=write,
                              stderr=subprocess.PIPE, timeout=300, text=True)
    finally:
        os.close(write)
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("argv", [
    ["workloads"],
    ["simulate", "--workload", "azure-2024-long", "--requests", "300", "-G", "2", "-B", "4", "-q"],
])
def test_a_closed_pipe_ends_quietly(argv) -> None:
    code, err = _closed_pipe(argv)
    assert code == 141 and "Traceback" not in err and "BrokenPipeError" not in err, (code, err)
