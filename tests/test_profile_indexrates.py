"""`ddbench profile --indexes` (issue 47): the selection under each index, on crafted and random landmarks, the
rates' intervals, the flat rows of a many-index run equal to a flat-only run's, and bad index names refused."""

import csv
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_profile_tiny import profile, tiny_model  # noqa: E402

from ddbench.core.errors import DDBenchError  # noqa: E402
from ddbench.profile import indexrates, selection  # noqa: E402
from ddbench.profile.metrics import overlaps  # noqa: E402
from tests.cli import assert_one_line_error  # noqa: E402


def _random(seed, N=64, d=32, H=2, Hq=4, nq=2):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, nq, Hq, d, generator=g)
    lm = torch.randn(1, H, N, d, generator=g) * torch.rand(1, 1, 1, d, generator=g) * 2
    return q, lm


def test_flat_is_todays_selection_and_its_rates():
    for seed in range(3):
        q, lm = _random(seed)
        ixs = selection.build_indexes([lm], ("flat", "fp8", "two-level:8,1"))
        assert ixs["flat"] is None and len(ixs["fp8"]) == 1
        got, today = selection.select_by(q, lm, ixs["flat"], 6), selection.select(q, lm, 6)
        assert torch.equal(got, today) and got.dtype == today.dtype
        assert torch.equal(selection.scores_by(q, lm, None, 6), selection.scores(q, lm))
        m, t = overlaps(got[0, 1:], got[0, :1], got[0, :1], 64), overlaps(today[0, 1:], today[0, :1], today[0, :1], 64)
        assert all(torch.equal(m[k], t[k]) for k in t)


def _crafted():
    """q = e0; flat's top 2 are chunks 3 and 20, each in a super-chunk (of 8) whose other chunks point away, so
    those super-chunks' means are negative; super-chunks 5 and 6 are uniformly mildly positive."""
    d, N = 16, 64
    lm = torch.zeros(1, 1, N, d)
    for s in (0, 2):
        lm[0, 0, s * 8:(s + 1) * 8, 0] = -5.0
    lm[0, 0, 3, 0] = lm[0, 0, 20, 0] = 10.0
    lm[0, 0, 40:56, 0] = 2.0 + 0.05 * torch.arange(16.0)            # distinct: no ties in the top-k
    q = torch.zeros(1, 2, 1, d)
    q[..., 0] = 1.0
    return q, lm


def test_coarse_two_level_selects_otherwise_and_moves_the_rates():
    q, lm = _crafted()
    ixs = selection.build_indexes([lm], ("flat", "two-level:8,1"))
    flat = selection.select_by(q, lm, None, 2)
    two = selection.select_by(q, lm, ixs["two-level:8,1"][0], 2)
    assert flat[0, 0, 0].tolist() == [3, 20]
    assert two[0, 0, 0].tolist() == [54, 55]          # the best chunks of the kept super-chunks 5 and 6
    sc = selection.scores_by(q, lm, ixs["two-level:8,1"][0], 2)
    assert float(sc[..., :40].abs().max()) == 0 and float(sc[..., 56:].abs().max()) == 0
    assert torch.equal(sc.topk(2, -1).indices.sort(-1).values.int(), two)
    # the true selection from flat's rule against a prediction under the coarse index: nothing hits
    assert float(overlaps(flat[0, :1], two[0, 1:], two[0, 1:], 64)["hit_rate"].max()) == 0


def test_parse_indexes_rejoins_two_level_names_and_refuses_bad_ones():
    assert selection.parse_indexes("fp8,int4,two-level:8,1,two-level:16,2,two-level:8,1,fp8") == (
        "flat", "fp8", "int4", "two-level:8,1", "two-level:16,2", "two-level:8,1,fp8")
    # a format right after a two-level's M is that index's own (the documented reading)
    assert selection.parse_indexes("two-level:16,2,int4,fp8") == ("flat", "two-level:16,2,int4,fp8")
    assert selection.parse_indexes(("bf16", "FP8")) == ("flat", "fp8")
    for bad in ("fp9", "two-level:1", "flat,,fp8", "two-level:8,0.5", "two-level"):
        with pytest.raises(DDBenchError):
            selection.parse_indexes(bad)


def test_interval_and_outside_flat():
    m, lo, hi, n = indexrates.interval([0.5, 0.7])
    assert (n, m) == (2, pytest.approx(0.6)) and hi - m == pytest.approx(1.2706) and m - lo == pytest.approx(1.2706)
    assert indexrates.interval([0.3]) == (0.3, 0.3, 0.3, 1)
    c = indexrates.Collector()
    for s, (a, b) in enumerate([(0.8, 0.4), (0.9, 0.5), (0.85, 0.45)]):
        for ix, v in (("flat", a), ("fp8", a), ("two-level:8,1", b)):
            c.add_overlaps((ix, 8128, "single", 128), s, {n: torch.full((2, 3), v) for n in indexrates.OVERLAPS})
    out = c.summary(("flat", "fp8", "two-level:8,1"), [], {})
    hit = [r for r in out["rates"] if r["metric"] == "hit_rate"]
    assert [r["index"] for r in hit] == ["flat", "fp8", "two-level:8,1"]
    assert [r["outside_flat"] for r in hit] == [None, False, True]
    assert any(o.startswith("two-level:8,1: hit_rate 0.450") for o in out["outside_flat"])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("m") / "tiny", "llama", max_pos=1024)


def _run(tiny, out, indexes):
    from ddbench.profile.layersweep import ProfileConfig, run
    return run(ProfileConfig(model=tiny, contexts=(256,), tasks=("single",), steps=3, budgets=(32,), inits=("t2",),
                             temperatures=(1.0,), device="cpu", out=str(out), progress=False, threads=1,
                             cache_capacities=(0, 1), cache_policies=("lru", "score"), prompts=1, indexes=indexes))


def test_flat_rows_of_a_many_index_run_equal_a_flat_only_run(tiny, tmp_path):
    _run(tiny, tmp_path / "flat", ("flat",))
    r = _run(tiny, tmp_path / "many", ("flat", "two-level:2,1"))
    name = os.path.basename(tiny)
    for f, drop in ((f"{name}.csv", ("date",)), (f"{name}.cache.csv", ("date",)), (f"{name}.steps.csv", ()),
                    (f"{name}.tasks.csv", ("date",))):
        one = list(csv.DictReader(open(tmp_path / "flat" / f)))
        many = list(csv.DictReader(open(tmp_path / "many" / f)))
        assert "index" not in one[0] and {x["index"] for x in many} == {"flat", "two-level:2,1"}
        flat = [{k: v for k, v in x.items() if k != "index" and k not in drop} for x in many if x["index"] == "flat"]
        assert flat == [{k: v for k, v in x.items() if k not in drop} for x in one], f
    assert "by_index" in r["summary"] and "indexes" in r["summary"]["config"]


def test_bad_index_names_one_line_exit2(tiny, tmp_path):
    for value, pattern in (("fp9", "unknown format"), ("two-level:1", "G >= 2")):
        r = profile("--layer-accuracy", "--model", tiny, "--indexes", value, "--out", str(tmp_path / "o"))
        assert_one_line_error(r, 2, pattern)
    with pytest.raises(DDBenchError, match="int4 packs groups"):       # head_dim 16: int4 cannot pack it
        _run(tiny, tmp_path / "o4", ("flat", "int4"))
    assert not os.path.exists(tmp_path / "o4") or os.listdir(tmp_path / "o4") == []
