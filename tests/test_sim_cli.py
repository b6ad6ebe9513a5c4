"""`ddbench simulate` end to end through the CLI, and its one-line errors."""

import csv
import json
import subprocess
import sys

import pytest


def _run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "ddbench", *args], capture_output=True, text=True, cwd=cwd)


def test_simulate_serving_writes_outputs(tmp_path):
    out = tmp_path / "o"
    p = _run("simulate", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--system", "dualdecoder,shadowkv",
             "--context", "64k", "--output", "64", "--rate", "0.5", "--requests", "20", "--seed", "1",
             "--out", str(out), "--trace")
    assert p.returncode == 0, p.stderr
    assert "SCALED" in p.stdout  # no H100 bundle: the H200 bundle is scaled, and the output says so
    for system in ("dualdecoder", "shadowkv"):
        d = out / system
        rows = list(csv.DictReader(line for line in open(d / "requests.csv") if not line.startswith("#")))
        assert len(rows) == 20 and all(float(r["ttft_s"]) > 0 for r in rows)
        assert all(float(r["completion_s"]) >= float(r["ttft_s"]) for r in rows)
        assert open(d / "requests.csv").readline().startswith("# cost model:")
        s = json.load(open(d / "summary.json"))
        assert s["completed"] == 20 and s["tokens_per_s"] > 0 and s["peak_memory_bytes"] <= s["capacity_bytes"]
        assert any("SCALED" in n for n in s["cost_model"])
        t = json.load(open(d / "trace.json"))
        assert any(e.get("ph") == "X" and e["name"].endswith("attention") for e in t["traceEvents"])


def test_simulate_timeline_mode(tmp_path):
    p = _run("simulate", "--model", "llama-3-8b", "--gpu", "h200", "--system", "dualdecoder", "--context", "128k",
             "--batch", "8", "--steps", "6", "--hit-rate", "0.67", "--out", str(tmp_path), "--json")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)["dualdecoder"]
    assert s["mode"] == "timeline" and s["step_ms"] > 0 and s["peak_buffer_bytes"] <= s["reserved_buffer_bytes"]
    assert s["aggregate_step_ms"] > 0
    layers = list(csv.DictReader(line for line in open(tmp_path / "layers.csv") if not line.startswith("#")))
    assert len(layers) == 32 and float(layers[0]["urgent_bytes"]) > 0


@pytest.mark.parametrize("args, msg", [
    (["--system", "nonesuch"], "unknown design"),
    (["--rate", "0"], "--rate must be positive"),
    (["--context", "1k"], "larger than the context"),
    (["--hit-rate", "1.5"], "hit rate must be within"),
    (["--calibration", "BROKEN"], "malformed calibration bundle"),
])
def test_simulate_errors_are_one_line(tmp_path, args, msg):
    broken = tmp_path / "BROKEN" / "h200"
    broken.mkdir(parents=True)
    (broken / "bundle.json").write_text("{nope")
    base = ["simulate", "--model", "llama-3-8b", "--gpu", "h200", "--requests", "2", "--out", str(tmp_path / "o")]
    p = _run(*base, *[a if a != "BROKEN" else str(tmp_path / "BROKEN") for a in args])
    assert p.returncode == 2
    assert msg in p.stderr and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert not (tmp_path / "o" / "summary.json").exists()


def test_calibrate_without_gpu_is_one_line_error():
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    p = _run("calibrate", "--sections", "link")
    assert p.returncode == 2 and "needs a CUDA GPU" in p.stderr and p.stderr.count("\n") == 1
