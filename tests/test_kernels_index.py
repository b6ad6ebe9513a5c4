"""The smaller selection indexes (kernels/indexkernels.py, issue 47) against their torch twins, on fresh random
keys and queries: the index built at prefill equals the twin's bit for bit; the selected chunk set equals
the twin's exactly (poisoned outputs and scratch); the flat bf16 index is today's selection unchanged;
two levels that keep every super-chunk select what one level selects; fp8 and int4 scores stay within
their stated error of the exact (fp32 landmark) scores. The CPU runs use fp16 queries (the Triton
interpreter's bf16 dot is not exact); the GPU tests run the same checks in bf16 at Llama-3-8B's 128K shape."""

import math
import zlib

import pytest
import torch

from ddbench.core.errors import DDBenchError
from ddbench.core.index import FP8_REL_ERROR, INT4_GROUP
from ddbench.kernels import indexkernels as X
from ddbench.kernels.engine import fastselect
from ddbench.kernels.select import LOG2E, select_chunks_ref

SPECS = ["flat", "fp8", "int4", "two-level:4", "two-level:4,2,fp8", "two-level:4,1,int4,fp8", "two-level:3,1.5,bf16,int4"]
FAST = ("fp8", "int4", "two-level:4,1,int4,fp8", "two-level:3,1.5,bf16,int4")     # the rest: make test-slow


def _inputs(B, nq, Hq, H, d, T, seed, dtype=torch.float16, dev="cpu"):
    g = torch.Generator().manual_seed(seed)
    keys = (torch.randn(B, H, T, d, generator=g) * torch.rand(1, 1, 1, d, generator=g) * 3).to(dev, dtype)
    q = torch.randn(B, nq, Hq, d, generator=g).to(dev, dtype)
    return keys, q


def _raw(L):
    return L.data.view(torch.uint8) if L.fmt == "fp8" else L.data


def _check_select(spec, B, nq, Hq, H, d, T, k, seed, dtype=torch.float16, dev="cpu", **kw):
    keys, q = _inputs(B, nq, Hq, H, d, T, seed, dtype, dev)
    ix, ref = X.build_index(keys, spec), X.build_index_ref(keys, spec)
    assert torch.equal(_raw(ix.fine), _raw(ref.fine)) and ((ix.coarse is None) == (ref.coarse is None))
    if ix.coarse is not None:
        assert torch.equal(_raw(ix.coarse), _raw(ref.coarse))
    out = torch.full((B, nq, H, k), -7, dtype=torch.int32, device=dev)
    got = X.index_select(q, ix, k, out=out, scores=torch.float32, **kw)
    assert got.data_ptr() == out.data_ptr() and (got.diff(dim=-1) > 0).all()
    want = X.index_select_ref(q, ix, k)
    assert torch.equal(got, want), (spec, int((got != want).sum()))
    return q, ix, got


@pytest.mark.parametrize("spec", [s if s in FAST else pytest.param(s, marks=pytest.mark.slow) for s in SPECS])
def test_selected_set_equals_twin(spec):
    _check_select(spec, 2, 2, 8, 2, 64, 8 * 90, 12, seed=zlib.crc32(spec.encode()) % 1000)


def test_one_token_and_group_of_one():
    _check_select("two-level:4,1,fp8", 1, 1, 3, 3, 32, 8 * 64, 8, seed=5)
    _check_select("int4", 1, 1, 2, 2, 32, 8 * 50, 7, seed=6)


def test_flat_is_todays_selection():
    keys, q = _inputs(2, 2, 8, 2, 64, 8 * 80, seed=11)
    ix = X.build_index(keys, "flat")
    assert ix.fine.data.dtype == keys.dtype and ix.coarse is None
    got = X.index_select(q, ix, 10, scores=torch.float32)
    assert torch.equal(got, fastselect.select_topk(q, ix.fine.data, 10, scores=torch.float32))
    assert torch.equal(got, select_chunks_ref(q, ix.fine.data, 10))


@pytest.mark.parametrize("fmt", [pytest.param("bf16", marks=pytest.mark.slow), "fp8",
                                 pytest.param("int4", marks=pytest.mark.slow)])
def test_two_level_keeping_all_is_flat(fmt):
    keys, q = _inputs(1, 2, 8, 2, 32, 8 * 48, seed=21)
    two = X.build_index(keys, f"two-level:4,1,{fmt}")
    flat = X.build_index(keys, "flat" if fmt == "bf16" else fmt)
    k = 6
    got = X.index_select(q, two, k, keep=two.coarse.n, scores=torch.float32)
    assert torch.equal(got, X.index_select(q, flat, k, scores=torch.float32))
    assert not torch.equal(X.index_select(q, two, k, keep=3, scores=torch.float32), got)   # fewer kept: a choice


def _stated_error(fmt, q, lm32, L):
    """|q . (lm - lm_hat)| bound per (b, t, hq, n): fp8 2^-4 |x| + 2^-10 s per element (normal / subnormal
    rounding), int4 s_g / 2 per element plus the rounding of code x scale to q's dtype (half an ulp)."""
    G = q.shape[2] // lm32.shape[1]
    aq = q.float().abs()
    if fmt == "fp8":
        per = FP8_REL_ERROR * lm32.abs() + 2.0 ** -10 * L.scale[..., None]
    else:
        half_ulp = torch.finfo(q.dtype).eps / 2
        per = (L.scale / 2).repeat_interleave(INT4_GROUP, -1) + half_ulp * X.dequantize_landmarks(L).abs()
    return torch.einsum("bthd,bhnd->bthn", aq, per.repeat_interleave(G, 1))


