"""kernels/engine/breakdown.py on the CPU: kernel categories, busy time as a union, bad input."""

import subprocess
import sys

import pytest

from ddbench.kernels.engine.breakdown import category, summarize, union_ms


@pytest.mark.parametrize("name,cat", [
    ("nvjet_sm90_tst_128x8_64x12_2x1_v_bz_NNT", "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float>", "gemm"),
    ("_score_pass1", "selection"), ("_norm_topk_kernel", "selection"), ("_spec_pass1_kernel", "selection"),
    ("_codes_kernel", "selection"), ("_stream_topk_kernel", "selection"), ("_bits_topk_kernel", "selection"),
    ("score_pass1_kernel", "selection"), ("score_pass2_kernel", "selection"), ("bits_topk_kernel", "selection"),
    ("stream_topk_kernel", "selection"), ("seg_topk_kernel", "selection"), ("merge_topk_kernel", "selection"),
    ("_attn_kernel", "attention"), ("_combine_kernel", "attention"),
    ("_plan_kernel", "misses"), ("_perturb_kernel", "misses"), ("_rebuild_kernel", "rebuild"),
    ("_gather_kernel", "gather"), ("_rmsnorm_kernel", "glue"), ("void at::native::vectorized_elementwise_kernel<4>", "glue"),
])
def test_categories(name, cat):
    assert category(name) == cat


def test_union_counts_overlap_once():
    assert union_ms([(0, 1000), (500, 1500), (3000, 3500), (3100, 3200)]) == pytest.approx(2.0)
    assert union_ms([]) == 0


def test_summarize_per_step():
    row = dict(design="dualdecoder", context=32768, batch=1, step_ms=5.0, floor_ms=4.0, step_over_floor=1.25,
               weights_gib=2.0)
    evs = [dict(name="nvjet_x", ts=0, dur=3000), dict(name="_attn_kernel", ts=3000, dur=1000),
           dict(name="nvjet_x", ts=5000, dur=3000), dict(name="_attn_kernel", ts=8000, dur=1000)]
    s = summarize(row, evs, steps=2, hbm_gbps=2 * 2 ** 30 / 1e9 / 2e-3)   # weights floor 2 ms
    assert s["categories"]["gemm"] == dict(ms=3.0, kernels=1)
    assert s["busy_ms"] == pytest.approx(4.0) and s["idle_ms"] == pytest.approx(1.0)
    assert s["weights_floor_ms"] == pytest.approx(2.0) and s["gemm_over_weights_floor"] == pytest.approx(1.5)


def test_bad_points_one_line_exit_2():
    r = subprocess.run([sys.executable, "-m", "ddbench.kernels.engine.breakdown", "--points", "32k:x"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--points" in r.stderr
