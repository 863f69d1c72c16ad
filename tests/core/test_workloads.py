"""Tests of the workload loaders, generators, transforms and registry (core/workloads)."""

from __future__ import annotations

import gzip
import json
import time
from importlib import resources

import numpy as np
import pytest

from balanceroute.core.workloads import (
    WORKLOADS,
    LengthBounds,
    Workload,
    WorkloadError,
    clip_lengths,
    detect_format,
    filter_lengths,
    generate_azure2024,
    head,
    list_workloads,
    load_azure2023,
    load_bundled_servegen,
    load_mooncake,
    load_plain,
    load_servegen,
    load_vidur,
    load_workload,
    prefix_hash,
    scale_rate,
)
from balanceroute.core.workloads.azure2024 import load_azure2024_histograms


def write(path, text: str, *, gz: bool = False):
    """Write ``text`` to ``path`` (gzipped if asked) and return the path."""
    data = text.encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.fixture(scope="module")
def servegen_pool():
    return load_bundled_servegen()


@pytest.fixture(scope="module")
def histograms():
    return load_azure2024_histograms()


# --- bundled replays --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "count", "prompt_sum", "output_sum", "last_s"),
    [
        ("azure-conv-2023", 19_366, 22_361_870, 4_088_665, 3501.721937),
        ("azure-code-2023", 8_819, 18_059_974, 245_896, 3435.948056),
        ("mooncake-conv", 12_031, 144_793_823, 4_122_048, 3536.999),
    ],
)
def test_bundled_replays(name, count, prompt_sum, output_sum, last_s):
    w = load_workload(name)
    assert len(w) == count  # no row of the real traces is dropped
    assert w.name == name
    assert int(w.prompt_len.sum()) == prompt_sum and int(w.output_len.sum()) == output_sum
    assert w.arrival_s[0] == 0.0 and np.all(np.diff(w.arrival_s) >= 0)
    assert w.arrival_s[-1] == pytest.approx(last_s, abs=1e-6)
    assert w.source


def test_azure_conv_first_rows_exact():
    w = load_workload("azure-conv-2023")
    assert w.prompt_len[:4].tolist() == [374, 396, 879, 91]
    assert w.output_len[:4].tolist() == [44, 109, 55, 16]
    assert w.arrival_s[1] == pytest.approx(4.314579, abs=1e-9)
    assert w.output_len.max() == 1000  # conv outputs are capped at 1000
    assert w.prefix_hash is None and w.client is None


def test_mooncake_bundled_hashes():
    w = load_workload("mooncake-conv")
    assert w.prompt_len[:2].tolist() == [6758, 7322] and w.output_len[:2].tolist() == [500, 490]
    assert w.prefix_hash is not None and w.prefix_hash.min() >= 0
    assert len(np.unique(w.prefix_hash)) == 11_913  # some full hash_ids lists repeat


def test_prefix_hash_stable():
    assert prefix_hash([0, 1, 2]) == 5909025735884024341  # pinned: same on every machine
    assert prefix_hash([0, 1, 2]) == prefix_hash((0, 1, 2))
    assert prefix_hash([0, 1, 2]) != prefix_hash([0, 1, 3]) != prefix_hash([0, 1])
    assert 0 <= prefix_hash([]) < 2**63


# --- handcrafted files -------------------------------------------------------------------------

AZURE_CSV = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:16:00.0000001,5,1\n"
)


@pytest.mark.parametrize("gz", [False, True])
def test_azure_file_exact(tmp_path, gz):
    path = write(tmp_path / ("t.csv.gz" if gz else "t.csv"), AZURE_CSV, gz=gz)
    w = load_azure2023(path)
    assert w.name == "t"
    assert w.prompt_len.tolist() == [374, 396, 5] and w.output_len.tolist() == [44, 109, 1]
    assert w.arrival_s.tolist() == pytest.approx([0.0, 4.314579, 13.3194101], abs=1e-9)
    assert detect_format(path) == "azure"


