"""A Triton GEMM for the decode step's skinny linear layers (M = 1..128 rows), one launch with split-K.

cuBLAS runs Llama-3-8B's decode GEMMs at 1.01-1.74x their HBM floor (traces/engine/h200/
devcheck-gemm.json); the loss on the small ones (qkv, o: 33-50 MB of weights, 8-12 us) is the ramp
and tail of a kernel that is over before a few waves of tiles have filled the memory pipe. This kernel
gives every SM enough programs and enough weight bytes in flight from the start: N tiles times K
splits fill the 132 SMs in about one wave, and deep software pipelining (num_stages) of large
BLOCK_K tiles keeps tens of KiB per SM outstanding.

    skinny_matmul(x, w, layout="kn", config=None, out=None) -> y [M, N] bf16
        x bf16 [M, K] contiguous; w bf16 [K, N] ("kn": y = x @ w) or [N, K] ("nk": y = x @ w.T);
        fp32 accumulation; `out` (bf16 [M, N] contiguous) is written if given
    skinny_matmul_ref(x, w, layout) -> the torch twin (fp32 matmul, cast to bf16)
    SkinnyConfig(block_m, block_n, block_k, split_k, num_warps, num_stages)
    candidate_configs(M, K, N, layout, sm_count, limit) -> configs ranked by model_us (a small
        roofline model: bytes per SM over min(per-SM rate, bytes in flight / latency), waves, and
        the split-K partials' traffic); default_config(...) -> the first of them
    precompile(M, K, N, layout, config): compile without tensors (Triton's warmup; on-disk cache)
    clear_workspaces(): drop the cached workspaces

Method: the grid is (M tiles x K splits x N tiles), M tiles fastest. A program accumulates its
[BLOCK_M, BLOCK_N] tile over its K range with tl.dot (M padded to BLOCK_M >= 16 by reading row
i % M and masking the store). With split_k = 1 it stores bf16 directly. Otherwise it stores its fp32
partial into a workspace slot [tile, split], then (CTA barrier, then atomic add with acq_rel on the
tile's arrival counter) the program that arrives last sums the tile's partials in split order (the
result does not depend on which program is last: deterministic), stores bf16, and resets the
counter to 0. Workspaces (partials, zeroed counters) are allocated once per (device, shape, layout,
config) and cached here, so a CUDA graph replays with nothing allocated or zeroed inside it (a
capture that would need a new one raises: call once before capturing); calls that share a
workspace must run in stream order (the engine's GEMMs run on its compute stream).
split_k is a runtime argument (Triton specializes 1 apart), so the splits of one tile shape share a
compiled kernel. In the CPU interpreter the tiles are upcast to fp32 before tl.dot (its bf16 dot is
wrong in triton 3.9; the upcast is exact and the products are exact in fp32).

Floor: the weight bytes K x N x 2 at the HBM copy rate (4277 GB/s on the H200: qkv 11.8 us, o 7.8,
gate_up 54.9, down 27.5). Measured on the H200 (`python -m kernels.engine.devcheck_skinny --quick`,
traces/engine/h200/devcheck-skinny.json, the best of about 12 configurations per point against
cuBLAS, 3 repetitions): faster at 4 of 12 points only, the o-projection at 2 and 32 rows by 7-10 %
(12.1 against 13.3 us) and down at 2 and 32 rows by 1 %; 7-13 % slower on qkv, 5-10 % on gate_up, and
on o at 128 rows. The engine keeps cuBLAS (kernels/engine/README.md). `default_config` and the
constants of `model_us` are the untuned first guess; the sweep's winners are in that file.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

LAYOUTS = ("kn", "nk")


@triton.jit(do_not_specialize=["M"])
def _skinny_kernel(x, w, y, part, counts, M, N, K, stride_wk, stride_wn, split_k, k_per_split,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, DOT_FP32: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % num_m
    pid_k = (pid // num_m) % split_k
    pid_n = pid // (num_m * split_k)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    # rows past M read row i % M (in bounds, no mask); their results are never stored
    xp = x + (offs_m % M)[:, None] * K + (k_lo + offs_k)[None, :]
    wp = w + (k_lo + offs_k)[:, None] * stride_wk + offs_n[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:  # K % BLOCK_K == 0: every tile lies inside its split (k_per_split is a multiple)
            xt = tl.load(xp)
            if EVEN_N:
                wt = tl.load(wp)
            else:
                wt = tl.load(wp, mask=n_ok[None, :], other=0.0)
        else:
            k_ok = (k0 + offs_k) < k_hi
            xt = tl.load(xp, mask=k_ok[None, :], other=0.0)
            wt = tl.load(wp, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if DOT_FP32:  # the CPU interpreter's bf16 dot is wrong (triton 3.9); bf16 -> fp32 is exact
            xt, wt = xt.to(tl.float32), wt.to(tl.float32)
        acc = tl.dot(xt, wt, acc)
        xp += BLOCK_K
        wp += BLOCK_K * stride_wk
    yp = y + offs_m[:, None] * N + offs_n[None, :]
    y_ok = (offs_m < M)[:, None] & n_ok[None, :]
    if split_k == 1:
        tl.store(yp, acc.to(y.dtype.element_ty), mask=y_ok)
    else:
        tile = pid_n * num_m + pid_m
        in_tile = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        slots = part + (tile * split_k).to(tl.int64) * (BLOCK_M * BLOCK_N)
        tl.store(slots + pid_k * (BLOCK_M * BLOCK_N) + in_tile, acc)
        tl.debug_barrier()                              # every thread's partial is stored before the release
        arrived = tl.atomic_add(counts + tile, 1, sem="acq_rel")
        if arrived == split_k - 1:                      # last of the tile's splits: reduce in split order
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(split_k):
                total += tl.load(slots + s * (BLOCK_M * BLOCK_N) + in_tile, cache_modifier=".cg")
            tl.store(yp, total.to(y.dtype.element_ty), mask=y_ok)
            tl.store(counts + tile, 0)                  # ready for the next launch (graph replays)


@dataclass(frozen=True)
class SkinnyConfig:
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3

    def check(self) -> SkinnyConfig:
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"skinny: {name}={v} must be a power of two >= 16")
        if self.split_k < 1 or self.num_stages < 1 or self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"skinny: bad config {self}")
        return self

    @property
    def label(self) -> str:
        return (f"m{self.block_m}n{self.block_n}k{self.block_k}s{self.split_k}"
                f"w{self.num_warps}p{self.num_stages}")

    def smem_bytes(self) -> int:
        """Shared memory of the pipelined operand tiles (bf16)."""
        return self.num_stages * (self.block_m + self.block_n) * self.block_k * 2


def k_per_split(K: int, cfg: SkinnyConfig) -> int:
    """K range of one split, a multiple of block_k (the last split may be shorter, or empty)."""
    return triton.cdiv(triton.cdiv(K, cfg.split_k), cfg.block_k) * cfg.block_k


# ---- the model behind default_config and the candidate list (untuned guesses, see the docstring) ----
HBM_GBPS = 4277.0          # H200 device-to-device copy rate (traces/engine/h200)
SM_MAX_GBPS = 40.0         # what one SM can pull when others idle (guess: 1.25x its fair share)
LATENCY_US = 1.0           # loaded HBM latency: bytes in flight / latency = an SM's rate
SMEM_PER_SM = 228 * 1024
SMEM_PER_PROGRAM = 200 * 1024   # margin under 227 KiB for the epilogue's layout conversions
REGS_PER_SM, WARPS_PER_SM, PROGRAMS_PER_SM = 65536, 64, 32
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)


def block_m_for(M: int) -> int:
    return min(128, max(16, triton.next_power_of_2(M)))


def resident_per_sm(cfg: SkinnyConfig) -> int:
    regs = min(255, 64 + cfg.block_m * cfg.block_n // (32 * cfg.num_warps))    # fp32 accumulator + rest
    return min(SMEM_PER_SM // cfg.smem_bytes(), WARPS_PER_SM // cfg.num_warps, PROGRAMS_PER_SM,
               REGS_PER_SM // (regs * 32 * cfg.num_warps))


def model_us(cfg: SkinnyConfig, M: int, K: int, N: int, layout: str, sm_count: int = 132) -> float | None:
    """Estimated kernel time in us, or None where the config cannot run well (too much shared memory
    or accumulator per thread, a warp without a whole 16x8 mma tile, a single K tile per split)."""
    bm, bn, bk, s = cfg.block_m, cfg.block_n, cfg.block_k, cfg.split_k
    iters = triton.cdiv(k_per_split(K, cfg), bk)
    if (cfg.smem_bytes() > SMEM_PER_PROGRAM or bm * bn // (32 * cfg.num_warps) > 128
            or bm * bn // cfg.num_warps < 128 or (s > 1 and iters < 2) or (s - 1) * k_per_split(K, cfg) >= K):
        return None
    programs = triton.cdiv(M, bm) * triton.cdiv(N, bn) * s
    per_sm = triton.cdiv(programs, sm_count)                      # programs on the busiest SM
    resident = resident_per_sm(cfg)
    waves = triton.cdiv(per_sm, resident)
    run = (bn if layout == "kn" else bk) * 2                      # contiguous bytes per weight row
    w_bytes = iters * bk * bn * 2 * (1.0 if run >= 128 else 1.15)
    part_bytes = 2 * bm * bn * 4 if s > 1 else 0                  # partial written, read back
    in_flight = min(per_sm, resident) * min(cfg.num_stages - 1, iters) * bk * bn * 2
    sm_rate = min(SM_MAX_GBPS, in_flight / LATENCY_US / 1e3)      # GB/s = KB/us
    t_sm = per_sm * (w_bytes + part_bytes) / (sm_rate * 1e3)
    t_all = programs * (w_bytes + part_bytes) / (HBM_GBPS * 1e3)
    return max(t_sm, t_all) + waves * LATENCY_US + (LATENCY_US if s > 1 else 0.0)


def candidate_configs(M: int, K: int, N: int, layout: str = "kn", sm_count: int = 132,
                      limit: int = 12) -> list[SkinnyConfig]:
    """Up to `limit` configs, spread over tile widths and splits rather than pipeline depths of one
    tile: the best config (lowest model_us; ties to less shared memory, then fewer warps) of each
    (block_n, split_k) group, best group first, for 2/3 of the list; then, for the best groups in
    turn, their best config with the other block_k and their best with the other num_warps (the model
    cannot rank those two; the device can). block_m is fixed by M (block_m_for)."""
    if layout not in LAYOUTS:
        raise ValueError(f"skinny: layout must be one of {LAYOUTS}, not {layout!r}")
    bm = block_m_for(M)
    scored = []
    for bn in (32, 64, 128):
        for bk in (128, 256):
            for s in SPLITS:
                for nw in (4, 8):
                    for st in (2, 3, 4, 5, 6):
                        cfg = SkinnyConfig(bm, bn, bk, s, nw, st)
                        t = model_us(cfg, M, K, N, layout, sm_count)
                        if t is not None:
                            scored.append((round(t, 2), cfg.smem_bytes(), nw, cfg))
    scored.sort(key=lambda r: r[:3])
    groups: dict = {}
    for *_, cfg in scored:                                   # dicts keep insertion order: best group first
        groups.setdefault((cfg.block_n, cfg.split_k), []).append(cfg)
    out = [g[0] for g in groups.values()][:max(1, limit - limit // 3)]
    for first, *rest in groups.values():
        for field in ("block_k", "num_warps"):
            alt = next((c for c in rest if getattr(c, field) != getattr(first, field)), None)
            if alt is not None and alt not in out and len(out) < limit:
                out.append(alt)
    return out


@functools.cache
def default_config(M: int, K: int, N: int, layout: str = "kn", sm_count: int = 132) -> SkinnyConfig:
    """Untuned: the model's first candidate, until the device sweep's measured winners replace it."""
    cands = candidate_configs(M, K, N, layout, sm_count, limit=1)
    return cands[0] if cands else SkinnyConfig(block_m_for(M), 32, 64, 1, 4, 2)


# ---- the wrapper ----
_WORKSPACES: dict = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def _workspace(device, M, K, N, layout, cfg):
    """(partials, counters) of one (device, shape, layout, config), allocated once (counters zeroed once,
    reset by the kernel); a one-element placeholder pair per device for split_k = 1."""
    key = (str(device), M, K, N, layout, cfg) if cfg.split_k > 1 else (str(device), "unused")
    ws = _WORKSPACES.get(key)
    if ws is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"skinny: no workspace for M={M} K={K} N={N} {cfg.label} inside a graph "
                               "capture: call once before capturing")
        tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n) if cfg.split_k > 1 else 1
        slots = tiles * cfg.split_k * cfg.block_m * cfg.block_n if cfg.split_k > 1 else 1
        ws = (torch.empty(slots, device=device, dtype=torch.float32),      # split 1: placeholders, never touched
              torch.zeros(tiles, device=device, dtype=torch.int32))
        _WORKSPACES[key] = ws
    return ws


def _check(x, w, layout, out) -> tuple[int, int, int]:
    if layout not in LAYOUTS:
        raise ValueError(f"skinny: layout must be one of {LAYOUTS}, not {layout!r}")
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"skinny: {name} must be a 2-D tensor")
        if t.dtype != torch.bfloat16:
            raise ValueError(f"skinny: {name} must be bfloat16, not {t.dtype}")
        if not t.is_contiguous():
            raise ValueError(f"skinny: {name} must be contiguous")
    M, K = x.shape
    Kw, N = w.shape if layout == "kn" else w.shape[::-1]
    if Kw != K:
        raise ValueError(f"skinny: x is [{M}, {K}] but w ({layout}) is {list(w.shape)}: K differs")
    if x.device != w.device:
        raise ValueError(f"skinny: x on {x.device}, w on {w.device}")
    if K * N >= 2 ** 31:
        raise ValueError(f"skinny: K x N = {K * N} elements needs 64-bit offsets (not supported)")
    if out is not None and (out.shape != (M, N) or out.dtype != torch.bfloat16 or not out.is_contiguous()
                            or out.device != x.device):
        raise ValueError(f"skinny: out must be a contiguous bfloat16 [{M}, {N}] tensor on {x.device}")
    return M, K, N


def skinny_matmul(x: torch.Tensor, w: torch.Tensor, *, layout: str = "kn", config: SkinnyConfig | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    M, K, N = _check(x, w, layout, out)
    cfg = (config or default_config(M, K, N, layout, _sm_count(x.device))).check()
    y = out if out is not None else torch.empty(M, N, device=x.device, dtype=torch.bfloat16)
    if M == 0 or N == 0:
        return y
    if K == 0:
        return y.zero_()
    part, counts = _workspace(x.device, M, K, N, layout, cfg)
    grid = (triton.cdiv(M, cfg.block_m) * cfg.split_k * triton.cdiv(N, cfg.block_n),)
    _skinny_kernel[grid](x, w, y, part, counts, *_launch_args(M, K, N, layout, cfg),
                         **_launch_meta(K, N, cfg, x.device.type != "cuda"))
    return y


def _launch_args(M, K, N, layout, cfg):
    stride_wk, stride_wn = (N, 1) if layout == "kn" else (1, K)
    return M, N, K, stride_wk, stride_wn, cfg.split_k, k_per_split(K, cfg)


def _launch_meta(K, N, cfg, dot_fp32=False):
    return dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_K=K % cfg.block_k == 0,
                EVEN_N=N % cfg.block_n == 0, DOT_FP32=dot_fp32, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def precompile(M: int, K: int, N: int, layout: str, cfg: SkinnyConfig) -> None:
    """Compile the kernel skinny_matmul would launch for this call into Triton's on-disk cache, without
    tensors or a launch (CUDA; the devcheck runs it in worker processes)."""
    bf = torch.bfloat16
    _skinny_kernel.warmup(bf, bf, bf, torch.float32, torch.int32, *_launch_args(M, K, N, layout, cfg.check()),
                          grid=(1,), **_launch_meta(K, N, cfg))


def clear_workspaces() -> None:
    """Drop every cached workspace (a benchmark between shapes; never while a captured graph uses one)."""
    _WORKSPACES.clear()


def skinny_matmul_ref(x: torch.Tensor, w: torch.Tensor, layout: str = "kn") -> torch.Tensor:
    wf = w.float() if layout == "kn" else w.float().t()
    return (x.float() @ wf).to(torch.bfloat16)


def floor_us(K: int, N: int, hbm_gbps: float = HBM_GBPS) -> float:
    """The weights' HBM time: K x N bf16 at the copy rate."""
    return K * N * 2 / (hbm_gbps * 1e3)


