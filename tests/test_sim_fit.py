"""Fit once, price many: the committed fitted-parameters file (traces/fit/h200/fitted.json, written by
`python -m ddbench.sim.fit`) is fresh against its inputs and is what a refit gives; the cost model takes it only
for the bundle it was fitted to and says so otherwise; a bad file, a bad meta.json or an empty engine
CSV is one line naming the file (and field), exit 2; `python -m ddbench.sim.validate` writes through the guard."""

import json
import os
import shutil

import pytest

from ddbench.core.calibration import load_bundle
from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir
from ddbench.sim.fit import cachefill, fitfile
from ddbench.sim.fit.replay import FUSED, FUSED64, TORCH
from ddbench.sim.fitted import FILE, fitted_path, load
from ddbench.sim.factory import cost_model
from tests.cli import assert_one_line_error, ddbench, module

FITTED = fitted_path("h200")


# ------------------------------------------------------------------ the committed file

def test_committed_fitted_file_is_fresh_against_its_inputs():
    """Every input file the fit read still has the sha256 the file records (rerun `python -m ddbench.sim.fit`)."""
    assert fitfile.stale(FITTED) == [], "traces/fit/h200/fitted.json is stale: rerun `python -m ddbench.sim.fit`"
    f = load(FITTED)
    assert set(f.inputs) == {"bundle", "breakdown", "cache_sweeps", "int64_fill_sweeps", "torch_fill_sweeps"}
    assert f.inputs["bundle"]["path"] == "traces/calibration/h200"
    assert {"bundle.json", "engine.csv", "reuse_fetch.csv", "link.csv"} <= set(f.inputs["bundle"]["files"])
    assert f.inputs["breakdown"]["path"] == "traces/engine/h200/breakdown.json"
    assert [x["path"] for x in f.inputs["cache_sweeps"]] == [f"traces/engine/h200-{it}" for it in cachefill.SWEEPS[FUSED]]
    assert [x["path"] for x in f.inputs["int64_fill_sweeps"]] == ["traces/engine/h200-cache-fill"]
    assert [x["path"] for x in f.inputs["torch_fill_sweeps"]] == ["traces/engine/h200-cache"]
    for sweep in ("cache_sweeps", "int64_fill_sweeps", "torch_fill_sweeps"):
        assert all(set(x["files"]) == {"engine.csv", "meta.json"} for x in f.inputs[sweep])
    assert f.cache_fill.contexts == cachefill.DEFAULT_CONTEXTS[FUSED] and f.cache_fill_torch.contexts == (65536,)
    assert f.cache_fill_int64.contexts == cachefill.DEFAULT_CONTEXTS[FUSED64] and f.cache_fill_int64.residuals_us
    assert f.provenance["command"].startswith("python -m ddbench.sim.fit") and f.provenance["git_sha"]
    assert f.engine is not None and f.engine.residuals and f.engine.floor_residuals
    assert f.reuse[(2048, 32, 2)].rel_residuals and f.cache_fill.residuals_us and f.cache_fill_torch.residuals_us


def test_staleness_is_seen(tmp_path):
    """Negative control: a recorded sha256 that no longer matches its file (or a new bundle file) is named."""
    doc = json.loads(open(FITTED, encoding="utf-8").read())
    doc["inputs"]["bundle"]["files"]["link.csv"] = "0" * 64
    doc["inputs"]["breakdown"]["sha256"] = "0" * 64
    del doc["inputs"]["bundle"]["files"]["kernels.csv"]
    p = tmp_path / FILE
    p.write_text(json.dumps(doc))
    assert fitfile.stale(str(p)) == ["traces/calibration/h200/link.csv",
                                     "traces/calibration/h200/kernels.csv (not fitted)",
                                     "traces/engine/h200/breakdown.json"]


def test_check_cli(tmp_path, capsys):
    assert fitfile.main(["--check"]) == 0 and capsys.readouterr().out.strip() == "fresh"
    doc = json.loads(open(FITTED, encoding="utf-8").read())
    doc["inputs"]["cache_sweeps"][0]["files"]["meta.json"] = "0" * 64
    (tmp_path / FILE).write_text(json.dumps(doc))
    assert fitfile.main(["--check", "--out", str(tmp_path)]) == 1
    assert f"traces/engine/h200-{cachefill.SWEEPS[FUSED][0]}/meta.json" in capsys.readouterr().err