def test_azure_utc_offsets(tmp_path):
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00.009930+00:00,10,2\n"
        "2024-05-10 02:00:01.009930+02:00,10,3\n"
    )
    w = load_azure2023(write(tmp_path / "a.csv", text))
    assert w.arrival_s.tolist() == pytest.approx([0.0, 1.0])


def test_mooncake_file_exact(tmp_path):
    lines = [
        {"timestamp": 1000, "input_length": 600, "output_length": 7, "hash_ids": [0, 1]},
        {"timestamp": 4000, "input_length": 20, "output_length": 3, "hash_ids": [0, 1]},
        {"timestamp": 4500, "input_length": 513, "output_length": 1, "hash_ids": [2]},
    ]
    path = write(tmp_path / "m.jsonl.gz", "\n".join(map(json.dumps, lines)) + "\n", gz=True)
    w = load_mooncake(path)
    assert w.arrival_s.tolist() == [0.0, 3.0, 3.5]
    assert w.prompt_len.tolist() == [600, 20, 513] and w.output_len.tolist() == [7, 3, 1]
    assert w.prefix_hash.tolist() == [prefix_hash([0, 1])] * 2 + [prefix_hash([2])]
    assert detect_format(path) == "mooncake"


def test_vidur_file(tmp_path):
    text = (
        "arrived_at,num_prefill_tokens,num_decode_tokens,extra\n0.0,4808,10,x\n0.052,3180.0,8,y\n"
    )
    path = write(tmp_path / "splitwise_code.csv", text)
    w = load_vidur(path)
    assert w.prompt_len.tolist() == [4808, 3180] and w.output_len.tolist() == [10, 8]
    assert w.arrival_s.tolist() == [0.0, 0.052]
    assert detect_format(path) == "vidur"
    lengths_only = write(tmp_path / "v.csv", "num_prefill_tokens,num_decode_tokens\n3772,54\n")
    assert load_workload(lengths_only).arrival_s is None


def test_plain_csv_and_json(tmp_path):
    csv_path = write(
        tmp_path / "p.csv", "timestamp,input_length,output_length,client\n10,5,6,1\n12.5,7,8,2\n"
    )
    w = load_plain(csv_path)
    assert w.arrival_s.tolist() == [0.0, 2.5]  # a timestamp is rebased to the first row
    assert w.prompt_len.tolist() == [5, 7] and w.client.tolist() == [1, 2]
    rows = [
        {"arrival_s": 1.5, "input_length": 3, "output_length": 4},
        {"arrival_s": 2.0, "input_length": 9, "output_length": 1},
    ]
    j = load_plain(write(tmp_path / "p.json", json.dumps(rows)))
    assert j.arrival_s.tolist() == [1.5, 2.0]  # arrival_s is used as-is
    assert j.output_len.tolist() == [4, 1]
    jl = load_workload(write(tmp_path / "p.jsonl", "\n".join(map(json.dumps, rows))))
    assert jl.prompt_len.tolist() == [3, 9]
    ms = load_plain(
        write(tmp_path / "q.csv", "timestamp,prompt_len,output_len\n0,1,1\n250,1,1\n"),
        time_unit="ms",
    )
    assert ms.arrival_s.tolist() == [0.0, 0.25]
    bare = load_workload(write(tmp_path / "b.csv", "input_length,output_length\n5,6\n"))
    assert bare.arrival_s is None and len(bare) == 1


