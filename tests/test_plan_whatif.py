"""`ddbench plan` with an SLO: the rate search, fleet sizing, host sharing, knob search, errors."""

import json
import math
import os

import pytest

from ddbench.core import defaults as D

from ddbench.core.catalog import fetch_share, get_host, get_link, shared_link
from ddbench.core.errors import DDBenchError
from ddbench.planner.knobs import pareto, parse_search, settings
from ddbench.planner.runs import capacity, run_point
from ddbench.planner.scenario import Scenario
from ddbench.planner.search import max_rate
from ddbench.planner.slo import parse_slo, violations
from tests.cli import ddbench

# small and fast: Llama-3-8B on the H200 (its own bundle), 32K contexts, short outputs
SMALL = dict(model="llama-3-8b", gpu="h200", context="32k", output="64", requests=60)


def test_parse_slo():
    s = parse_slo("p99-completion=60s, p99-tpot=100ms,p50-ttft=500us")
    assert [(x.pct, x.metric, x.limit_s) for x in s] == [(99, "completion", 60.0), (99, "tpot", 0.1),
                                                          (50, "ttft", 5e-4)]
    assert s[1].column == "tpot_p99_s" and s[1].text == "p99-tpot=100ms"
    assert violations({"completion_p99_s": 61.0, "tpot_p99_s": 0.1, "ttft_p50_s": None}, s) == \
        ["p99-completion=60s", "p50-ttft=500us"]


@pytest.mark.parametrize("text, msg", [("p99-tpot=100", "cannot parse SLO term"), ("p99-speed=1s", "unknown metric"),
                                       ("p0-tpot=1s", "percentile"), ("tpot<1s", "cannot parse"),
                                       ("p99-tpot=1s,p99-tpot=2s", "given twice")])
def test_parse_slo_errors(text, msg):
    with pytest.raises(DDBenchError, match=msg):
        parse_slo(text)


def test_search_brackets_the_rate():
    """The answer passes, the rate just above it fails, within the tolerance and the run budget; a
    tighter SLO gives no higher a rate."""
    slos = parse_slo("p99-tpot=60ms")
    sc = Scenario(design="dualdecoder", **SMALL)
    res = max_rate(sc, slos, seeds=(0,), tol=0.05, max_runs=12)
    assert res.status == "met" and res.runs <= 12
    passed = [p for p in res.probes if p[1]]
    failed = [p for p in res.probes if not p[1]]
    assert res.rate == max(p[0] for p in passed) and res.hi == min(p[0] for p in failed)
    assert res.rate < res.hi and (res.hi / res.rate <= 1.05 or res.runs == 12)
    assert res.row["tpot_p99_s"] <= 0.060 and res.row["sustainable"]
    at_hi = run_point(sc, res.hi, 0, (99,))
    assert at_hi["tpot_p99_s"] > 0.060 or not at_hi["sustainable"]
    tight = max_rate(sc, parse_slo("p99-tpot=45ms"), seeds=(0,), tol=0.05, max_runs=12)
    assert tight.rate <= res.rate
    assert res.binding in ("memory", "link", "compute", "compute (prefill)")


def test_overload_is_not_sustainable():
    sc = Scenario(design="dualdecoder", **SMALL)
    cap = capacity(sc)
    light, heavy = run_point(sc, cap["rate"] / 20), run_point(sc, cap["rate"] * 8)
    assert light["sustainable"] and abs(light["backlog_growth"]) < 0.05
    assert not heavy["sustainable"] and heavy["backlog_growth"] > 1.0


def test_host_sharing_halves_a_link_bound_design():
    """Paper testbed: 2 GPUs per PCIe 5 switch; 8 GPUs fetching at once get half the link each, and a
    link-bound design (DualDecoder, Llama-3-8B at 128K on the H200: link-bound at its max batch)
    decodes about half the tokens/s; with 2 GPUs on different switches nothing changes."""
    share = fetch_share(get_host("paper-testbed"))
    assert share.per_switch == 2 and share.limit == "switch"
    assert share.per_gpu_gbps == pytest.approx(get_link("pcie5").achievable_gbps / 2)
    assert fetch_share(get_host("paper-testbed"), 2).per_gpu_gbps == get_link("pcie5").achievable_gbps
    assert shared_link(get_link("pcie5"), fetch_share(get_host("paper-testbed"), 4)) == get_link("pcie5")
    base = dict(model="llama-3-8b", gpu="h200", context="128k", output="256", design="dualdecoder")
    alone = capacity(Scenario(**base, host_mem_gb=200))
    shared = capacity(Scenario(**base, host="paper-testbed"))
    assert alone["max_batch"] == shared["max_batch"]
    assert 0.45 < shared["tokens_per_s"] / alone["tokens_per_s"] < 0.56
    full = capacity(Scenario(**dict(base, design="full-kv"), host="paper-testbed"))
    assert full["tokens_per_s"] == pytest.approx(capacity(Scenario(**dict(base, design="full-kv")))["tokens_per_s"])


