"""`ddbench simulate` with an accuracy profile: the row choice (--profile-*) and the low-rank key layers
from the profile's summary (--lowrank-layers profile), through a subprocess; bad values are one line."""

import csv
import json
import os

import pytest

from test_accuracy_consumers import rates, write_profile
from tests.cli import ddbench

SUMMARY_SET = [20, 25]        # not the worst-predicted layers (those are 0 and 1 in write_profile's rates)
BASE = ("simulate", "--model", "llama-3-8b", "--gpu", "h200", "--system", "dualdecoder", "--context", "128k",
        "--batch", "4", "--steps", "3", "--json")


_run = ddbench


@pytest.fixture
def prof(tmp_path):
    path = write_profile(tmp_path / "p.csv", model="llama-3-8b", layers=32)
    (tmp_path / "p.summary.json").write_text(json.dumps({
        "model": "llama-3-8b", "shape": {"layers": 32},
        "lowrank_layers": {"rule": "§5.3: layers whose mean hit rate is below the threshold", "threshold": 0.7,
                           "basis": "test fixture", "layers": SUMMARY_SET}}))
    return str(path)


def _layers(folder):
    return list(csv.DictReader(open(os.path.join(folder, "layers.csv"))))


def test_profile_flags_pick_the_rows(tmp_path, prof):
    out = tmp_path / "o"
    p = _run(*BASE, "--hit-rate", prof, "--out", str(out), "--profile-init", "random", "--profile-temperature", "1.0",
             "--profile-budget", "1536", "--profile-context", "4k", "--profile-task", "b")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)["dualdecoder"]
    assert "init random, temperature 1, context 4096, task b, budget 1536" in s["hit_rates"]
    rows = _layers(out)
    for i in (0, 31):
        assert float(rows[i]["hit_rate"]) == pytest.approx(rates(i, 32, "random", 1.0, "b", 1536)[0])
    d = tmp_path / "d"
    p = _run(*BASE, "--hit-rate", prof, "--out", str(d))            # the defaults: t2, 0.6, smallest budget
    assert p.returncode == 0, p.stderr
    assert "init t2, temperature 0.6" in json.loads(p.stdout)["dualdecoder"]["hit_rates"]
    assert "budget 1024" in json.loads(p.stdout)["dualdecoder"]["hit_rates"]
    assert float(_layers(d)[0]["hit_rate"]) != float(rows[0]["hit_rate"])
    p = _run(*BASE, "--hit-rate", prof, "--out", str(tmp_path / "a"), "--profile-temperature", "all",
             "--profile-budget", "all", "--profile-init", "all")
    assert p.returncode == 0, p.stderr
    assert "every init, every temperature" in json.loads(p.stdout)["dualdecoder"]["hit_rates"]


def test_lowrank_layers_from_the_profile_summary(tmp_path, prof):
    out = tmp_path / "o"
    p = _run(*BASE, "--hit-rate", prof, "--out", str(out), "--lowrank-layers", "profile")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)["dualdecoder"]
    assert s["lowrank_layers"]["layers"] == SUMMARY_SET and "p.summary.json" in s["lowrank_layers"]["note"]
    assert [int(r["lowrank_keys"]) for r in _layers(out)] == [int(i in SUMMARY_SET) for i in range(32)]
    # the count the memory model sees matches the set: the same memory as --lowrank-layers 2, which
    # instead picks the two worst-predicted layers
    n = tmp_path / "n"
    p2 = _run(*BASE, "--hit-rate", prof, "--out", str(n), "--lowrank-layers", str(len(SUMMARY_SET)))
    assert p2.returncode == 0, p2.stderr
    s2 = json.loads(p2.stdout)["dualdecoder"]
    assert s2["memory_bytes"] == s["memory_bytes"]
    assert s["memory_bytes"] != json.loads(_run(*BASE, "--hit-rate", prof, "--out", str(tmp_path / "z")).stdout)[
        "dualdecoder"]["memory_bytes"]
    assert [int(r["lowrank_keys"]) for r in _layers(n)] == [int(i in (0, 1)) for i in range(32)]
    # ShadowKV keeps low-rank keys on every layer whatever the profile says
    p3 = _run(*BASE[:6], "shadowkv", *BASE[7:], "--hit-rate", prof, "--out", str(tmp_path / "s"),
              "--lowrank-layers", "profile")
    assert p3.returncode == 0, p3.stderr
    assert all(int(r["lowrank_keys"]) for r in _layers(tmp_path / "s"))


