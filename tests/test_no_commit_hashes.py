"""One engine in the code: no product file names a commit (an engine's history is data recorded with its
runs: traces/fit/engine-versions.json, the runs' meta.json), and none keys on one."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHA = re.compile(r"(?<![\w.+-])[0-9a-f]{7,40}(?![\w.])")


def _shas(text: str) -> list[str]:
    return [m for m in SHA.findall(text) if re.search(r"[a-f]", m) and re.search(r"[0-9]", m)]


def test_no_commit_hash_in_product_code():
    found = []
    for folder in ("ddbench", "sim", "kernels"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            hits = _shas(path.read_text(encoding="utf-8"))
            found += [f"{path.relative_to(ROOT)}: {h}" for h in hits]
    assert found == []


def test_the_scan_sees_a_hash():
    assert _shas('SINCE = "3aee1653b8ccfd2fbf42f367beb5a0d041f19292"  # the engine of commit 0f05ef2') == \
        ["3aee1653b8ccfd2fbf42f367beb5a0d041f19292", "0f05ef2"]
    assert _shas("x = 1.9353071795864769e-3; e4m3; 0x7fffffff; deadbeef") == []
