"""Low-rank key rebuild with RoPE at original positions against its torch twin.

Fresh random factors (never zeros) and NaN-poisoned key buffers: the rebuilt slots must match the
twin and every other slot must stay NaN. On CPU the kernel runs through Triton's interpreter (fp16
factors: its bf16 dot is wrong; libdevice sin/cos there); the `gpu` tests run bf16 and the SFU sin/cos
path (fast_rope) the engine uses.
"""

import math

import pytest
import torch

from ddbench.kernels.rebuild import RebuildLaunch, apply_rope_ref, rebuild_keys, rebuild_keys_ref


def _check(B, T, R, H, d, n, off, dtype, dev, theta, seed, out_dtype=None, last=None, tol=1e-2, **kw):
    """n chunks per (request, head), distinct, from all T // 8 chunks or (last) from the last `last` ones."""
    g = torch.Generator().manual_seed(seed)
    U = (torch.randn(B, T, R, generator=g) / math.sqrt(R)).to(dev, dtype)
    SV = torch.randn(B, H, R, d, generator=g).to(dev, dtype)
    nch = T // 8
    pool = nch if last is None else last
    idx = (nch - pool + torch.rand(B, H, pool, generator=g).argsort(-1)[..., :n]).int().to(dev)
    out = torch.full((B, H, off + n * 8 + 5, d), float("nan"), dtype=out_dtype or dtype, device=dev)
    ref = out.clone()
    rebuild_keys(U, SV, idx, out, rope_theta=theta, slot_offset=off, launch=RebuildLaunch(**kw))
    rebuild_keys_ref(U, SV, idx, ref, rope_theta=theta, slot_offset=off)
    a, b = out[:, :, off:off + n * 8].float(), ref[:, :, off:off + n * 8].float()
    assert not a.isnan().any()
    err = float((a - b).norm() / b.norm())
    assert err < tol, err
    assert out[:, :, :off].isnan().all() and out[:, :, off + n * 8:].isnan().all()
    return err


def test_rope_ref_is_a_rotation():
    x = torch.randn(5, 64)
    y = apply_rope_ref(x, torch.arange(5) * 1000, 10000.0)
    assert torch.allclose(x.norm(dim=-1), y.norm(dim=-1), rtol=1e-5)
    assert torch.allclose(apply_rope_ref(x, torch.zeros(5, dtype=torch.long), 10000.0), x)


@pytest.mark.parametrize("R", [40, 48])
def test_rebuild_cpu(R):
    _check(2, 8 * 40, R, 2, 32, 11, 3, torch.float16, "cpu", 10000.0, seed=R, block_chunks=4, rank_block=16)


# (n, block_chunks, rank_block, R): n a multiple of the block or not, rank blocks tiling R or not
@pytest.mark.parametrize("n,bc,rb,R", [(8, 4, 16, 48), (8, 4, 32, 40), (13, 8, 32, 64), (5, 16, 16, 32),
                                       (16, 16, 64, 160)])
def test_rebuild_cpu_blocks(n, bc, rb, R):
    _check(2, 8 * 48, R, 3, 64, n, 7, torch.float16, "cpu", 500000.0, seed=n + bc + rb, block_chunks=bc,
           rank_block=rb)


# impl="resident": SV loaded once per program, each program runs over several blocks (tiles > 1 here:
# 2 programs per (request, head) by default on CPU, or `programs`); rank split 32+16 (masked), 128+32, 32+0
@pytest.mark.parametrize("n,bc,R,programs", [(13, 2, 40, None), (16, 4, 48, None), (9, 2, 160, 6), (5, 4, 32, 1),
                                             (3, 8, 48, 100)])
def test_rebuild_cpu_resident(n, bc, R, programs):
    _check(2, 8 * 48, R, 3, 64, n, 7, torch.float16, "cpu", 500000.0, seed=n + bc + R, block_chunks=bc,
           impl="resident", programs=programs, num_stages=2)


