"""The simulator's accuracy-profile reader (sim/hitrates.py) on synthetic profiles in the profiler's schema."""

import csv
import json

import pytest

from ddbench.core.errors import DDBenchError
from ddbench.sim import hitrates as P

# the profiler's schema (ddbench/profile/trace.py, schema 1)
COLUMNS = ["layer", "context_tokens", "task", "init", "temperature", "top_p", "budget_tokens", "chunk_tokens",
           "local_tokens", "hit_rate", "reuse_hit_rate", "union_hit_rate", "new_pred_share", "token_acc", "n",
           "model", "model_sha256", "transformers_version", "torch_version", "git_sha", "date", "command"]
PROV = {"model_sha256": "0123456789abcdef", "transformers_version": "5.0", "torch_version": "2.13.0",
        "git_sha": "abc123", "date": "2026-11-30T00:00:00+00:00", "command": "ddbench profile --layer-accuracy"}


def rates(layer, layers, init, temp, task, budget=1024):
    """A made-up but structured profile: deeper layers predict better, random init, heat and a smaller
    budget worse."""
    base = 0.6 + 0.3 * layer / (layers - 1) + (0.05 if budget > 1024 else 0.0)
    hit = base - (0.2 if init == "random" else 0.0) - (0.0 if temp == 0.0 else 0.1 * temp) - (0.02 if task == "b" else 0)
    if init == "t2" and temp == 0.0:
        hit = 1.0
    return round(hit, 6), round(base - 0.15, 6)


def write_profile(path, model="tiny-llama", layers=6, inits=("t2", "random"), temps=(0.0, 0.6, 1.0),
                  contexts=(2048, 4096), tasks=("a", "b"), budgets=(1024, 1536), n=64, extra=None):
    rows = []
    for ctx in contexts:
        for task in tasks:
            for init in inits:
                for t in temps:
                    for b in budgets:
                        for layer in range(layers):
                            hit, reuse = rates(layer, layers, init, t, task, b)
                            rows.append({"layer": layer, "context_tokens": ctx, "task": task, "init": init,
                                         "temperature": t, "top_p": 1.0, "budget_tokens": b, "chunk_tokens": 8,
                                         "local_tokens": 64, "hit_rate": hit, "reuse_hit_rate": reuse,
                                         "union_hit_rate": max(hit, reuse), "new_pred_share": 0.1,
                                         "token_acc": 0.5, "n": n * (2 if ctx == 4096 else 1), "model": model,
                                         **PROV})
    if extra:
        rows += extra
    with open(path, "w", newline="") as fh:
        fh.write("# provenance: synthetic test fixture\n")
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return path


def test_default_selection_is_t2_at_temperature_06(tmp_path):
    prof = P.read_hitrates(write_profile(tmp_path / "m.csv"))
    assert prof.layers == 6 and prof.model == "tiny-llama"
    # t2, T=0.6, tasks a and b averaged (n-weighted, equal n per task): base - 0.06 - 0.01
    for i, h in enumerate(prof.hit):
        assert h == pytest.approx(0.6 + 0.3 * i / 5 - 0.06 - 0.01)
    assert "init t2" in prof.selection and "temperature 0.6" in prof.selection
    assert "tasks a, b averaged" in prof.selection and "contexts 2048/4096 averaged" in prof.selection
    assert "budget 1024 (50%/25% of the context) (the smallest measured)" in prof.selection
    wide = P.read_hitrates(tmp_path / "m.csv", P.Select(budget=1536))
    assert wide.hit[0] == pytest.approx(prof.hit[0] + 0.05)
    every = P.read_hitrates(tmp_path / "m.csv", P.Select(budget=None))
    assert every.hit[0] == pytest.approx(prof.hit[0] + 0.025) and "budget 1024/1536" in every.selection


def test_filters_change_the_rates(tmp_path):
    path = write_profile(tmp_path / "m.csv")
    t2 = P.read_hitrates(path, P.Select(task="a"))
    rnd = P.read_hitrates(path, P.Select(init="random", task="a"))
    greedy = P.read_hitrates(path, P.Select(temperature=0.0, task="a"))
    assert all(h == pytest.approx(r + 0.2) for h, r in zip(t2.hit, rnd.hit))
    assert greedy.hit == (1.0,) * 6                      # greedy + T2: the speculative token is the next token
    assert P.read_hitrates(path, P.Select(context=2048)).rows == 12
    assert "task a" in t2.selection


