"""The calibration's SpeCache selection rows (kernels/calibrate.py, kernel `triton_quant_scan`): which
points it takes, and that resuming a bundle without them attempts only those (CPU: nothing is measured,
the run's deadline has passed, so `point` only asks the writer which rows it lacks)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from ddbench.core.calibration import SECTIONS, load_bundle  # noqa: E402
from ddbench.core.catalog import MODELS  # noqa: E402
from ddbench.core.paths import traces_dir  # noqa: E402

KEY = SECTIONS["kernels"]["key"]


class _Writer:
    """A bundle writer holding the committed H200 rows less `drop`; records the keys it is asked for and lacks."""

    def __init__(self, drop=("triton_quant_scan",)):
        b = load_bundle(str(traces_dir("calibration", "h200")))
        self.gpu = "h200"
        self.rows = {s: [r for r in rows if s != "kernels" or r["kernel"] not in drop] for s, rows in b.rows.items()}
        self.keys = {tuple(str(r[c]) for c in KEY) for r in self.rows["kernels"]}
        self.missing: list[dict] = []

    def have(self, section, **key):
        assert section == "kernels"
        if tuple(str(key[c]) for c in KEY) in self.keys:
            return True
        self.missing.append(key)
        return False

    def add(self, section, row):  # pragma: no cover - nothing is measured here
        raise AssertionError("measured on the CPU")

    def complete(self, section, note=""):  # pragma: no cover - the deadline has passed
        raise AssertionError("completed past the deadline")


def _run_kernels(writer):
    from ddbench.kernels.calibrate import Calibrator
    cal = Calibrator(writer, deadline=0.0, log=lambda m: None)  # out of time: point() measures nothing
    cal.kernels()
    assert cal.measured == 0 and not cal.errors
    return cal


def test_resume_without_quant_scan_rows_attempts_only_the_12_new_points():
    w = _Writer()
    cal = _run_kernels(w)
    assert cal.skipped == len(w.rows["kernels"]) > 300
    assert len(w.missing) == 12
    assert all(k["kernel"] == "triton_quant_scan" for k in w.missing)
    got = {(k["kv_tokens"], k["batch"], k["q_tokens"]) for k in w.missing}
    assert got == {(ctx, b, q) for ctx in (32768, 131072) for b in (1, 8, 32) for q in (1, 2)}
    assert {(k["num_heads"], k["num_kv_heads"], k["head_dim"], k["param"]) for k in w.missing} == {(32, 8, 128, 64)}
    assert all(set(k) == set(KEY) for k in w.missing)


def test_quant_scan_points_only_for_the_engine_heads():
    from ddbench.kernels.calibrate import QUANT_SCAN_GROUP, QUANT_SCAN_HEADS, Calibrator, quant_scan_bytes
    assert QUANT_SCAN_HEADS in {(m.num_heads, m.num_kv_heads, m.head_dim) for m in MODELS.values()}
    assert len(Calibrator.QUANT_SCAN_POINTS) == 12
    # the HBM floor's bytes: codes (4 tokens a byte) + bf16 scale and zero per group, per KV head and channel
    assert quant_scan_bytes(16, 8, 131072, 128) == 16 * 8 * 128 * (131072 // 4 + 2 * 2 * 131072 // QUANT_SCAN_GROUP)
    # the cost model's x for the same row is the same bytes
    from ddbench.sim.costmodel import CostModel
    assert CostModel._kernel_x("triton_quant_scan", 16, 2, 131072, 32, 8, 128, QUANT_SCAN_GROUP) == \
        quant_scan_bytes(16, 8, 131072, 128)


def test_nothing_missing_once_the_rows_exist():
    """A bundle with every row (the committed one plus the 12) attempts nothing."""
    from ddbench.kernels.calibrate import Calibrator, QUANT_SCAN_HEADS, QUANT_SCAN_GROUP
    w = _Writer()
    hq, hk, d = QUANT_SCAN_HEADS
    for ctx, b, q in Calibrator.QUANT_SCAN_POINTS:
        key = {"kernel": "triton_quant_scan", "batch": b, "q_tokens": q, "kv_tokens": ctx, "num_heads": hq,
               "num_kv_heads": hk, "head_dim": d, "param": QUANT_SCAN_GROUP}
        w.keys.add(tuple(str(key[c]) for c in KEY))
    _run_kernels(w)
    assert w.missing == []
