"""Every figure: each panel has axis labels, with a unit where the axis is numeric; every paper
number its notes, labels or CSV state is one of traces/paper/reported.json."""

import re

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from ddbench.core.paper_numbers import reported
from ddbench.experiments import load_all
from ddbench.plotting import new_figure

# Figures drawn in files this suite's owners do not edit; each entry names the flaw, and the
# test fails (strict xfail) once it is fixed, so the entry goes.
KNOWN: dict[str, str] = {}

UNIT = re.compile(r"\((?:[^()]*?)(?:ms|us|s|GB|GiB|MiB|%|tokens|requests|ratio|tokens/s|GB/s|requests/s|"
                  r"steps?|scale)[^()]*\)")
PAPER_NUMBER = re.compile(r"\bpaper(?:'s)?:?(?:\s+(?:up to|implied|\d+[KB]|[A-Za-z-]+))?\s+(\d+(?:\.\d+)?)(%?)(?![\w.])")


@pytest.fixture(scope="module")
def results():
    return {k: e.compute() for k, e in load_all().items()}


def _categorical(axis) -> bool:
    labels = [t.get_text() for t in axis.get_ticklabels() if t.get_text()]
    return bool(labels) and not all(re.fullmatch(r"[−\-\d.,eE+ ]+", s) for s in labels)


def _axes_problems(exp, res) -> list[str]:
    fig = new_figure()
    try:
        exp.draw(res, fig)
        fig.canvas.draw()
        out = []
        for i, ax in enumerate(fig.axes):
            if not (ax.lines or ax.patches or ax.collections):
                continue
            for name, label, axis in (("x", ax.get_xlabel(), ax.xaxis), ("y", ax.get_ylabel(), ax.yaxis)):
                if not label.strip():
                    out.append(f"panel {i}: no {name}-label")
                elif not _categorical(axis) and not UNIT.search(label):
                    out.append(f"panel {i}: {name}-label {label!r} has no unit in parentheses")
        return out
    finally:
        plt.close(fig)


@pytest.mark.parametrize("fid", sorted(load_all()))
def test_axis_labels_with_units(fid, results):
    if fid in KNOWN:
        pytest.xfail(KNOWN[fid]) if _axes_problems(load_all()[fid], results[fid]) else \
            pytest.fail(f"{fid} is fixed: drop it from KNOWN")
    assert _axes_problems(load_all()[fid], results[fid]) == []


def _matches(x: str, pct: str, values) -> bool:
    q = float(x)
    digits = len(x.split(".")[1]) if "." in x else 0
    tol = 0.5 * 10 ** -digits + 1e-9
    return any(abs(q - v) <= tol or (pct and abs(q - 100 * v) <= tol) for v in values)


def _texts(exp, res) -> list[str]:
    fig = new_figure()
    try:
        exp.draw(res, fig)
        texts = [t.get_text() for ax in fig.axes for t in ax.texts]
        texts += [ax.get_title() for ax in fig.axes] + [t.get_text() for t in fig.texts]
        if fig._suptitle is not None:
            texts.append(fig._suptitle.get_text())
        for leg in [ax.get_legend() for ax in fig.axes] + list(fig.legends):
            if leg is not None:
                texts += [t.get_text() for t in leg.get_texts()]
        return texts
    finally:
        plt.close(fig)


@pytest.mark.parametrize("fid", sorted(load_all()))
def test_paper_numbers_in_notes_are_in_reported(fid, results):
    values = [r.value for r in reported().values()]
    res = results[fid]
    texts = [c.note for c in res.comparisons] + [res.setup] + _texts(load_all()[fid], res)
    for text in texts:
        for m in PAPER_NUMBER.finditer(text):
            assert _matches(m.group(1), m.group(2), values), (fid, m.group(0), text)
    df = res.data
    for col in [c for c in df.columns if c.startswith("paper")]:
        for v in pd.to_numeric(df[col], errors="coerce").dropna():
            assert any(abs(v - x) < 1e-9 for x in values), (fid, col, v)


def test_the_paper_number_pattern_finds_what_it_should():
    found = [m.group(1) + m.group(2) for m in PAPER_NUMBER.finditer(
        "the paper's 120 implies; (paper 1.24); paper: up to 64%; the paper's implied 60; paper 128K 2.62; "
        "paper 8B 1.24; the paper's limits here are 2x")]
    assert found == ["120", "1.24", "64%", "60", "2.62", "1.24"]
    assert _matches("64", "%", [0.64]) and _matches("1.24", "", [1.244]) and not _matches("1.3", "", [1.244])