def test_rows_weighted_by_n(tmp_path):
    path = write_profile(tmp_path / "m.csv", tasks=("a",), contexts=(4096,))
    extra_path = tmp_path / "w.csv"
    # the same profile plus one heavy row for layer 0 at a different rate
    extra = [{"layer": 0, "context_tokens": 4096, "task": "a", "init": "t2", "temperature": 0.6, "top_p": 1.0,
              "budget_tokens": 1024, "chunk_tokens": 8, "local_tokens": 64, "hit_rate": 0.0, "reuse_hit_rate": 0.0,
              "union_hit_rate": 0.0, "new_pred_share": 0.0, "token_acc": 0.0, "n": 384, "model": "tiny-llama",
              **PROV}]
    write_profile(extra_path, tasks=("a",), contexts=(4096,), extra=extra)
    base = P.read_hitrates(path).hit[0]
    assert P.read_hitrates(extra_path).hit[0] == pytest.approx(base * 128 / (128 + 384))


def test_missing_filter_value_lists_what_the_file_has(tmp_path):
    path = write_profile(tmp_path / "m.csv", temps=(0.0, 1.0))
    with pytest.raises(DDBenchError, match=r"no rows for temperature 0.6 \(it has 0, 1\)"):
        P.read_hitrates(path)
    with pytest.raises(DDBenchError, match="no rows for task zzz"):
        P.read_hitrates(path, P.Select(temperature=1.0, task="zzz"))


def test_old_two_column_profile_still_reads(tmp_path):
    path = tmp_path / "old.csv"
    path.write_text("layer,hit_rate\n0,0.5\n1,0.7\n1,0.9\n")
    prof = P.read_hitrates(path)
    assert prof.hit == (0.5, 0.8) and prof.reuse == prof.hit
    assert "no init column" in prof.selection and "no temperature column" in prof.selection


def test_default_lookup_never_uses_another_models_profile(tmp_path, monkeypatch):
    (tmp_path / "accuracy").mkdir()
    write_profile(tmp_path / "accuracy" / "llama-3-8b.csv", model="smollm2-135m", layers=30)
    monkeypatch.setenv("DDBENCH_DATA", str(tmp_path))
    with pytest.raises(DDBenchError, match=r"measured on smollm2-135m \(30 layers\) but llama-3-8b has 32.*--hit-rate"):
        P.resolve(None, "llama-3-8b", 32)
    # absent: the paper's constant, and the note says so
    hit, reuse, note = P.resolve(None, "qwen2.5-32b", 64)
    assert hit == [0.88] * 64 and "no traces/accuracy/qwen2.5-32b.csv" in note


def test_default_lookup_uses_own_profile(tmp_path, monkeypatch):
    (tmp_path / "accuracy").mkdir()
    write_profile(tmp_path / "accuracy" / "llama-3-8b.csv", model="llama-3-8b", layers=32)
    monkeypatch.setenv("DDBENCH_DATA", str(tmp_path))
    hit, reuse, note = P.resolve(None, "llama-3-8b", 32)
    assert len(hit) == 32 and hit[0] < hit[-1] and reuse[0] == pytest.approx(0.45)
    assert "measured on llama-3-8b (32 layers)" in note and "init t2, temperature 0.6" in note
    assert "mapped" not in note


def test_explicit_profile_maps_by_relative_depth(tmp_path):
    path = write_profile(tmp_path / "smol.csv", model="SmolLM2-135M-Instruct", layers=30)
    src = P.read_hitrates(path)
    hit, reuse, note = P.resolve(str(path), "qwen2.5-32b", 64)
    assert len(hit) == 64
    assert hit[0] == src.hit[0] and hit[-1] == src.hit[-1]
    assert hit[32] == src.hit[15]                 # the middle maps to the middle
    assert all(a <= b for a, b in zip(hit, hit[1:]))
    assert ("measured on SmolLM2-135M-Instruct (30 layers), mapped by relative depth onto qwen2.5-32b"
            " (64 layers)") in note
    # fewer target layers: still the same relative depth
    assert P.map_depth(list(range(30)), 3) == [5.0, 15.0, 25.0]
    # the mean of a mapped profile stays close to the source's
    assert sum(hit) / 64 == pytest.approx(src.hit_mean, abs=0.01)