def test_refit_is_the_committed_file():
    """The fits, rerun now on the committed inputs, give the committed parameters (code drift is seen)."""
    committed = load(FITTED)
    again = fitfile.fit_bundle(load_bundle(str(traces_dir("calibration", "h200"))),
                               fitfile.default_cache_sweeps("h200"), committed.cache_fill.contexts,
                               torch_dirs=fitfile.default_cache_sweeps("h200", TORCH),
                               int64_dirs=fitfile.default_cache_sweeps("h200", FUSED64))
    # A least-squares refit is reproducible to about 1e-8 across CPUs and BLAS kernels (7.3e-9 seen on
    # one x86 machine), not to 1e-9; 1e-6 still catches any change of the code or its inputs.
    for c, th in committed.engine.theta.items():
        assert again.engine.theta[c] == pytest.approx(th, rel=1e-6, abs=1e-18), c
    assert set(again.reuse) == set(committed.reuse)
    for k, f in committed.reuse.items():
        g = again.reuse[k]
        assert (g.fixed_s, g.copy_Bps, g.hit_s, g.miss_s, g.mix_s) == pytest.approx(
            (f.fixed_s, f.copy_Bps, f.hit_s, f.miss_s, f.mix_s), rel=1e-6)
    for fill in ("cache_fill", "cache_fill_int64", "cache_fill_torch"):
        for t, v in getattr(committed, fill).theta.items():
            assert getattr(again, fill).theta[t] == pytest.approx(v, rel=1e-6, abs=1e-12), (fill, t)


# ------------------------------------------------------------------ the cost model takes it for its bundle only

def test_cost_model_prices_with_the_file():
    cm = cost_model("llama-3-8b", "h200")
    f = load(FITTED)
    assert cm.fitted.path == "traces/fit/h200/fitted.json"
    assert cm.engine == f.engine and cm.reuse_fits == f.reuse and cm.cache_fill == f.cache_fill
    assert any("RECONCILED" in n and "traces/fit/h200/fitted.json" in n for n in cm.notes)


def test_another_bundle_gets_no_fitted_terms_and_says_why(tmp_path):
    """A bundle whose files are not the fitted ones (measured again: here bundle.json rewritten) is priced
    from its microbenchmarks, and every note says why and what to run; the same files copied elsewhere
    are still the fitted bundle."""
    root = tmp_path / "cal"
    shutil.copytree(str(traces_dir("calibration", "h200")), str(root / "h200"))
    shutil.copy(str(traces_dir("engine", "h200", "breakdown.json")), str(root / "h200" / "breakdown.json"))
    same = cost_model("llama-3-8b", "h200", root=str(root))
    assert same.engine is not None and same.reuse_fits and same.cache_fill is not None
    meta = json.loads((root / "h200" / "bundle.json").read_text())
    (root / "h200" / "bundle.json").write_text(json.dumps(meta, indent=2))
    cm = cost_model("llama-3-8b", "h200", root=str(root))
    assert cm.engine is None and cm.reuse_fits == {} and cm.cache_fill is None
    note = next(n for n in cm.notes if n.startswith("NOT RECONCILED"))
    assert "fitted to another bundle (bundle.json differs)" in note and "python -m ddbench.sim.fit" in note
    cm.cache_fill_s(4, 1024)
    cm.reuse_fetch_s(16 * 8 * 256, 2048, 32, 2, 0.25)
    assert any("cache fill NOT MEASURED" in n and "bundle.json differs" in n for n in cm.notes)
    assert any("BUNDLE-DERIVED" in n and "24 records are not fitted" in n for n in cm.notes)
    # a fitted file beside the bundle's own data root is looked at first, and fitted to it
    from ddbench.sim.fit.fitfile import main
    assert main(["--calibration", str(root), "--cache-sweep", "none"]) == 0
    own = cost_model("llama-3-8b", "h200", root=str(root))
    assert own.engine is not None and own.cache_fill is None and own.fitted.path.endswith("fit/h200/fitted.json")
    assert own.fitted.inputs["bundle"]["files"]["bundle.json"] != same.fitted.inputs["bundle"]["files"]["bundle.json"]


# ------------------------------------------------------------------ typed loaders: one line, the file and field

def _mutated(tmp_path, change) -> str:
    doc = json.loads(open(FITTED, encoding="utf-8").read())
    text = change(doc)
    p = tmp_path / FILE
    p.write_text(text if isinstance(text, str) else json.dumps(doc))
    return str(p)


