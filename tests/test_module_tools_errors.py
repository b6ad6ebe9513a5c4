"""The `python -m` tools beside the CLI (fits, validation, doctables, the engine sweep and its tables, the
benchmarks) report a bad argument as the CLI does: one line, exit 2 (ddbench.core.flags.OneLineParser)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.cli import ROOT

TOOLS = ("ddbench.sim.fit", "ddbench.sim.validate", "ddbench.doctables", "ddbench.profile.contexts",
         "ddbench.kernels.engine.sweep", "ddbench.kernels.engine.tables", "ddbench.kernels.engine.breakdown",
         "ddbench.kernels.linkbench", "ddbench.kernels.hostbench")


def _run(args, cwd):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))


@pytest.mark.parametrize("module", TOOLS)
def test_a_bad_argument_is_one_line_exit_2(module, tmp_path):
    r = _run(["-m", module, "--no-such-flag"], tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and ": error: " in r.stderr, r.stderr
    assert os.listdir(tmp_path) == []


def test_plain_argparse_is_not_one_line(tmp_path):
    """Negative control: argparse's own error prints the usage first (more than one line)."""
    r = _run(["-c", "import argparse; argparse.ArgumentParser(prog='x').parse_args(['--no-such-flag'])"], tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") > 1