@pytest.mark.parametrize("bad,where", [
    ("hit_rate", "field hit_rate: is not a number, got 'x'"),
    ("range", "field reuse_hit_rate: must be <= 1.0, got '1.5'"),
    ("layer", "field layer: is not an integer, got '1.5'"),
    ("fields", "3 fields, the header has 22"),
])
def test_malformed_profile_names_file_line_field(tmp_path, bad, where):
    path = write_profile(tmp_path / "m.csv", contexts=(4096,), tasks=("a",), temps=(0.6,), inits=("t2",))
    lines = path.read_text().splitlines()
    cells = lines[4].split(",")                   # line 5 of the file (comment, header, 3 rows before it)
    if bad == "hit_rate":
        cells[COLUMNS.index("hit_rate")] = "x"
    elif bad == "range":
        cells[COLUMNS.index("reuse_hit_rate")] = "1.5"
    elif bad == "layer":
        cells[COLUMNS.index("layer")] = "1.5"
    else:
        cells = cells[:3]
    lines[4] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DDBenchError) as exc:
        P.read_hitrates(path)
    msg = str(exc.value)
    assert "\n" not in msg and str(path) in msg and "line 5" in msg and where in msg


def test_missing_column_and_missing_layer(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("# comment\nlayer,reuse_hit_rate\n0,0.5\n")
    with pytest.raises(DDBenchError, match=r"m.csv line 2: missing column\(s\) hit_rate"):
        P.read_hitrates(path)
    path.write_text("layer,hit_rate\n0,0.5\n2,0.5\n")
    with pytest.raises(DDBenchError, match=r"no rows for layers \[1\]"):
        P.read_hitrates(path)


def write_summary(path, model="SmolLM2-135M-Instruct", layers=30, lowrank=(0, 1, 7)):
    path.write_text(json.dumps({"schema": 1, "model": model, "shape": {"layers": layers},
                                "lowrank_layers": {"rule": "§5.3: layers whose mean hit rate is below the threshold",
                                                   "threshold": 0.7, "basis": "init t2, temperature > 0",
                                                   "layers": list(lowrank)}}))
    return path


def test_lowrank_from_summary(tmp_path):
    write_summary(tmp_path / "smol.summary.json")
    same, note = P.lowrank_from_summary(str(tmp_path / "smol.csv"), 30)
    assert same == {0, 1, 7} and "below the threshold, threshold 0.7; basis init t2" in note
    mapped, note = P.lowrank_from_summary(str(tmp_path / "smol.csv"), 60, target="m60")
    assert mapped == {0, 1, 2, 3, 14, 15} and "mapped by relative depth onto m60 (60 layers)" in note
    with pytest.raises(DDBenchError, match="60"):
        P.lowrank_from_summary(str(tmp_path / "smol.csv"), 60, explicit=False)
    (tmp_path / "bad.summary.json").write_text('{"shape": {"layers": 30}, "lowrank_layers": {"layers": [31]}}')
    with pytest.raises(DDBenchError, match=r"bad.summary.json: field lowrank_layers.layers: outside 0..29"):
        P.lowrank_from_summary(str(tmp_path / "bad.csv"), 30)


def test_lowrank_by_threshold_and_plan_agree_on_lowest_layers():
    from ddbench.core.catalog import get_model
    from ddbench.core.memory import Workload
    from ddbench.core.designs import get_design
    from ddbench.sim.steplayers import lowrank_layers
    hit = [0.9, 0.5, 0.95, 0.6, 0.99, 0.65]
    by_rule = P.lowrank_by_threshold(hit, 0.7)
    assert by_rule == {1, 3, 5}
    m = get_model("llama-3-8b")
    hit32 = hit + [0.99] * (m.num_layers - len(hit))
    chosen = lowrank_layers(get_design("dualdecoder"), m, Workload(context=131072, lowrank_layers=len(by_rule)), hit32)
    assert chosen == P.lowrank_by_threshold(hit32, 0.7)
