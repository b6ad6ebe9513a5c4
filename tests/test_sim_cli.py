"""`ddbench simulate` end to end through the CLI, and its one-line errors."""

import csv
import json
import os
import signal
import stat
import subprocess
import time

import pandas as pd
import pytest

from tests.cli import ROOT, assert_one_line_error, command, ddbench, default_signals, env

_run = ddbench
REQUEST_COLUMNS = ["id", "arrival_s", "context", "output_tokens", "rejected", "admitted_s", "ttft_s", "tpot_s",
                   "completion_s", "finished_at_s"]
STEP_COLUMNS = ["start_s", "steps", "batch", "step_s", "prefill_tokens", "link_util", "memory_bytes"]
MEMORY_COLUMNS = ["time_s", "weights", "resident_kv", "landmarks", "aux_residency", "sparse_kv_buffers",
                  "activations", "runtime_overhead", "total"]


def test_simulate_serving_writes_outputs(tmp_path):
    out = tmp_path / "o"
    p = _run("simulate", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--system", "dualdecoder,shadowkv",
             "--context", "64k", "--output", "64", "--rate", "0.5", "--requests", "20", "--seed", "1",
             "--out", str(out), "--trace")
    assert p.returncode == 0, p.stderr
    assert "SCALED" in p.stdout  # no H100 bundle: the H200 bundle is scaled, and the output says so
    for design in ("dualdecoder", "shadowkv"):
        d = out / design
        rows = list(csv.DictReader(open(d / "requests.csv")))
        assert len(rows) == 20 and all(float(r["ttft_s"]) > 0 for r in rows)
        assert all(float(r["completion_s"]) >= float(r["ttft_s"]) for r in rows)
        # plain CSVs: pandas reads them as they are, one header line, no comment lines
        assert list(pd.read_csv(d / "requests.csv").columns) == REQUEST_COLUMNS
        assert list(pd.read_csv(d / "steps.csv").columns) == STEP_COLUMNS
        assert list(pd.read_csv(d / "memory.csv").columns) == MEMORY_COLUMNS
        s = json.load(open(d / "summary.json"))
        assert s["completed"] == 20 and s["tokens_per_s"] > 0 and s["peak_memory_bytes"] <= s["capacity_bytes"]
        assert any("SCALED" in n for n in s["cost_model"])
        t = json.load(open(d / "trace.json"))
        assert any(e.get("ph") == "X" and e["name"].endswith("attention") for e in t["traceEvents"])
    prov = json.load(open(out / "provenance.json"))   # the cost model's notes, the arguments, version, sha
    assert prov["command"] == "ddbench simulate" and any("SCALED" in n for n in prov["cost_model"])
    assert prov["arguments"]["design"] == ["dualdecoder", "shadowkv"] and prov["arguments"]["rate"] == 0.5
    assert prov["ddbench_version"] and prov["git_sha"]


def test_simulate_timeline_mode(tmp_path):
    p = _run("simulate", "--model", "llama-3-8b", "--gpu", "h200", "--system", "dualdecoder", "--context", "128k",
             "--batch", "8", "--steps", "6", "--hit-rate", "0.67", "--out", str(tmp_path), "--json")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)["dualdecoder"]
    assert s["mode"] == "timeline" and s["step_ms"] > 0 and s["peak_buffer_bytes"] <= s["reserved_buffer_bytes"]
    assert s["aggregate_step_ms"] > 0
    layers = pd.read_csv(tmp_path / "layers.csv")
    assert len(layers) == 32 and layers.urgent_bytes[0] > 0
    assert list(layers.columns) == ["layer", "pre_s", "rebuild_assemble_s", "attention_s", "post_s", "prefetch_bytes",
                                    "urgent_bytes", "stall_s_per_step", "hit_rate", "lowrank_keys"]
    assert list(pd.read_csv(tmp_path / "steps.csv").columns) == ["step", "step_s", "stall_s"]


def _strict_json(text):
    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def _leftovers(folder):
    """Temporary run folders or files left in `folder`."""
    return [n for n in os.listdir(folder) if ".tmp-" in n or ".old-" in n or n.startswith(".tmp")]


BASE = ["simulate", "--model", "llama-3-8b", "--gpu", "h200", "--requests", "2"]


