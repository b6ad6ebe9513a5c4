"""The audit's "other defects" (issue 30), each as a new user meets it: a subprocess run that gives one
line and exit 2 (or the right result), and leaves nothing behind.

- a cache profile with a bad cell or cut short (mid-line, or at a line's end) is refused, not replayed;
- SIGTERM stops `plan --slo --workers 2` (and its workers) within seconds;
- an empty grid axis, YAML's true as a number, a repeated grid value, a NaN rope_theta;
- `sweep --force` beside a user's results.csv refuses before it runs a point;
- the former tracebacks: a 300-byte --out name, manifest entries that are no record, a bad fitted-parameters
  file, a dangling-symlink --out, stdout on a full device, an empty engine CSV, a binary engine summary,
  running out of memory;
- the former two-line errors: every --only figure failing, a path holding a newline.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import time

import pytest

from ddbench.core.paths import SOURCE_TRACES
from tests.cli import assert_one_line_error, command, ddbench, env

pytestmark = pytest.mark.skipif(not SOURCE_TRACES.is_dir(), reason="needs the source checkout's traces/")

SMOL = "SmolLM2-135M-Instruct.Q4_1"
SIM = ("simulate", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k", "--requests", "5")
GRID = """\
name: tiny
requests: 5
grid:
  model: llama-3-8b
  gpu: h200
  context: 32k
  output: "64"
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A copy of the committed traces (the tests that change a file restore it)."""
    d = tmp_path_factory.mktemp("data") / "d"
    shutil.copytree(SOURCE_TRACES, d)
    return d


def run(*args, data, cwd, **kw):
    return ddbench(*args, cwd=cwd, env={"DDBENCH_DATA": str(data)}, **kw)


# --------------------------------------------------------------------------- silently wrong rates

def _cut(text: str, how: str) -> str:
    lines = text.splitlines(keepends=True)
    if how == "bad-layer":
        return "".join(lines[:2] + ["x" + lines[2][lines[2].index(","):]] + lines[3:])
    if how == "mid-line":
        return text[: len(text) // 2].rsplit(",", 3)[0]
    return "".join(lines[: 1 + 30 * 60])          # at a line's end, after 60 whole 30-layer configurations


@pytest.mark.parametrize("how, says", [("bad-layer", "line 3, field layer"), ("mid-line", "line"),
                                       ("line-end", "truncated or incomplete")])
def test_a_damaged_cache_profile_is_refused(tmp_path, data, how, says):
    csv = data / "accuracy" / f"{SMOL}.cache.csv"
    trends = sorted((data / "accuracy").glob("*.cache-trend.json"))
    good, trend_texts = csv.read_text(), [t.read_text() for t in trends]
    try:
        for t in trends:
            t.unlink()                       # the replay itself is read (with a trend, the trend is)
        csv.write_text(_cut(good, how))
        r = run(*SIM, "--design", "dualdecoder-cache", "--out", "res", data=data, cwd=tmp_path)
        assert_one_line_error(r, contains=f"{SMOL}.cache.csv")
        assert says in r.stderr
        assert not (tmp_path / "res").exists()
    finally:
        csv.write_text(good)
        for t, text in zip(trends, trend_texts):
            t.write_text(text)


# --------------------------------------------------------------------------- SIGTERM

def test_sigterm_stops_plan_slo_with_workers(tmp_path, data):
    p = subprocess.Popen(command("plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "128k",
                                 "--slo", "p99-completion=60s", "--workers", "2", "--design", "every",
                                 "--seeds", "3", "--max-runs", "40", "--tol", "0.0001", "--requests", "2000"),
                         # short runs, many of them: about 20 s of search alone, so still searching at 6 s
                         env=env({"DDBENCH_DATA": str(data)}), cwd=tmp_path, start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(6)
        assert p.poll() is None, p.stderr.read()          # still searching
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        p.wait(20)
        assert time.monotonic() - t0 < 10
        assert p.returncode == 130
        assert p.stderr.read().strip().splitlines()[-1] == "ddbench: interrupted"
        time.sleep(1)
        with pytest.raises(ProcessLookupError):            # no worker of its process group is left
            os.killpg(p.pid, 0)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


# --------------------------------------------------------------------------- sweep specs

def _sweep(tmp_path, data, extra: str, *args, out="sw"):
    text = GRID + extra
    if "rate:" not in extra:
        text += "  rate: [1]\n"
    if "system:" not in extra:
        text += "  system: [dualdecoder]\n"
    (tmp_path / "s.yaml").write_text(text.replace("requests: 5", "requests: true") if "REQ" in extra else text)
    return run("sweep", "s.yaml", "--out", out, *args, data=data, cwd=tmp_path)


@pytest.mark.parametrize("field", ["link", "kv_bits", "cache_tokens", "seed", "host_mem_gb"])
def test_an_empty_grid_axis_is_one_line(tmp_path, data, field):
    r = _sweep(tmp_path, data, f"  {field}: []\n")
    assert_one_line_error(r, contains=f"grid.{field}: List should have at least 1 item")
    assert not (tmp_path / "sw").exists()


@pytest.mark.parametrize("line, field", [("  chunk: true\n", "grid.chunk"), ("  seed: true\n", "grid.seed"),
                                         ("  rate: true\n", "grid.rate"), ("  host_mem_gb: true\n", "grid.host_mem_gb"),
                                         ("  lowrank_layers: false\n", "grid.lowrank_layers"),
                                         ("  # REQ\n", "requests")])
def test_yaml_true_is_not_the_number_1(tmp_path, data, line, field):
    r = _sweep(tmp_path, data, line)
    assert_one_line_error(r, contains=f"{field}: true/false is not a value here")
    assert not (tmp_path / "sw").exists()


def test_a_repeated_grid_value_runs_once(tmp_path, data):
    r = _sweep(tmp_path, data, "  system: [dualdecoder, dualdecoder]\n  rate: [1, 1.0]\n")
    assert r.returncode == 0, r.stderr
    assert len((tmp_path / "sw" / "results.csv").read_text().splitlines()) == 2     # a header and one point


def test_a_repeated_design_runs_once(tmp_path, data):
    r = run(*SIM, "--design", "dualdecoder,dualdecoder", "--json", "--out", "res", data=data, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (len(doc) if isinstance(doc, list) else 1) == 1


def test_sweep_force_beside_a_users_results_refuses_before_running(tmp_path, data):
    user = tmp_path / "user"
    user.mkdir()
    (user / "results.csv").write_text("my,data\n")
    t0 = time.monotonic()
    r = _sweep(tmp_path, data, "  rate: [1, 2, 3, 4]\n", "--force", out="user")
    assert_one_line_error(r, contains="results.csv exists and was not written by ddbench")
    assert time.monotonic() - t0 < 30
    assert sorted(os.listdir(user)) == ["results.csv"] and (user / "results.csv").read_text() == "my,data\n"


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-1"])
def test_a_bad_rope_theta_is_one_line(tmp_path, data, value):
    cfg = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
           "num_key_value_heads": 8, "vocab_size": 128256, "rope_theta": 0}
    (tmp_path / "config.json").write_text(json.dumps(cfg).replace('"rope_theta": 0', f'"rope_theta": {value}'))
    r = run("plan", "--model", "config.json", "--gpu", "h200", "--context", "32k", data=data, cwd=tmp_path)
    assert_one_line_error(r, contains="rope_theta: must be")


# --------------------------------------------------------------------------- former tracebacks

def test_a_300_byte_out_name_is_one_line(tmp_path, data):
    r = run(*SIM, "--out", "a" * 300, data=data, cwd=tmp_path)
    assert_one_line_error(r, contains="File name too long")


@pytest.mark.parametrize("link", ["nowhere", "nowhere/deeper"])
def test_a_dangling_symlink_out_is_one_line(tmp_path, data, link):
    os.symlink(tmp_path / link, tmp_path / "dang")
    r = run(*SIM, "--out", "dang", data=data, cwd=tmp_path)
    assert_one_line_error(r, contains="which does not exist")
    assert os.listdir(tmp_path) == ["dang"] and not os.path.exists(tmp_path / "nowhere")


@pytest.mark.parametrize("entry", ['"x"', "null", "[1]"])
def test_a_manifest_entry_that_is_no_record_is_one_line(tmp_path, data, entry):
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / ".ddbench-manifest.json").write_text(
        '{"schema": 1, "command": "ddbench simulate", "files": {"requests.csv": %s}}' % entry)
    r = run(*SIM, "--out", "res", "--force", data=data, cwd=tmp_path)
    assert_one_line_error(r, contains="is corrupt")


@pytest.mark.parametrize("content", [b'{"schema": 1, "x": [', b"[]", b"\x00\xff\xfe"])
def test_a_bad_fitted_parameters_file_is_one_line(tmp_path, data, content):
    fitted = data / "fit" / "h200" / "fitted.json"      # the cost model's fits (cache_fill.json once)
    good = fitted.read_bytes()
    try:
        fitted.write_bytes(content)
        r = run(*SIM, "--out", "res", data=data, cwd=tmp_path)
        assert_one_line_error(r, contains="fitted.json")
        assert not (tmp_path / "res").exists()
    finally:
        fitted.write_bytes(good)


@pytest.mark.parametrize("args", [("plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k"),
                                  (*SIM, "--json"), ("--version",)])
def test_stdout_on_a_full_device_is_one_line(tmp_path, data, args):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        r = subprocess.run(command(*args), stdout=full, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                           env=env({"DDBENCH_DATA": str(data)}), timeout=300)
    assert_one_line_error(r, contains="No space left on device")


@pytest.mark.parametrize("content", ["", "a,b\n"])
def test_an_empty_engine_csv_fails_its_figure_in_one_line(tmp_path, data, content):
    csv = data / "engine" / "h200" / "engine.csv"
    good = csv.read_bytes()
    try:
        csv.write_text(content)
        r = run("figures", "--quiet", "--only", "fig18e", "--out", "figs", data=data, cwd=tmp_path)
        assert_one_line_error(r, contains="every figure failed (fig18e: ")
        assert "engine.csv" in r.stderr and not (tmp_path / "figs").exists()
    finally:
        csv.write_bytes(good)


BAD_SUMMARIES = [b"\x00\xff\xfe\x80", b'{"paper": 3}', b'{"paper": [1]}', b"[]"]


@pytest.mark.parametrize("content", BAD_SUMMARIES)
def test_a_bad_engine_summary_fails_its_figure_in_one_line(tmp_path, data, content):
    summary = data / "engine" / "h200-paper" / "summary.json"
    good = summary.read_bytes()
    try:
        summary.write_bytes(content)
        r = run("figures", "--quiet", "--only", "fig12", "--out", "figs", data=data, cwd=tmp_path)
        assert_one_line_error(r, contains="malformed engine summary")
    finally:
        summary.write_bytes(good)


@pytest.mark.parametrize("content", BAD_SUMMARIES)
def test_a_bad_inplace_shadowkv_summary_is_one_line(data, content):
    """The in-place ShadowKV's points (a later engine than fig12's run: its table in docs/results.md reads them,
    no figure does): a malformed summary is a one-line error naming it."""
    from ddbench.core.errors import DDBenchError
    from ddbench.experiments.engine_points import inplace_shadowkv
    summary = data / "engine" / "h200-shadowkv-fast" / "paper-80gb" / "summary.json"
    good = summary.read_bytes()
    try:
        summary.write_bytes(content)
        with pytest.raises(DDBenchError, match="malformed engine summary") as info:
            inplace_shadowkv(data)
        assert "\n" not in str(info.value)
    finally:
        summary.write_bytes(good)


@pytest.mark.slow
def test_running_out_of_memory_is_one_line(tmp_path, data):
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (1_500_000 << 10, 1_500_000 << 10))
    r = subprocess.run(command(*SIM[:-1], "10000000", "--out", "res"), capture_output=True, text=True,
                       cwd=tmp_path, env=env({"DDBENCH_DATA": str(data)}), timeout=300, preexec_fn=limit)
    assert_one_line_error(r, contains="out of memory")
    assert not (tmp_path / "res").exists()


# --------------------------------------------------------------------------- former two-line errors

def test_every_only_figure_failing_is_one_line_with_the_reasons(tmp_path):
    d = tmp_path / "d"
    (d / "paper").mkdir(parents=True)
    shutil.copy(SOURCE_TRACES / "paper" / "reported.json", d / "paper")
    r = run("figures", "--only", "fig17,fig18e", "--out", "figs", data=d, cwd=tmp_path)
    line = assert_one_line_error(r, contains="every figure failed (fig17: ")
    assert "kernels.csv" in line and "fig18e: " in line and "engine.csv" in line
    assert not (tmp_path / "figs").exists()


@pytest.mark.parametrize("args", [("plan", "--model", "a\nb", "--gpu", "h200", "--context", "32k"),
                                  ("plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "3\n2k")])
def test_a_newline_in_a_name_stays_on_one_line(tmp_path, data, args):
    line = assert_one_line_error(run(*args, data=data, cwd=tmp_path))
    assert "\\n" in line
