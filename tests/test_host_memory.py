"""Host memory is a capacity too: pinned host KV per request by design, the hosts' capacities, and the
batch bound by host memory beside GPU memory in plan, the planner's serving runs, simulate and sweep."""

import csv
import io
import json
import math
import os

import pandas as pd
import pytest

from ddbench.core.catalog import HOSTS, NOT_BOUNDED, get_gpu, get_host, get_model, host_memory
from ddbench.core.designs import DESIGNS, get_design
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import BOUND_BOTH, BOUND_GPU, BOUND_HOST, Workload, batch_bounds, host_kv_bytes, max_batch
from ddbench.planner.runs import binding, capacity, run_point
from ddbench.planner.scenario import Scenario, resolve
from ddbench.planner.spec import point_key
from tests.cli import assert_one_line_error, ddbench

GIB = 1 << 30
CTX = 128 * 1024
# Llama-3-8B's shape: 32 layers x 8 KV heads x 128 dims x 2 bytes (bf16), per token and K or V
L, HKV, D, E = 32, 8, 128, 2
KV_128K = L * HKV * D * E * CTX * 2           # K + V of a 128K prompt
V_128K = L * HKV * D * E * CTX                # values only
PLAN = ("plan", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--context", "128k")


# ---------------------------------------------------------------- the memory model
def test_host_kv_bytes_per_design_llama3_8b_128k():
    m, w = get_model("llama-3-8b"), Workload(context=CTX)
    assert (m.num_layers, m.num_kv_heads, m.head_dim, m.dtype_bytes) == (L, HKV, D, E)
    assert KV_128K == 16 * GIB and V_128K == 8 * GIB
    want = {"full-kv": 0, "shadowkv": V_128K, "specache": KV_128K, "ideal": KV_128K}
    for name, design in DESIGNS.items():
        expect = want.get(name, KV_128K)           # dualdecoder and every ablation: K + V
        assert host_kv_bytes(design, m, w) == expect, name
    # the host KV does not depend on the batch, the budget or the chunk
    assert host_kv_bytes(get_design("dualdecoder"), m, Workload(context=CTX, batch=7, budget=1024, chunk=16)) \
        == KV_128K


def test_lowrank_layers_keep_only_values_on_the_host():
    """Adaptive key reconstruction: a low-rank layer rebuilds keys on the GPU, so the host keeps its values."""
    m = get_model("llama-3-8b")
    got = host_kv_bytes(get_design("dualdecoder"), m, Workload(context=CTX, lowrank_layers=8))
    assert got == (24 * 2 + 8) * HKV * D * E * CTX == 14 * GIB


def test_batch_bounds_and_what_binds():
    m, gpu, w = get_model("llama-3-8b"), get_gpu("h100-80gb"), Workload(context=CTX)
    dd = get_design("dualdecoder")
    free = batch_bounds(dd, m, gpu, w)
    assert free.max_batch_host is None and free.max_batch == free.max_batch_gpu == max_batch(dd, m, gpu, w) == 60
    assert free.bound_by == BOUND_GPU
    b = batch_bounds(dd, m, gpu, w, 200 * 10 ** 9)
    assert b.max_batch_host == 200 * 10 ** 9 // KV_128K == 11
    assert b.max_batch == 11 and b.bound_by == BOUND_HOST and b.host_fits(11) and not b.host_fits(12)
    full = batch_bounds(get_design("full-kv"), m, gpu, w, 10 ** 9)        # keeps nothing on the host
    assert full.max_batch_host is None and full.bound_by == BOUND_GPU
    sk = batch_bounds(get_design("shadowkv"), m, gpu, w, 23 * V_128K)     # exactly the GPU's 23
    assert sk.max_batch_gpu == sk.max_batch_host == 23 and sk.bound_by == BOUND_BOTH


# ---------------------------------------------------------------- the host catalog
def test_every_host_has_a_memory_capacity_and_its_source():
    for h in HOSTS.values():
        assert h.host_mem_gb > 0 and h.host_mem_source, h.name
    assert get_host("paper-testbed").host_mem_gb == 1600.0 and "1.6TB" in get_host("paper").host_mem_source
    assert get_host("hgx-h100").host_mem_gb == pytest.approx(2 * 1024 ** 4 / 1e9)      # DGX H100: 2 TB (2 TiB)
    assert "datasheet" in get_host("dgx-h100").host_mem_source
    hm = host_memory("paper-testbed", None)
    assert hm.bytes_per_gpu == 200 * 10 ** 9 and "8 GPUs, all serving" in hm.note and hm.host == "paper-testbed"
    over = host_memory("paper-testbed", 50)
    assert over.bytes_per_gpu == 50 * 10 ** 9 and "--host-mem" in over.note
    assert host_memory(None, None) is None
    for bad in (0, -1.0, math.nan, math.inf, True):
        with pytest.raises(DDBenchError, match="host memory must be a positive number"):
            host_memory(None, bad)


# ---------------------------------------------------------------- plan (memory answer)
def test_plan_host_memory_binds_on_the_paper_testbed():
    """1.6 TB for 8 GPUs: 200 GB per GPU, 11 DualDecoder requests at 128K (16 GiB each), not 60."""
    r = ddbench(*PLAN, "--design", "all", "--host", "paper-testbed", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["host_memory"]["bytes_per_gpu"] == 200 * 10 ** 9 and out["host_memory"]["host"] == "paper-testbed"
    rows = {s["system"]: s for s in out["systems"]}
    dd = rows["dualdecoder"]
    assert dd["host_bytes_per_request"] == KV_128K
    assert (dd["max_batch_gpu"], dd["max_batch_host"], dd["max_batch"], dd["bound_by"]) == (60, 11, 11, BOUND_HOST)
    assert dd["breakdown_batch"] == 11 and dd["fits"] and dd["host_bytes"] == 11 * KV_128K
    assert rows["shadowkv"]["host_bytes_per_request"] == V_128K and rows["shadowkv"]["max_batch_host"] == 23
    assert rows["specache"]["max_batch"] == 11 and rows["specache"]["bound_by"] == BOUND_HOST
    assert rows["full-kv"]["max_batch_host"] is None and rows["full-kv"]["bound_by"] == BOUND_GPU
    t = ddbench(*PLAN, "--design", "all", "--host", "paper-testbed", "--verbose")   # the wide table
    assert t.returncode == 0, t.stderr
    lines = t.stdout.splitlines()
    assert lines[0].endswith("host memory: 200.0 GB per GPU") and "bound by" in lines[1]
    row = next(ln.split() for ln in lines if ln.startswith("dualdecoder"))
    assert row[1:5] == ["11", "host", "60", "11"] and row[-1] == "17.18"
    assert any(x.startswith("host memory: 200.0 GB per GPU (paper-testbed: 1600 GB / 8 GPUs, all serving") for x in lines)


def test_plan_gpu_memory_binds_where_the_host_is_large():
    """ShadowKV keeps only values on the host: on an HGX H100 (2 TiB / 8 GPUs) the GPU binds first."""
    r = ddbench(*PLAN, "--design", "shadowkv,full-kv", "--host", "hgx-h100", "--csv")
    assert r.returncode == 0, r.stderr
    rows = {x["system"]: x for x in csv.DictReader(io.StringIO(r.stdout))}
    sk = rows["shadowkv"]
    assert int(sk["max_batch_gpu"]) == int(sk["max_batch"]) == 23 and int(sk["max_batch_host"]) == 32
    assert sk["bound_by"] == BOUND_GPU and int(sk["host_bytes_per_request"]) == V_128K
    assert rows["full-kv"]["max_batch_host"] == "" and rows["full-kv"]["bound_by"] == BOUND_GPU


def test_plan_without_host_memory_is_unbounded_and_unchanged():
    r = ddbench(*PLAN, "--design", "all", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["host_memory"] is None and out["host_memory_note"] == NOT_BOUNDED
    for s in out["systems"]:
        assert s["max_batch_host"] is None and s["bound_by"] == BOUND_GPU and s["max_batch"] == s["max_batch_gpu"]
    assert {s["system"]: s["max_batch"] for s in out["systems"]} == \
        {"full-kv": 3, "shadowkv": 23, "specache": 20, "dualdecoder": 60, "dualdecoder-cache": 40}
    t = ddbench(*PLAN, "--design", "all")
    assert t.stdout.splitlines()[-1] == f"host memory: {NOT_BOUNDED}"


def test_plan_host_mem_overrides_and_a_batch_over_it_does_not_fit():
    r = ddbench(*PLAN, "--design", "dualdecoder", "--host", "paper-testbed", "--host-mem", "40", "--json")
    assert r.returncode == 0, r.stderr
    dd = json.loads(r.stdout)["systems"][0]
    assert dd["max_batch_host"] == 2 and dd["max_batch"] == 2
    r = ddbench(*PLAN, "--design", "dualdecoder", "--host", "paper-testbed", "--batch", "20", "--json")
    assert r.returncode == 3, r.stderr
    out = json.loads(r.stdout)
    dd = out["systems"][0]
    assert dd["status"] == "does-not-fit" and dd["fits_gpu"] and not dd["fits_host"]
    assert "200.0 GB of host memory" in out["verdict"]
    t = ddbench(*PLAN, "--design", "dualdecoder", "--host", "paper-testbed", "--batch", "20")
    assert t.returncode == 3 and "host OOM" in t.stdout and "no fit: no design fits batch 20" in t.stdout


@pytest.mark.parametrize("value, message", [("0", "must be above 0"), ("-5", "must be above 0"),
                                            ("nan", "must be finite"), ("inf", "must be finite"),
                                            ("", "is not a number"), ("lots", "is not a number")])
def test_host_mem_flag_values(value, message, tmp_path):
    for argv in (PLAN, ("simulate", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--out", "o"), ("sweep", "s.yaml")):
        assert_one_line_error(ddbench(*argv, "--host-mem", value, cwd=tmp_path), contains=message)
    assert os.listdir(tmp_path) == []


def test_host_memory_smaller_than_one_request_is_bad_input(tmp_path):
    msg = "one dualdecoder request at context 128K pins 17.2 GB of KV in host memory, more than the 10.0 GB"
    assert_one_line_error(ddbench(*PLAN, "--host-mem", "10", "--design", "dualdecoder", cwd=tmp_path), contains=msg)
    assert_one_line_error(ddbench(*PLAN, "--host-mem", "10", "--slo", "p99-tpot=1s", "--design", "shadowkv,dualdecoder",
                                  cwd=tmp_path), contains=msg)
    # --design all: the first design whose host KV does not fit is named (SpeCache keeps K + V there too)
    assert_one_line_error(ddbench(*PLAN, "--host-mem", "10", cwd=tmp_path), contains="one specache request")
    assert_one_line_error(ddbench("simulate", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--context", "128k",
                                  "--host-mem", "10", "--out", "o", cwd=tmp_path), contains=msg)
    assert os.listdir(tmp_path) == []     # nothing written
    # full-kv keeps nothing on the host: any host memory holds it
    r = ddbench(*PLAN, "--host-mem", "1", "--design", "full-kv", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["systems"][0]["max_batch"] == 3


# ---------------------------------------------------------------- the planner's serving runs
SERVE = dict(model="llama-3-8b", gpu="h100-80gb", design="dualdecoder", context="128k", output="16",
             prefill="elsewhere", requests=40)


def test_serving_admission_is_capped_by_host_memory():
    free, capped = Scenario(**SERVE), Scenario(**SERVE, host_mem_gb=40)
    assert resolve(free).host_cap is None and resolve(capped).host_cap == 2 == resolve(capped).batch_cap
    cap = capacity(capped)
    assert (cap["max_batch"], cap["max_batch_gpu"], cap["max_batch_host"], cap["bound_by"]) == \
        (2, 60, 2, "host memory")
    assert capacity(free)["max_batch"] == 60 and capacity(free)["bound_by"] == "gpu memory"
    rate = 50.0                                        # far above what two requests at a time serve
    row = run_point(capped, rate)
    assert row["mean_batch"] <= 2.0 + 1e-9 and row["batch_p90"] <= 2
    assert binding(capped, row) == "host memory"
    assert run_point(free, rate)["mean_batch"] > 2
    # --max-batch below the host cap: the batch cap binds
    both = Scenario(**SERVE, host_mem_gb=40, max_batch=1)
    assert resolve(both).batch_cap == 1 and capacity(both)["bound_by"] == "batch cap"


def test_uniform_contexts_cap_at_the_longest():
    sc = Scenario(**dict(SERVE, context="uniform:64k:128k"), host="paper-testbed")
    assert resolve(sc).max_context == CTX and resolve(sc).host_cap == 11


def test_serving_point_where_no_request_fits_in_host_memory():
    row = run_point(Scenario(**SERVE, host_mem_gb=10), 1.0)
    assert row["completed"] == 0 and row["rejected"] == 40 and not row["sustainable"]


# ---------------------------------------------------------------- simulate
def test_simulate_records_the_host_bound(tmp_path):
    out = tmp_path / "o"
    r = ddbench("simulate", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--design", "dualdecoder", "--context",
                "128k", "--output", "16", "--rate", "50", "--requests", "30", "--prefill-elsewhere",
                "--host", "paper-testbed", "--out", str(out))
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    h = s["host_memory"]
    assert (h["max_batch_gpu"], h["max_batch_host"], h["max_batch"], h["bound_by"]) == (60, 11, 11, "host memory")
    assert h["bytes_per_gpu"] == 200 * 10 ** 9 and h["host_bytes_per_request"] == KV_128K
    assert pd.read_csv(out / "steps.csv").batch.max() <= 11
    assert "max batch 11 (GPU 60, host 11: host memory)" in " ".join(r.stdout.split())   # wrapped at 120
    r = ddbench("simulate", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--context", "128k", "--output", "16",
                "--requests", "5", "--out", str(tmp_path / "free"), "--json")
    s = json.loads(r.stdout)["dualdecoder"]
    assert s["host_memory"]["bytes_per_gpu"] is None and s["host_memory"]["note"] == NOT_BOUNDED
    assert s["host_memory"]["max_batch_host"] is None and s["host_memory"]["bound_by"] == "gpu memory"


def test_simulate_timeline_batch_over_host_memory_does_not_fit(tmp_path):
    r = ddbench("simulate", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--context", "128k", "--batch", "20",
                "--steps", "3", "--host-mem", "200", "--out", str(tmp_path / "o"))
    assert r.returncode == 3, r.stderr
    assert "its host KV needs 343.6 GB of the 200.0 GB of host memory" in r.stdout.splitlines()[0]
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["status"] == "does-not-fit" and not s["fits"] and s["host_memory"]["max_batch_host"] == 11


# ---------------------------------------------------------------- sweep
SPEC = """name: hostmem
requests: 20
grid:
  model: llama-3-8b
  gpu: h100-80gb
  design: [dualdecoder, full-kv]
  context: 128k
  output: "16"
  prefill: elsewhere
  host_mem_gb: [null, 10, 40]
  rate: 1
"""


def test_sweep_host_mem_gb(tmp_path):
    (tmp_path / "s.yaml").write_text(SPEC)
    r = ddbench("sweep", "s.yaml", "--out", "out", "--workers", "1", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(tmp_path / "out" / "results.csv")
    assert len(df) == 6
    dd = df[df.system == "dualdecoder"].set_index(df[df.system == "dualdecoder"].host_mem_gb.fillna(0))
    assert dd.loc[10, "status"] == "does-not-fit" and dd.loc[10, "max_batch_host"] == 0
    assert dd.loc[10, "bound_by"] == "host memory" and dd.loc[10, "binding"] == "host memory"
    assert dd.loc[40, "status"] == "ok" and dd.loc[40, "max_batch_host"] == 2 and dd.loc[40, "max_batch_fit"] == 2
    assert dd.loc[0, "status"] == "ok" and pd.isna(dd.loc[0, "max_batch_host"]) and dd.loc[0, "max_batch_fit"] == 60
    assert set(dd.host_bytes_per_request) == {KV_128K}
    full = df[df.system == "full-kv"]
    assert set(full.status) == {"ok"} and set(full.host_bytes_per_request) == {0}
    # --host-mem replaces the grid's host_mem_gb at every point
    r = ddbench("sweep", "s.yaml", "--out", "out2", "--workers", "1", "--quiet", "--host-mem", "100", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(tmp_path / "out2" / "results.csv")
    assert len(df) == 2 and set(df.host_mem_gb) == {100.0}
    assert df.set_index("system").max_batch_fit.to_dict() == {"dualdecoder": 5, "full-kv": 3}


def test_sweep_keys_of_points_without_host_memory_are_unchanged():
    import hashlib
    p = {"model": "llama-3-8b", "rate": 1.0, "host_mem_gb": None}
    old = hashlib.sha1(json.dumps({"model": "llama-3-8b", "rate": 1.0}, sort_keys=True).encode()).hexdigest()[:16]
    assert point_key(p) == old and point_key(dict(p, host_mem_gb=40.0)) != old


@pytest.mark.parametrize("value, message", [("0", "greater than 0"), ("-1", "greater than 0"),
                                            (".nan", "must be finite"), ("''", "grid.host_mem_gb[0]")])
def test_sweep_spec_host_mem_gb_values(value, message, tmp_path):
    (tmp_path / "s.yaml").write_text(SPEC.replace("host_mem_gb: [null, 10, 40]", f"host_mem_gb: {value}"))
    line = assert_one_line_error(ddbench("sweep", "s.yaml", cwd=tmp_path), contains="grid.host_mem_gb[0]")
    assert message in line