def test_knob_grid_and_pareto():
    knobs = parse_search("budget=1k:2k:4k,chunk=8:16,lowrank-layers=0:4,buffers")
    dd = settings(Scenario(design="dualdecoder", **SMALL), knobs, 32768, 32)
    assert len(dd) == 3 * 2 * 2 * 2
    sk = settings(Scenario(design="shadowkv", **SMALL), knobs, 32768, 32)
    assert len(sk) == 3 * 2 and {s.buffers for s in sk} == {"design"}
    assert len(settings(Scenario(design="full-kv", **SMALL), knobs, 32768, 32)) == 1
    assert len(settings(Scenario(design="dualdecoder", **SMALL), parse_search("budget=2k:64k"), 32768, 32)) == 1
    assert sorted(pareto([(10, 5), (8, 3), (9, 6), (10, 4), (7, 3)])) == [1, 3]
    with pytest.raises(DDBenchError, match="unknown knob"):
        parse_search("budget,temperature")


def test_cache_knob_searches_the_chunk_cache_capacity_and_buffers_the_layout():
    knobs = parse_search("budget=1k:2k,cache=2x:4x:12k,buffers=pingpong")
    cc = settings(Scenario(design="dualdecoder-cache", **SMALL), knobs, 32768, 32)
    got = sorted((s.knob("budget"), s.knob("cache_tokens")) for s in cc)
    assert got == [(1024, 2048), (1024, 4096), (1024, 12288), (2048, 4096), (2048, 8192), (2048, 12288)]
    assert {s.buffers for s in cc} == {"design"}                   # layouts do not apply to it
    dd = settings(Scenario(design="dualdecoder", **SMALL), knobs, 32768, 32)
    assert {s.buffers for s in dd} == {"pingpong"} and {s.knob("cache_tokens") for s in dd} == {D.CACHE_TOKENS}
    from ddbench.planner.knobs import knob_label
    assert knob_label(cc[0], knobs) == "budget=1024 cache=2x" and knob_label(dd[0], knobs) == \
        "budget=1024 buffers=pingpong"
    assert parse_search("cache")["cache"] == ("2x", "4x", "8x")
    assert parse_search("buffers")["buffers"] == ("pingpong", "per-layer")
    for bad in ("cache=0.5x", "cache=fast", "cache=-2x", "cache=nanx"):
        with pytest.raises(DDBenchError, match="cache '"):
            parse_search(bad)
    for bad in ("cache=pingpong", "cache=4x:per-layer"):       # a layout is the buffers knob's, not the cache's
        with pytest.raises(DDBenchError, match="is a buffer layout: use buffers="):
            parse_search(bad)


def test_plan_slo_cli_ranks_and_sizes_the_fleet(tmp_path):
    png = tmp_path / "p99.png"
    r = ddbench("plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k", "--output", "64",
                "--design", "shadowkv,dualdecoder", "--slo", "p99-tpot=60ms", "--requests", "60",
                "--target-rate", "10", "--workers", "2", "--json", "--plot", str(png))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    ds = out["designs"]
    assert [d["rank"] for d in ds] in ([1, 2], [1, 1])     # [1, 1]: undecided inside the rates' intervals
    assert (ds[1]["rank"] == 1) == bool(ds[0]["undecided_with"])
    assert ds[0]["max_rate_req_per_s"] >= ds[1]["max_rate_req_per_s"] > 0
    for d in ds:
        assert d["gpus"] == math.ceil(10 / d["max_rate_req_per_s"] - 1e-9)
        assert d["tpot_p99_s"] <= 0.060 and d["runs"] <= 12
        assert d["peak_memory_gb"] == pytest.approx(sum(d[f"{c}_gb"] for c in (
            "weights", "resident_kv", "landmarks", "aux_residency", "sparse_kv_buffers", "activations",
            "runtime_overhead")), rel=1e-6)
    assert png.stat().st_size > 10_000
    assert out["verdict"] is None
    be = out["break_even"]                    # the winner's misses scaled until the ranking flips
    assert be["winner"] == ds[0]["system"] and be["scaled"].startswith("miss rate")
    rates = [g["max_rate_req_per_s"] for g in be["grid"]]
    assert [g["factor"] for g in be["grid"]][0] == 1.0 and rates[0] == ds[0]["max_rate_req_per_s"]
    tol = out["tolerance"]                            # more misses never raise the rate (to within the searches')
    assert all(b <= a * (1 + tol) for a, b in zip(rates, rates[1:])) and rates[-1] < rates[0]
    (pair,) = be["pairs"]
    assert pair["against"] == ds[1]["system"]
    assert pair["factor"] is None or 1.0 <= pair["factor"] <= be["grid"][-1]["factor"]


