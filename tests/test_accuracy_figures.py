"""Figures 7, 16, Table 1 and the sensitivity map, on a synthetic data root in the profiler's schema
(ddbench/profile/trace.py); and their one-line failure where no profile exists."""

import csv
import json
import os

import pandas as pd
import pytest

from ddbench.core.errors import DDBenchError
from ddbench.core.paths import SOURCE_TRACES
from test_accuracy_consumers import rates, write_profile

MODEL = "SmolLM2-135M-Instruct-fixture"
LAYERS = 30
TASKS = ("single", "multikey", "vt")
IDS = ("fig07", "fig16", "table1", "sensitivity")
STEP_COLUMNS = ["context_tokens", "task", "sample", "init", "temperature", "budget_tokens", "step", "hit_rate",
                "reuse_hit_rate", "union_hit_rate", "new_pred_share", "token_acc", "output_token", "spec_token"]
# task accuracy: (task, method, budget) -> correct of 4
ACC = {("single", "dense", None): 4, ("multikey", "dense", None): 3, ("vt", "dense", None): 2,
       ("single", "sparse", 1024): 4, ("multikey", "sparse", 1024): 3, ("vt", "sparse", 1024): 1,
       ("single", "lowrank", 1024): 2, ("multikey", "lowrank", 1024): 1, ("vt", "lowrank", 1024): 0,
       ("single", "sparse", 2048): 4, ("multikey", "sparse", 2048): 3, ("vt", "sparse", 2048): 2,
       ("single", "lowrank", 2048): 3, ("multikey", "lowrank", 2048): 2, ("vt", "lowrank", 2048): 1}


