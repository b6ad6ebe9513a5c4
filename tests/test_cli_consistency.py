"""Issue 33's "one consistent CLI": one --prefill form, `all` inside a design list (each design once),
`ddbench --version`, fp8 named in plan's header, a --kv-bits help that is true about ShadowKV, sweep-spec
errors naming every bad field, and simulate's "queue grows" warning (the planner's rule) with serving
examples in its --help that are sustainable."""

import json
import re
import shlex

import pytest

from ddbench.cli import main
from tests.cli import after_rates_block as _body, assert_one_line_error, ddbench

SIM = ["simulate", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k", "--output", "16"]
PLAN = ["plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "128k"]


def _main(argv, capsys):
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:   # argparse's usage errors, --version, --help
        rc = exc.code
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _one_line(argv, capsys, contains):
    rc, out, err = _main(argv, capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and out == "", (rc, out, err)
    assert contains in lines[0], lines[0]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)



# ---------------------------------------------------------------- --version


def test_version_prints_version_and_git_sha():
    from ddbench import __version__
    r = ddbench("--version")
    assert r.returncode == 0 and r.stderr == ""
    assert re.fullmatch(rf"ddbench {re.escape(__version__)} \(git \S+\)\n", r.stdout), r.stdout
    assert "--version" in ddbench("--help").stdout


# ---------------------------------------------------------------- designs: all inside a list, each once
def test_design_names_take_all_and_every_inside_a_list_once_each():
    from ddbench.core.designs import ALL_DESIGNS, DESIGNS, design_names
    assert design_names("all,dualdecoder-cache") == ALL_DESIGNS
    assert design_names("all, dualdecoder-per-layer") == ALL_DESIGNS + ("dualdecoder-per-layer",)
    assert design_names("dualdecoder,all") == ("dualdecoder",) + tuple(d for d in ALL_DESIGNS if d != "dualdecoder")
    assert design_names("every,all") == tuple(DESIGNS)
    assert design_names("dualdecoder,DualDecoder , dualdecoder") == ("dualdecoder",)


@pytest.mark.parametrize("value, message", [("all,nope", "unknown design 'nope'"),
                                            ("all,,shadowkv", "has an empty item"), (",", "names no design")])
def test_bad_design_lists_are_one_line(value, message, capsys):
    _one_line(PLAN + ["--design", value], capsys, message)
    _one_line(SIM + ["--design", value, "--batch", "2"], capsys, message)


def test_plan_takes_all_beside_a_design(capsys):
    rc, out, _ = _main(PLAN + ["--design", "all,dualdecoder-cache,dualdecoder-per-layer", "--json"], capsys)
    assert rc == 0
    from ddbench.core.designs import ALL_DESIGNS
    assert [r["system"] for r in json.loads(out)["systems"]] == list(ALL_DESIGNS) + ["dualdecoder-per-layer"]


def test_a_design_named_twice_runs_once(tmp_path, capsys):
    rc, out, _ = _main(SIM + ["--system", "dualdecoder,dualdecoder", "--batch", "2", "--steps", "3",
                              "--out", tmp_path / "o"], capsys)
    assert rc == 0 and out.count("dualdecoder: batch 2") == 1
    assert (tmp_path / "o" / "summary.json").exists() and not (tmp_path / "o" / "dualdecoder").exists()


# ---------------------------------------------------------------- one --prefill form
def test_simulate_takes_prefill_like_plan_and_keeps_the_old_flag(tmp_path, capsys):
    runs = {}
    for name, flag in (("new", ["--prefill", "elsewhere"]), ("old", ["--prefill-elsewhere"]),
                       ("here", ["--prefill", "here"]), ("default", [])):
        rc, out, err = _main(SIM + ["--rate", "1", "--requests", "6", "--out", tmp_path / name, "--json"] + flag,
                             capsys)
        assert rc == 0, err
        runs[name] = json.loads(out)["dualdecoder"]
    assert runs["new"]["prefill"] == "elsewhere" and runs["here"]["prefill"] == "this GPU"
    drop = ("wall_s",)
    assert {k: v for k, v in runs["new"].items() if k not in drop} == {k: v for k, v in runs["old"].items()
                                                                        if k not in drop}
    assert {k: v for k, v in runs["here"].items() if k not in drop} == {k: v for k, v in runs["default"].items()
                                                                         if k not in drop}
    assert runs["new"]["ttft_p50_s"] < runs["here"]["ttft_p50_s"]     # no prefill on this GPU


def test_prefill_help_and_errors(capsys):
    rc, out, _ = _main(["simulate", "--help"], capsys)
    assert rc == 0 and "--prefill {here,elsewhere}" in out and "--prefill-elsewhere" not in out   # hidden alias
    _one_line(SIM + ["--prefill", "there"], capsys, "argument --prefill: invalid choice: 'there'")
    _one_line(SIM + ["--prefill", "here", "--prefill-elsewhere"], capsys, "disagree")


# ---------------------------------------------------------------- fp8: the header, and a true --help
def test_plan_header_names_fp8(capsys):
    rc, out, _ = _main(PLAN + ["--design", "dualdecoder", "--kv-bits", "8"], capsys)
    assert rc == 0 and "KV fp8 (e4m3) on the host and the link" in out.splitlines()[1:5]    # under the answer
    rc, out, _ = _main(PLAN + ["--design", "dualdecoder"], capsys)
    assert rc == 0 and not any("fp8" in x for x in out.splitlines()[:5])


def test_plan_serving_header_names_fp8():
    from ddbench.commands.plan import render_serving
    out = {"model": "m", "gpu": "g", "capacity_gb": 80.0, "link": "pcie5", "link_gbps_per_gpu": 50.0,
           "context": "128k", "output": "256", "prefill": "here", "kv_bits": 8, "slo": [], "slo_columns": [],
           "tolerance": 0.05, "seeds": [0], "requests_per_run": 10, "max_runs": 4, "host_memory": "x",
           "designs": [], "cost_model": ["c"], "hit_rates": "h"}
    assert "KV fp8 (e4m3)" in render_serving(out, verbose=True).splitlines()[0]
    assert "fp8" not in render_serving(dict(out, kv_bits=16), verbose=True).splitlines()[0]
    assert "KV fp8 (e4m3)" in render_serving(out)        # the default text names it on its line of inputs
    assert "fp8" not in render_serving(dict(out, kv_bits=16))


def test_kv_bits_help_is_true_about_shadowkv(tmp_path, capsys):
    """--help says ShadowKV's fp8 values are the memory model's only; the simulator refuses them (no measured
    1 KiB gather rate in the bundle), the memory answer takes them, and the designs it lists do simulate."""
    rc, out, _ = _main(["simulate", "--help"], capsys)
    text = " ".join(out.split())
    assert "ShadowKV's fp8 values: the memory model only; the simulator refuses them" in text
    rc, out, err = _main(SIM + ["--design", "shadowkv", "--kv-bits", "8", "--batch", "2", "--out", tmp_path / "s"],
                         capsys)
    assert rc == 2 and "no measured uva_gather rate" in err and not (tmp_path / "s").exists()
    rc, out, _ = _main(PLAN + ["--design", "shadowkv", "--kv-bits", "8"], capsys)
    assert rc == 0
    rc, out, err = _main(SIM + ["--design", "dualdecoder,dualdecoder-cache", "--kv-bits", "8", "--batch", "2",
                                "--steps", "3", "--out", tmp_path / "d"], capsys)
    assert rc == 0, err
    assert _body(out)[0] == "KV fp8 (e4m3) on the host and the link"


# ---------------------------------------------------------------- sweep spec: every bad field
def test_sweep_spec_error_names_every_bad_field(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("requests: 0\ngrid:\n  model: llama-3-8b\n  gpu: h200\n  design: dualdecoder\n"
                    "  context: 32k\n  rate: [1, -2, .nan]\n  bogus: 3\n")
    line = assert_one_line_error(ddbench("sweep", str(spec), "--out", str(tmp_path / "o")))
    for field in ("requests:", "grid.rate[1]:", "grid.rate[2]:", "grid.bogus: unknown field"):
        assert field in line, line
    assert "more)" not in line and not (tmp_path / "o").exists()


def test_sweep_spec_catalog_errors_name_every_bad_value(tmp_path, capsys):
    spec = tmp_path / "bad.yaml"
    spec.write_text("grid:\n  model: [llama-3-8b, gpt-9]\n  gpu: tpu\n  design: [dualdecoder, nope]\n"
                    "  context: 32k\n  output: ['16', x]\n  rate: 1\n")
    rc, out, err = _main(["sweep", spec, "--out", tmp_path / "o"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    for field in ("grid.model[1]: unknown model 'gpt-9'", "grid.gpu[0]: unknown GPU 'tpu'",
                  "grid.system[1]: unknown design 'nope'", "grid.output[1]:"):
        assert field in err, err


# ---------------------------------------------------------------- simulate: the queue grows
def test_simulate_warns_where_the_queue_grows_by_the_planners_rule(tmp_path, capsys):
    from ddbench.planner import runs
    from ddbench.planner.scenario import Scenario
    args = ["simulate", "--model", "qwen2.5-32b", "--gpu", "h200", "--design", "dualdecoder", "--context", "128k",
            "--output", "64", "--requests", "40"]
    rc, out, _ = _main(args + ["--rate", "0.2", "--out", tmp_path / "hot"], capsys)
    assert rc == 0
    warning = [ln for ln in out.splitlines() if ln.startswith("WARNING: the queue grows for dualdecoder")]
    assert len(warning) == 1 and f"slope above {runs.STABLE_SLOPE}" in warning[0]
    hot = json.load(open(tmp_path / "hot" / "summary.json"))
    assert hot["queue_grows"] and hot["backlog_growth"] > runs.STABLE_SLOPE
    # the very number the planner's run computes for the same run (one rule, one code path)
    sc = Scenario.make(model="qwen2.5-32b", gpu="h200", design="dualdecoder", context="128k", output="64",
                       requests=40)
    row = runs.run_point(sc, 0.2, 0)
    assert row["backlog_growth"] == pytest.approx(hot["backlog_growth"], rel=1e-12) and not row["sustainable"]
    rc, out, _ = _main(args + ["--rate", "0.005", "--out", tmp_path / "cool"], capsys)
    assert rc == 0 and "queue grows" not in out
    cool = json.load(open(tmp_path / "cool" / "summary.json"))
    assert not cool["queue_grows"] and cool["backlog_growth"] <= runs.STABLE_SLOPE


def _epilog_examples(command: str) -> list[list[str]]:
    from ddbench.cli import build_parser
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    text = (sub.choices[command].epilog or "").replace("\\\n", " ")
    return [shlex.split(ln.strip())[1:] for ln in text.splitlines() if ln.strip().startswith("ddbench ")]


def test_simulates_serving_examples_are_sustainable(tmp_path, capsys):
    serving = [a for a in _epilog_examples("simulate") if "--batch" not in a]
    assert len(serving) >= 3
    for i, argv in enumerate(serving):
        rc, out, err = _main(argv + ["--out", tmp_path / f"ex{i}", "--json"], capsys)
        assert rc == 0, (argv, err)
        for name, s in json.loads(out).items():
            assert s["status"] == "ok" and not s["queue_grows"], (argv, name, s["backlog_growth"])