@pytest.mark.parametrize("args, msg", [
    (["--system", "nonesuch"], "unknown design"),
    (["--system", ""], "names no design"),
    (["--system", " , "], "names no design"),
    (["--rate", "0"], "argument --rate: '0': must be at least"),
    (["--rate", "inf"], "argument --rate: 'inf': must be finite"),
    (["--rate", "nan"], "argument --rate: 'nan': must be finite"),
    (["--rate", "1e-308"], "argument --rate: '1e-308': must be at least"),
    (["--requests", "0"], "argument --requests: '0': must be at least 1"),
    (["--max-batch", "0"], "argument --max-batch: '0': must be at least 1"),
    (["--batch", "0"], "argument --batch: '0': must be at least 1"),
    (["--batch", "2", "--steps", "0"], "argument --steps: '0': must be in [1, 100000]"),
    (["--link", ""], "argument --link: '': is empty"),
    (["--calibration", ""], "argument --calibration: '': is empty"),
    (["--hit-rate", ""], "argument --hit-rate: '': is empty"),
    (["--chunk", "0"], "chunk must be an integer >= 1"),
    (["--budget", "0"], "budget must be positive"),
    (["--context", "1k"], "larger than the context"),
    (["--context", "uniform:1k"], "use uniform:LO:HI"),
    (["--hit-rate", "1.5"], "argument --hit-rate: '1.5': must be in [0, 1]"),
    (["--calibration", "BROKEN"], "malformed calibration bundle"),
    (["--out", ""], "--out: '': is empty"),
    (["--out", "/proc/x"], "cannot write --out /proc/x"),
    (["--out", "FILE/x"], "is not a folder"),
])
def test_simulate_errors_are_one_line(tmp_path, args, msg):
    broken = tmp_path / "BROKEN" / "h200"
    broken.mkdir(parents=True)
    (broken / "bundle.json").write_text("{nope")
    (tmp_path / "FILE").write_text("a file")
    args = [str(tmp_path / a) if a in ("BROKEN", "FILE/x") else a for a in args]
    before = sorted(os.listdir(tmp_path))
    p = _run(*BASE, "--out", str(tmp_path / "o"), *args, cwd=tmp_path)
    assert_one_line_error(p, contains=msg)
    assert p.stdout == ""
    assert sorted(os.listdir(tmp_path)) == before  # nothing left behind, not even a temporary folder


def test_nonempty_out_is_refused_and_force_replaces_it_whole(tmp_path):
    out = tmp_path / "o"
    assert _run(*BASE, "--out", str(out)).returncode == 0
    assert (out / "requests.csv").exists()
    p = _run(*BASE, "--batch", "2", "--steps", "2", "--out", str(out))
    assert p.returncode == 2 and "holds an earlier ddbench run; pass --force" in p.stderr and p.stderr.count("\n") == 1
    assert (out / "requests.csv").exists() and not (out / "layers.csv").exists()
    p = _run(*BASE, "--batch", "2", "--steps", "2", "--out", str(out), "--force")
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(out)) == [".ddbench-manifest.json", "layers.csv", "provenance.json", "steps.csv",
                                       "summary.json"]  # serving set gone
    assert _leftovers(tmp_path) == []


def test_force_writes_beside_files_ddbench_did_not_write_and_keeps_them(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    p = _run(*BASE, "--out", str(tmp_path))
    assert p.returncode == 2 and "did not write (notes.txt)" in p.stderr and p.stderr.count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]
    p = _run(*BASE, "--out", str(tmp_path), "--force")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "requests.csv").exists()
    p = _run(*BASE, "--batch", "2", "--steps", "2", "--out", str(tmp_path), "--force")   # replaces its own only
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine" and not (tmp_path / "requests.csv").exists()


def test_serving_where_nothing_fits_says_so(tmp_path):
    """full-kv at 1M tokens on the H200: no request fits; no throughput, no NaN, exit 3."""
    p = _run("simulate", "--model", "llama-3-8b", "--gpu", "h200", "--system", "full-kv", "--context", "1m",
             "--requests", "3", "--out", str(tmp_path / "o"), "--json")
    assert p.returncode == 3, p.stderr
    s = _strict_json(p.stdout)["full-kv"]
    assert s["status"] == "nothing-fits" and s["completed"] == 0 and s["rejected"] == 3
    assert s["tokens_per_s"] is None and "fits" in s["reasons"]["tokens_per_s"]
    assert _strict_json((tmp_path / "o" / "summary.json").read_text()) == s
    p = _run("simulate", "--model", "llama-3-8b", "--gpu", "h200", "--system", "full-kv,dualdecoder",
             "--context", "1m", "--requests", "3", "--out", str(tmp_path / "o2"))
    assert p.returncode == 0, p.stderr  # one design fits: a result, and the other says it fits nothing
    line = next(x for x in p.stdout.splitlines() if x.startswith("full-kv:"))
    assert "NOTHING FITS" in line and "tokens/s" not in line
    assert "tokens/s" in next(x for x in p.stdout.splitlines() if x.startswith("dualdecoder:"))