def make_root(root, with_profile=True):
    """A data root: the committed traces the cost model reads, plus a synthetic accuracy profile."""
    os.makedirs(root / "accuracy")
    # the cost model reads the bundle, its engine fit (fit/ and the engine runs it names) and the link bench rows
    for sub in ("paper", "calibration", "link", "fit", "engine"):
        os.symlink(SOURCE_TRACES / sub, root / sub)
    if not with_profile:
        return root
    acc = root / "accuracy"
    write_profile(acc / f"{MODEL}.csv", model=MODEL, layers=LAYERS, contexts=(4096,), tasks=TASKS,
                  budgets=(1024, 2048))
    with open(acc / f"{MODEL}.steps.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=STEP_COLUMNS)
        w.writeheader()
        for task in TASKS:
            for init in ("t2", "random"):
                for t in (0.0, 0.6, 1.0):
                    for b in (1024, 2048):
                        for step in range(8):
                            hit = sum(rates(i, LAYERS, init, t, task, b)[0] for i in range(LAYERS)) / LAYERS
                            w.writerow({"context_tokens": 4096, "task": task, "sample": 0, "init": init,
                                        "temperature": t, "budget_tokens": b, "step": step,
                                        "hit_rate": hit - 0.01 * (step % 2), "reuse_hit_rate": 0.5,
                                        "union_hit_rate": hit, "new_pred_share": 0.1,
                                        "token_acc": int(step % 4 == 0), "output_token": 1, "spec_token": 2})
    summary = {"schema": 1, "model": MODEL, "shape": {"layers": LAYERS, "model_type": "llama"},
               "config": {"rank": 160}, "per_layer": {"basis": "init t2, temperature > 0", "rows": []},
               "lowrank_layers": {"rule": "§5.3: layers whose mean hit rate is below the threshold",
                                  "threshold": 0.6, "basis": "init t2, temperature > 0", "layers": [0, 1, 2]},
               "task_accuracy": [{"context_tokens": 4096, "task": t, "budget_tokens": b, "method": m,
                                  **({"rank": 160} if m == "lowrank" else {}), "correct": c, "total": 4,
                                  "accuracy": c / 4} for (t, m, b), c in ACC.items()]}
    (acc / f"{MODEL}.summary.json").write_text(json.dumps(summary))
    return root


@pytest.fixture
def fixture_root(tmp_path, monkeypatch):
    root = make_root(tmp_path / "data")
    monkeypatch.setenv("DDBENCH_DATA", str(root))
    return root


def _exp(fid):
    from ddbench.experiments import accuracy_figures, sensitivity_figure  # noqa: F401  (register)
    from ddbench.experiments import EXPERIMENTS
    return EXPERIMENTS[fid]


def _expected_hit(init, temp, budget=1024):
    return sum(sum(rates(i, LAYERS, init, temp, t, budget)[0] for i in range(LAYERS)) / LAYERS for t in TASKS) / 3


def test_fig07_means_follow_the_profile(fixture_root):
    res = _exp("fig07").compute()
    cmp = {c.paper_id: c for c in res.comparisons}
    assert cmp["fig7a.kv_accuracy.mean"].ours == pytest.approx(_expected_hit("t2", 0.6), abs=5e-4)
    assert cmp["fig7b.random_init.kv_accuracy.mean"].ours == pytest.approx(_expected_hit("random", 0.6), abs=5e-4)
    for c in cmp.values():
        assert MODEL in c.note and "30 layers" in c.note and "not this model" in c.note
    a = res.data[res.data.panel == "a"]
    assert list(a.step) == list(range(8)) and (a.budget_tokens == 1024).all()
    assert a.token_accuracy.tolist() == [1, 0, 0, 0, 1, 0, 0, 0]
    b = res.data[res.data.panel == "b"].set_index(["init", "temperature"]).kv_accuracy
    assert b["t2", 0.0] == pytest.approx(1.0)          # greedy + T2: every hit by construction
    assert b["t2", 1.0] < b["t2", 0.6] and b["random", 0.6] < b["t2", 0.6]


def test_fig16_reports_the_worst_task_mean(fixture_root):
    res = _exp("fig16").compute()
    cmp = {c.paper_id: c.ours for c in res.comparisons}
    worst = min(sum(rates(i, LAYERS, "t2", 0.6, t)[0] for i in range(LAYERS)) / LAYERS for t in TASKS)
    assert cmp["fig16.ruler.128k.min_accuracy"] == pytest.approx(worst, abs=5e-4)
    assert cmp["fig16.ruler.128k.miss_share"] == pytest.approx(1 - worst, abs=5e-4)
    lay = res.data[res.data.kind == "layer"]
    assert len(lay) == LAYERS and lay[lay.lowrank == 1].layer.tolist() == [0, 1, 2]
    assert "multikey" in [c.note for c in res.comparisons][0]     # task "b"-like penalty is not in TASKS: check name
    assert res.data[res.data.kind == "task"].task.tolist() == sorted(TASKS)


def test_table1_maps_paper_columns_to_methods(fixture_root):
    res = _exp("table1").compute()
    cmp = {c.paper_id: c.ours for c in res.comparisons}
    assert cmp["table1.niah-1.128k.shadowkv"] == 0.5 and cmp["table1.niah-1.128k.dualdecoder"] == 1.0
    assert cmp["table1.niah-2.64k.shadowkv"] == 0.25 and cmp["table1.niah-2.64k.dualdecoder"] == 0.75
    assert cmp["table1.avg.128k.dualdecoder"] == pytest.approx((4 + 3 + 1) / 12, abs=1e-3)
    assert cmp["table1.budget_tokens"] == 1024
    # no multivalue task profiled, no QA task at all: those stay unreplayed rather than compared to something else
    assert not any(k.startswith(("table1.niah-3", "table1.qa-2")) for k in cmp)
    paper = res.data[res.data.source == "paper"]
    assert len(paper) == 20 and paper.accuracy.min() == 0.24


def test_sensitivity_map_is_monotone_and_marks_points(fixture_root):
    res = _exp("sensitivity").compute()
    df = res.data
    g = df[df.kind == "grid"]
    assert len(g) == 121
    piv = g.pivot(index="hit_rate", columns="reuse_rate", values="ratio")
    assert (piv.diff(axis=0).iloc[1:] >= -1e-9).all().all()      # more hits: DualDecoder no slower
    assert (piv.diff(axis=1).iloc[:, 1:] <= 1e-9).all().all()    # more reuse: ShadowKV no slower
    assert piv.to_numpy().min() < 1 < piv.to_numpy().max()          # the verdict flips inside the map
    paper = df[df.kind == "paper"].iloc[0]
    assert paper.hit_rate == paper.reuse_rate == 0.88
    assert paper.ratio_aggregate == pytest.approx(paper.ratio, rel=0.05)   # aggregate grid vs timeline marks
    meas = df[df.kind == "measured"].iloc[0]
    assert meas.hit_rate == pytest.approx(_expected_hit("t2", 0.6), abs=5e-4)
    assert "not Qwen2.5-32B" in meas.source and "rates" in meas.source and MODEL in meas.source
    assert paper.dd_batch > paper.sk_batch > 0
    assert "DualDecoder wins for hit >=" in res.setup


@pytest.mark.parametrize("fid", IDS)
def test_no_profile_is_one_line_naming_the_figure(tmp_path, monkeypatch, fid):
    monkeypatch.setenv("DDBENCH_DATA", str(make_root(tmp_path / "data", with_profile=False)))
    with pytest.raises(DDBenchError) as exc:
        _exp(fid).compute()
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{fid}: no accuracy profile") and "ddbench profile --layer-accuracy" in msg


def test_malformed_steps_name_line_and_field(fixture_root):
    path = fixture_root / "accuracy" / f"{MODEL}.steps.csv"
    lines = path.read_text().splitlines()
    cells = lines[3].split(",")
    cells[STEP_COLUMNS.index("hit_rate")] = "1.7"
    lines[3] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DDBenchError, match=r"steps.csv: line 4, field hit_rate: '1.7' is not a rate"):
        _exp("fig07").compute()


