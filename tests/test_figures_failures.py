"""`ddbench figures` when one figure fails: one line naming it, the others written and swapped in
whole, exit 2; a failed figure leaves none of its files (with --only, the previous copy stays)."""

import json
import os
import shutil

import pytest

from ddbench.core.outputs import MANIFEST as MARKER
from ddbench.core.paths import SOURCE_TRACES
from tests.cli import ddbench

FAST = "fig05"       # a memory-model figure: about a second
FAILS = "fig07"      # needs traces/accuracy/


def ddb(*args, data, cwd):
    return ddbench("figures", *args, cwd=cwd, env={"DDBENCH_DATA": str(data)}, timeout=600)


@pytest.fixture
def no_accuracy(tmp_path):
    if not SOURCE_TRACES.is_dir():
        pytest.skip("needs the source checkout's traces/")
    data = tmp_path / "traces"
    shutil.copytree(SOURCE_TRACES, data, ignore=shutil.ignore_patterns("accuracy"))
    assert not (data / "accuracy").exists()
    return data


def _failure_lines(stderr):
    return [ln for ln in stderr.splitlines() if "failed" in ln and "ddbench: figure" in ln]


def test_one_failed_figure_leaves_the_others_written(tmp_path, no_accuracy):
    out = tmp_path / "figs"
    p = ddb("--only", f"{FAST},{FAILS},fig15", "--out", str(out), data=no_accuracy, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    lines = _failure_lines(p.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"ddbench: figure {FAILS} failed: {FAILS}: no accuracy profile"), \
        p.stderr
    assert f"wrote 2 figure(s) into {out}; 1 failed: {FAILS}" in p.stderr
    names = set(os.listdir(out))
    assert names == {MARKER} | {f"{f}.{x}" for f in (FAST, "fig15") for x in ("csv", "png", "pdf")}
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]      # no temporary folder left behind


def test_failed_figure_keeps_its_previous_copy_with_only(tmp_path, no_accuracy):
    out = tmp_path / "figs"
    assert ddb("--only", FAST, "--out", str(out), data=SOURCE_TRACES, cwd=tmp_path).returncode == 0
    (out / f"{FAILS}.csv").write_text("previous run\n")       # stands for the last good fig07
    p = ddb("--only", f"{FAILS},{FAST}", "--out", str(out), data=no_accuracy, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert (out / f"{FAILS}.csv").read_text() == "previous run\n"
    assert not (out / f"{FAILS}.png").exists() and (out / f"{FAST}.png").exists()


def test_every_figure_failing_leaves_out_as_it_was(tmp_path, no_accuracy):
    out = tmp_path / "figs"
    assert ddb("--only", FAST, "--out", str(out), data=SOURCE_TRACES, cwd=tmp_path).returncode == 0
    before = {n: os.stat(out / n).st_mtime_ns for n in os.listdir(out)}
    p = ddb("--only", FAILS, "--out", str(out), data=no_accuracy, cwd=tmp_path)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [p.stderr.strip()]           # one line: the reason in it
    assert p.stderr.startswith(f"ddbench: error: every figure failed ({FAILS}: ")
    assert {n: os.stat(out / n).st_mtime_ns for n in os.listdir(out)} == before


def test_a_paper_number_not_marked_replayed_fails_only_its_figure(tmp_path):
    if not SOURCE_TRACES.is_dir():
        pytest.skip("needs the source checkout's traces/")
    data = tmp_path / "traces"
    shutil.copytree(SOURCE_TRACES, data)
    doc = json.loads((data / "paper" / "reported.json").read_text())
    for r in doc["numbers"]:
        if r["id"] == "fig7a.kv_accuracy.mean":
            r["status"], r["reason"] = "not replayed yet", "test: pretend nothing replays it"
    (data / "paper" / "reported.json").write_text(json.dumps(doc))
    out = tmp_path / "figs"
    p = ddb("--only", f"{FAILS},{FAST}", "--out", str(out), data=data, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = _failure_lines(p.stderr)
    assert len(lines) == 1 and "fig7a.kv_accuracy.mean, which reported.json marks 'not replayed yet'" in lines[0]
    assert (out / f"{FAST}.png").exists() and not (out / f"{FAILS}.png").exists()
