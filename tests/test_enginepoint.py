"""Engine points as typed records (ddbench.core.enginepoint): every committed row's label reads back into one
and writes back the same, and no product file decodes a label by slicing."""

import csv
import re
from pathlib import Path

import pytest

from ddbench.core.designs import DESIGNS
from ddbench.core.enginepoint import EnginePoint
from ddbench.core.errors import DDBenchError

ROOT = Path(__file__).resolve().parents[1]


def test_every_committed_label_round_trips_and_matches_its_columns():
    seen = 0
    for path in sorted((ROOT / "traces" / "engine").glob("**/engine.csv")):
        for r in csv.DictReader(path.open()):
            label = r.get("design_label")
            if not label:
                continue
            p = EnginePoint.parse(label)
            assert str(p) == label and p.base == r["design"] and p.spec().name == r["design"]
            for col in ("kv_bits", "cache_bits"):
                if r.get(col):
                    assert getattr(p, col) == int(float(r[col])), (path, label, col)
            if p.cache_tokens:
                assert p.cache_tokens == int(float(r["cache_tokens"]))
            seen += 1
    assert seen > 500


def test_single_is_the_dual_token_design_with_one_query_token():
    p = EnginePoint.named("dualdecoder", single=True)
    assert p.design == "dualdecoder-single" and p.single and p.base == "dualdecoder"
    assert p.spec().tokens_per_step == 1 and DESIGNS["dualdecoder"].tokens_per_step == 2
    assert EnginePoint("shadowkv").spec() is DESIGNS["shadowkv"] and not EnginePoint("shadowkv").single
    with pytest.raises(DDBenchError, match="unknown design"):
        EnginePoint("nonesuch-single").spec()
    with pytest.raises(DDBenchError, match="whole number"):
        EnginePoint.parse("dualdecoder-cache@8k")


def test_no_label_is_decoded_by_slicing():
    pat = re.compile(r"\[:-7\]|endswith\(\"-single\"\)|partition\(\"@\"\)")
    hits = [f"{p.relative_to(ROOT)}" for folder in ("ddbench", "sim", "kernels") for p in (ROOT / folder).rglob("*.py")
            if pat.search(p.read_text(encoding="utf-8")) and p.name != "enginepoint.py"]
    assert hits == []
