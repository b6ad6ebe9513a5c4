"""No absolute local path (a home, /root, /tmp or a checkout under /work) in the committed traces and docs.

Traces and docs travel to other machines; a path of the machine they were written on means nothing
there and leaks its layout. Provenance keeps commands with relative paths (the model file name, the
data root's `traces/...`, `out/...` for scratch output folders).
"""

from __future__ import annotations

import os
import re
import subprocess

from tests.cli import ROOT

PATTERN = re.compile(r"/work/|/root/|/home/|/tmp/|/Users/")
SCOPE = ("traces", "docs", "README.md", os.path.join("figures", "README.md"))


def _files() -> list[str]:
    """Tracked files and untracked ones not ignored (about to be committed) in SCOPE."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", *SCOPE], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        return sorted({line for line in out.splitlines() if line.strip()})
    except (OSError, subprocess.CalledProcessError):       # no git: every file in scope
        found = []
        for top in SCOPE:
            path = os.path.join(ROOT, top)
            if os.path.isfile(path):
                found.append(top)
            for d, _, names in os.walk(path):
                found += [os.path.relpath(os.path.join(d, n), ROOT) for n in names]
        return sorted(found)


def _text(path: str) -> str | None:
    with open(os.path.join(ROOT, path), "rb") as fh:
        data = fh.read()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_the_scope_is_not_empty():
    files = _files()
    assert "README.md" in files and any(f.startswith("traces/") for f in files), files[:5]


def test_no_absolute_local_paths():
    hits = []
    for path in _files():
        if not os.path.isfile(os.path.join(ROOT, path)):
            continue                                        # deleted in the working tree
        text = _text(path)
        if text is None:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            m = PATTERN.search(line)
            if m:
                hits.append(f"{path}:{n}: ...{line[max(0, m.start() - 40):m.end() + 40]}...")
    assert not hits, f"{len(hits)} lines with absolute local paths, first ones:\n" + "\n".join(hits[:20])


def test_the_pattern_catches_what_it_should():
    assert PATTERN.search("--model /work/main/.venv/x.gguf") and PATTERN.search("--out /tmp/e")
    assert PATTERN.search("/root/out/cal") and PATTERN.search("/home/me/models")
    assert not PATTERN.search("--out out/e --model SmolLM2-135M-Instruct.Q4_1.gguf traces/calibration/h200")
