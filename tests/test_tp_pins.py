"""TP=1 answers pinned as main gives them without tensor parallelism (issue 46; re-pinned from main's own run
after the memory model's change in main): --tp 1, and no --tp at all, give exactly these numbers (memory by
design, a serving rate search, a disaggregated fleet)."""

import json

import pytest

from tests.cli import in_process


@pytest.fixture
def run_cli(capsys):
    return lambda argv: in_process(argv, capsys)

MEMORY = {
    ("llama-3-8b", "h100-80gb", "128k", "paper-testbed"): {
        "full-kv": (3, 69050066944, 0), "shadowkv": (23, 83896041472, 8589934592),
        "specache": (11, 53999587840, 17179869184), "dualdecoder": (11, 29769191936, 17179869184),
        "dualdecoder-cache": (11, 35822642976, 17179869184)},
    ("llama-3-70b", "h200", "64k", None): {
        "full-kv": (0, 164793785344, 0), "shadowkv": (1, 147892968448, 10737418240),
        "specache": (1, 148172388864, 21474836480), "dualdecoder": (4, 148956114432, 21474836480),
        "dualdecoder-cache": (2, 148900401696, 21474836480)},
}

@pytest.mark.parametrize("key", list(MEMORY))
@pytest.mark.parametrize("tp", [None, "1"])
def test_memory_answer_unchanged_at_tp1(key, tp, run_cli):
    model, gpu, ctx, host = key
    argv = ["plan", "--model", model, "--gpu", gpu, "--context", ctx, "--design", "all", "--json"]
    argv += ["--host", host] if host else []
    argv += ["--tp", tp] if tp else []
    rc, out, err = run_cli(argv)
    assert rc in (0, 3), err
    got = {x["system"]: (x["max_batch"], x["bytes"]["total"], x["host_bytes_per_request"])
           for x in json.loads(out)["systems"]}
    assert got == MEMORY[key]


@pytest.mark.parametrize("tp", [None, "1"])
def test_serving_search_unchanged_at_tp1(tp, run_cli):
    argv = ["plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k", "--output", "64",
            "--slo", "p99-tpot=200ms", "--design", "dualdecoder,full-kv,shadowkv", "--requests", "200",
            "--max-runs", "6", "--prefill", "here", "--json"] + (["--tp", tp] if tp else [])
    rc, out, err = run_cli(argv)
    assert rc == 0, err
    got = {d["system"]: (d["max_rate_req_per_s"], d["max_batch"]) for d in json.loads(out)["designs"]}
    want = {"full-kv": (0.5759383388726129, 30), "shadowkv": (0.5341488734660095, 128),
            "dualdecoder": (0.32611930792373034, 426)}
    assert got.keys() == want.keys()
    for k, (rate, batch) in want.items():
        assert got[k][0] == pytest.approx(rate, rel=1e-9) and got[k][1] == batch


def test_disaggregated_fleet_unchanged_at_tp1(run_cli):
    rc, out, err = run_cli(["plan", "--model", "qwen2.5-14b", "--gpu", "h100-80gb", "--context", "128k", "--output",
                            "256", "--slo", "p99-tpot=80ms,p99-ttft=30s", "--target-rate", "10", "--design",
                            "shadowkv", "--prefill", "elsewhere", "--json"])
    assert rc == 0, err
    d = json.loads(out)["designs"][0]
    assert d["max_rate_req_per_s"] == pytest.approx(1.1395317026158853, rel=1e-9)
    assert (d["max_batch"], d["fleet"]["fleet_gpus"], d["fleet"]["prefill_gpus"], d["fleet"]["decode_gpus"]) == \
        (12, 223, 214, 9)
    assert d["tpot_p99_s"] == pytest.approx(0.03612113312119172, rel=1e-9)
