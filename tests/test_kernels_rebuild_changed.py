"""The miss-only key rebuild (kernels/rebuild.py rebuild_changed, ShadowKV's in-place buffer) against
its torch twin.

Fresh random factors (never zeros), fresh random old/new id rows with a random share of changed
slots, NaN-poisoned key buffers: the changed slots must match the twin (and rebuild_keys of the same
chunks) and every other slot must stay NaN. On the CPU the kernel runs through Triton's interpreter
(fp16 / fp32 factors: its bf16 dot is wrong); the `gpu` tests run bf16 and the SFU sin/cos path.
"""

import math

import pytest
import torch

from ddbench.core.errors import DDBenchError
from ddbench.kernels.rebuild import RebuildLaunch, rebuild_changed, rebuild_changed_ref, rebuild_keys_ref


def _ids(B, H, n, nch, share, g):
    """old: n distinct chunks per (b, h); new: about `share` of its slots replaced by chunks outside old."""
    perm = torch.rand(B, H, nch, generator=g).argsort(-1)
    old = perm[..., :n].int()
    fresh = perm[..., n:2 * n].int()
    chg = torch.rand(B, H, n, generator=g) < share
    return old, torch.where(chg, fresh, old), chg


def _check(B, T, R, H, d, n, off, dtype, dev, theta, seed, share=0.3, out_dtype=None, tol=1e-2, **kw):
    g = torch.Generator().manual_seed(seed)
    U = (torch.randn(B, T, R, generator=g) / math.sqrt(R)).to(dev, dtype)
    SV = torch.randn(B, H, R, d, generator=g).to(dev, dtype)
    old, new, chg = _ids(B, H, n, T // 8, share, g)
    old, new, chg = old.to(dev), new.to(dev), chg.to(dev)
    out = torch.full((B, H, off + n * 8 + 5, d), float("nan"), dtype=out_dtype or dtype, device=dev)
    ref = out.clone()
    rebuild_changed(U, SV, old, new, out, rope_theta=theta, slot_offset=off, launch=RebuildLaunch(**kw))
    rebuild_changed_ref(U, SV, old, new, ref, rope_theta=theta, slot_offset=off)
    tok = chg.repeat_interleave(8, -1)                                     # [B, H, n*8]: rebuilt tokens
    a, b = out[:, :, off:off + n * 8], ref[:, :, off:off + n * 8]
    assert torch.equal(a.isnan().all(-1), ~tok) and torch.equal(b.isnan().all(-1), ~tok)
    assert not a[tok].isnan().any()
    if tok.any():
        err = float((a[tok].float() - b[tok].float()).norm() / b[tok].float().norm())
        assert err < tol, err
    assert out[:, :, :off].isnan().all() and out[:, :, off + n * 8:].isnan().all()
    # the twin agrees with the whole rebuild of the new ids on the changed slots
    full = torch.full_like(ref, float("nan"))
    rebuild_keys_ref(U, SV, new, full, rope_theta=theta, slot_offset=off)
    assert torch.equal(full[:, :, off:off + n * 8][tok], b[tok])
    return int(tok.sum())


@pytest.mark.parametrize("n,bc,R,programs,share", [(13, 2, 40, None, 0.3), (16, 4, 48, 1, 0.5), (9, 2, 160, 3, 0.8),
                                                   (32, 4, 32, None, 0.12), (5, 8, 48, 2, 1.0)])
def test_rebuild_changed_cpu(n, bc, R, programs, share):
    assert _check(2, 8 * 64, R, 3, 64, n, 7, torch.float16, "cpu", 500000.0, seed=n + bc + R, share=share,
                  block_chunks=bc, programs=programs) > 0


def test_rebuild_changed_cpu_fp32_positions_near_128k():
    """fp32 factors and keys: the rotation at positions near 128K within 1e-4 of the twin."""
    _check(1, 131072, 32, 2, 128, 9, 16, torch.float32, "cpu", 500000.0, seed=11, share=0.5, tol=1e-4)


def test_rebuild_changed_nothing_changed_is_a_no_op():
    g = torch.Generator().manual_seed(3)
    U, SV = torch.randn(1, 256, 16, generator=g), torch.randn(1, 2, 16, 32, generator=g)
    ids = torch.rand(1, 2, 256 // 8, generator=g).argsort(-1)[..., :6].int()
    out = torch.full((1, 2, 48, 32), float("nan"))
    rebuild_changed(U, SV, ids, ids.clone(), out)
    assert out.isnan().all()


def test_rebuild_changed_bad_input():
    U, SV = torch.randn(1, 64, 16), torch.randn(1, 2, 16, 32)
    ids = torch.zeros(1, 2, 2, dtype=torch.int32)
    with pytest.raises(DDBenchError):
        rebuild_changed(U, SV, ids, torch.zeros(1, 2, 3, dtype=torch.int32), torch.zeros(1, 2, 24, 32))
    with pytest.raises(DDBenchError):
        rebuild_changed(U[..., :8], SV[:, :, :8], ids, ids, torch.zeros(1, 2, 16, 32))


@pytest.mark.gpu
@pytest.mark.parametrize("B,T,n,share,kw", [(4, 32768, 256, 0.12, {}), (46, 8192, 256, 0.12, {}),
                                            (3, 32768, 250, 0.5, dict(block_chunks=2)),
                                            (2, 131072, 256, 1.0, dict(programs=1)),
                                            (8, 32768, 256, 0.12, dict(fast_rope=False, block_chunks=8))])
def test_rebuild_changed_gpu_shadowkv_shapes(B, T, n, share, kw):
    assert _check(B, T, 160, 8, 128, n, 32, torch.bfloat16, "cuda", 500000.0, seed=B + n, share=share, **kw) > 0


@pytest.mark.gpu
def test_rebuild_changed_gpu_positions_near_128k():
    _check(2, 131072, 160, 8, 128, 200, 8, torch.bfloat16, "cuda", 500000.0, seed=13, share=0.3,
           out_dtype=torch.float32, tol=1e-4)
