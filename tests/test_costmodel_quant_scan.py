"""SpeCache's quantized-key selection in the cost model (sim/costmodel.py quant_scan_s): the measured
`triton_quant_scan` rows where the bundle has them, the HBM roofline (and a note saying so) where not."""

import pytest

from ddbench.core.calibration import Bundle, load_bundle
from ddbench.core.catalog import get_gpu, get_link, get_model
from ddbench.core.memory import Workload
from ddbench.core.paths import traces_dir
from ddbench.core.designs import DESIGNS
from ddbench.sim.costmodel import E, CostModel

M8 = get_model("llama-3-8b")
HQ, HK, D, GROUP = 32, 8, 128, 64
SLOW = 2.5          # the synthetic rows: SLOW x the HBM floor + a fixed 10 us
FIXED_MS = 0.010


def _h200_rows():
    b = load_bundle(str(traces_dir("calibration", "h200")))
    rows = {s: list(r) for s, r in b.rows.items()}
    rows["kernels"] = [r for r in rows["kernels"] if r["kernel"] != "triton_quant_scan"]
    return b, rows


def _qs_bytes(batch, ctx, hk=HK, d=D, group=GROUP):
    return batch * hk * ctx * (d * 2 / 8 + 2 * E * d / group)


def _bundle(with_rows: bool) -> Bundle:
    """The committed H200 bundle with its triton_quant_scan rows replaced by synthetic ones (or none)."""
    b, rows = _h200_rows()
    if with_rows:
        hbm = next(r["value"] for r in rows["ceilings"] if r["name"] == "hbm_d2d_copy_gbps") * 1e9
        for ctx in (32768, 131072):
            for batch in (1, 8, 32):
                for qt in (1, 2):
                    floor_ms = _qs_bytes(batch, ctx) / hbm * 1e3
                    rows["kernels"].append({"kernel": "triton_quant_scan", "batch": batch, "q_tokens": qt,
                                            "kv_tokens": ctx, "num_heads": HQ, "num_kv_heads": HK, "head_dim": D,
                                            "param": GROUP, "latency_ms": FIXED_MS + SLOW * floor_ms,
                                            "hbm_floor_ms": floor_ms})
    return Bundle(b.path, b.meta, rows)


def _cm(with_rows: bool, gpu="h200", model=M8) -> CostModel:
    return CostModel(model, get_gpu(gpu), get_link("pcie5"), _bundle(with_rows))


def _roof(cm, batch, q, ctx, bits=2, group=GROUP, m=M8):
    nbytes = batch * m.num_kv_heads * ctx * (m.head_dim * bits / 8 + 2 * E * m.head_dim / group)
    return cm._roofline(2.0 * batch * q * m.num_heads * ctx * m.head_dim, nbytes)


def _qs_notes(cm):
    return [n for n in cm.notes if "quantized-key" in n or "triton_quant_scan" in n]


@pytest.mark.parametrize("batch,q,ctx", [(1, 1, 32768), (8, 2, 65536), (16, 2, 131072), (32, 1, 131072)])
def test_measured_rows_are_used(batch, q, ctx):
    cm = _cm(True)
    t = cm.quant_scan_s(batch, q, ctx, 2, GROUP)
    # the rows are SLOW x the floor + 10 us: the fit reproduces them (exact between the measured points)
    want = FIXED_MS / 1e3 + SLOW * _qs_bytes(batch, ctx) / cm.hbm
    assert t == pytest.approx(want, rel=1e-9)
    assert t > 2 * _roof(cm, batch, q, ctx)
    assert not _qs_notes(cm)
    assert not any(n.startswith("ROOFLINE") for n in cm.notes)