def test_figures_command_writes_the_accuracy_figures(fixture_root, tmp_path):
    from ddbench.cli import build_parser
    from ddbench.commands.figures import run

    args = build_parser().parse_args(["figures", "--out", str(tmp_path / "figs"), "--only", ",".join(IDS), "--quiet"])
    assert run(args) == 0
    for fid in IDS:
        for ext in ("png", "pdf"):
            assert (tmp_path / "figs" / f"{fid}.{ext}").stat().st_size > 5000
        assert len(pd.read_csv(tmp_path / "figs" / f"{fid}.csv")) >= 3


# ---------------------------------------------------------------- the committed SmolLM2 profile
REAL = "SmolLM2-135M-Instruct.Q4_1"


def test_real_profile_committed_and_read_as_pandas_would():
    """The committed traces exist (this fails, loudly, where they are missing) and the reader's layer means
    equal an independent pandas computation at the default selection (t2, temperature 0.6, budget 1024)."""
    path = SOURCE_TRACES / "accuracy" / f"{REAL}.csv"
    assert path.exists(), f"{path} is not committed: run `ddbench profile --layer-accuracy` (issue 8)"
    from ddbench.sim.hitrates import read_hitrates
    df = pd.read_csv(path)
    sel = df[(df.init == "t2") & (df.temperature == 0.6) & (df.budget_tokens == df.budget_tokens.min())]
    per_layer = sel.groupby("layer").apply(lambda g: (g.hit_rate * g.n).sum() / g.n.sum(), include_groups=False)
    prof = read_hitrates(path)
    assert prof.layers == 30 == len(per_layer)
    assert list(prof.hit) == pytest.approx(per_layer.tolist(), abs=1e-9)
    assert prof.model == REAL and prof.budgets == (int(df.budget_tokens.min()),)


def test_real_figures_name_the_model_and_never_an_8b():
    from ddbench.core.paths import ENV
    if os.environ.get(ENV):
        pytest.skip("DDBENCH_DATA points elsewhere")
    for fid in IDS:
        res = _exp(fid).compute()
        text = res.setup + " ".join(c.note for c in res.comparisons)
        assert REAL in text and "30 layers" in text, fid
        assert "8B" not in text.replace("Llama-3-8B", ""), fid
    sens = _exp("sensitivity").compute().data
    meas = sens[sens.kind == "measured"].iloc[0]
    assert "not Qwen2.5-32B's" in meas.source and 0.5 < meas.ratio < 3