@pytest.mark.parametrize("change,match", [
    (lambda d: "{not json", "line 1"),
    (lambda d: "[]", "top level is not an object"),
    (lambda d: d.update(schema=1), "field schema"),
    (lambda d: d["engine"]["theta"].update(gemm=[1.0]), "field engine.theta.gemm: 1 parameters"),
    (lambda d: d["engine"]["theta"]["glue"].__setitem__(0, -1.0), r"field engine.theta.glue\[0\]"),
    (lambda d: d["cache_fill"]["theta"].pop("fixed_s"), "field cache_fill.theta: must hold"),
    (lambda d: d["cache_fill"].update(contexts=["64k"]), "field cache_fill.contexts"),
    (lambda d: d["cache_fill"].update(sources=[]), "field cache_fill.sources"),
    (lambda d: d["reuse_fetch"][0].update(copy_Bps=0), r"field reuse_fetch\[0\].copy_Bps"),
    (lambda d: d["reuse_fetch"][0].update(rel_residuals=[[1, 2]]), r"reuse_fetch\[0\].rel_residuals\[0\]"),
    (lambda d: d.pop("inputs"), "field inputs: missing"),
])
def test_bad_fitted_file_is_one_line(tmp_path, change, match):
    p = _mutated(tmp_path, change)
    with pytest.raises(DDBenchError, match=match) as exc:
        load(p)
    assert "\n" not in str(exc.value) and p in str(exc.value)


def _data_copy(tmp_path):
    d = tmp_path / "data"
    shutil.copytree(str(traces_dir()), str(d), ignore=shutil.ignore_patterns("rows.jsonl", "*.log", "devcheck-*"))
    return d


def test_cli_bad_fitted_file_and_empty_engine_csv(tmp_path):
    """Subprocesses: `simulate` with a bad fitted file, `ddbench.sim.validate` and `ddbench.sim.fit` over an empty engine
    CSV or a meta.json that is not an object: one line naming the file, exit 2, nothing written."""
    d = _data_copy(tmp_path)
    fit = d / "fit" / "h200" / FILE
    doc = json.loads(fit.read_text())
    doc["cache_fill"]["theta"]["fixed_s"] = "x"
    fit.write_text(json.dumps(doc))
    env = {"DDBENCH_DATA": str(d)}
    r = ddbench("simulate", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k", "--batch", "4",
                "--design", "dualdecoder", env=env, cwd=tmp_path)
    assert_one_line_error(r, contains=f"{fit}: field cache_fill.theta.fixed_s")
    shutil.copy(FITTED, str(fit))
    (d / "engine" / "h200-cache" / "engine.csv").write_text("")
    out = tmp_path / "val"
    r = module("ddbench.sim.validate", "--engine", str(d / "engine" / "h200-cache"), "--out", str(out / "v.csv"),
               "--held-out", "none", "--cache", "none", "--fp8", "none", env=env, cwd=tmp_path)
    assert_one_line_error(r, contains=f"{d / 'engine' / 'h200-cache' / 'engine.csv'}: empty")
    r = module("ddbench.sim.fit", "--out", str(out), env=env, cwd=tmp_path)
    assert_one_line_error(r, contains="engine.csv: empty")
    (d / "engine" / "h200-validation" / "meta.json").write_text("[1]")
    r = module("ddbench.sim.validate", "--out", str(out / "v.csv"), "--held-out", "none", "--cache", "none", "--fp8",
               "none", env=env, cwd=tmp_path)
    assert_one_line_error(r, contains="meta.json: the top level is not an object")
    assert not out.exists()


# ------------------------------------------------------------------ ddbench.sim.validate through the output guard

def test_validate_writes_through_the_guard(tmp_path, capsys):
    """Its files land with a manifest naming the command; a rerun replaces only its own; a user's file of
    the same name is never overwritten, even with --force."""
    from ddbench.sim import validate as cli
    out = tmp_path / "val"
    args = ["--out", str(out / "h200-engine.csv"), "--held-out", "none", "--cache", "none", "--fp8", "none",
            "--in-place", "none"]
    assert cli.main(args) == 0
    files = sorted(os.listdir(out))
    assert files == [".ddbench-manifest.json", "README.md", "h200-engine-summary.json", "h200-engine.csv"]
    man = json.loads((out / ".ddbench-manifest.json").read_text())["files"]
    assert set(man) == {"README.md", "h200-engine-summary.json", "h200-engine.csv"}
    assert {e["command"] for e in man.values()} == {"python -m ddbench.sim.validate"}
    assert cli.main(args) == 0                              # its own files: replaced in place
    (out / "h200-engine.csv").write_text("mine\n")          # now a user's file
    capsys.readouterr()
    assert cli.main(args + ["--force"]) == 2
    assert "not written by ddbench" in capsys.readouterr().err
    assert (out / "h200-engine.csv").read_text() == "mine\n"
    assert not [f for f in os.listdir(out) if f.startswith(".ddbench-stage")]
