"""Tensor parallelism (issue 46) against hand-computed cases: one rank's shard of the model and its memory, KV
heads replicated where they are fewer than the ranks, a host whose DRAM binds before its links, the
all-reduce's price from the published table, and bad --tp values as one line, exit 2."""

import json
import math
import re

import pytest

from tests.cli import in_process as _run
from ddbench.core.catalog import get_model
from ddbench.core.catalog.interconnect import interconnect_of
from ddbench.core.designs import get_design
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import host_kv_bytes, memory_breakdown
from ddbench.core.tp import check_tp, kv_replication, rank_model
from ddbench.core.workload import Workload
from ddbench.planner.scenario import Scenario, resolve

CONFIG = {"num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 2, "hidden_size": 4096,
          "head_dim": 128, "intermediate_size": 8192, "vocab_size": 32000, "max_position_embeddings": 131072,
          "model_type": "llama"}



@pytest.fixture
def few_kv(tmp_path):
    """A model with 2 KV heads: at TP 8 each KV head sits on 4 ranks."""
    p = tmp_path / "fewkv" / "config.json"
    p.parent.mkdir()
    p.write_text(json.dumps(CONFIG))
    return str(p)


def test_fewer_kv_heads_than_tp_replicates_them(few_kv):
    m = get_model(few_kv)
    r = rank_model(m, 8)
    assert (r.num_heads, r.num_kv_heads, r.intermediate, r.vocab) == (4, 1, 1024, 4000)
    assert kv_replication(m, 8) == 4
    # hand-computed weights of one rank, bf16: untied embedding and head V/8 * h each, per layer q/o 4 heads,
    # k/v 1 head, MLP 3 * h * I/8, two norms; the final norm
    per_layer = 4096 * (4 * 128 + 2 * 128) + 4 * 128 * 4096 + 3 * 4096 * 1024 + 2 * 4096
    assert r.weight_bytes == 2 * (2 * 4000 * 4096 + 4 * per_layer + 4096)
    w = Workload(context=65536, batch=3, rank=128)    # one rank factorises one KV head: rank <= d
    # full-kv keeps the whole context of its one (replicated) KV head: b * (S + gen + 2) * L * 2 * 1 * d * 2
    bd = memory_breakdown(get_design("full-kv"), r, get_gpu("h200"), w)
    assert bd.resident_kv == 3 * (65536 + w.gen_tokens + 2) * 4 * 2 * 1 * 128 * 2
    # dualdecoder pins its head's K and V on the host: S * L * 2 * 1 * d * 2 per request, per rank
    assert host_kv_bytes(get_design("dualdecoder"), r, w) == 65536 * 4 * 2 * 128 * 2


def get_gpu(name):
    from ddbench.core.catalog import get_gpu as g
    return g(name)


def test_tp_must_divide_heads_and_kv_heads():
    m = get_model("llama-3-70b")
    for tp in (1, 2, 4, 8):
        check_tp(m, tp)
    with pytest.raises(DDBenchError, match="does not divide llama-3-70b's 64 attention heads"):
        check_tp(m, 3)
    q7 = get_model("qwen2.5-7b")          # 28 heads, 4 KV heads: TP 8 divides neither
    with pytest.raises(DDBenchError, match="28 attention heads"):
        check_tp(q7, 8)


def test_host_dram_binds_before_the_links(tmp_path):
    """8 GPUs each on its own PCIe 5 root port (55.4 GB/s), DRAM 200 GB/s: 0.8 * 200 / 8 = 20 GB/s per GPU."""
    host = tmp_path / "thin-dram.yaml"
    host.write_text("name: thin-dram\ngpu: h200\ngpus: 8\ngpus_per_switch: 1\nlink: pcie5\nhost_mem_gbps: 200\n"
                    "host_mem_gb: 1000\n")
    r = resolve(Scenario.make(model="llama-3-70b", gpu="h200", design="dualdecoder", context="64k",
                              host=str(host), tp=8))
    assert r.share.limit == "host memory"
    assert r.link.achievable_gbps == pytest.approx(0.8 * 200 / 8)
    assert r.host_mem.bytes_per_gpu == int(1000 / 8 * 1e9)       # every GPU's requests share the host's memory
    # each rank pins its own KV head's share: S * L * 2 * 1 * d * 2 bytes per request
    assert r.bounds(65536).host_bytes_per_request == 65536 * 80 * 2 * 1 * 128 * 2


