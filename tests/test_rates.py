"""The one rate set (ddbench.core.rates, ddbench.core.ratefile): every design's rates matched from one profile
with intervals, the user's own rates (--rates FILE, --rate), the ranking priced at the intervals' ends, and every
bad rates file as one line, exit 2 (issue 44)."""

import json
import os

import pytest

from ddbench.core.designs import DESIGNS
from ddbench.core.errors import DDBenchError
from ddbench.core.ratefile import load_source, parse_override
from ddbench.core.rates import rate_set
from tests.cli import ddbench
from tests.cli import in_process as _main

MAIN = ("shadowkv", "dualdecoder", "specache", "dualdecoder-cache", "lru-cache")
SMOL = "SmolLM2-135M-Instruct.Q4_1"
# a regime where decode, not prefill, sets the ranking (the lead of the cache turns on its churn)
FLIP = ["plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k", "--output", "1024",
        "--design", "shadowkv,dualdecoder-cache", "--slo", "p99-tpot=100ms", "--requests", "100", "--workers", "1",
        "--json"]



def _rates_file(path, cache_churn, extra=""):
    path.write_text("source: what-if\nrates:\n  shadowkv: {miss: 0.3}\n"
                    f"  dualdecoder-cache: {{urgent: 0.01, churn: {cache_churn}}}\n{extra}")
    return str(path)


def test_one_matched_set_prices_every_design_with_intervals():
    rs = rate_set("llama-3-8b", 32, 131072, 2048, 4096, tuple(DESIGNS))
    assert rs.sources() == [SMOL]                 # one profile for every design
    for name in MAIN:
        dr = rs.of(name)
        assert dr.matched and max(dr.measured) == 8128 and dr.extrapolation == pytest.approx(131072 / 8128)
        for r in dr.rates:
            assert r.has_interval and r.mean("low") < r.mean() < r.mean("high") <= 1.0
        assert "SmolLM2-135M, measured 1K-7.94K, extrapolated 16.1x" in dr.line()
    assert rs.of("full-kv").family is None and rs.of("dualdecoder-fifo").get("miss") == rs.of("dualdecoder").get("miss")
    # not the constant 0.88 of the old default: ShadowKV's misses are the profile's, and larger than 12 %
    assert rs.of("shadowkv").get("miss").mean() > 0.2


def test_trend_matches_the_measured_contexts_it_was_fitted_on():
    """At a measured context (4K, share 1/64, capacity 2x) every design's interval holds the profile's own mean:
    ShadowKV's miss is 1 - reuse, DualDecoder's 1 - hit, the cache's urgent share and churn (its prefetched)."""
    rs = rate_set(SMOL, 30, 4096, 64, 128, tuple(DESIGNS))
    import csv
    rows = list(csv.DictReader(open(os.path.join("traces", "accuracy", f"{SMOL}.contexts.csv"))))

    def mean(metric, prediction="", capacity=""):
        (r,) = [r for r in rows if r["context_tokens"] == "4096" and r["budget_tokens"] == "64" and r["band"] == "all"
                and r["metric"] == metric and r["prediction"] == prediction and r["policy"] in ("lru", "prediction")
                and (capacity == "" or r["capacity"] == capacity)]
        return float(r["mean"])
    want = {("shadowkv", "miss"): 1 - mean("reuse_hit_rate"), ("dualdecoder", "miss"): 1 - mean("hit_rate"),
            ("dualdecoder-cache", "urgent"): mean("urgent_per_budget", "speculative", "2.0"),
            ("dualdecoder-cache", "churn"): mean("prefetched_per_budget", "speculative", "2.0")}
    for (d, m), v in want.items():
        r = rs.of(d).get(m)
        assert r.mean("low") <= v <= r.mean("high"), (d, m, v, r.text())
    assert rs.of("shadowkv").extrapolation == 1.0 and "inside" in rs.of("shadowkv").line()


def test_a_profile_of_global_layers_only_prices_another_models_layers():
    """Gemma 3 profiles only its 3 global layers (bands 1, 3 and 5 of 6): each of Llama-3-8B's 32 layers takes the
    nearest measured band by relative depth (an all-global profile maps as before), and the plan runs on it."""
    from ddbench.core.rates import band_of_layers, trend_cell
    assert band_of_layers(6, list(range(6)), 32) == [min(5, int((j + 0.5) * 6 / 32)) for j in range(32)]
    assert band_of_layers(6, [1, 3, 5], 6) == [1, 1, 1, 3, 3, 5]     # a tie goes to the shallower
    gemma = os.path.join("traces", "accuracy", "gemma-3-270m-q4_k_m.cache-trend.json")
    centre, low, high = trend_cell(gemma, "speculative", 4.0, "urgent_per_budget", 1 / 64, 131072, 32)
    assert len(centre) == 32 and all(lo <= c <= hi for c, lo, hi in zip(centre, low, high))
    assert len(set(centre)) == 3                              # three measured bands, each its own law
    assert ddbench("plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "128k", "--design",
                   "dualdecoder-cache", "--cache-tokens", "8192", "--rates", gemma).returncode == 0


