"""The selection index (issue 47) through the layers: its spec and bytes (ddbench/core/index.py), the memory
model's landmark bytes per format (scales included), the simulator's selection priced from the bytes each
level reads (marked so), `--index` in plan, simulate and sweep, the planner's `--search index=...`, and bad
input (G < 2, k' below the budget, an unknown format, int4 on a head dim it cannot pack): one line, exit 2."""

import json
import math

import pytest

from tests.cli import in_process as _run
from ddbench.core.catalog import get_gpu, get_model
from ddbench.core.designs import DESIGNS, get_design
from ddbench.core.errors import DDBenchError
from ddbench.core.index import (FLAT, candidates, check_index, parse_index, read_bytes, resident_bytes,
                                selection_bytes, vector_bytes)
from ddbench.core.memory import landmark_bytes, max_batch
from ddbench.core.workload import Workload
from ddbench.planner.knobs import knob_label, parse_search, settings
from ddbench.planner.scenario import Scenario

M8, H200 = get_model("llama-3-8b"), get_gpu("h200")
LANDMARK = [n for n, d in DESIGNS.items() if d.landmarks]


def test_spec_names_and_bytes():
    assert parse_index("flat") == FLAT == parse_index("BF16") and FLAT.name == "flat"
    two = parse_index("two-level:8")
    assert (two.group, two.keep, two.fmt, two.coarse, two.name) == (8, 1.0, "bf16", "bf16", "two-level:8,1")
    assert parse_index("two-level:16,2,fp8").name == "two-level:16,2,fp8"
    assert parse_index("two-level:8,1,int4,fp8").name == "two-level:8,1,int4,fp8"
    assert [vector_bytes(f, 128) for f in ("bf16", "fp8", "int4")] == [256, 132, 80]
    n, k = 16384, 256                                        # Llama-3-8B at 128K, budget 2048
    assert resident_bytes(two, n, 128) == n * 256 + n // 8 * 256
    assert candidates(two, n, k) == 256 * 8 and read_bytes(two, n, 128, k, tokens=2) == 2048 * 256 + 2 * 2048 * 256
    assert read_bytes(parse_index("two-level:8,100"), n, 128, k) == 2048 * 256 + n * 256   # k' capped at all
    assert selection_bytes(FLAT, n, 128, k, score_rows=8) == n * 256 + 2 * 8 * n * 2


@pytest.mark.parametrize("text, message", [
    ("two-level:1", "at least 2 chunks"), ("two-level:8,0.5", "at least the budget"), ("fp9", "unknown format"),
    ("two-level", "needs its super-chunk size"), ("two-level:x", "G must be an integer"),
    ("two-level:8,1,int4,fp8,bf16", "at most"), ("two-level:8,1,int3", "unknown format")])
def test_spec_errors(text, message):
    with pytest.raises(DDBenchError, match=message):
        parse_index(text)


def test_int4_needs_whole_groups():
    check_index(parse_index("int4"), 128)
    with pytest.raises(DDBenchError, match="head_dim 80"):
        check_index(parse_index("two-level:8,1,int4,bf16"), 80)
    check_index(parse_index("fp8"), 80)


@pytest.mark.parametrize("design", LANDMARK)
def test_memory_model_counts_each_format(design):
    d = get_design(design)
    w = Workload(context=131072, batch=10)
    flat = landmark_bytes(d, M8, w)
    chunks, per = 16384, 10 * 32 * 8                           # chunks; batch x layers x KV heads
    assert flat == per * chunks * 256
    for idx, vec in (("fp8", 132), ("int4", 80), ("two-level:8,1,int4", 80 + 80 / 8)):
        assert landmark_bytes(d, M8, Workload(context=131072, batch=10, index=idx)) == per * chunks * vec
    assert max_batch(d, M8, H200, Workload(context=131072, index="int4")) > max_batch(d, M8, H200, w)


def test_designs_without_landmarks_ignore_it():
    for name in ("full-kv", "specache"):
        d = get_design(name)
        assert max_batch(d, M8, H200, Workload(context=131072, index="int4")) == \
            max_batch(d, M8, H200, Workload(context=131072))


