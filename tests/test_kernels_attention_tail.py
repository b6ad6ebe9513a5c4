"""Sparse decode attention over an fp8 chunk cache's slots and its 16-bit tail (tail=(tk, tv), kc): logical
tokens below kc through `rows` into the e4m3 slots (one fp32 scale per chunk and KV head), tokens from kc
on from the tail's rows. The kernel against its twin, the twin against attention over the logical buffer
built by hand, and the refusals. Fresh random inputs, NaN-poisoned outputs; fp16 on the CPU (the
interpreter's bf16 dot is wrong), bf16 on the GPU."""

import pytest
import torch

from ddbench.core.errors import DDBenchError
from ddbench.kernels.attention import CacheView, chunk_cache_rows, dual_sparse_attention, dual_sparse_attention_ref
from ddbench.kernels.fp8 import dequantize_chunks, quantize_chunks

C = 8


def _inputs(B, nq, Hq, H, slots, kc, T, d, seed, dev="cpu", dtype=torch.float16):
    """q; e4m3 slots [B, H, slots*C, d] with scales (chunks spread 0.25-4x); rows: kc tokens in random slots,
    then T rows the kernel must not read (poisoned); the tail [B, H, T + 3, d] (3 spare rows, NaN)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, nq, Hq, d, generator=g)
    spread = 4.0 ** (2 * torch.rand(B, H, slots, 1, 1, generator=g) - 1)
    k, v = ((torch.randn(B, H, slots, C, d, generator=g) * spread).view(B, H, slots * C, d) for _ in range(2))
    (k8, ks), (v8, vs) = quantize_chunks(k, C), quantize_chunks(v, C)
    rows = torch.full((B, H, kc + T), 2 ** 30, dtype=torch.int32)      # past the slots: a read would fault
    rows[..., :kc] = chunk_cache_rows(B, H, kc, slots, C, generator=g)
    tk, tv = (torch.full((B, H, T + 3, d), float("nan")) for _ in range(2))
    tk[:, :, :T], tv[:, :, :T] = torch.randn(B, H, T, d, generator=g), torch.randn(B, H, T, d, generator=g)
    lengths = torch.randint(kc + 1 - nq, kc + T - nq + 1, (B,), generator=g, dtype=torch.int32).clamp(min=1)
    lengths[0] = kc + T - nq
    to = lambda x: x.to(dev)    # noqa: E731
    return dict(q=to(q).to(dtype), k8=to(k8), v8=to(v8), ks=to(ks), vs=to(vs), rows=to(rows),
                tail=(to(tk).to(dtype), to(tv).to(dtype)), kc=kc, lengths=to(lengths))


def _call(fn, x, **kw):
    return fn(x["q"], x["k8"], x["v8"], x["lengths"],
              cache=CacheView(x["rows"], x["ks"], x["vs"], C, tail=x["tail"], kc=x["kc"]), **kw)


def _logical(x):
    """The attention over the logical buffer built by hand: slots dequantised and read through rows, then the tail."""
    kc, T = x["kc"], x["rows"].shape[2] - x["kc"]
    idx = x["rows"][..., :kc].long()[..., None].expand(*x["rows"].shape[:2], kc, x["q"].shape[-1])
    k = torch.cat([dequantize_chunks(x["k8"], x["ks"], C).gather(2, idx), x["tail"][0][:, :, :T].float()], 2)
    v = torch.cat([dequantize_chunks(x["v8"], x["vs"], C).gather(2, idx), x["tail"][1][:, :, :T].float()], 2)
    return dual_sparse_attention_ref(x["q"], k, v, x["lengths"])


def _relerr(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_twin_is_attention_over_the_logical_buffer():
    x = _inputs(2, 2, 8, 2, slots=12, kc=64, T=20, d=32, seed=1, dtype=torch.float32)
    assert _relerr(_call(dual_sparse_attention_ref, x), _logical(x)) < 1e-6


@pytest.mark.parametrize("nq", [1, 2])
@pytest.mark.parametrize("Hq,H", [(8, 2), (6, 2)])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("kc,T", [(64, 20), (48, 37)])    # the boundary on, and inside, a 16-token tile
def test_tail_kernel_matches_twin_cpu(nq, Hq, H, splits, kc, T):
    x = _inputs(2, nq, Hq, H, slots=10, kc=kc, T=T, d=32, seed=nq * 7 + Hq + splits * 3 + kc + T)
    out = torch.full_like(x["q"], float("nan"))
    _call(dual_sparse_attention, x, out=out, splits=splits, block_n=16)
    assert not out.isnan().any()
    assert _relerr(out, _call(dual_sparse_attention_ref, x)) < 2e-3


def test_tail_is_read_where_it_should_be_cpu():
    """The tail's rows matter: the same call with the tail negated differs clearly."""
    x = _inputs(1, 2, 8, 2, slots=10, kc=48, T=24, d=32, seed=5)
    got = _call(dual_sparse_attention, x, splits=1, block_n=16)
    tk, tv = x["tail"]
    negated = dict(x, tail=(-tk, -tv))
    assert _relerr(got, _call(dual_sparse_attention_ref, x)) < 2e-3
    assert _relerr(got, _call(dual_sparse_attention_ref, negated)) > 0.05


@pytest.mark.parametrize("attn", [dual_sparse_attention, dual_sparse_attention_ref])
def test_tail_refusals(attn):
    x = _inputs(1, 2, 8, 2, slots=10, kc=48, T=24, d=32, seed=9)
    tk, tv = x["tail"]
    for bad in [dict(tail=(tk[:, :, :10], tv[:, :, :10])), dict(tail=(tk.float(), tv.float())), dict(kc=100),
                dict(tail=(tk, tv[:, :1]))]:
        with pytest.raises(DDBenchError) as ei:
            _call(attn, dict(x, **bad))
        assert "\n" not in str(ei.value) and "tail" in str(ei.value)
    with pytest.raises(DDBenchError, match="goes with rows"):
        attn(x["q"], x["k8"], x["v8"], x["lengths"],
             cache=CacheView(k_scale=x["ks"], v_scale=x["vs"], tail=x["tail"], kc=48))


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 4, None])
def test_tail_kernel_gpu_llama3_heads(splits):
    """Llama-3-8B heads, bf16, the engine's shape: 2048 tokens in 1024 slots, a 176-row tail."""
    x = _inputs(6, 2, 32, 8, slots=1024, kc=2048, T=170, d=128, seed=splits or 0, dev="cuda", dtype=torch.bfloat16)
    out = torch.full_like(x["q"], float("nan"))
    _call(dual_sparse_attention, x, out=out, splits=splits)
    assert not out.isnan().any()
    assert _relerr(out, _call(dual_sparse_attention_ref, x)) < 1e-2
