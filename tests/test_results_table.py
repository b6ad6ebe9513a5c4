"""The README's one results table (ddbench/doctables/results_table.py): one engine run, the grid points that
bracket each design's matched rates, and a README that is short and names no commit or issue in its prose."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from ddbench import doctables
from ddbench.doctables.results_table import AXES, CTX, GRID, bracket, results
from tests.cli import ROOT

ROOT_P = Path(ROOT)
README = (ROOT_P / "README.md").read_text(encoding="utf-8")


def test_the_committed_block_is_what_the_generator_writes():
    (body,) = [b for n, b in doctables.blocks(README, "README.md") if n == "results"]
    assert body == doctables.generate("results", ROOT_P)


def test_bracket_takes_the_grid_points_around_the_interval_or_the_grids_end():
    grid = [0.06, 0.12, 0.18, 0.25, 0.31, 0.38, 0.45]
    assert bracket(grid, 0.240, 0.311) == (0.18, 0.38)
    assert bracket(grid, 0.25, 0.31) == (0.25, 0.31)          # a grid point on an end is that end
    assert bracket(grid, 0.015, 0.148) == (0.06, 0.18)        # below the grid: its lowest point


def test_every_cell_is_the_median_of_the_separate_process_builds_of_one_run():
    eng = pd.read_csv(ROOT_P / "traces" / GRID / "engine.csv")
    eng = eng[eng["context"] == CTX]
    assert eng["git_sha"].nunique() == 1 and eng["seed"].nunique() == 3     # one code, three processes
    text = results(ROOT_P)
    assert "separate processes" in text and "NOT fitted to these rows" in text
    g = eng[(eng["design"] == "shadowkv") & ((eng["forced_urgent_or_miss"] - 0.18).abs() < 1e-9)]
    med = sorted(g["tok_s"])[1]
    row = next(ln for ln in text.splitlines() if ln.startswith("| shadowkv, batch 46 |"))
    assert f"{med:,.0f} ({min(g['tok_s']):,.0f}-{max(g['tok_s']):,.0f}); sim" in row
    assert set(AXES) == {r.split(",")[0].strip("| ") for r in text.splitlines() if r.startswith("| ") and ", batch" in r}


def test_readme_is_short_and_its_prose_names_no_commit_or_issue():
    assert len(README.splitlines()) <= 200
    prose = re.sub(r"<!-- generated: .*?<!-- end -->", "", README, flags=re.S)
    prose = re.sub(r"```.*?```", "", prose, flags=re.S)
    assert not re.search(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", prose), "a commit hash"
    assert not re.search(r"\bissues? \d+|#\d+", prose, flags=re.I), "an issue number"
    generated = "".join(b for _, b in doctables.blocks(README, "README.md"))
    assert not re.search(r"\bgit [0-9a-f]{7}", generated)
