"""Layer stack pieces for the decode-step engine: seeded random weights at a real model's shapes,
RMSNorm, fused QKV, Llama RoPE (rotate-half), output projection, gated MLP, LM head; NVTX ranges.

    Weights.random(model, device, seed, dtype=bf16) -> Weights   (one shared set for all designs)
    weight_bytes(model, dtype_bytes=2) -> the bytes Weights.random allocates (checked before allocating)
    rmsnorm(x, w), rope(x, cos, sin), rope_tables(pos, d, theta)
    nvtx_range(name)   `nvtx` package if importable, else torch.cuda.nvtx, else a no-op (CPU)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

try:  # optional: the GPU machine lacks it
    import nvtx as _nvtx  # type: ignore
except ImportError:  # pragma: no cover - depends on the environment
    _nvtx = None


@contextlib.contextmanager
def nvtx_range(name: str):
    if not torch.cuda.is_available():
        yield
        return
    if _nvtx is not None:
        with _nvtx.annotate(name):
            yield
        return
    torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()


@dataclass
class Weights:
    embed: torch.Tensor          # [V, h]
    lm_head: torch.Tensor        # [V, h]
    norm: torch.Tensor           # [h]
    ln1: list                    # L x [h]
    ln2: list
    wqkv: list                   # L x [h, (Hq + 2H) d]
    wo: list                     # L x [Hq d, h]
    wgu: list                    # L x [2 I, h] (nn.Linear's layout: used transposed, see below)
    wdown: list                  # L x [I, h]
    bqkv: list | None = None     # L x [(Hq + 2H) d] where the model has a QKV bias (Qwen2.5), else None

    @staticmethod
    def random(model, device, seed: int, dtype=torch.bfloat16, layers: int | None = None) -> "Weights":
        """Seeded N(0, 1/fan_in) weights (norms = 1); `layers` distinct layer sets, reused cyclically."""
        g = torch.Generator(device=device).manual_seed(seed)
        h, d, I, V = model.hidden, model.head_dim, model.intermediate, model.vocab
        nqkv = (model.num_heads + 2 * model.num_kv_heads) * d

        def w(*shape):
            t = torch.empty(*shape, device=device, dtype=dtype)
            return t.normal_(0.0, shape[0] ** -0.5, generator=g)

        n = model.num_layers if layers is None else layers
        one = torch.ones(h, device=device, dtype=dtype)
        # gate_up is stored [2I, h] and multiplied as x @ w.T: with [h, 2I] cuBLAS ran it at 1.9x its
        # HBM floor at 128 rows (dual-token batch 64) against 1.24x, and within 1.01-1.09x against
        # 1.03-1.14x at 1-64 rows (traces/engine/h200/devcheck-gemm.json); the others are best [K, N]
        sets = [(w(h, nqkv), w(model.num_heads * d, h), w(h, 2 * I).t().contiguous(), w(I, h)) for _ in range(n)]
        L = model.num_layers
        embed = w(V, h).mul_(h ** 0.5 / 4)     # in place: no second embedding-sized transient
        lm_head = w(V, h)
        bias = None
        if model.qkv_bias:
            bs = [torch.empty(nqkv, device=device, dtype=dtype).normal_(0.0, 0.02, generator=g) for _ in range(n)]
            bias = [bs[i % n] for i in range(L)]
        return Weights(embed=embed, lm_head=lm_head, norm=one,
                       ln1=[one] * L, ln2=[one] * L,
                       wqkv=[sets[i % n][0] for i in range(L)], wo=[sets[i % n][1] for i in range(L)],
                       wgu=[sets[i % n][2] for i in range(L)], wdown=[sets[i % n][3] for i in range(L)],
                       bqkv=bias)


def weight_bytes(model, dtype_bytes: int = 2) -> int:
    """Bytes of Weights.random(model) (every layer distinct): embedding and LM head, one shared norm
    vector, per layer the fused QKV (and its bias), o-proj, gate_up and down. Differs from the
    catalog's ModelSpec.weight_bytes only by the norms (one vector here, 2L + 1 in a checkpoint)."""
    h, d, I, V = model.hidden, model.head_dim, model.intermediate, model.vocab
    nqkv = (model.num_heads + 2 * model.num_kv_heads) * d
    layer = h * nqkv + model.num_heads * d * h + 3 * I * h + (nqkv if model.qkv_bias else 0)
    return (2 * V * h + h + model.num_layers * layer) * dtype_bytes


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope_tables(pos: torch.Tensor, d: int, theta: float):
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=pos.device, dtype=torch.float32) / d))
    ang = pos.float()[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, nh, d]; cos/sin [T, d/2] (rotate-half, as ddbench.kernels.rebuild.apply_rope_ref)."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).to(x.dtype)
