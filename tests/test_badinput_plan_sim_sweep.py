"""Every flag of plan, simulate and sweep (and every field of a sweep spec) with bad values: empty, 0,
negative, nan, inf, 1e308, 1e-308, garbage, huge. Each is one line on stderr and exit 2, with nothing
written. Most run in process (`ddbench.cli.main`, fast); a few run as a subprocess end to end. The
audit's cases (issue 20) are marked "audit"."""

import json
import os
import textwrap

import pytest

from tests.cli import assert_one_line_error, ddbench
from tests.cli import in_process as _main

PLAN = ["plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k"]
SLO = ["--slo", "p99-tpot=1s"]
SIM = ["simulate", "--model", "llama-3-8b", "--gpu", "h200", "--requests", "2"]
SPEC = """\
name: tiny
requests: 20
grid:
  model: llama-3-8b
  gpu: h200
  design: dualdecoder
  context: 32k
  output: "16"
  rate: 1
"""
NUMBERS = ["", "0", "-1", "nan", "inf", "1e308", "1e-308", "lots", "99999999999999999999"]



def _one_line(argv, capsys, contains=None):
    rc, out, err = _main(argv, capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and out == "", (rc, out, err)
    assert contains is None or contains in lines[0], lines[0]
    return lines[0]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Every case runs in an empty folder, and must leave it empty."""
    monkeypatch.chdir(tmp_path)
    yield
    assert sorted(os.listdir(tmp_path)) in ([], ["spec.yaml"])


# ---------------------------------------------------------------- flags every mode parses
COUNTS = ["--batch", "--chunk", "--rank", "--quant-group", "--max-batch", "--requests", "--fetching", "--max-runs",
          "--workers"]
TOKENS = ["--context", "--budget", "--prefill-chunk", "--output"]
ZERO_OK = ["--gen-tokens", "--local-chunks", "--outliers-per-1k", "--quant-residual", "--lowrank-layers"]


@pytest.mark.parametrize("flag", COUNTS + TOKENS + ZERO_OK)
@pytest.mark.parametrize("value", NUMBERS)
def test_plan_numbers(flag, value, capsys):
    """In every mode: the memory answer parses the serving flags' values too (audit: `plan` without --slo
    ignored invalid serving flags)."""
    if value == "0" and flag in ZERO_OK:
        pytest.skip("0 layers or slots is valid")
    base = PLAN[:5] + ([] if flag == "--context" else ["--context", "32k"])
    _one_line(base + [flag, value], capsys)


@pytest.mark.parametrize("flag, value, message", [
    ("--model", "", "argument --model: '': is empty"),
    ("--model", "gpt-9", "unknown model 'gpt-9'"),
    ("--gpu", "", "argument --gpu: '': is empty"),
    ("--gpu", "tpu", "unknown GPU 'tpu'"),
    ("--design", "", "'' names no design"),
    ("--design", ",", "names no design"),
    ("--design", "shadowkv,,dualdecoder", "has an empty item"),
    ("--system", "vllm", "unknown design 'vllm'"),
    ("--context", "uniform:16k", "use uniform:LO:HI"),
    ("--context", "uniform:32k:16k", "LO is larger than HI"),
    ("--context", "uniform:16k:32k", "cannot parse context 'uniform:16k:32k'"),   # the memory answer: one context
    ("--lowrank-layers", "99", "exceeds the model's 32 layers"),
    ("--lowrank-layers", "profile", "must be an integer, got 'profile'"),
    ("--rank", "4097", "exceeds H_kv*d"),
    ("--budget", "1004", "not a multiple of the chunk size"),
    ("--output", "exp:x", "cannot parse output 'x'"),
    ("--link", "", "argument --link: '': is empty"),                       # audit: '' became the default
    ("--calibration", "", "argument --calibration: '': is empty"),         # audit
    ("--hit-rate", "", "argument --hit-rate: '': is empty"),
    ("--hit-rate", "1.5", "must be in [0, 1]"),
    ("--hit-rate", "-0.1", "must be in [0, 1]"),
    ("--hit-rate", "nan", "must be finite"),
    ("--hit-rate", "inf", "must be finite"),
    ("--host", "", "argument --host: '': is empty"),
    ("--prefill", "nowhere", "invalid choice: 'nowhere'"),
    ("--slo", "", "argument --slo: '': is empty"),
    ("--slo", ",", "cannot parse SLO term"),
    ("--slo", "p99-tpot=1s,", "cannot parse SLO term ''"),
    ("--slo", "p99-tpot=0s", "the limit must be positive"),
    ("--slo", "p99-tpot=nans", "cannot parse SLO term"),
    ("--slo", "p100.5-tpot=1s", "percentile must be within (0, 100]"),
    ("--target-rate", "", "is not a number"),
    ("--target-rate", "0", "must be above 0"),
    ("--target-rate", "-1", "must be above 0"),
    ("--target-rate", "nan", "must be finite"),
    ("--target-rate", "inf", "must be finite"),                            # audit: a traceback
    ("--target-rate", "1e308", "must be at most"),
    ("--search", "", "argument --search: '': is empty"),
    ("--search", ",", "names no knob"),
    ("--search", "budget,,chunk", "has an empty term"),
    ("--search", "budget=", "has an empty value"),
    ("--search", "budget=1k::2k", "has an empty value"),
    ("--search", "warp", "unknown knob 'warp'"),
    ("--search", "lowrank-layers=-1", "must be at least 0"),
    ("--search", "cache=x", "cache 'x' is not a capacity"),
    ("--search", "cache=pingpong", "'pingpong' is a buffer layout: use buffers=pingpong"),   # the knob's old name
    ("--search", "cache=2x:per-layer", "use buffers=per-layer"),
    ("--search", "buffers=2x", "buffers takes pingpong and per-layer, got '2x'"),
    ("--search", "buffers=design", "buffers takes pingpong and per-layer"),
    ("--search", "budget=lots", "cannot parse budget 'lots'"),
    ("--seeds", "", "is an empty list"),
    ("--seeds", "0,,1", "has an empty item"),
    ("--seeds", "-1", "must be at least 0"),
    ("--seeds", "1.5", "is not a whole number"),
    ("--tol", "0", "must be in (0, 1)"),
    ("--tol", "1", "must be in (0, 1)"),
    ("--tol", "nan", "must be finite"),
    ("--max-runs", "1", "must be at least 2"),
    ("--plot", "", "argument --plot: '': is empty"),
    ("--plot", "x.txt", "must name a .png, .pdf or .svg file"),
])
def test_plan_values(flag, value, message, capsys):
    _one_line(PLAN + [flag, value], capsys, message)


@pytest.mark.parametrize("args", [["--output", "256"], ["--link", "pcie5"], ["--hit-rate", "0.5"],
                                  ["--calibration", "x"], ["--roofline"], ["--max-batch", "4"], ["--requests", "9"],
                                  ["--fetching", "2"], ["--prefill", "here"],
                                  ["--seeds", "0"], ["--tol", "0.1"], ["--max-runs", "4"], ["--workers", "1"],
                                  ["--plot", "x.png"]])
def test_plan_serving_flags_need_slo(args, capsys):
    """Audit: without --slo (or --target-rate, --search) a serving flag was ignored; now it is named."""
    _one_line(PLAN + args, capsys, f"{args[0]} needs --slo (or --target-rate or --search)")


@pytest.mark.parametrize("args, message", [
    (["--batch", "4"], "--batch is for the memory answer"),
    (["--seeds", "0,1,2", "--max-runs", "4"], "--max-runs must allow at least two probes"),
    (["--search", "chunk=3"], "--search leaves no setting for shadowkv"),        # audit: an IndexError
    (["--search", "budget=64k", "--design", "dualdecoder"], "every budget is above the smallest context"),
    (["--host", "nope"], "unknown host 'nope'"),
    (["--link", "nope"], "unknown link 'nope'"),
    (["--fetching", "2"], "GPUs fetching at once needs a host"),
    (["--host", "paper-testbed", "--fetching", "9"], "within 1..8"),
    (["--calibration", "/nonexistent"], "no calibration bundle under /nonexistent"),
    (["--hit-rate", "/nonexistent.csv"], "/nonexistent.csv"),
    (["--context", "exp:64k"], "an exponential context can fall below the sparse budget"),
    (["--json", "--csv"], "--json and --csv: choose one"),
])
def test_plan_serving_values(args, message, capsys):
    _one_line(PLAN + SLO + args, capsys, message)


# ---------------------------------------------------------------- simulate
SIM_NUMBERS = ["--rate", "--requests", "--seed", "--batch", "--steps", "--max-batch", "--context", "--output",
               "--budget", "--chunk"]


@pytest.mark.parametrize("flag", SIM_NUMBERS)
@pytest.mark.parametrize("value", NUMBERS)
def test_simulate_numbers(flag, value, capsys):
    if flag == "--seed" and value == "0":
        pytest.skip("seed 0 is valid")
    _one_line(SIM + [flag, value, "--out", "o"], capsys)


@pytest.mark.parametrize("args, message", [
    (["--model", ""], "argument --model: '': is empty"),
    (["--gpu", ""], "argument --gpu: '': is empty"),
    (["--design", "x,,y"], "has an empty item"),
    (["--link", ""], "argument --link: '': is empty"),                     # audit: '' became the default
    (["--link", "nope"], "unknown link 'nope'"),
    (["--calibration", ""], "argument --calibration: '': is empty"),       # audit
    (["--hit-rate", "inf"], "must be finite"),
    (["--hit-rate", "2"], "must be in [0, 1]"),
    (["--rate", "1e-308"], "must be at least 1e-09"),                      # audit: NaN reached the JSON writer
    (["--rate", "1e308"], "must be at most 1000000000"),
    (["--requests", "100000000"], "must be at most 10000000"),
    (["--steps", "1000000", "--batch", "2"], "must be in [1, 100000]"),
    (["--seed", "18446744073709551616"], "must be at most"),
    (["--context", "exp:64k"], "an exponential context can fall below the sparse budget"),
    (["--context", "uniform:16k:32k", "--batch", "2"], "cannot parse context 'uniform:16k:32k'"),
    (["--output", "exp:0"], "output must be positive"),
    (["--lowrank-layers", "many"], "must be an integer or 'profile', got 'many'"),
    (["--profile-init", ""], "--profile-init is empty"),
    (["--profile-temperature", "inf"], "must be finite and at least 0"),
    (["--profile-context", "0"], "must be positive"),
])
def test_simulate_values(args, message, capsys):
    _one_line(SIM + ["--out", "o"] + args, capsys, message)


# ---------------------------------------------------------------- sweep
@pytest.mark.parametrize("args, message", [
    (["--out", ""], "argument --out: '': is empty"),                        # audit: '' became the default
    (["--workers", "0"], "must be in [1, 4096]"), (["--workers", "nan"], "is not a whole number"),
    (["--max-points", "0"], "must be at least 1"), (["--max-points", "1e308"], "is not a whole number"),
    (["--address", ""], "is empty"), (["--executor", "slurm"], "invalid choice: 'slurm'"),
    (["--address", "h:1"], "--address is for --executor ray"),
])
def test_sweep_flags(args, message, capsys, tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC)
    _one_line(["sweep", "spec.yaml"] + args, capsys, message)


@pytest.mark.parametrize("path, message", [("", "argument spec: '': is empty"),
                                           ("missing.yaml", "cannot read sweep spec missing.yaml"),
                                           (".", "cannot read sweep spec .")])
def test_sweep_spec_path(path, message, capsys):
    _one_line(["sweep", path], capsys, message)


def _edit(field: str, value: str) -> str:
    """SPEC with one grid field set (or a top-level one, for requests / max_batch / name)."""
    if field in ("requests", "max_batch", "name"):
        lines = [ln for ln in SPEC.splitlines() if not ln.startswith(f"{field}:")]
        return f"{field}: {value}\n" + "\n".join(lines) + "\n"
    lines = [ln for ln in SPEC.splitlines() if not ln.startswith(f"  {field}:")]
    return "\n".join(lines) + f"\n  {field}: {value}\n"


@pytest.mark.parametrize("field, value, message", [
    ("requests", "0", "requests: Input should be greater than or equal to 1"),
    ("requests", "1e308", "requests: Input should be"),
    ("requests", "99999999999", "requests: Input should be less than or equal to"),
    ("requests", "x", "requests: must be a whole number, not the text"),
    ("max_batch", "0", "max_batch: Input should be greater than or equal to 1"),
    ("name", "../../x", "is not a plain name"),                           # audit: wrote outside sweep-out/
    ("name", "''", "is not a plain name"),
    ("model", "''", "grid.model[0]: String should have at least 1 character"),
    ("gpu", "[]", "grid.gpu: List should have at least 1 item"),
    ("design", "''", "grid.design[0]: String should have at least 1 character"),
    ("context", "''", "grid.context[0]: String should have at least 1 character"),
    ("context", "0", "grid.context[0]: Input should be greater than or equal to 1"),
    ("context", ".nan", "grid.context[0]"),
    ("context", "99999999999999999999", "grid.context[0]"),
    ("output", "-5", "grid.output[0]"),
    ("output", "exp:0", "grid.output[0]: output must be positive"),
    ("budget", "0", "grid.budget[0]"),
    ("chunk", "0", "grid.chunk[0]: Input should be greater than or equal to 1"),
    ("lowrank_layers", "-1", "grid.lowrank_layers[0]"),
    ("lowrank_layers", "99", "exceeds the model's 32 layers"),
    ("buffers", "x", "grid.buffers[0]"),
    ("cache", "[pingpong]", "grid.cache: the sparse-KV buffer layout (design | pingpong | per-layer) is now the"
                            " field buffers"),                              # the field's old name
    ("cache", "design", "is now the field buffers"),
    ("hit_rate", "''", "grid.hit_rate[0]"),
    ("hit_rate", ".inf", "grid.hit_rate[0]"),
    ("hit_rate", "-1", "grid.hit_rate[0]"),
    ("prefill", "x", "grid.prefill[0]"),
    ("rate", "''", "grid.rate[0]"),
    ("rate", "0", "grid.rate[0]: Input should be greater than or equal to"),
    ("rate", ".inf", "grid.rate[0]: must be finite, got inf"),
    ("rate", ".nan", "grid.rate[0]: must be finite, got nan"),
    ("rate", "1e-308", "grid.rate[0]: Input should be greater than or equal to"),
    ("rate", "1e308", "grid.rate[0]: Input should be less than or equal to"),
    ("seed", "-1", "grid.seed[0]: Input should be greater than or equal to 0"),
    ("seed", "1.5", "grid.seed[0]"),
    ("fetching", "0", "grid.fetching[0]"),
    ("link", "''", "grid.link[0]: String should have at least 1 character"),   # audit: '' became the default
    ("link", "nope", "grid.link[0]: unknown link 'nope'"),
    ("host", "''", "grid.host[0]"),
])
def test_sweep_spec_fields(field, value, message, capsys, tmp_path):
    (tmp_path / "spec.yaml").write_text(_edit(field, value))
    _one_line(["sweep", "spec.yaml"], capsys, message)


# ---------------------------------------------------------------- end to end, as a subprocess
@pytest.mark.parametrize("argv, message", [
    (PLAN + ["--target-rate", "inf"], "argument --target-rate: 'inf': must be finite"),
    (PLAN + SLO + ["--search", "chunk=3"], "--search leaves no setting"),
    (PLAN + ["--hit-rate", "0.5"], "--hit-rate needs --slo"),
    (SIM + ["--rate", "1e-308", "--out", "o"], "must be at least 1e-09"),
    (SIM + ["--link", "", "--out", "o"], "argument --link: '': is empty"),
])
def test_subprocess_cases(argv, message, tmp_path):
    assert_one_line_error(ddbench(*argv, cwd=tmp_path), contains=message)
    assert os.listdir(tmp_path) == []


def test_binary_spec_and_a_path_as_name(tmp_path):
    (tmp_path / "spec.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe" * 50)
    assert_one_line_error(ddbench("sweep", "spec.yaml", cwd=tmp_path), contains="not a text file")
    (tmp_path / "spec.yaml").write_text(_edit("name", "../../x"))
    assert_one_line_error(ddbench("sweep", "spec.yaml", cwd=tmp_path), contains="is not a plain name")
    assert os.listdir(tmp_path) == ["spec.yaml"]


def test_a_tiny_target_rate_needs_one_gpu(tmp_path):
    """Audit: --target-rate 1e-10 answered "0 GPUs"; a load below one GPU's rate still needs that GPU."""
    r = ddbench(*PLAN, "--output", "16", "--design", "dualdecoder", "--slo", "p99-tpot=1s", "--requests", "20",
                "--max-runs", "4", "--workers", "1", "--target-rate", "1e-10", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)["designs"][0]
    assert d["status"] == "met" and d["gpus"] == 1
    assert os.listdir(tmp_path) == []


def test_spec_helper_edits_what_it_says():
    text = _edit("rate", "[1, 2]")
    assert "  rate: [1, 2]" in text and text.count("rate:") == 1 and textwrap.dedent(text) == text
