"""traces/paper/reported.json against the paper itself: every quote is the paper's own text,
every number stands in its quote, and what it calls inconsistent is."""

import re
from pathlib import Path

import pytest

from ddbench.core.errors import DDBenchError
from ddbench.core.paper_numbers import Reported, coverage, coverage_line, reported

PAPER = Path(__file__).resolve().parents[1].parent / "shared" / "seed" / "000_4d6cfa8e98b9173f.txt"


def _norm(text: str) -> str:
    """Whitespace collapsed and LaTeX math marks dropped ('$64\\%$' reads as '64%')."""
    return re.sub(r"\s+", " ", text.replace("$", "").replace("\\%", "%")).strip()


@pytest.fixture(scope="module")
def paper_text():
    if not PAPER.exists():
        pytest.skip(f"the paper's text is not beside this checkout ({PAPER})")
    return _norm(PAPER.read_text(encoding="utf-8"))


def test_every_quote_is_verbatim(paper_text):
    for rep in reported().values():
        for part in rep.quote.split(" ... "):
            assert _norm(part) in paper_text, rep.id


def _printed(value: float, unit: str) -> set[str]:
    """The ways the paper prints a value."""
    out = set()
    for v in (value, 100 * value if unit.startswith("fraction") and "exact" not in unit else None):
        if v is None:
            continue
        out |= {f"{v:g}", f"{v:.1f}", f"{v:.2f}", f"{v:.0f}" if float(v).is_integer() else f"{v:g}"}
    if unit == "tokens" and value % 1024 == 0:
        out.add(f"{int(value) // 1024}K")
    return out


def test_every_value_stands_in_its_quote():
    """Each number is printed in its sentence, unless it is derived (then the derivation says how)
    or an OOM claim (0 requests, 'OOM' in the sentence)."""
    for rep in reported().values():
        if rep.derived:
            continue
        if rep.value == 0 and "OOM" in rep.quote:
            continue
        words = set(re.findall(r"\d+(?:\.\d+)?K?", rep.quote))
        assert words & _printed(rep.value, rep.unit), (rep.id, rep.value, rep.quote)


def test_derived_values_follow_from_their_formula():
    for rep in reported().values():
        if rep.derived:
            expr = rep.derived.split("=")[0].split(",")[0]
            got = eval(expr, {"__builtins__": {}})  # noqa: S307 (our own file: "4 / 0.067")
            assert got == pytest.approx(rep.value, rel=0.01), rep.id


def test_table1_avg_row_is_called_inconsistent_exactly_where_it_is():
    p = reported()
    for ctx in ("64k", "128k"):
        for design in ("shadowkv", "dualdecoder"):
            col = [p[f"table1.{d}.{ctx}.{design}"].value for d in ("niah-1", "niah-2", "niah-3", "qa-2")]
            avg = p[f"table1.avg.{ctx}.{design}"]
            mean = sum(col) / len(col)
            # "inconsistent" until replayed; once replayed, the same words move to its inconsistency field
            said = avg.reason if avg.status == "inconsistent" else avg.inconsistency
            assert (abs(mean - avg.value) > 0.005) == bool(said), (ctx, design)
            assert f"{mean:.4f}" in said


def test_fig3_losses_imply_two_ideal_batches():
    """Proportional scaling (the paper's words) makes each loss fix an ideal batch: they differ."""
    p = reported()
    ideal = {s: p[f"fig3.{s}.max_batch"].value / (1 - p[f"fig3.{s}.lost_share"].value) for s in ("full-kv", "shadowkv")}
    assert round(ideal["full-kv"]) == 29 and round(ideal["shadowkv"]) == 74
    for s in ideal:
        assert f"= {round(ideal[s])}" in p[f"fig3.{s}.lost_share"].inconsistency
    assert p["fig2.ideal.8b.max_batch"].value not in {round(v) for v in ideal.values()}


def test_issue_numbers_are_present():
    p = reported()
    for pid in ("fig7a.kv_accuracy.mean", "fig7b.random_init.kv_accuracy.mean", "fig16.ruler.128k.min_accuracy",
                "fig16.ruler.128k.miss_share", "table1.budget_tokens", "fig14.specache.8b.max_batch",
                "fig12.128k.full-kv.max_batch", "fig12.256k.full-kv.max_batch", "fig12.256k.specache.max_batch",
                "fig2.ideal.32b.max_batch", "testbed.hbm_tbps", "testbed.host_cores", "testbed.host_memory_tb",
                "testbed.pcie_gbps_bidirectional", "setup.arrival_rate.min", "setup.arrival_rate.max",
                "fig15.range.start_tokens"):
        assert pid in p, pid
    assert sum(k.startswith("table1.") and k != "table1.budget_tokens" for k in p) == 20


def test_coverage_counts_and_refuses_disagreement():
    paper = {"a": Reported("a", "1", 1, "x", "q"), "b": Reported("b", "1", 2, "x", "q", inconsistency="i"),
             "c": Reported("c", "1", 3, "x", "q", status="not replayable", reason="r")}
    c = coverage(paper, {"a", "b"})
    assert coverage_line(c) == ("2 of 3 paper numbers replayed; 1 not replayable, with reasons; 0 inconsistent in "
                                "the paper; 0 not replayed yet; of the replayed, 1 contradicted elsewhere in the paper")
    assert "1 marked replayed but not in this run" in coverage_line(coverage(paper, {"a"}))
    with pytest.raises(DDBenchError, match="marks c as not replayed"):
        coverage(paper, {"a", "c"})
    with pytest.raises(DDBenchError, match="not in reported.json: z"):
        coverage(paper, {"z"})