@pytest.mark.parametrize("fmt", ["fp8", "int4"])
def test_low_bit_scores_within_stated_error(fmt):
    B, nq, Hq, H, d, T = 2, 2, 8, 2, 64, 8 * 70
    keys, q = _inputs(B, nq, Hq, H, d, T, seed=31)
    ix = X.build_index(keys, fmt)
    poison = (torch.full((B * H * 16 * (T // 8),), float("nan")), torch.full((B * H * 16 * 4 * 2,), float("nan")))
    scratch, pml, N = X.index_pass1(q, ix.fine, scores=torch.float32, splits=3, scratch=poison)
    raw = scratch.view(B, H, 16, N)[:, :, [t * 4 + g for t in range(nq) for g in range(4)]]
    raw = raw.view(B, H, nq, 4, N).permute(0, 2, 1, 3, 4).reshape(B, nq, Hq, N) / (LOG2E / math.sqrt(d))
    lm32 = keys.float().view(B, H, N, 8, d).mean(3)
    exact = torch.einsum("bthd,bhnd->bthn", q.float(), lm32.repeat_interleave(Hq // H, 1))
    err = (raw - exact).abs()
    bound = _stated_error(fmt, q, lm32, ix.fine)
    assert torch.isfinite(raw).all() and (err <= bound + 1e-4 * exact.abs().amax()).all()
    assert err.amax() > 0                                             # it is a low-bit format
    probs = fastselect.probs_from_scratch_ref(scratch, pml, B, H, nq, Hq // H, N)
    twin = X.index_scores_ref(q, ix.fine).permute(0, 2, 1, 3).reshape(B * H, nq, N)
    torch.testing.assert_close(probs, twin, rtol=1e-4, atol=1e-6)    # every slot of scratch and pml written


def test_index_bytes_are_the_core_arithmetic():
    keys, _ = _inputs(1, 1, 8, 8, 128, 8 * 64, seed=41, dtype=torch.bfloat16)
    sizes = {s: X.build_index_ref(keys, s).nbytes for s in ("flat", "fp8", "int4", "two-level:8,1,int4")}
    assert sizes == {"flat": 8 * 64 * 256, "fp8": 8 * 64 * 132, "int4": 8 * 64 * 80,
                     "two-level:8,1,int4": 8 * 64 * 80 + 8 * 8 * 80}
    real = X.build_index_ref(keys, "int4").fine
    assert real.data.numel() + 4 * real.scale.numel() == sizes["int4"]


def test_bad_inputs():
    keys, q = _inputs(1, 1, 2, 2, 48, 8 * 16, seed=51)
    with pytest.raises(DDBenchError, match="int4"):
        X.quantize_landmarks(keys.float(), "int4")
    with pytest.raises(DDBenchError, match="unknown"):
        X.quantize_landmarks(keys.float(), "int3")
    keys, q = _inputs(1, 1, 2, 2, 32, 8 * 64, seed=52)
    ix = X.build_index(keys, "two-level:4")
    with pytest.raises(DDBenchError, match="cannot hold"):
        X.index_select(q, ix, 12, keep=2)
    with pytest.raises(DDBenchError, match="fp8"):
        X.quantize_landmarks(torch.full((1, 1, 2, 32), float("inf")), "fp8")


@pytest.mark.gpu
@pytest.mark.parametrize("spec", SPECS)
def test_selected_set_equals_twin_gpu(spec):
    # Llama-3-8B at 128K: 32 query heads on 8 KV heads, d 128, 16,384 chunks, budget 256, two tokens
    _check_select(spec, 2, 2, 32, 8, 128, 131072, 256, seed=7, dtype=torch.bfloat16, dev="cuda")


@pytest.mark.gpu
def test_two_level_keeping_all_is_flat_gpu():
    keys, q = _inputs(2, 2, 32, 8, 128, 131072, seed=8, dtype=torch.bfloat16, dev="cuda")
    for fmt in ("bf16", "fp8", "int4"):
        two = X.build_index(keys, f"two-level:8,1,{fmt}")
        flat = X.build_index(keys, "flat" if fmt == "bf16" else fmt)
        got = X.index_select(q, two, 256, keep=two.coarse.n, scores=torch.float32)
        assert torch.equal(got, X.index_select(q, flat, 256, scores=torch.float32)), fmt


def test_random_index_builds_one_request_at_a_time():
    g = torch.Generator().manual_seed(61)
    ix = X.random_index(3, 2, 40, 32, "two-level:4,1,int4,fp8", torch.float16, g, "cpu", kernel=False)
    g = torch.Generator().manual_seed(61)
    want = [X.index_from_landmarks(torch.empty(1, 2, 40, 32).normal_(generator=g), "two-level:4,1,int4,fp8",
                                   torch.float16, kernel=False) for _ in range(3)]
    for lvl in ("fine", "coarse"):
        got = getattr(ix, lvl)
        assert torch.equal(_raw(got), torch.cat([_raw(getattr(w, lvl)) for w in want]))
        assert torch.equal(got.scale, torch.cat([getattr(w, lvl).scale for w in want]))
    assert ix.nbytes == sum(w.nbytes for w in want)