# --- error messages ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            AZURE_CSV + "2023-11-16 18:16:01,12,abc\n",
            r"t\.csv:5: field GeneratedTokens: 'abc' is not an integer",
        ),
        (
            AZURE_CSV + "2023-11-16 18:16:01,0,3\n",
            r"t\.csv:5: field ContextTokens: 0 is not a positive length",
        ),
        (
            AZURE_CSV + "2023-11-16 18:16:01,4,-3\n",
            r"t\.csv:5: field GeneratedTokens: -3 is not a positive",
        ),
        (
            AZURE_CSV + "2023-11-16 18:16:01,4.5,3\n",
            r"t\.csv:5: field ContextTokens: '4\.5' is not an integer",
        ),
        (
            AZURE_CSV + "yesterday,4,3\n",
            r"t\.csv:5: field TIMESTAMP: 'yesterday' is not a timestamp",
        ),
        (
            AZURE_CSV + "2023-11-16 18:00:00,4,3\n",
            r"t\.csv:5: field TIMESTAMP: time goes backwards",
        ),
        (AZURE_CSV + "2023-11-16 18:16:01,4\n", r"t\.csv:5: 2 fields, expected 3"),
        (
            "TIMESTAMP,ContextTokens\n2023-11-16 18:16:01,4\n",
            r"t\.csv:1: missing column GeneratedTokens",
        ),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", r"t\.csv: no data rows"),
        ("", r"t\.csv: empty file"),
    ],
)
def test_azure_errors(tmp_path, text, message):
    with pytest.raises(WorkloadError, match=message):
        load_azure2023(write(tmp_path / "t.csv", text))


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(WorkloadError, match=r"nope\.csv: no such file"):
        load_azure2023(tmp_path / "nope.csv")
    corrupt = tmp_path / "z.csv.gz"
    corrupt.write_bytes(gzip.compress(AZURE_CSV.encode())[:30])
    with pytest.raises(WorkloadError, match=r"z\.csv\.gz: corrupt gzip"):
        load_azure2023(corrupt)
    with pytest.raises(WorkloadError, match=r"unknown workload 'no-such'.*servegen-r1"):
        load_workload("no-such")
    with pytest.raises(WorkloadError, match=r"unknown CSV header"):
        load_workload(write(tmp_path / "u.csv", "a,b\n1,2\n"))


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (
            {"timestamp": 0, "input_length": 5, "output_length": 0, "hash_ids": [1]},
            r"m\.jsonl:2: field output_length: 0 is not a positive length",
        ),
        (
            {"timestamp": 0, "input_length": "x", "output_length": 1, "hash_ids": [1]},
            r"m\.jsonl:2: field input_length: 'x' is not an integer",
        ),
        (
            {"timestamp": 0, "input_length": 5, "output_length": 1},
            r"m\.jsonl:2: field hash_ids: missing",
        ),
        (
            {"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [-1]},
            r"m\.jsonl:2: field hash_ids: expected a list of non-negative integers",
        ),
        (
            {"input_length": 5, "output_length": 1, "hash_ids": []},
            r"m\.jsonl:2: field timestamp: missing",
        ),
    ],
)
def test_mooncake_errors(tmp_path, obj, message):
    good = {"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}
    path = write(tmp_path / "m.jsonl", json.dumps(good) + "\n" + json.dumps(obj) + "\n")
    with pytest.raises(WorkloadError, match=message):
        load_mooncake(path)


def test_plain_and_vidur_errors(tmp_path):
    with pytest.raises(WorkloadError, match=r"p\.jsonl:2: invalid JSON"):
        load_plain(write(tmp_path / "p.jsonl", '{"input_length": 1, "output_length": 1}\n{oops\n'))
    items = [{"input_length": 1, "output_length": 1}, {"input_length": 1}]
    with pytest.raises(WorkloadError, match=r"p\.json: item 1: field output_length: missing"):
        load_plain(write(tmp_path / "p.json", json.dumps(items)))
    with pytest.raises(WorkloadError, match=r"v\.csv:3: field num_decode_tokens: 0 is not a"):
        load_vidur(write(tmp_path / "v.csv", "num_prefill_tokens,num_decode_tokens\n1,1\n2,0\n"))
    with pytest.raises(WorkloadError, match=r"v\.csv:1: missing column num_decode_tokens"):
        load_vidur(write(tmp_path / "v.csv", "num_prefill_tokens\n1\n"))


# --- transforms -------------------------------------------------------------------------------


def _toy() -> Workload:
    return Workload(
        name="toy",
        prompt_len=np.array([10, 200, 30, 4000, 5]),
        output_len=np.array([1500, 20, 1001, 1000, 3]),
        arrival_s=np.array([0.0, 1.0, 2.0, 4.0, 8.0]),
        client=np.array([0, 1, 0, 1, 0]),
    )


def test_transforms_exact():
    w = _toy()
    long = filter_lengths(w, min_output=1001)
    assert long.output_len.tolist() == [1500, 1001] and long.arrival_s.tolist() == [0.0, 2.0]
    assert long.client.tolist() == [0, 0]
    mid = filter_lengths(w, LengthBounds(min_prompt=10, max_prompt=300, max_output=1001))
    assert mid.prompt_len.tolist() == [200, 30]
    assert filter_lengths(w) is w
    assert head(w, 2).prompt_len.tolist() == [10, 200] and len(head(w, 99)) == 5
    clipped = clip_lengths(w, max_prompt=100, max_output=1000)
    assert clipped.prompt_len.tolist() == [10, 100, 30, 100, 5]
    assert clipped.output_len.tolist() == [1000, 20, 1000, 1000, 3]
    assert scale_rate(w, 2.0).arrival_s.tolist() == [0.0, 0.5, 1.0, 2.0, 4.0]
    assert w.output_len.tolist() == [1500, 20, 1001, 1000, 3]  # the input is unchanged
    with pytest.raises(WorkloadError, match="min_output=5 exceeds max_output=4"):
        LengthBounds(min_output=5, max_output=4)
    with pytest.raises(WorkloadError, match="positive"):
        scale_rate(w, 0.0)
    with pytest.raises(WorkloadError, match="no arrival times"):
        scale_rate(Workload("x", np.array([1]), np.array([1])), 2.0)


def test_load_workload_pipeline():
    full = load_workload("azure-code-2023")
    w = load_workload("azure-code-2023", min_output=1001)
    assert w.output_len.tolist() == full.output_len[full.output_len > 1000].tolist()
    first = load_workload("azure-conv-2023", requests=100, rate_scale=4.0, clip_output=50)
    ref = load_workload("azure-conv-2023")
    assert len(first) == 100
    assert first.arrival_s.tolist() == pytest.approx((ref.arrival_s[:100] / 4.0).tolist())
    assert first.output_len.tolist() == np.minimum(ref.output_len[:100], 50).tolist()
    with pytest.raises(WorkloadError, match=r"unknown option\(s\) start_s"):
        load_workload("azure-2024", requests=10, start_s=5)


def test_registry_listing_and_data_files():
    names = [n for n, _ in list_workloads()]
    expected = {
        "servegen-r1",
        "azure-conv-2023",
        "azure-code-2023",
        "mooncake-conv",
        "azure-2024",
        "azure-2024-long",
    }
    assert expected <= set(names) == set(WORKLOADS)
    assert all(desc for _, desc in list_workloads())
    data = resources.files("balanceroute.data")
    readme = data.joinpath("README.md").read_text()
    assert all(f"`{n}`" in readme for n in names)
    for folder in ("azure2023", "mooncake", "azure2024", "servegen_deepseek_r1"):
        files = [c.name for c in data.joinpath(folder).iterdir()]
        assert "SOURCE.md" in files and any(f.startswith("LICENSE") for f in files)


# --- Azure 2024 (distribution-matched) ------------------------------------------------------


def test_azure2024_histograms_match_summary(histograms):
    for trace in ("conv", "code"):
        assert histograms.output[trace][2].sum() == histograms.requests[trace]
        assert histograms.input[trace][2].sum() == histograms.requests[trace]
    assert histograms.max_output == {"conv": 1500, "code": 5000}
    assert histograms.output_edge(1001) == 1024 and histograms.output_edge(None) == 1


def test_azure2024_long(histograms):
    n = 20_000
    w = load_workload("azure-2024-long", requests=n, seed=3)
    assert len(w) == n and w.name == "azure-2024-long"
    assert "DISTRIBUTION-MATCHED" in w.source and "SYNTHETIC" in w.source
    assert w.output_len.min() >= 1024
    conv, code = w.client == 0, w.client == 1
    assert w.output_len[conv].max() <= 1500 and w.output_len[code].max() <= 5000
    assert w.prompt_len[conv].max() <= 7999 and w.prompt_len[code].max() <= 7743
    p_code = 14_335 / 58_423  # share of code among the real requests with output >= 1024
    assert abs(code.mean() - p_code) < 4 * np.sqrt(p_code * (1 - p_code) / n)
    assert np.all(np.diff(w.arrival_s) >= 0) and w.arrival_s[0] == 0.0
    # default rate: the real week-average rate of those requests, 58,423 / 604,800 s
    assert n / w.arrival_s[-1] == pytest.approx(58_423 / 604_800, rel=0.05)


def test_azure2024_all_traffic_and_options(histograms):
    n = 20_000
    w = generate_azure2024(n, np.random.default_rng(0), histograms=histograms, rate=10.0)
    p_code = 16_803_695 / 44_107_694
    assert abs((w.client == 1).mean() - p_code) < 4 * np.sqrt(p_code * (1 - p_code) / n)
    assert n / w.arrival_s[-1] == pytest.approx(10.0, rel=0.05)
    only_code = generate_azure2024(
        500, np.random.default_rng(0), traces=("code",), histograms=histograms, min_output=600
    )
    assert set(only_code.client.tolist()) == {1} and only_code.output_len.min() >= 1024
    bounded = load_workload("azure-2024", requests=300, min_output=1001, max_output=1200)
    assert bounded.output_len.min() >= 1024 and bounded.output_len.max() <= 1200
    with pytest.raises(WorkloadError, match="generator: pass requests"):
        load_workload("azure-2024")


@pytest.mark.parametrize("name", ["azure-2024", "servegen-r1"])
def test_generators_deterministic(name):
    a = load_workload(name, requests=2_000, seed=7)
    b = load_workload(name, requests=2_000, seed=7)
    c = load_workload(name, requests=2_000, seed=8)
    for col in ("prompt_len", "output_len", "arrival_s", "client"):
        assert np.array_equal(getattr(a, col), getattr(b, col))
    assert not np.array_equal(a.output_len, c.output_len)
    assert not np.array_equal(a.arrival_s, c.arrival_s)


# --- ServeGen -----------------------------------------------------------------------------------


def test_servegen_full_day(servegen_pool):
    pool = servegen_pool
    assert pool.counts.shape == (73, 144) and pool.window_s == 600.0
    assert pool.counts.sum() == 1_383_669
    assert pool.output_share(1000) == pytest.approx(0.4324, abs=5e-4)
    w = pool.generate(None, np.random.default_rng(0))
    assert len(w) == 1_383_669
    # request-weighted share of outputs > 1000: 43 %; 1.38 M draws -> binomial sd 0.0004
    assert (w.output_len > 1000).mean() == pytest.approx(pool.output_share(1000), abs=0.003)
    per_window = np.bincount((w.arrival_s // 600).astype(int), minlength=144)
    assert np.array_equal(per_window, pool.counts.sum(axis=0))  # exact counts per window


def test_servegen_default_slice(servegen_pool):
    pool = servegen_pool
    t0 = time.perf_counter()
    w = pool.generate(20_000, np.random.default_rng(0), name="servegen-r1")
    assert time.perf_counter() - t0 < 1.0
    assert len(w) == 20_000 and w.prefix_hash is None
    assert np.all(np.diff(w.arrival_s) >= 0) and 0 <= w.arrival_s[0] < 600
    assert set(np.unique(w.client)) <= set(pool.clients.tolist())
    # the first 20,000 requests from time 0 fill the first three windows; their expected share
    # of outputs > 1000 (about 49 %, more than the day's 43 %) is computed from the PDFs
    tail = pool.output_pdfs.tail_share(1000)
    counts = pool.counts[:, :3]
    expected = (counts * tail[np.maximum(pool.group[:, :3], 0)]).sum() / counts.sum()
    assert (w.output_len > 1000).mean() == pytest.approx(expected, abs=0.02)


def test_servegen_start_bounds_and_wrap(servegen_pool):
    pool = servegen_pool
    rng = np.random.default_rng(1)
    busy = pool.generate(5_000, rng, start_s="busiest")
    assert pool.busiest_start_s() == 79_800.0 and busy.arrival_s[0] >= 0
    long = pool.generate(5_000, rng, bounds=LengthBounds(min_output=1001))
    assert len(long) == 5_000 and long.output_len.min() > 1000
    wrap = pool.generate(30_000, rng, start_s=85_800.0)  # crosses the end of the day
    assert len(wrap) == 30_000 and np.all(np.diff(wrap.arrival_s) >= 0)
    assert wrap.arrival_s[-1] > 600
    mid = pool.generate(1_000, rng, start_s=300.0)
    assert mid.arrival_s[0] >= 0
    with pytest.raises(WorkloadError, match="start_s"):
        pool.generate(10, rng, start_s="noon")


def _servegen_dir(tmp_path, dataset: dict) -> object:
    folder = tmp_path / "sg"
    folder.mkdir()
    write(
        folder / "chunk-3-trace.csv",
        "0,0.01,1.0,Gamma,2.0,5.0\n600,0,0,,0,0\n1200,0.005,1.0,Weibull,0.5,3.0\n",
    )
    write(folder / "chunk-5-trace.csv", "0,0,0,,0,0\n600,0.02,1.0,Exponential,0,0\n1200,0,0,,0,0\n")
    write(folder / "chunk-3-dataset.json.gz", json.dumps(dataset), gz=True)
    write(
        folder / "chunk-5-dataset.json",
        json.dumps(
            {
                "0": {
                    "input_tokens": "{7: 1.0}",
                    "output_tokens": "{2: 0.5, 9: 0.5}",
                    "reason_ratio": "{}",
                }
            }
        ),
    )
    return folder


def test_servegen_handcrafted(tmp_path):
    dataset = {
        "0": {"input_tokens": "{5: 1.0}", "output_tokens": "{100: 0.25, 3000: 0.75}"},
        "1200": {"input_tokens": "{}", "output_tokens": "{}"},  # empty: falls back to window 0
    }
    folder = _servegen_dir(tmp_path, dataset)
    pool = load_servegen(folder)
    assert pool.clients.tolist() == [3, 5] and pool.counts.tolist() == [[6, 0, 3], [0, 12, 0]]
    w = load_workload(folder, seed=4)
    assert len(w) == 21
    windows = (w.arrival_s // 600).astype(int)
    assert np.array_equal(windows[w.client == 3], [0] * 6 + [2] * 3)
    assert np.all(windows[w.client == 5] == 1)
    assert set(w.prompt_len[w.client == 3].tolist()) == {5}
    assert set(w.output_len[w.client == 3].tolist()) <= {100, 3000}
    assert set(w.prompt_len[w.client == 5].tolist()) == {7}
    assert set(w.output_len[w.client == 5].tolist()) <= {2, 9}
    assert pool.output_share(1000) == pytest.approx(0.75 * 9 / 21)


def test_servegen_rejects_code_in_pdfs(tmp_path):
    evil = {"0": {"input_tokens": "__import__('os').getcwd()", "output_tokens": "{1: 1.0}"}}
    with pytest.raises(WorkloadError, match=r"window 0: field input_tokens"):
        load_servegen(_servegen_dir(tmp_path, evil))