def test_weights_that_do_not_fit_are_a_status_not_bad_input(tmp_path):
    """Llama-3-70B's weights alone exceed an L40S: exit 3, summary.json's status says it, the CSVs read."""
    out = tmp_path / "o"
    p = _run("simulate", "--model", "llama-3-70b", "--gpu", "l40s", "--requests", "5", "--out", str(out), "--tp", "1")
    assert p.returncode == 3, p.stderr
    line = next(x for x in p.stdout.splitlines() if x.startswith("dualdecoder:"))      # after the rates lines
    assert line.startswith("dualdecoder: NOTHING FITS: 5/5 requests rejected (the weights and runtime overhead")
    s = _strict_json((out / "summary.json").read_text())
    assert s["status"] == "nothing-fits" and s["completed"] == 0 and "do not fit" in s["reason"]
    assert list(pd.read_csv(out / "requests.csv").columns) == REQUEST_COLUMNS
    assert pd.read_csv(out / "requests.csv").rejected.tolist() == [1] * 5
    assert list(pd.read_csv(out / "steps.csv").columns) == STEP_COLUMNS
    assert list(pd.read_csv(out / "memory.csv").columns) == MEMORY_COLUMNS


def test_timeline_batch_that_does_not_fit_reports_no_throughput(tmp_path):
    p = _run("simulate", "--model", "llama-3-8b", "--gpu", "h200", "--context", "128k", "--batch", "4096",
             "--out", str(tmp_path / "o"))
    assert p.returncode == 3
    first = next(x for x in p.stdout.splitlines() if x.startswith("dualdecoder:"))     # after the rates lines
    assert "does not fit" in first and "tokens/s" not in first and "buffers" not in first
    s = _strict_json((tmp_path / "o" / "summary.json").read_text())
    assert s["status"] == "does-not-fit" and not s["fits"] and s["tokens_per_s"] is None
    assert s["memory_bytes"]["total"] > s["memory_bytes"]["capacity"]


def test_files_follow_the_umask(tmp_path):
    out = tmp_path / "o"
    p = _run(*BASE, "--system", "dualdecoder,shadowkv", "--out", str(out), umask=0o027)
    assert p.returncode == 0, p.stderr
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o750
    assert stat.S_IMODE(os.stat(out / "shadowkv").st_mode) == 0o750
    assert {stat.S_IMODE(os.stat(f).st_mode) for f in out.rglob("*") if f.is_file()} == {0o640}


def test_interrupt_leaves_no_partial_set(tmp_path):
    """Ctrl-C in the middle of a nine-design run: exit 130, no --out, no temporary folder."""
    out = tmp_path / "o"
    p = subprocess.Popen(command("simulate", "--model", "llama-3-8b", "--gpu", "h200", "--system", "every",
                                 "--context", "uniform:16k:64k", "--rate", "5", "--requests", "3000", "--out", out),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals,
                         cwd=ROOT, env=env())
    deadline = time.time() + 60
    while time.time() < deadline:  # wait until the staging folder inside --out holds a finished design
        tmp = [d for d in out.iterdir() if d.name.startswith(".ddbench-stage-")] if out.is_dir() else []
        if tmp and any((d / "summary.json").exists() for d in tmp[0].iterdir() if d.is_dir()):
            break
        assert p.poll() is None, p.communicate()
        time.sleep(0.02)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "interrupted" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_calibrate_without_gpu_is_one_line_error():
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    p = _run("calibrate", "--sections", "link")
    assert p.returncode == 2 and "needs a CUDA GPU" in p.stderr and p.stderr.count("\n") == 1


@pytest.mark.parametrize("how", ["flag", "env"])
def test_empty_data_root_is_refused_not_the_working_folder(tmp_path, how):
    args = ["--data", ""] if how == "flag" else []
    p = _run(*args, *BASE, "--out", str(tmp_path / "o"), cwd=tmp_path,
             env={"DDBENCH_DATA": ""} if how == "env" else None)
    assert p.returncode == 2 and "data root" in p.stderr and p.stderr.count("\n") == 1
    assert os.listdir(tmp_path) == []