@pytest.mark.parametrize("B,H,n,want", [(1, 2, 37, "blocks"), (2, 4, 11, "blocks"), (2, 4, 37, "resident")])
def test_rebuild_cpu_auto_picks_by_blocks_per_program(B, H, n, want, monkeypatch):
    """impl="auto" (the default) takes the resident kernel where each of its programs (16 on CPU's 4
    'SMs', at least one per (request, head)) gets >= 4 blocks of 4 chunks: 2*4 (b, h) x 10 blocks."""
    import ddbench.kernels.rebuild as rb
    used = []
    for name, impl in (("_rebuild_kernel", "blocks"), ("_rebuild_resident_kernel", "resident")):
        kern = getattr(rb, name)

        class Spy:
            def __getitem__(self, grid, kern=kern, impl=impl):
                used.append(impl)
                return kern[grid]
        monkeypatch.setattr(rb, name, Spy())
    _check(B, 8 * 40, 48, H, 64, n, 3, torch.float16, "cpu", 500000.0, seed=B * H + n)
    assert used == [want]


def test_rebuild_cpu_default_launch():
    """The default launch (the engine's): n=11 is not a multiple of its block."""
    _check(1, 8 * 64, 160, 2, 128, 11, 0, torch.float16, "cpu", 500000.0, seed=5)


def test_rebuild_cpu_positions_near_128k():
    """RoPE at positions near 128K (angles ~1.3e5 rad): fp32 keys out, so the rotation's error is
    visible (a range reduction that drifts by 1e-3 rad fails); n not a multiple of the block."""
    err = _check(1, 131072, 32, 2, 128, 9, 16, torch.float16, "cpu", 500000.0, seed=11, out_dtype=torch.float32,
                 last=40, tol=1e-4)
    assert err < 1e-4


def test_rebuild_no_chunks_is_a_no_op():
    U = torch.randn(1, 64, 16)
    SV = torch.randn(1, 2, 16, 32)
    out = torch.full((1, 2, 4, 32), float("nan"))
    rebuild_keys(U, SV, torch.zeros(1, 2, 0, dtype=torch.int32), out)
    assert out.isnan().all()


@pytest.mark.gpu
@pytest.mark.parametrize("kw", [dict(), dict(impl="blocks"),
                                dict(impl="blocks", block_chunks=4, rank_block=32, num_warps=4, num_stages=3),
                                dict(impl="blocks", block_chunks=8, num_warps=8),
                                dict(impl="blocks", block_chunks=32, rank_block=32, num_warps=16),
                                dict(fast_rope=False), dict(impl="resident", block_chunks=8, num_warps=4),
                                dict(impl="resident", block_chunks=16, num_warps=8, programs=64)])
def test_rebuild_gpu_shadowkv_shapes(kw):
    _check(4, 32768, 160, 8, 128, 256, 32, torch.bfloat16, "cuda", 500000.0, seed=3, **kw)


@pytest.mark.gpu
def test_rebuild_gpu_auto_resident_at_large_batch():
    """B*H = 320: the default takes the resident kernel, one program per (b, h) (n not a multiple of its block)."""
    _check(40, 8192, 160, 8, 128, 254, 16, torch.bfloat16, "cuda", 500000.0, seed=40)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [250, 3])
def test_rebuild_gpu_uneven_n(n):
    _check(3, 32768, 160, 8, 128, n, 5, torch.bfloat16, "cuda", 500000.0, seed=n)


@pytest.mark.gpu
@pytest.mark.parametrize("kw", [dict(), dict(fast_rope=False), dict(impl="blocks"),
                                dict(impl="resident", block_chunks=8, num_warps=4)])
def test_rebuild_gpu_positions_near_128k(kw):
    """fp32 keys out: the SFU sin/cos after the range reduction stays within 1e-4 of the twin."""
    _check(2, 131072, 160, 8, 128, 200, 8, torch.bfloat16, "cuda", 500000.0, seed=13, out_dtype=torch.float32,
           last=300, tol=1e-4, **kw)


def test_rebuild_rejects_unknown_impl():
    from ddbench.core.errors import DDBenchError
    U, SV = torch.randn(1, 64, 16), torch.randn(1, 2, 16, 32)
    with pytest.raises(DDBenchError):
        rebuild_keys(U, SV, torch.zeros(1, 2, 1, dtype=torch.int32), torch.zeros(1, 2, 8, 32),
                     launch=RebuildLaunch(impl="nope"))