def test_break_even_crossing_interpolates_and_says_beyond():
    from ddbench.planner.breakeven import _crossing, render
    pts = [(1.0, 2.0), (1.5, 1.5), (2.0, 1.0)]
    assert _crossing(pts, 1.25) == pytest.approx(1.75)
    assert _crossing(pts, 2.5) == 1.0 and _crossing(pts, 0.5) is None
    doc = {"winner": "a", "scaled": "miss rate (1 - hit)", "grid": [{"factor": f, "max_rate_req_per_s": r}
                                                                    for f, r in pts],
           "pairs": [{"against": "b", "against_rate_req_per_s": 1.25, "factor": 1.75},
                     {"against": "c", "against_rate_req_per_s": 0.5, "factor": None}]}
    lines = render(doc, 0.05)
    assert len(lines) == 3 and "a over b: flips at 1.8x" in lines[1] and "a over c: holds beyond 2x" in lines[2]


def test_plan_slo_nothing_meets_is_a_result():
    r = ddbench("plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k", "--output", "64",
                "--system", "shadowkv,dualdecoder", "--slo", "p99-tpot=1ms", "--requests", "40", "--workers", "1")
    assert r.returncode == 0, r.stderr
    last = [line for line in r.stdout.splitlines() if line.startswith("no design meets")]
    assert len(last) == 1 and "no design meets p99-tpot=1ms; the best is " in last[0] and " ms (at " in last[0]


def test_plan_knob_search_cli():
    r = ddbench("plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k", "--output", "64",
                "--design", "dualdecoder", "--slo", "p99-tpot=60ms", "--requests", "40", "--max-runs", "6",
                "--search", "budget=1k:2k,buffers", "--workers", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    sets = out["settings"]
    assert len(sets) == 4 and any(s["pareto_memory"] for s in sets)
    assert {s["setting"].split()[-1] for s in sets} == {"buffers=pingpong", "buffers=per-layer"}
    best = out["designs"][0]
    assert best["buffers"] in ("pingpong", "per-layer") and "cache" not in best
    assert best["max_rate_req_per_s"] == max(s["max_rate_req_per_s"] for s in sets)
    # the memory front: nothing on it is beaten on both tokens/s and memory
    met = [s for s in sets if s["tokens_per_s"] is not None]
    for s in met:
        if s["pareto_memory"]:
            assert not any(o["tokens_per_s"] > s["tokens_per_s"] and o["peak_memory_gb"] < s["peak_memory_gb"]
                           for o in met)


@pytest.mark.parametrize("args, message", [
    (["--slo", "p99-tpot=fast"], "cannot parse SLO term 'p99-tpot=fast'"),
    (["--slo", ""], "argument --slo: '': is empty"),
    (["--slo", "p99-tpot=1s", "--system", ""], "'' names no design"),
    (["--system", ""], "'' names no design"),
    (["--slo", "p99-tpot=1s", "--search", "warp"], "unknown knob 'warp'"),
    (["--slo", "p99-tpot=1s", "--host", "dgx-9"], "unknown host 'dgx-9'"),
    (["--slo", "p99-tpot=1s", "--host", "paper", "--fetching", "9"], "within 1..8"),
    (["--slo", "p99-tpot=1s", "--target-rate", "-1"], "argument --target-rate: '-1': must be above 0"),
    (["--slo", "p99-tpot=1s", "--output", "exp:x"], "cannot parse output"),
    (["--plot", "x.png"], "--plot needs --slo"),
])
def test_plan_slo_errors(args, message, tmp_path):
    r = ddbench("plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k", *args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr
    assert os.listdir(tmp_path) == []


def test_plan_csv_memory_answer_matches_json():
    import csv
    import io
    a = ddbench("plan", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--context", "128k", "--csv")
    b = ddbench("plan", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--context", "128k", "--json")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    rows = list(csv.DictReader(io.StringIO(a.stdout)))
    js = json.loads(b.stdout)["systems"]
    assert [r["system"] for r in rows] == [s["system"] for s in js]
    for r, s in zip(rows, js):
        assert int(r["max_batch"]) == s["max_batch"] and int(r["total_bytes"]) == s["bytes"]["total"]


def test_plan_slo_where_no_design_fits_is_exit_3():
    """Weights larger than the GPU at --tp 1 (without --tp it would shard them, --tp auto): every row's status is
    "no fit", the verdict says so, exit 3."""
    r = ddbench("plan", "--model", "llama-3-70b", "--gpu", "l40s", "--context", "32k", "--slo", "p99-tpot=1s",
                "--requests", "20", "--workers", "1", "--json", "--tp", "1", "--prefill", "here")
    assert r.returncode == 3, r.stderr
    out = json.loads(r.stdout)
    assert {d["status"] for d in out["designs"]} == {"no fit"} and "none fits one request" in out["verdict"]


def test_one_fetching_gpu_is_singular():
    """'1 GPU of ... fetching at once', '8 GPUs of ...' (issue 30: plurals are right)."""
    from ddbench.core.catalog.hosts import fetch_share, get_host
    host = get_host("paper-testbed")
    assert fetch_share(host, 1).describe().startswith("1 GPU of paper-testbed fetching at once")
    assert fetch_share(host, 8).describe().startswith("8 GPUs of paper-testbed fetching at once")
