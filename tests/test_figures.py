"""`ddbench figures`: every figure's files, every paper number compared, the index table."""

import os

import pandas as pd
import pytest

from ddbench.commands.figures import run
from ddbench.core.errors import DDBenchError
from ddbench.experiments import load_all
from ddbench.core.paper_numbers import load_reported, reported


def Args(out, only=None, force=False):
    """The figures command's namespace, as the CLI parses it (so every flag has its default)."""
    from ddbench.cli import build_parser
    return build_parser().parse_args(["figures", "--out", out, "--quiet"] + (["--only", only] if only else [])
                                     + (["--force"] if force else []))


@pytest.fixture(scope="module")
def figures_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("figs")
    assert run(Args(str(out))) == 0
    return out


def test_every_figure_written(figures_dir):
    for exp in load_all():
        for ext in ("png", "pdf"):
            path = figures_dir / f"{exp}.{ext}"
            assert path.stat().st_size > 5000, path
        assert len(pd.read_csv(figures_dir / f"{exp}.csv")) >= 3
    assert not [f for f in os.listdir(figures_dir) if f.startswith(".tmp-")]


def test_issue_figures_present():
    assert {"fig02", "fig04", "fig05", "fig14", "fig15"} <= set(load_all())


def test_every_paper_number_has_a_row(figures_dir):
    """The table covers every number in reported.json, replayed or not; the replayed ones are
    exactly those a figure compares."""
    text = (figures_dir / "README.md").read_text()
    for rep in reported().values():
        assert rep.quote.replace("|", "/").replace("\t", " ") in text, rep.id
        if not rep.replayed:
            assert rep.reason.replace("|", "/") in text, rep.id
    comparisons = [c.paper_id for e in load_all().values() for c in e.compute().comparisons]
    assert set(comparisons) == {k for k, r in reported().items() if r.replayed}
    n_rows = sum(1 for line in text.splitlines() if line.startswith("| ") and ' | "' in line)
    # one row per comparison (fig18's numbers are replayed twice: simulator and engine), one per other number
    assert n_rows == len(comparisons) + sum(not r.replayed for r in reported().values())


def test_fig02_csv_matches_memory_model(figures_dir):
    df = pd.read_csv(figures_dir / "fig02.csv")
    row = df[(df.system == "shadowkv") & (df.model_size == "8B")].iloc[0]
    assert row.max_batch == 23 and row.paper_max_batch == 24


def test_fig15_dualdecoder_grows_by_landmarks_only(figures_dir):
    df = pd.read_csv(figures_dir / "fig15.csv")
    dd = df[df.system == "dualdecoder"].set_index("context")
    growth = dd.total_gb.iloc[-1] - dd.total_gb.iloc[0]
    assert growth == pytest.approx(448 * 1024 * 8192 / 1e9, rel=0.02)     # chunk-mean keys: 8,192 B a token
    full = df[df.system == "full-kv"].set_index("context")
    assert not full.fits.iloc[-1] and full.fits.iloc[0]


GOOD = {"id": "x", "figure": "2", "value": 4, "unit": "requests", "quote": "only 4", "status": "replayed"}


@pytest.mark.parametrize("change, message", [
    ({"value": "four"}, r"entry 0 \(x\) is malformed \(value must be a finite number"),
    ({"value": float("nan")}, "value must be a finite number"),
    ({"value": True}, "value must be a finite number"),
    ({"status": "done"}, "status 'done'; expected one of replayed"),
    ({"status": "not replayable"}, "needs a reason"),
    ({"status": "inconsistent", "reason": " "}, "reason must be a non-empty string"),
    ({"quote": ""}, "quote must be a non-empty string"),
    ({"source": "x"}, r"unknown field\(s\) source"),
    ({"status": None}, "status must be a non-empty string"),
])
def test_malformed_reported_entry(tmp_path, change, message):
    import json
    bad = tmp_path / "reported.json"
    bad.write_text(json.dumps({"schema": 2, "numbers": [dict(GOOD, **change)]}))
    with pytest.raises(DDBenchError, match=message) as err:
        load_reported(str(bad))
    assert "\n" not in str(err.value)


def test_malformed_reported_file(tmp_path):
    bad = tmp_path / "reported.json"
    bad.write_text('{"schema": 1, "numbers": []}')
    with pytest.raises(DDBenchError, match="expected schema 2, got 1"):
        load_reported(str(bad))
    bad.write_text('{"schema": 2, "numbers": [{"id": "x"}]}')
    with pytest.raises(DDBenchError, match=r"entry 0 \(x\) is malformed \(missing figure, value"):
        load_reported(str(bad))
    bad.write_text('{"schema": 2, "numbers": []}')
    with pytest.raises(DDBenchError, match="non-empty list"):
        load_reported(str(bad))
    bad.write_text('{"schema": 2,')
    with pytest.raises(DDBenchError, match="cannot read the paper's numbers"):
        load_reported(str(bad))
    import json
    bad.write_text(json.dumps({"schema": 2, "numbers": [GOOD, GOOD]}))
    with pytest.raises(DDBenchError, match="duplicate id x"):
        load_reported(str(bad))
    bad.write_text(json.dumps({"schema": 2, "numbers": [GOOD]}))
    assert load_reported(str(bad))["x"].value == 4


def test_trace_readers_reject_bad_files(tmp_path, monkeypatch):
    import ddbench.core.traces as traces
    monkeypatch.setenv("DDBENCH_DATA", str(tmp_path))
    with pytest.raises(DDBenchError, match="cannot read kernel benchmarks"):
        traces.kernel_bench()
    (tmp_path / "engine" / "x").mkdir(parents=True)
    (tmp_path / "engine" / "x" / "engine.csv").write_text("design,context\ndualdecoder,1\n")
    with pytest.raises(DDBenchError, match=r"missing column\(s\) batch"):
        traces.engine_bench("x")
