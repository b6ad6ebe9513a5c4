"""The ablation's figure and table (ddbench/experiments/ablation_figure.py, ddbench/doctables/ablation.py) and
the engine points they share with the cache figure (ddbench/experiments/rate_grid.py): every design at every
point simulated at one matched rate set; the engine's diamonds only from the one matched-rate run, at the grid
points around the matched rates; a run that holds two batches of one design is a one-line error naming it."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from ddbench.core.errors import DDBenchError
from ddbench.core.paths import ENV, traces_dir
from ddbench.experiments import ablation_figure as A
from ddbench.experiments import rate_grid as G


def test_every_design_at_every_point_simulated_and_the_engine_only_from_one_run():
    df = A.points()
    assert len(df) == len(A.POINTS) * len(A.DESIGNS)
    assert (df.sim_tok_s_matched > 0).all() and (df.batch > 0).all()
    eng = df.dropna(subset=["engine_lower_tok_s"])
    # the matched-rate run: the cache at every Llama-3-8B context, ShadowKV and DualDecoder at 128K; no lru-cache
    assert sorted(zip(eng.design, eng.context)) == sorted(
        [("dualdecoder-cache", c) for c in (32768, 65536, 131072)] + [("dualdecoder", 131072), ("shadowkv", 131072)])
    assert (eng.model == G.MODEL).all() and (eng.engine_builds >= 2).all()
    gain = A.prediction_gain(df)
    assert len(gain) == len(A.POINTS) and (gain.gain > 0).all()


@pytest.mark.parametrize("design,context", [("dualdecoder-cache", 131072), ("dualdecoder-cache", 32768),
                                            ("shadowkv", 131072), ("dualdecoder", 131072)])
def test_the_engine_points_bracket_the_matched_rates(design, context):
    low, high = G.engine_at_matched(design, context)
    want = G.matched_rates(design, context)
    e = G.grid_rows()
    e = e[(e.design == design) & (e.context == context)]
    grid = sorted(set(e.forced_urgent_or_miss.astype(float)))
    x = want.get("urgent", want.get("miss"))
    key = "forced_urgent" if "urgent" in want else "forced_miss"
    assert low[key] <= high[key]
    assert low[key] <= x or low[key] == grid[0]          # at or below the centre, else the grid's lowest
    assert high[key] >= x or high[key] == grid[-1]
    assert low["tok_s_min"] <= low["tok_s"] <= low["tok_s_max"] and low["batch"] == high["batch"]
    assert low["tok_s"] >= high["tok_s"] * 0.99          # fewer chunks moved: no slower


def test_a_design_the_run_lacks_has_no_engine_point():
    assert G.engine_at_matched("lru-cache", 131072) == []
    assert G.engine_at_matched("shadowkv", 32768) == []


def test_two_batches_of_one_design_are_refused(tmp_path, monkeypatch):
    root = tmp_path / "data"
    shutil.copytree(traces_dir(), root)
    monkeypatch.setenv(ENV, str(root))
    G.grid_rows.cache_clear()
    try:
        path = root / "engine" / G.RUN / "engine.csv"
        e = pd.read_csv(path)
        first = e.index[(e.design == "shadowkv") & (e.context == 131072) & (e.forced_urgent_or_miss == 0.25)][0]
        e.loc[first, "batch"] = 45
        e.to_csv(path, index=False)
        with pytest.raises(DDBenchError, match="shadowkv at 131072 ran at batches") as info:
            G.engine_at_matched("shadowkv", 131072)
        assert "\n" not in str(info.value)
    finally:
        G.grid_rows.cache_clear()
