"""`make figures` reproduces figures/ byte for byte (issue 30, part 5): two fast figures regenerated into a
temporary folder equal the committed ones, image (PNG, PDF: no dates, no software version in their
metadata) and data CSV (floats written %.10g). The whole run is 45 s; these two take a few seconds."""

from __future__ import annotations

import os

import pytest

from ddbench.core.paths import SOURCE_TRACES
from tests.cli import ROOT, ddbench

FIGURES = os.path.join(ROOT, "figures")
FAST = ("fig15", "fig17")

pytestmark = pytest.mark.skipif(not (SOURCE_TRACES.is_dir() and os.path.isdir(FIGURES)),
                                reason="needs the source checkout's traces/ and figures/")


def test_figures_regenerate_byte_for_byte(tmp_path):
    out = tmp_path / "figs"
    r = ddbench("figures", "--quiet", "--only", ",".join(FAST), "--out", str(out), cwd=tmp_path,
                env={"DDBENCH_DATA": str(SOURCE_TRACES), "SOURCE_DATE_EPOCH": None})
    assert r.returncode == 0, r.stderr
    written = sorted(n for n in os.listdir(out) if not n.startswith("."))
    assert written == sorted(f"{f}.{ext}" for f in FAST for ext in ("csv", "pdf", "png"))
    for name in written:
        with open(out / name, "rb") as a, open(os.path.join(FIGURES, name), "rb") as b:
            assert a.read() == b.read(), f"figures/{name} differs from a fresh `ddbench figures`"
    with open(out / f"{FAST[0]}.pdf", "rb") as fh:
        assert b"/CreationDate" not in fh.read()


@pytest.mark.slow
def test_every_figure_regenerates_byte_for_byte(tmp_path):
    """The whole `ddbench figures` (45 s; `make test-slow`): every file it writes equals the committed one."""
    out = tmp_path / "figs"
    r = ddbench("figures", "--quiet", "--out", str(out), cwd=tmp_path,
                env={"DDBENCH_DATA": str(SOURCE_TRACES), "SOURCE_DATE_EPOCH": None})
    assert r.returncode == 0, r.stderr
    written = sorted(n for n in os.listdir(out) if not n.startswith("."))
    committed = sorted(n for n in os.listdir(FIGURES) if not n.startswith("."))
    assert written == committed
    differ = []
    for name in written:
        with open(out / name, "rb") as a, open(os.path.join(FIGURES, name), "rb") as b:
            if a.read() != b.read():
                differ.append(name)
    assert differ == [], f"differ from a fresh `ddbench figures`: {differ}"