def test_a_trend_missing_cells_is_not_picked(tmp_path):
    """A trend without a family's cells cannot price it: that design is unmatched (never silently another
    source). Gemma 3's trend prices every design, but measured only the depth bands of its global layers: the
    matched set is SmolLM2's (every band), although Gemma's reaches further; with Gemma alone, Gemma's."""
    import shutil
    gemma = os.path.join("traces", "accuracy", "gemma-3-270m-q4_k_m.cache-trend.json")
    assert rate_set("llama-3-8b", 32, 131072, 2048, 4096, tuple(DESIGNS)).sources() == [SMOL]
    shutil.copy(gemma, tmp_path)
    alone = rate_set("llama-3-8b", 32, 131072, 2048, 4096, tuple(DESIGNS), root=str(tmp_path))
    assert alone.of("shadowkv").matched and alone.of("shadowkv").source == "gemma-3-270m-q4_k_m"
    doc = json.load(open(gemma))
    doc["fits"] = [f for f in doc["fits"] if f.get("prediction") != "none"]     # no cells without prediction
    (tmp_path / "cut").mkdir()                                                  # a new path: trends are cached by path
    (tmp_path / "cut" / "gemma-3-270m-q4_k_m.cache-trend.json").write_text(json.dumps(doc))
    alone = rate_set("llama-3-8b", 32, 131072, 2048, 4096, tuple(DESIGNS), root=str(tmp_path / "cut"))
    assert not alone.of("shadowkv").matched and "no" in alone.of("shadowkv").detail


def test_rates_file_and_overrides_replace_the_profile(tmp_path):
    src = load_source(_rates_file(tmp_path / "r.yaml", "{value: 0.1, low: 0.05, high: 0.2}"))
    rs = rate_set("llama-3-8b", 32, 131072, 2048, 4096, tuple(DESIGNS), src, (("shadowkv", "miss", 0.5),))
    cache = rs.of("dualdecoder-cache").get("churn")
    assert (cache.mean("low"), cache.mean(), cache.mean("high")) == pytest.approx((0.05, 0.1, 0.2))
    assert rs.of("shadowkv").get("miss").mean() == 0.5 and rs.of("shadowkv").source.startswith("--rate")
    assert rs.of("dualdecoder").source == SMOL           # not in the file: the matched profile, and it says so
    assert parse_override("dualdecoder-cache.churn=0.2") == ("dualdecoder-cache", "churn", 0.2)


def test_a_profile_output_folder_is_a_rates_source(tmp_path):
    import shutil
    shutil.copy(os.path.join("traces", "accuracy", f"{SMOL}.cache.csv"), tmp_path)   # one run: its replay
    src = load_source(str(tmp_path))
    assert src.kind == "replay"
    rs = rate_set("llama-3-8b", 32, 131072, 2048, 4096, tuple(DESIGNS), src)
    dr = rs.of("dualdecoder-cache")
    assert dr.matched and dr.measured == (4096,) and not dr.get("urgent").has_interval and dr.source == SMOL
    assert rs.of("shadowkv").get("miss").has_interval     # that old run has no replay without prediction: the trend
    shutil.copy(os.path.join("traces", "accuracy", f"{SMOL}.cache-trend.json"), tmp_path)
    assert load_source(str(tmp_path)).kind == "trend"


