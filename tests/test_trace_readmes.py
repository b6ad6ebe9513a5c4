"""Every trace folder says what it holds: each folder under traces/ (to depth 2) has a README.md or a
meta.json (its commit, GPU, versions, command and what it holds), so a reader of a committed number can
find where it came from."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _folders(traces: Path) -> list[Path]:
    return sorted(p for p in traces.glob("*") if p.is_dir()) + sorted(p for p in traces.glob("*/*") if p.is_dir())


def _undescribed(traces: Path) -> list[str]:
    bad = []
    for folder in _folders(traces):
        readme, meta = folder / "README.md", folder / "meta.json"
        if readme.is_file() and readme.read_text(encoding="utf-8").strip():
            continue
        if meta.is_file() and isinstance(json.loads(meta.read_text(encoding="utf-8")), dict):
            continue
        bad.append(str(folder.relative_to(traces)))
    return sorted(bad)


def test_every_trace_folder_has_a_readme_or_meta():
    assert _folders(ROOT / "traces"), "no trace folders found"
    assert _undescribed(ROOT / "traces") == []


def test_the_check_sees_a_bare_folder(tmp_path):
    (tmp_path / "engine" / "run").mkdir(parents=True)
    (tmp_path / "engine" / "README.md").write_text("# runs\n")
    (tmp_path / "engine" / "run" / "engine.csv").write_text("a\n1\n")
    (tmp_path / "kernels" / "h200" / "deep").mkdir(parents=True)
    (tmp_path / "kernels" / "h200" / "meta.json").write_text('{"git_sha": "x"}')
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.md").write_text("  \n")
    assert _undescribed(tmp_path) == ["empty", "engine/run", "kernels"]