def test_simulator_prices_selection_from_bytes():
    from ddbench.sim.factory import cost_model
    from ddbench.sim.indexcost import select_index_s
    cm = cost_model("llama-3-8b", "h200")
    w = Workload(context=131072)
    flat = select_index_s(cm, 60, 2, 131072, w)
    assert flat == cm.select_s(60, 2, 131072, 8) and not any("PRICED FROM BYTES" in n for n in cm.notes)
    t = {i: select_index_s(cm, 60, 2, 131072, Workload(context=131072, index=i)) for i in
         ("fp8", "int4", "two-level:8,1", "two-level:8,1,int4", "two-level:8,1000")}
    assert t["int4"] < t["fp8"] < flat and t["two-level:8,1,int4"] < t["two-level:8,1"] < flat
    assert t["two-level:8,1000"] > flat              # every super-chunk kept: both passes, more than flat
    assert any("PRICED FROM BYTES" in n for n in cm.notes)


def test_search_index_knob():
    knobs = parse_search("budget=1k:2k,index=flat:int4:two-level:8,2")
    assert knobs["index"] == ("flat", "int4", "two-level:8,2")
    base = dict(model="llama-3-8b", gpu="h200", context="32k")
    cc = settings(Scenario(design="dualdecoder-cache", **base), knobs, 32768, 32)
    assert sorted((s.knob("budget"), s.knob("index")) for s in cc) == sorted(
        (b, i) for b in (1024, 2048) for i in ("flat", "int4", "two-level:8,2"))
    assert "index=int4" in {knob_label(s, knobs).split()[-1] for s in cc}
    assert len(settings(Scenario(design="specache", **base), knobs, 32768, 32)) == 2      # no landmarks
    for bad in ("index=fp9", "index=two-level:1", "index=two-level:8,0.5"):
        with pytest.raises(DDBenchError):
            parse_search(bad)



PLAN = ["plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "128k", "--design", "dualdecoder-cache"]


def test_plan_and_simulate_take_index(capsys, tmp_path):
    rc, out, _ = _run(PLAN + ["--index", "int4", "--json"], capsys)
    res = json.loads(out)
    assert rc == 0 and res["workload"]["index"] == "int4"
    rc, flat, _ = _run(PLAN + ["--json"], capsys)
    assert json.loads(flat)["systems"][0]["max_batch"] < res["systems"][0]["max_batch"]
    rc, out, _ = _run(["simulate", "--model", "llama-3-8b", "--gpu", "h200", "--design", "dualdecoder", "--context",
                       "32k", "--batch", "4", "--steps", "3", "--index", "two-level:8,1,fp8", "--out",
                       str(tmp_path / "s"), "--verbose"], capsys)
    assert rc == 0 and "selection index two-level:8,1,fp8" in out and "PRICED FROM BYTES" in out


@pytest.mark.parametrize("value, message", [
    ("two-level:1", "G >= 2"), ("two-level:8,0.5", "M >= 1"), ("fp9", "unknown format")])
def test_bad_index_one_line(value, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for argv in (PLAN, ["simulate", "--model", "llama-3-8b", "--gpu", "h200", "--requests", "2"]):
        rc, out, err = _run(argv + ["--index", value], capsys)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert rc == 2 and len(lines) == 1 and out == "" and message in lines[0], (rc, out, err)
    (tmp_path / "spec.yaml").write_text("grid:\n  model: llama-3-8b\n  gpu: h200\n  design: dualdecoder\n"
                                        f"  context: 32k\n  rate: 1\n  index: '{value}'\n")
    rc, out, err = _run(["sweep", "spec.yaml"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


def test_int4_on_a_head_dim_it_cannot_pack(capsys, tmp_path):
    cfg = dict(num_hidden_layers=4, num_attention_heads=32, hidden_size=2560, num_key_value_heads=8,
               intermediate_size=6912, vocab_size=1000)                      # head_dim 80
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    argv = ["plan", "--model", str(tmp_path / "config.json"), "--gpu", "h200", "--context", "32k"]
    rc, out, err = _run(argv + ["--index", "int4"], capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "head_dim 80" in err
    assert _run(argv + ["--index", "fp8"], capsys)[0] == 0