def test_allreduce_from_the_published_table():
    comm = interconnect_of("h200")
    assert comm.provenance == "published" and "nccl-tests" in comm.source
    # TP 8, one decode token of hidden 8192 in bf16: 16 KB, priced as the 4-rank table at 16384 * 1.75 / 1.5 bytes,
    # between its 16 KB (16.19 us) and 64 KB (16.76 us) rows
    x = 16384 * 1.75 / 1.5
    want = (16.19 + (16.76 - 16.19) * (x - 16384) / (65536 - 16384)) * 1e-6
    assert comm.allreduce_s(16384, 8, 55.4) == pytest.approx(want, rel=1e-12)
    assert comm.allreduce_s(16384, 1, 55.4) == 0.0
    assert interconnect_of("l40s").provenance == "estimated"


def test_decode_step_adds_two_allreduces_per_layer():
    from ddbench.sim.steplayers import step_layers
    r = resolve(Scenario.make(model="llama-3-70b", gpu="h200", design="full-kv", context="64k", tp=8))
    cm = r.cm
    w = r.workload
    plan = step_layers(r.design, r.model, cm, w, 4, 65536, r.hit, r.reuse)
    comm = cm.comm
    cm.comm, cm.tp = None, 1
    try:
        base = step_layers(r.design, r.model, cm, w, 4, 65536, r.hit, r.reuse)
    finally:
        cm.comm, cm.tp = comm, 8
    ar = comm.allreduce_s(4 * 8192 * 2, 8, r.link.achievable_gbps)
    assert plan.post[0] - base.post[0] == pytest.approx(2 * ar, rel=1e-9)
    assert plan.compute_s - base.compute_s == pytest.approx(80 * 2 * ar, rel=1e-9)