def test_fit_is_per_query_tokens():
    b, rows = _h200_rows()
    hbm = next(r["value"] for r in rows["ceilings"] if r["name"] == "hbm_d2d_copy_gbps") * 1e9
    for ctx in (32768, 131072):
        for batch in (1, 8, 32):
            for qt, slow in ((1, 2.0), (2, 3.0)):
                f = _qs_bytes(batch, ctx) / hbm * 1e3
                rows["kernels"].append({"kernel": "triton_quant_scan", "batch": batch, "q_tokens": qt,
                                        "kv_tokens": ctx, "num_heads": HQ, "num_kv_heads": HK, "head_dim": D,
                                        "param": GROUP, "latency_ms": slow * f, "hbm_floor_ms": f})
    cm = CostModel(M8, get_gpu("h200"), get_link("pcie5"), Bundle(b.path, b.meta, rows))
    t1, t2 = cm.quant_scan_s(8, 1, 65536, 2, GROUP), cm.quant_scan_s(8, 2, 65536, 2, GROUP)
    assert t2 / t1 == pytest.approx(1.5, rel=1e-9)


def test_without_rows_roofline_and_note():
    cm = _cm(False)
    t = cm.quant_scan_s(16, 2, 131072, 2, GROUP)
    assert t == _roof(cm, 16, 2, 131072)
    assert any(n.startswith("ROOFLINE") and "quantized-key" in n and "no kernel measured" in n for n in cm.notes)
    # and with no bundle at all
    roof = CostModel(M8, get_gpu("h200"), get_link("pcie5"), None)
    assert roof.quant_scan_s(16, 2, 131072, 2, GROUP) == _roof(roof, 16, 2, 131072)
    assert any("quantized-key" in n for n in roof.notes)


@pytest.mark.parametrize("bits,group", [(1, 64), (4, 64), (2, 32), (2, 128)])
def test_other_bits_or_group_fall_back_with_a_note(bits, group):
    cm = _cm(True)
    t = cm.quant_scan_s(8, 2, 65536, bits, group)
    assert t == _roof(cm, 8, 2, 65536, bits, group)
    notes = [n for n in cm.notes if n.startswith("ROOFLINE") and "quantized-key" in n]
    assert len(notes) == 1
    assert f"{bits} bits, group {group}" in notes[0] and "triton_quant_scan" in notes[0] and "group 64" in notes[0]


def test_scaled_bundle_scales_the_kernel():
    """Another GPU: the measured time scaled by the roofline ratio (HBM-bound: the HBM ratio)."""
    own, h100 = _cm(True), _cm(True, gpu="h100-80gb")
    a, b = own.quant_scan_s(32, 2, 131072, 2, GROUP), h100.quant_scan_s(32, 2, 131072, 2, GROUP)
    assert b / a == pytest.approx(get_gpu("h200").hbm_gbps / get_gpu("h100-80gb").hbm_gbps, rel=1e-6)
    assert any(n.startswith("SCALED") for n in h100.notes) and not _qs_notes(h100)


def test_other_head_configuration_uses_the_fit_and_says_so():
    m = get_model("qwen2.5-7b")  # 28 / 4 heads: not measured; fitted on the bundle's 32 / 8 rows
    cm = _cm(True, model=m)
    t = cm.quant_scan_s(8, 2, 65536, 2, GROUP)
    assert t == pytest.approx(FIXED_MS / 1e3 + SLOW * _qs_bytes(8, 65536, hk=m.num_kv_heads) / cm.hbm, rel=1e-9)
    assert any("triton_quant_scan" in n and "other head configurations" in n for n in cm.notes)


def test_specache_plan_selection_is_the_measured_scan_only():
    """SpeCache's per-layer selection in the step plan is quant_scan_s alone: the measured row already
    holds the top-k, and nothing adds another."""
    from ddbench.sim.steplayers import step_layers
    cm = _cm(True)
    w = Workload(context=131072)
    hit = [0.9] * M8.num_layers
    p = step_layers(DESIGNS["specache"], M8, cm, w, 16, 131072, hit, hit)
    lin = cm.linear_s(M8.hidden, (M8.num_heads + 2 * M8.num_kv_heads) * M8.head_dim, 16 * p.q_tokens)
    sel = cm.quant_scan_s(16, p.q_tokens, 131072, 2, w.quant_group)
    assert p.pre[0] == pytest.approx(lin + sel, rel=1e-12)
    assert sel > 2 * _roof(cm, 16, p.q_tokens, 131072)
