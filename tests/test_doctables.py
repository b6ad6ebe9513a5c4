"""The generated tables of README.md and docs/*.md match the committed traces (ddbench/doctables/).

A table edited by hand, or a trace changed without `python -m ddbench.doctables`, fails here.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from ddbench import doctables
from tests.cli import ROOT, module

ROOT_P = Path(ROOT)


def _groups() -> dict[str, list[tuple[str, str]]]:
    """Every generated block of README.md and docs/*.md, grouped so that an example and the notes that
    read its output run in one test (one run of its command): {group: [(file, name), ...]}."""
    out: dict[str, list[tuple[str, str]]] = {}
    for path in doctables.documents(ROOT_P):
        rel = str(path.relative_to(ROOT_P))
        for name, _ in doctables.blocks(path.read_text(encoding="utf-8"), rel):
            group = name.removeprefix("example-").removeprefix("notes-")
            out.setdefault(group, []).append((rel, name))
    return out


GROUPS = _groups()


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_every_generated_block_is_up_to_date(group):
    """One test per block (an example with its notes), so that xdist spreads the command runs."""
    stale = []
    for rel, name in GROUPS[group]:
        text = (ROOT_P / rel).read_text(encoding="utf-8")
        _, changed = doctables.render(text, ROOT_P, where=rel, only={name})
        stale += [f"{rel}: {n}" for n in changed]
    assert not stale, f"stale generated blocks (run `python -m ddbench.doctables`): {stale}"


def test_readme_has_the_results_block_and_docs_use_known_names():
    readme = (ROOT_P / "README.md").read_text(encoding="utf-8")
    assert "<!-- generated: results -->" in readme
    names = [m.group(1) for p in doctables.documents(ROOT_P) for m in doctables.START.finditer(p.read_text("utf-8"))]
    assert names and set(names) <= set(doctables.GENERATORS), names


def test_a_hand_edited_table_is_stale():
    text = (ROOT_P / "README.md").read_text(encoding="utf-8")
    new, changed = doctables.render(text, ROOT_P)
    assert new == text and changed == []
    row = next(ln for ln in text.splitlines() if ln.startswith("| dualdecoder, batch"))
    edited = text.replace(row, row.replace("115", "116", 1))
    assert edited != text
    fixed, changed = doctables.render(edited, ROOT_P)
    assert changed == ["results"] and fixed == text


def test_headline_numbers_come_from_the_engine_trace():
    cal = pd.read_csv(ROOT_P / "traces/engine/h200/engine.csv")
    val = pd.read_csv(ROOT_P / "traces/engine/h200-validation/engine.csv")
    table = doctables.headline(ROOT_P)
    f = cal[(cal.phase == "floor") & (cal.design == "dualdecoder") & (cal.context == 131072) & (cal.batch == 16)
            & (cal.miss_rate == "none") & (cal.tokens == 2)]
    assert len(f) == 1
    row = next(ln for ln in table.splitlines() if ln.startswith("| dualdecoder |"))
    assert f"{f.tok_s.iloc[0]:,.0f}" in row and f"{f.step_over_floor.iloc[0]:.2f}" in row
    both = [x[(x.phase == "validation") & (x.design == "dualdecoder") & (x.context == 131072) & (x.batch == 32)
              & (x.transfers == 1) & (x.miss_rate == "0.25")].tok_s for x in (cal, val)]
    tok = sorted(v for s in both for v in s)
    assert len(tok) == 2                                    # one run each: the cell says so
    assert f"({tok[0]:.0f}-{tok[1]:.0f}, 2 runs)" in row
    assert "| full-kv | 7 | does not fit" in table          # 128K at batch 16 is out of memory


def test_validation_errors_match_the_summary():
    import json
    s = json.loads((ROOT_P / "traces/validation/h200-engine-summary.json").read_text())
    line = doctables.validation_line(ROOT_P)
    for regime, v in s["regimes"].items():
        assert f"{regime} {100 * v['median_abs_error']:.1f} % ({v['points']} points, " \
               f"worst {100 * v['worst_abs_error']:.1f} %)" in line


def test_unknown_or_unterminated_block_is_an_error():
    with pytest.raises(doctables.DocTablesError, match="unknown generated block"):
        doctables.render("<!-- generated: nosuch -->\n<!-- end -->\n", ROOT_P)
    with pytest.raises(doctables.DocTablesError, match="has no"):
        doctables.render("<!-- generated: headline -->\nno end\n", ROOT_P)


def test_cli_check_and_rewrite(tmp_path):
    """--check exits 1 on a stale block and changes nothing; without it the block is rewritten."""
    for part in ("traces", "figures"):
        (tmp_path / part).symlink_to(ROOT_P / part)
    doc = tmp_path / "README.md"
    doc.write_text("# x\n\n<!-- generated: validation -->\nold table\n<!-- end -->\ntail\n", encoding="utf-8")
    r = module("ddbench.doctables", "--check", "--root", tmp_path)
    assert r.returncode == 1 and "README.md: validation" in r.stderr, (r.returncode, r.stderr)
    assert "old table" in doc.read_text()
    r = module("ddbench.doctables", "--root", tmp_path)
    assert r.returncode == 0, r.stderr
    text = doc.read_text()
    assert "old table" not in text and "| link-bound |" in text and text.endswith("<!-- end -->\ntail\n")
    assert module("ddbench.doctables", "--check", "--root", tmp_path).returncode == 0