@pytest.mark.parametrize("argv,needle", [
    (["--tp", "0"], "positive integer"),
    (["--tp", "3"], "does not divide llama-3-70b's 64 attention heads"),
    (["--tp", "16", "--host", "hgx-h200"], "host hgx-h200 has 8 GPUs"),
    (["--tp", "2.5"], "positive integer"),
    (["--tp", "four"], "positive integer"),
])
def test_bad_tp_is_one_line_exit_2(argv, needle, capsys):
    rc, out, err = _run(["plan", "--model", "llama-3-70b", "--gpu", "h200", "--context", "64k"] + argv, capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in err and out == ""


def test_seventy_b_memory_answer_is_sharded(capsys):
    rc, out, err = _run(["plan", "--model", "llama-3-70b", "--gpu", "h200", "--context", "64k", "--tp", "8",
                         "--design", "all", "--json"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["tp"] == 8
    weights = {s["bytes"]["weights"] for s in d["systems"]}
    assert weights == {rank_model(get_model("llama-3-70b"), 8).weight_bytes}
    fk = next(s for s in d["systems"] if s["system"] == "full-kv")
    assert fk["max_batch"] >= 40            # 1.0 instead of 0 at TP 1: 17.6 GB of weights per GPU
    assert "nccl-tests" in d["tp_detail"]["source"] and d["tp_detail"]["provenance"] == "published"


def test_weights_over_one_gpu_take_tp_auto(capsys):
    rc, out, err = _run(["plan", "--model", "llama-3-70b", "--gpu", "h100-80gb", "--context", "32k",
                         "--design", "full-kv"], capsys)
    assert rc == 0, err
    first, second = out.splitlines()[:2]
    assert first.startswith("full-kv, TP 2:") or first.startswith("full-kv, TP 4:")
    assert "exceed one h100-80gb" in second and "--tp" in second


def test_no_default_line_over_120(capsys):
    for argv in (["plan", "--model", "llama-3-70b", "--gpu", "h200", "--context", "64k", "--tp", "8", "--design",
                  "every"],
                 ["plan", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--context", "128k", "--host",
                  "paper-testbed"]):
        rc, out, err = _run(argv, capsys)
        assert rc == 0, err
        assert max(len(x) for x in out.splitlines()) <= 120


def test_trained_context_warning(capsys):
    rc, out, err = _run(["plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "1m", "--design",
                         "dualdecoder"], capsys)
    assert any(x.startswith("warning: context 1M is beyond llama-3-8b's trained context 8K") for x in
               out.splitlines()[:3]), out
    rc, out, err = _run(["plan", "--model", "llama-3.1-8b", "--gpu", "h200", "--context", "64k", "--design",
                         "dualdecoder"], capsys)
    assert "warning" not in out


def test_deploy_flags_only_where_supported(capsys):
    rc, out, err = _run(["plan", "--model", "llama-3-70b", "--gpu", "h200", "--context", "64k", "--tp", "4",
                         "--design", "full-kv,lru-cache,dualdecoder"], capsys)
    assert rc == 0, err
    lines = out.splitlines()
    assert any("--tensor-parallel-size 4" in x and "--tp-size 4" in x for x in lines)
    hisparse = [x for x in lines if "HiSparse" in x]
    assert hisparse and "DeepSeek Sparse Attention" in hisparse[0] and "no command" in hisparse[0]
    assert not any("--hisparse-config" in x for x in lines)     # never a command that would not run


def test_replicas_count_gpus():
    """The serving rate is one replica's: GPUs for a target are replicas x TP."""
    from ddbench.planner.fleet import fleet
    sc = Scenario.make(model="llama-3-70b", gpu="h200", design="shadowkv", context="64k", output="64", tp=4,
                       host="hgx-h200", prefill="elsewhere", requests=50)
    f = fleet(sc, 0.5, 10.0, 0, target_rate=2.0)
    assert f["decode_gpus"] == 4 * math.ceil(2.0 / 0.5)
    assert f["prefill_gpus"] % 4 == 0 and f["fleet_gpus"] == f["decode_gpus"] + f["prefill_gpus"]


def test_sweep_grid_takes_tp(tmp_path):
    """A sweep point at TP 8 is one replica of Llama-3-70B on an HGX H200 (its GPU's usual host); at TP 1 (or no
    tp:) it is the whole model on one GPU, its key unchanged."""
    from ddbench.planner.spec import load_spec, point_key, points, scenario_of
    spec = tmp_path / "s.yaml"
    spec.write_text("name: t\nrequests: 20\ngrid:\n  model: llama-3-70b\n  gpu: h200\n  tp: [null, 8]\n"
                    "  system: dualdecoder\n  context: 64k\n  output: '64'\n  rate: 0.5\n")
    pts = points(load_spec(str(spec)))
    one, eight = (scenario_of(p) for p in pts)
    assert (one.tp, one.host) == (1, None) and (eight.tp, eight.host) == (8, "hgx-h200")
    assert point_key(pts[0]) == point_key({k: v for k, v in pts[0].items() if k != "tp"})
    r = resolve(eight)
    assert r.model.num_kv_heads == 1 and r.model.weight_bytes == rank_model(get_model("llama-3-70b"), 8).weight_bytes


def test_long_context_default_answers_with_prefill_on_separate_gpus(capsys):
    """The issue's question: Qwen2.5-14B at 128K, p99 TPOT <= 80 ms, TTFT <= 30 s, 10 req/s. The default command
    searches both placements: the first line is the answer with decode and prefill GPUs and their hosts, the
    second says prefill on the decode GPU binds, and no line is over 120 characters."""
    rc, out, err = _run(["plan", "--model", "qwen2.5-14b", "--gpu", "h100-80gb", "--context", "128k", "--output",
                         "256", "--slo", "p99-tpot=80ms,p99-ttft=30s", "--target-rate", "10", "--design", "shadowkv",
                         "--requests", "300", "--max-runs", "6"], capsys)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("shadowkv TP1 batch ") and " req/s/GPU; " in lines[0] and "p99 TPOT" in lines[0]
    assert lines[1].startswith("prefill on the decode GPU binds:")
    fleet = next(x for x in lines if x.startswith("fleet: "))
    n, dec, pre, hosts = (int(v) for v in re.match(r"fleet: (\d+) GPUs: (\d+) decode \+ (\d+) prefill on (\d+) hosts",
                                                   fleet).groups())
    assert n == dec + pre and pre > dec and hosts == math.ceil(dec / 8) + math.ceil(pre / 8)
    assert f"; {n} GPUs, {hosts} hosts; " in lines[0]
    assert max(len(x) for x in lines) <= 120


def test_tp_auto_with_an_slo_keeps_the_tp_with_most_requests_per_gpu(capsys):
    """--tp auto with an SLO searches every TP that shards the model on its host and keeps the best per GPU."""
    rc, out, err = _run(["plan", "--model", "llama-3-70b", "--gpu", "h200", "--context", "32k", "--output", "64",
                         "--slo", "p99-tpot=200ms", "--design", "dualdecoder", "--prefill", "elsewhere", "--tp", "auto",
                         "--requests", "60", "--max-runs", "4", "--json"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    tried = {t["tp"]: t["req_per_s_per_gpu"] for t in d["tp_auto"]}
    assert sorted(tried) == [1, 2, 4, 8]
    assert d["tp"]["tp"] == max(tried, key=tried.get)
    assert d["answer"].startswith(f"dualdecoder TP{d['tp']['tp']} ")