BAD = {
    "missing field": ("rates:\n  dualdecoder-cache: {urgent: 0.01}\n", "rates.dualdecoder-cache.churn: missing"),
    "non-finite": ("rates:\n  shadowkv: {miss: .nan}\n", "rates.shadowkv.miss: not finite"),
    "out of range": ("rates:\n  shadowkv: {miss: 1.5}\n", "must be within 0..1"),
    "wrong design": ("rates:\n  shadowkvv: {miss: 0.1}\n", "rates.shadowkvv"),
    "wrong metric": ("rates:\n  shadowkv: {churn: 0.1}\n", "rates.shadowkv.churn: not a rate of shadowkv"),
    "no rates": ("source: x\n", "rates: missing"),
    "interval": ("rates:\n  shadowkv: {miss: {value: 0.3, low: 0.4}}\n", "low 0.4 <= value 0.3"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_rates_file_is_one_line_exit_2(case, tmp_path, capsys):
    text, contains = BAD[case]
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    for argv in (["plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k", "--design", "shadowkv"],
                 ["simulate", "--model", "llama-3-8b", "--gpu", "h200", "--requests", "2",
                  "--out", str(tmp_path / "o")]):
        rc, out, err = _main(argv + ["--rates", str(f)], capsys)
        lines = [x for x in err.splitlines() if x.strip()]
        assert rc == 2 and out == "" and len(lines) == 1 and contains in lines[0] and str(f) in lines[0], err
    spec = tmp_path / "s.yaml"
    spec.write_text("requests: 5\ngrid:\n  model: llama-3-8b\n  gpu: h200\n  design: shadowkv\n  context: 32k\n"
                    "  rate: 1\n")
    rc, out, err = _main(["sweep", str(spec), "--rates", str(f), "--out", str(tmp_path / "sw")], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and contains in err, err
    assert not (tmp_path / "o").exists() and not (tmp_path / "sw").exists()


@pytest.mark.parametrize("text,contains", [("shadowkv.miss=2", "within 0..1"), ("shadowkv.churn=0.1", "not a rate"),
                                           ("nodesign.miss=0.1", "nodesign"), ("shadowkv=0.1", "design.metric"),
                                           ("shadowkv.miss=nan", "not finite")])
def test_bad_rate_override_is_one_line(text, contains, capsys):
    rc, out, err = _main(["plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k", "--rate", text],
                         capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and contains in err, err


def test_rates_beside_the_spec_or_config_never_from_the_cwd(tmp_path, monkeypatch, capsys):
    """A spec's (or config's) rates: path resolves beside it; one that exists only from the current folder is an
    error naming it."""
    here, there = tmp_path / "cwd", tmp_path / "specs"
    here.mkdir()
    there.mkdir()
    _rates_file(here / "r.yaml", 0.05)
    monkeypatch.chdir(here)
    spec = there / "s.yaml"
    spec.write_text("name: t\nrequests: 5\nrates: r.yaml\ngrid:\n  model: llama-3-8b\n  gpu: h200\n"
                    "  design: shadowkv\n  context: 32k\n  output: 8\n  rate: 1\n")
    rc, out, err = _main(["sweep", str(spec), "--out", str(tmp_path / "sw"), "--quiet"], capsys)
    assert rc == 2 and "exists from the current folder" in err and str(spec) in err and len(err.splitlines()) == 1
    cfg = there / "c.yaml"
    cfg.write_text("model: llama-3-8b\ngpu: h200\ncontext: 32k\nrates: r.yaml\n")
    rc, out, err = _main(["plan", "--config", str(cfg)], capsys)
    assert rc == 2 and "exists from the current folder" in err and len(err.strip().splitlines()) == 1
    _rates_file(there / "r.yaml", 0.05)            # beside them: both run on it
    rc, out, err = _main(["plan", "--config", str(cfg), "--design", "shadowkv"], capsys)
    assert rc == 0 and "shadowkv: miss 0.300; what-if" in out, err
    rc, out, err = _main(["sweep", str(spec), "--out", str(tmp_path / "sw"), "--quiet"], capsys)
    assert rc == 0, err
    import pandas as pd
    row = pd.read_csv(tmp_path / "sw" / "results.csv").iloc[0]
    assert row["rates"] == "shadowkv: miss 0.300; what-if"       # the rates the point ran at, no interval:
    assert row["tokens_per_s_worst_rates"] == row["tokens_per_s_best_rates"] == row["tokens_per_s"]
    (there / "r.yaml").write_text((there / "r.yaml").read_text().replace("0.3", "0.4"))
    rc, out, err = _main(["sweep", str(spec), "--out", str(tmp_path / "sw"), "--quiet"], capsys)
    assert rc == 0 and "(1 run, 0 reused" in out, out     # an edited rates file is run again, not resumed


def _after_inputs(lines) -> int:
    """The index of the first line after plan's inputs line (`... GB = 1e9 bytes`) and its notes (KV fp8, chunk cache),
    within the first 8 lines: where the rates block starts."""
    i = next(k for k, x in enumerate(lines[:8]) if x.endswith("GB = 1e9 bytes")) + 1
    while lines[i].startswith(("KV fp8", "chunk cache")):
        i += 1
    return i


def test_plan_prints_each_designs_rates_at_one_matched_set(capsys):
    rc, out, err = _main(["plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "128k", "--design", "all"],
                         capsys)
    assert rc == 0, err
    lines = out.splitlines()          # the answer, its warning, the inputs line and its notes, then the rates
    assert lines[_after_inputs(lines)] == f"rates (95 % interval), one matched set: {SMOL}:", out
    for d in ("shadowkv", "specache", "dualdecoder", "dualdecoder-cache"):
        (ln,) = [x for x in lines if x.startswith(f"  {d}: ")]
        assert ln.endswith("SmolLM2-135M, measured 1K-8K, extrapolated 16x") and "[" in ln and len(ln) <= 120


def test_ranking_flips_when_the_rates_file_moves_the_cache_churn(tmp_path, capsys):
    """Below the cache's break-even (churn 0.02) it ranks first; above it (0.9) ShadowKV does; both decided."""
    ranks = {}
    for churn in (0.02, 0.9):
        rc, out, err = _main(FLIP + ["--rates", _rates_file(tmp_path / f"r{churn}.yaml", churn)], capsys)
        assert rc == 0, err
        doc = json.loads(out)
        ranks[churn] = {d["system"]: d["rank"] for d in doc["designs"]}
        assert all(not d["undecided_with"] for d in doc["designs"])
        assert doc["rates"]["sources"] == ["what-if"]
    assert ranks[0.02] == {"dualdecoder-cache": 1, "shadowkv": 2}
    assert ranks[0.9] == {"shadowkv": 1, "dualdecoder-cache": 2}


def test_ranking_inside_the_interval_is_undecided_never_a_winner(tmp_path):
    f = _rates_file(tmp_path / "wide.yaml", "{value: 0.15, low: 0.02, high: 0.9}")
    r = ddbench(*[a for a in FLIP if a != "--json"], "--rates", f, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "undecided at these rates: dualdecoder-cache, shadowkv" in out and "winner at these rates" not in out
    assert "break-even: dualdecoder-cache's rates scaled" in out
    (iv,) = [x for x in out.splitlines() if x.startswith("  =1. dualdecoder-cache ")]   # the ranking's own row
    lo, hi = iv.split("[")[1].split("]")[0].split(", ")
    assert float(lo) < float(hi)


def test_no_profile_is_said_in_the_first_lines(tmp_path):
    (tmp_path / "accuracy").mkdir()
    r = ddbench("plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "128k", "--design", "all",
                cwd=tmp_path, env={"DDBENCH_DATA": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    first = lines[_after_inputs(lines)]    # after the answer, its warning, the inputs line and its notes
    assert first.startswith("NO PROFILE MATCHES shadowkv, specache, dualdecoder, dualdecoder-cache")
    assert "  shadowkv: constant hit rate 0.88, not measured" in r.stdout


def test_simulate_prices_its_throughput_at_the_interval_ends(tmp_path, capsys):
    rc, out, err = _main(["simulate", "--model", "llama-3-8b", "--gpu", "h200", "--design", "dualdecoder-cache",
                          "--context", "32k", "--requests", "20", "--rate", "2", "--rate", "dualdecoder-cache.urgent=0.5",
                          "--out", str(tmp_path / "s")], capsys)
    assert rc == 0, err
    s = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert s["rate"] == 2.0 and "urgent 0.500" in out
    lo, hi = s["tokens_per_s_interval"]        # churn keeps its interval; the urgent share is the what-if
    assert lo <= s["tokens_per_s"] <= hi


def test_bad_rates_text_raises_ddbencherror(tmp_path):
    with pytest.raises(DDBenchError, match="not a `ddbench profile` output folder"):
        load_source(str(tmp_path))


def test_engine_point_runs_at_the_matched_rates_unless_forced():
    """The engine's --point takes each design's rates from the rate set (not a forced 12 % / 17.4 % miss), and its
    row records the line of the rates it ran at; --miss still forces one."""
    from dataclasses import replace as dc_replace

    from ddbench.kernels.engine.options import SweepOptions, check_args, check_point
    from ddbench.kernels.engine.runner import pt_rates_note
    a = check_args(SweepOptions(model="llama-3-8b", point="shadowkv:131072:8"))
    rs = rate_set("llama-3-8b", 32, 131072, 2048, 4096, tuple(DESIGNS))
    for d in ("shadowkv", "dualdecoder"):
        cfg = check_point(a.model_spec, d, 131072, 8, a)
        assert cfg.miss_rate == round(rs.of(d).get("miss").mean(), 4)
        assert pt_rates_note(a.model_spec, d, 131072, cfg, a) == rs.of(d).line()
    cfg = check_point(a.model_spec, "dualdecoder-cache", 131072, 8, a)
    assert (cfg.miss_rate, cfg.churn_rate) == (round(rs.of("dualdecoder-cache").get("urgent").mean(), 4),
                                               round(rs.of("dualdecoder-cache").get("churn").mean(), 4))
    forced = check_args(dc_replace(SweepOptions(model="llama-3-8b", point="shadowkv:131072:8"), miss=0.12))
    assert check_point(forced.model_spec, "shadowkv", 131072, 8, forced).miss_rate == 0.12
