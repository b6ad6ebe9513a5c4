"""The ablation's figure and table (ddbench/experiments/ablation_figure.py, ddbench/doctables/ablation.py):
the committed runs give every design at every point once, 3 builds each; a run that lost a design or
holds two batches of one is a one-line error naming it."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from ddbench.core.errors import DDBenchError
from ddbench.core.paths import ENV, traces_dir
from ddbench.experiments import ablation_figure as A


def test_every_design_at_every_point_from_three_builds():
    df = A.engine_points()
    assert len(df) == len(A.POINTS) * len(A.DESIGNS)
    assert (df.builds == 3).all() and (df.tok_s_min <= df.tok_s).all() and (df.tok_s <= df.tok_s_max).all()
    gain = A.prediction_gain(df)
    assert ((gain.lo <= gain.gain) & (gain.gain <= gain.hi)).all()
    cache = df[df.design.str.endswith("-cache")]
    assert (cache.cache_tokens == A.CACHE_TOKENS).all()
    assert (df[df.design == "lru-cache"].forced_prefetched == 0).all()     # it prefetches nothing


def _copy(tmp_path, monkeypatch):
    root = tmp_path / "data"
    shutil.copytree(traces_dir(), root)
    monkeypatch.setenv(ENV, str(root))
    return root


def test_a_missing_design_is_one_line(tmp_path, monkeypatch):
    root = _copy(tmp_path, monkeypatch)
    path = root / "engine" / "h200-ablation" / "engine.csv"
    e = pd.read_csv(path)
    e[e.design != "lru-cache"].to_csv(path, index=False)
    with pytest.raises(DDBenchError, match="no engine rows for lru-cache llama-3-8b 32K") as info:
        A.engine_points()
    assert "\n" not in str(info.value)


def test_two_batches_of_one_design_are_refused(tmp_path, monkeypatch):
    root = _copy(tmp_path, monkeypatch)
    path = root / "engine" / "h200-ablation" / "engine.csv"
    e = pd.read_csv(path)
    first = e.index[(e.design == "lru-cache") & (e.context == 131072)][0]
    e.loc[first, "batch"] = 59
    e.to_csv(path, index=False)
    with pytest.raises(DDBenchError, match="lru-cache at llama-3-8b 128K ran at batches"):
        A.engine_points()