@pytest.mark.parametrize("args, msg", [
    (("--profile-temperature", "hot"), "--profile-temperature must be a number or 'all', got 'hot'"),
    (("--profile-temperature", "-1"), "--profile-temperature must be finite and at least 0"),
    (("--profile-temperature", "nan"), "--profile-temperature must be finite and at least 0"),
    (("--profile-budget", "0"), "--profile-budget must be positive"),
    (("--profile-budget", "lots"), "cannot parse --profile-budget 'lots'"),
    (("--profile-context", "8k"), "has no rows for context_tokens 8192 (it has 2048, 4096)"),
    (("--profile-task", "nope"), "has no rows for task nope (it has a, b)"),
    (("--profile-init", "t3"), "has no rows for init t3 (it has random, t2)"),
    (("--profile-init", ""), "--profile-init is empty"),
    (("--lowrank-layers", "many"), "--lowrank-layers must be an integer or 'profile', got 'many'"),
])
def test_bad_profile_values_are_one_line(tmp_path, prof, args, msg):
    out = tmp_path / "o"
    p = _run(*BASE, "--hit-rate", prof, "--out", str(out), *args)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and msg in lines[0], p.stderr
    assert not out.exists()


@pytest.mark.parametrize("args, msg", [
    (("--hit-rate", "0.5", "--lowrank-layers", "profile"), "--lowrank-layers profile needs an accuracy profile"),
    (("--profile-temperature", "1.0"), "--profile-temperature picks rows of an accuracy profile"),
    (("--hit-rate", "0.7", "--profile-init", "random"), "--profile-init picks rows of an accuracy profile"),
])
def test_profile_flags_without_a_profile_are_one_line(tmp_path, args, msg):
    out = tmp_path / "o"
    p = _run(*BASE, "--out", str(out), *args)     # llama-3-8b has no committed profile
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and msg in lines[0], p.stderr
    assert not out.exists()


def test_lowrank_summary_for_another_layer_count_maps_only_when_named(tmp_path):
    """The profile named with --hit-rate is explicit: a 16-layer summary maps by relative depth onto 32 layers."""
    path = write_profile(tmp_path / "q.csv", model="small", layers=16)
    (tmp_path / "q.summary.json").write_text(json.dumps({
        "model": "small", "shape": {"layers": 16},
        "lowrank_layers": {"rule": "§5.3", "threshold": 0.7, "layers": [3]}}))
    out = tmp_path / "o"
    p = _run(*BASE, "--hit-rate", str(path), "--out", str(out), "--lowrank-layers", "profile")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)["dualdecoder"]
    assert s["lowrank_layers"]["layers"] == [6, 7] and "mapped by relative depth onto llama-3-8b" in \
        s["lowrank_layers"]["note"]


def test_plan_keeps_an_integer_lowrank_layers():
    p = _run("plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "128k", "--lowrank-layers", "profile")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    assert "--lowrank-layers" in p.stderr and "'profile'" in p.stderr


def test_step_layers_takes_a_lowrank_set():
    from ddbench.core.catalog import get_model
    from ddbench.core.errors import DDBenchError
    from ddbench.core.memory import Workload
    from ddbench.core.designs import get_design
    from ddbench.sim.steplayers import step_layers
    from ddbench.sim.factory import cost_model
    m, cm = get_model("llama-3-8b"), cost_model("llama-3-8b", "h200", "pcie5")
    hit = [0.5 + i / 100 for i in range(32)]
    w = Workload(context=131072, lowrank_layers=2)
    given = step_layers(get_design("dualdecoder"), m, cm, w, 4, 131072, hit, hit, lowrank=frozenset({9, 30}))
    worst = step_layers(get_design("dualdecoder"), m, cm, w, 4, 131072, hit, hit)
    assert given.lowrank == {9, 30} and worst.lowrank == {0, 1}
    # mid = the key rebuild (low-rank layers only) + assembling the attended buffer (every layer)
    assert given.mid[9] > given.mid[8] and given.mid[0] == given.mid[8] and worst.mid[0] > given.mid[0]
    # values only (keys rebuilt) on the low-rank layers: half the bytes of the others
    assert given.pf_bytes[9] == pytest.approx(given.pf_bytes[8] / 2)
    with pytest.raises(DDBenchError, match="has 3 layers but the workload counts 2"):
        step_layers(get_design("dualdecoder"), m, cm, w, 4, 131072, hit, hit, lowrank=frozenset({1, 2, 3}))
    with pytest.raises(DDBenchError, match="outside the model's 0..31"):
        step_layers(get_design("dualdecoder"), m, cm, w, 4, 131072, hit, hit, lowrank=frozenset({1, 32}))
    full = step_layers(get_design("shadowkv"), m, cm, w, 4, 131072, hit, hit, lowrank=frozenset({9, 30}))
    assert full.lowrank == set(range(32))
