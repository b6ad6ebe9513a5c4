"""The context trend of the cache rates (ddbench/profile/contexts.py) and its use by the planner's and
simulator's rates (ddbench.core.rates.trend_rates): synthetic one-prompt runs with a known law."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ddbench.core.rates import load_trend, trend_rates
from ddbench.core.errors import DDBenchError
from ddbench.profile import contexts

LAYERS = 12
CONTEXTS = (1024, 2048, 4096, 8192)
MODEL = "Toy-Model"


def _law(ctx, layer, cap, curved=False):
    """The synthetic urgent rate: x0.8 per doubling of the context, deeper layers higher, smaller with a
    larger cache; optionally curved (a log-context squared term in the exponent)."""
    x = math.log2(ctx / 1024)
    u = (0.2 + 0.2 * layer / LAYERS) / (1 + cap) * 0.8 ** x
    return u * (math.exp(0.12 * x * x) if curved else 1.0)


def _write_run(folder: Path, ctx: int, seed: int, rng, curved=False):
    folder.mkdir(parents=True)
    cache = ["layer,context_tokens,task,budget_tokens,chunk_tokens,policy,capacity,coverage,prefetched_per_budget,"
             "urgent_per_budget,moved_per_budget,urgent_share,n,model,git_sha,date,command"]
    pred = ["layer,context_tokens,task,init,temperature,top_p,budget_tokens,chunk_tokens,local_tokens,hit_rate,"
            "reuse_hit_rate,union_hit_rate,new_pred_share,token_acc,n,model,layers,model_sha256,"
            "transformers_version,torch_version,git_sha,date,command"]
    for budget in (ctx // 64, ctx // 16):
        for layer in range(LAYERS):
            pred.append(f"{layer},{ctx},single,t2,0.6,1.0,{budget},8,32,{0.8 + rng.uniform(-.02, .02):.6f},"
                        f"{0.6 + rng.uniform(-.02, .02):.6f},0.9,0.2,0.5,40,{MODEL},{LAYERS},x,5,2,g,d,c")
            for policy in ("lru", "score"):
                for cap in (0, 1, 2, 4):
                    u = min(max(_law(ctx, layer, cap, curved) + rng.gauss(0, 0.01), 0.0), 1.0)
                    p = 1.0 if cap == 0 else 0.1 + rng.uniform(0, 0.01)
                    cache.append(f"{layer},{ctx},single,{budget},8,{policy},{cap},{1 - u:.6f},{p:.6f},{u:.6f},"
                                 f"{p + u:.6f},{u / (p + u):.6f},40,{MODEL},g,d,c")
    (folder / f"{MODEL}.cache.csv").write_text("\n".join(cache) + "\n")
    (folder / f"{MODEL}.csv").write_text("\n".join(pred) + "\n")
    (folder / ".ddbench-manifest.json").write_text("{}")


def _root(tmp_path, prompts=6, curved=False):
    rng = random.Random(7)
    root = tmp_path / "runs"
    for ctx in CONTEXTS:
        for s in range(prompts):
            _write_run(root / str(ctx) / f"single-s{s}", ctx, s, rng, curved)
    return root


def _fits(root):
    cache, pred, model, layers = contexts.load_prompts(str(root))
    return cache, pred, model, layers, contexts.trends(cache)


def test_trend_recovers_the_law_and_passes_its_checks(tmp_path):
    cache, pred, model, layers, fits = _fits(_root(tmp_path))
    assert (model, layers) == (MODEL, LAYERS)
    f = next(f for f in fits if f["share"] == "1/64" and f["policy"] == "lru" and f["capacity"] == 2.0
             and f["band"] == "all" and f["metric"] == "urgent_per_budget")
    assert f["per_doubling"] == pytest.approx(0.8, abs=0.03)
    assert f["supported"] is True and f["curvature_p"] >= 0.05
    assert f["holdout"]["low"] <= f["holdout"]["measured"] <= f["holdout"]["high"]
    y, lo, hi = contexts.predict(f, 131072)                       # extrapolated 16x: positive, with its interval
    truth = sum(_law(131072, l, 2) for l in range(LAYERS)) / LAYERS
    assert 0 < lo < y < hi and lo < truth < hi


def test_curved_rates_are_not_supported(tmp_path):
    *_, fits = _fits(_root(tmp_path, curved=True))
    f = next(f for f in fits if f["share"] == "1/64" and f["policy"] == "lru" and f["capacity"] == 2.0
             and f["band"] == "all" and f["metric"] == "urgent_per_budget")
    assert f["supported"] is False
    assert f["curvature_p"] < 0.05


def test_cells_give_intervals_over_prompts(tmp_path):
    cache, pred, *_ = _fits(_root(tmp_path))
    rows = contexts.cells(cache, pred)
    r = next(r for r in rows if r["context_tokens"] == 4096 and r["policy"] == "lru" and r["capacity"] == 2.0
             and r["band"] == "all" and r["metric"] == "urgent_per_budget" and r["budget_tokens"] == 64)
    assert r["prompts"] == 6 and r["low"] < r["mean"] < r["high"]
    assert r["mean"] == pytest.approx(sum(_law(4096, l, 2) for l in range(LAYERS)) / LAYERS, abs=0.01)
    assert any(r["policy"] == "prediction" and r["metric"] == "hit_rate" for r in rows)


def test_command_writes_both_files_and_the_rates_follow_the_trend(tmp_path):
    root = _root(tmp_path)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "ddbench.profile.contexts", str(root), "--out", str(out)],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    trend = out / f"{MODEL}.cache-trend.json"
    doc = json.loads(trend.read_text())
    assert doc["prompts_per_context"] == {str(c): 6 for c in CONTEXTS}
    import pandas as pd
    assert len(pd.read_csv(out / f"{MODEL}.contexts.csv"))
    inside = trend_rates(str(trend), "dualdecoder-cache", "cache", 32, 4096, 64, 128)   # share 1/64, 2x, measured
    far = trend_rates(str(trend), "dualdecoder-cache", "cache", 32, 131072, 2048, 4096)  # 128K: extrapolated 16x
    assert inside.extrapolation == 1.0 and "inside" in inside.line()
    assert far.extrapolation == 16.0 and max(far.measured) == 8192 and "extrapolated 16x" in far.line()
    assert "passed its checks (no curvature, the longest context held out) in" in far.detail
    urgent_in, urgent_far = inside.get("urgent"), far.get("urgent")
    mean = urgent_in.mean()
    assert mean == pytest.approx(sum(_law(4096, l, 2) for l in range(LAYERS)) / LAYERS, abs=0.02)
    assert urgent_in.mean("low") <= mean <= urgent_in.mean("high")
    assert urgent_far.mean() < mean                                           # the law falls with context
    deep, shallow = urgent_far.centre[-1], urgent_far.centre[0]
    assert deep >= shallow                                                    # per depth band, by relative depth


def test_trend_refuses_a_malformed_file_and_a_capacity_outside(tmp_path):
    bad = tmp_path / "x.cache-trend.json"
    bad.write_text('{"fits": [{"a": 1}], "bands": 6, "ref_context": 1024}')
    with pytest.raises(DDBenchError, match="malformed cache trend"):
        load_trend(str(bad))
    bad.write_bytes(b"\x00\xff")
    with pytest.raises(DDBenchError, match="cache trend"):
        load_trend(str(bad))
    root = _root(tmp_path, prompts=3)
    out = tmp_path / "o"
    subprocess.run([sys.executable, "-m", "ddbench.profile.contexts", str(root), "--out", str(out)], check=True,
                   capture_output=True, cwd=tmp_path)
    with pytest.raises(DDBenchError, match="outside the profiled"):
        trend_rates(str(out / f"{MODEL}.cache-trend.json"), "dualdecoder-cache", "cache", 4, 4096, 64, 64 * 16)


def test_an_empty_root_is_one_line_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ddbench.profile.contexts", str(tmp_path)], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no finished profile runs" in r.stderr


def test_a_bad_layer_cell_in_a_cache_profile_is_refused(tmp_path):
    root = _root(tmp_path, prompts=2)
    f = root / "1024" / "single-s0" / f"{MODEL}.cache.csv"
    lines = f.read_text().splitlines()
    lines[3] = "x" + lines[3][1:]
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(DDBenchError, match=r"line 4, field layer"):
        contexts.load_prompts(str(root))


def test_gemma3_global_layers_from_layer_types():
    from ddbench.profile.loadmodel import global_layers
    types = (["sliding_attention"] * 5 + ["full_attention"]) * 3
    cfg = SimpleNamespace(num_hidden_layers=18, layer_types=types, sliding_window=512)
    assert global_layers(cfg) == ((5, 11, 17), 512)
    assert global_layers(SimpleNamespace(num_hidden_layers=4)) == ((0, 1, 2, 3), None)
    assert global_layers(SimpleNamespace(num_hidden_layers=2, layer_types=["full_attention"] * 2)) == ((0, 1), None)
