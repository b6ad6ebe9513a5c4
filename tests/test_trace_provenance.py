"""Every engine trace folder says what it holds and where it came from: a README.md or a meta.json."""

from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1] / "traces" / "engine"


def test_every_engine_trace_folder_has_a_readme_or_meta():
    folders = [p for p in ENGINE.iterdir() if p.is_dir()]
    assert len(folders) >= 20
    bare = [p.name for p in folders if not ((p / "README.md").is_file() or (p / "meta.json").is_file())]
    assert bare == []


def test_folder_names_are_not_near_duplicates():
    """No two folders whose names differ only by hyphens (h200-cache-fill against h200-cachefill)."""
    names = [p.name for p in ENGINE.iterdir() if p.is_dir()]
    squashed = [n.replace("-", "") for n in names]
    assert len(set(squashed)) == len(squashed), sorted(names)
