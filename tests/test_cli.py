"""The CLI through a subprocess: output, --json, and every error path (one line, exit 2)."""

import json
import os

import pytest

from tests.cli import assert_one_line_error, ddbench


def test_plan_table():
    r = ddbench("plan", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--context", "128k", "--system", "all")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("dualdecoder, TP 1: up to 60 requests per GPU")        # the answer first
    assert lines[1] == "warning: context 128K is beyond llama-3-8b's trained context 8K (max_position_embeddings)"
    assert lines[2].startswith("llama-3-8b on h100-80gb") and "context 128K" in lines[2]
    head = next(i for i, x in enumerate(lines) if x.startswith("  design"))
    rows = {line.split()[0]: line.split() for line in lines[head + 1:head + 6]}
    assert set(rows) == {"full-kv", "shadowkv", "specache", "dualdecoder", "dualdecoder-cache"}   # all: ours too
    assert rows["full-kv"][1] == "3" and rows["dualdecoder"][1] == "60"
    assert max(len(x) for x in lines) <= 120


@pytest.mark.parametrize("context", ["131072", "128k", "128K"])
def test_plan_json_and_context_forms(context):
    r = ddbench("plan", "--model", "qwen2.5-14b", "--gpu", "h200", "--context", context, "--system",
                "shadowkv,dualdecoder", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["context"] == 131072 and [s["system"] for s in out["systems"]] == ["shadowkv", "dualdecoder"]
    for s in out["systems"]:
        assert s["fits"] and s["bytes"]["total"] <= out["capacity_bytes"]
        assert s["bytes"]["total"] == sum(v for k, v in s["bytes"].items() if k != "total")


def test_plan_one_million_and_fixed_batch():
    r = ddbench("plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "1m", "--batch", "64", "--json")
    out = json.loads(r.stdout)
    assert out["context"] == 1048576
    full = next(s for s in out["systems"] if s["system"] == "full-kv")
    assert full["max_batch"] == 0 and not full["fits"] and full["breakdown_batch"] == 64


def test_plan_hf_config(tmp_path):
    cfg = {"num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584,
           "intermediate_size": 18944, "vocab_size": 152064, "model_type": "qwen2"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = ddbench("plan", "--model", str(tmp_path / "config.json"), "--gpu", "a100-80gb", "--context", "64k", "--json")
    assert r.returncode == 0, r.stderr
    ref = ddbench("plan", "--model", "qwen2.5-7b", "--gpu", "a100-80gb", "--context", "64k", "--json")
    got, want = json.loads(r.stdout), json.loads(ref.stdout)
    # Qwen2.5-7B's config.json gives the catalog's Qwen2.5-7B: the same batches and bytes per design
    assert got["systems"] == want["systems"] and got["model"] != want["model"]
    assert {s["system"]: s["max_batch"] for s in got["systems"]}["dualdecoder"] > 1


@pytest.mark.parametrize("args, message", [
    (["--model", "gpt-9", "--gpu", "h100", "--context", "128k"], "unknown model 'gpt-9'; known: "),
    (["--model", "llama-3-8b", "--gpu", "tpu", "--context", "128k"], "unknown GPU 'tpu'; known: a100-40gb"),
    (["--model", "llama-3-8b", "--gpu", "h100", "--context", "128k", "--system", "vllm"],
     "unknown design 'vllm'; known: "),
    (["--model", "llama-3-8b", "--gpu", "h100", "--context", "lots"], "cannot parse context 'lots'"),
    (["--model", "llama-3-8b", "--gpu", "h100", "--context", "0"], "context must be positive"),
    (["--model", "llama-3-8b", "--gpu", "h100", "--context=-4k"], "context must be positive"),
    (["--model", "llama-3-8b", "--gpu", "h100", "--context", "1k"], "sparse budget 2048 is larger than the context"),
    (["--model", "llama-3-8b", "--gpu", "h100", "--context", "8k", "--budget", "16k"], "larger than the context"),
    (["--model", "llama-3-8b", "--gpu", "h100", "--context", "8k", "--batch", "0"],
     "argument --batch: '0': must be at least 1"),
    (["--model", "llama-3-8b", "--gpu", "h100", "--context", "uniform:8k:16k"], "cannot parse context 'uniform"),
    (["--model", "", "--gpu", "h100", "--context", "8k"], "argument --model: '': is empty"),
    (["--gpu", "h100", "--context", "8k"], "required: --model"),
])
def test_plan_errors(args, message):
    r = ddbench("plan", *args)
    assert r.returncode == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("text", ["{", '{"num_hidden_layers": "many"}', "[]"])
def test_malformed_config_json(tmp_path, text):
    path = tmp_path / "config.json"
    path.write_text(text)
    r = ddbench("plan", "--model", str(path), "--gpu", "h100", "--context", "128k")
    assert r.returncode == 2 and "malformed config.json" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_missing_config_json():
    r = ddbench("plan", "--model", "/nonexistent/config.json", "--gpu", "h100", "--context", "128k")
    assert r.returncode == 2 and "cannot read config.json" in r.stderr


def test_help_has_examples():
    for cmd in (["--help"], ["plan", "--help"], ["figures", "--help"]):
        r = ddbench(*cmd)
        assert r.returncode == 0 and "example" in r.stdout


def test_design_is_the_flag_and_system_its_alias():
    a = ddbench("plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "128k", "--design", "shadowkv", "--json")
    b = ddbench("plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "128k", "--system", "shadowkv", "--json")
    assert a.returncode == 0 and a.stdout == b.stdout
    assert [s["system"] for s in json.loads(a.stdout)["systems"]] == ["shadowkv"]   # the published key stays


def test_plan_memory_answer_where_nothing_fits_is_exit_3():
    """Weights larger than the GPU at --tp 1 (without --tp they are sharded: --tp auto): each row says so, a status
    line names it, exit 3."""
    r = ddbench("plan", "--model", "llama-3-70b", "--gpu", "l40s", "--context", "128k", "--json", "--tp", "1")
    assert r.returncode == 3, r.stderr
    out = json.loads(r.stdout)
    assert {s["status"] for s in out["systems"]} == {"does-not-fit"} and "no design fits" in out["verdict"]
    t = ddbench("plan", "--model", "llama-3-70b", "--gpu", "l40s", "--context", "128k", "--tp", "1")
    assert t.returncode == 3 and t.stdout.strip().splitlines()[-1].startswith("no fit: no design fits one request")


@pytest.mark.parametrize("only, message", [("", "names no figure"), (",,", "names no figure"),
                                           ("fig02,,fig14", "has an empty item")])
def test_empty_figure_selection_is_one_line(tmp_path, only, message):
    r = ddbench("figures", "--only", only, "--out", str(tmp_path / "f"))
    assert_one_line_error(r, contains=message)
    assert os.listdir(tmp_path) == []


def test_unknown_figure_id(tmp_path):
    r = ddbench("figures", "--only", "fig99", "--out", str(tmp_path))
    assert r.returncode == 2 and "unknown figure 'fig99'; known: " in r.stderr and "fig02" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert os.listdir(tmp_path) == []


def _examples():
    """(command, example argv) for every example line in every command's --help epilog."""
    import argparse
    import shlex

    from ddbench.cli import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = []
    for name, p in sub.choices.items():
        text = (p.epilog or "").replace("\\\n", " ")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("ddbench ")]
        out += [(name, shlex.split(ln, comments=True)[1:]) for ln in lines]
    return sub.choices, out


def test_every_command_has_examples_and_each_parses():
    from ddbench.cli import COMMANDS, build_parser
    choices, examples = _examples()
    assert set(choices) == set(COMMANDS)
    by_command = {}
    for name, argv in examples:
        by_command.setdefault(name, []).append(argv)
        assert argv[0] == name, argv
        args = build_parser().parse_args(argv)    # SystemExit(2) on a broken example
        assert args.command == name and callable(args.func)
    assert set(by_command) == set(COMMANDS), set(COMMANDS) - set(by_command)


def test_example_parse_check_catches_a_broken_example():
    from ddbench.cli import build_parser
    with pytest.raises(SystemExit):
        build_parser().parse_args(["simulate", "--model", "llama-3-8b", "--gpu", "h200", "--no-such-flag"])


def test_help_of_every_command_through_the_cli():
    from ddbench.cli import COMMANDS
    for name in COMMANDS:
        r = ddbench(name, "--help")
        assert r.returncode == 0 and "examples:" in r.stdout and f"ddbench {name} " in r.stdout, name
