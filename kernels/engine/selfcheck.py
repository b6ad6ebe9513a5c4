"""Small CUDA run of the engine's Triton path against the torch reference, for compute-sanitizer.

    python -m ddbench.kernels.engine.selfcheck [--graph] [--kernels] [DESIGN ...]
        -> prints one line per design (eager; with --graph also captured and replayed) and, with
           --kernels, per kernel variant the engine may pick (both key-rebuild kernels, every top-k
           method with one and per-token outputs, the seg top-k with the fused miss plan, the fused
           residual norm) against its twin at small shapes; exits 1 on a mismatch
"""

from __future__ import annotations

import sys

import torch

from ddbench.core.catalog.models import ModelSpec
from ddbench.core.designs import DESIGNS as SYSTEMS
from ddbench.core.designs import DUALDECODER, DUALDECODER_CPU_GATHER, DUALDECODER_FIFO, SHADOWKV, SPECACHE

SMALL = ModelSpec("gpu-small", 3, 32, 8, 128, 1024, 2048, 1000)
# Qwen2.5-14B / 32B heads (40 query heads over 8 KV heads: a group of 5; QKV bias), small otherwise
SMALL_QWEN = ModelSpec("gpu-small-qwen", 3, 40, 8, 128, 1024, 2048, 1000, qkv_bias=True, rope_theta=1e6)


def build(name, miss_rate=0.33, B=3, ctx=8192, budget=512, seed=0, lowrank=(1,), debug=True, model=SMALL, **extra):
    from ddbench.kernels.engine.engine import Engine, EngineConfig
    from ddbench.kernels.engine.model import Weights
    from ddbench.kernels.layout import alloc_host_kv
    g = torch.Generator(device="cuda").manual_seed(seed)
    host = alloc_host_kv(model.num_layers, B, model.num_kv_heads, ctx // 8, 8, model.head_dim)
    tmp = torch.empty(host.shape, device="cuda", dtype=host.dtype).normal_(generator=g)
    host.copy_(tmp)
    w = Weights.random(model, "cuda", seed)
    cfg = EngineConfig.of(context=ctx, batch=B, budget=budget, local_chunks=4, gen_tokens=16, rank=32, outliers_per_1k=16,
                          miss_rate=miss_rate, lowrank_layers=lowrank, seed=seed, prefetch_programs=8, urgent_programs=16,
                          **extra)
    return Engine(model, SYSTEMS[name], cfg, w, "cuda", host_kv=host, debug=debug), host


def reference_output(e, rec, host):
    from ddbench.kernels.attention import dual_sparse_attention_ref
    from ddbench.kernels.gather import gather_ref
    from ddbench.kernels.rebuild import rebuild_keys_ref
    B, H, d, C = e.B, e.H, e.d, e.C
    true = rec["true"].sort(-1).values
    kC = true.shape[-1] * C
    S = kC + e.R0 + int(rec["g"]) + rec["nq"]
    kb = torch.full((B, H, S, d), float("nan"), dtype=e.dt, device=e.dev)
    vb = torch.full_like(kb, float("nan"))
    layer = rec["layer"]
    gather_ref(host, layer % host.shape[0], true, None if rec["lowrank"] else kb, vb)
    if rec["lowrank"]:
        rebuild_keys_ref(e.U[layer], e.SV[layer], true, kb, chunk=C, rope_theta=e.m.rope_theta)
    R = e.R0 + int(rec["g"])          # the device's count of generated tokens (graphs: no host mirror)
    kb[:, :, kC:kC + R], vb[:, :, kC:kC + R] = rec["recent_k"][:, :, :R], rec["recent_v"][:, :, :R]
    kb[:, :, kC + R:], vb[:, :, kC + R:] = rec["k"].transpose(1, 2), rec["v"].transpose(1, 2)
    return dual_sparse_attention_ref(rec["q"], kb, vb, torch.full((B,), kC + R, dtype=torch.int32, device=e.dev))


def check(name, miss_rate=0.33, steps=3):
    e, host = build(name, miss_rate)
    for _ in range(steps):
        e.step()
    torch.cuda.synchronize()
    worst = 0.0
    for rec in e.debug:
        ref = reference_output(e, rec, host)
        err = (rec["out"].float() - ref.float()).abs().max().item()
        worst = max(worst, err)
    return worst, e


def check_graph(name, miss_rate=0.33, replays=2, **extra):
    """Two eager steps, capture two steps into a CUDA graph, replay: the captured layers' outputs
    (debug copies are graph nodes too, so they hold the last replay's values) against the reference."""
    e, host = build(name, miss_rate, **extra)
    e.step()
    e.step()
    n0 = len(e.debug)
    e.capture(2)
    captured = e.debug[n0:]
    worst, outs = 0.0, []
    for _ in range(replays):
        e.replay()
        torch.cuda.synchronize()
        outs.append(captured[-1]["out"].clone())
        for rec in captured:
            ref = reference_output(e, rec, host)
            worst = max(worst, (rec["out"].float() - ref.float()).abs().max().item())
    moved = not torch.equal(outs[0], outs[-1])     # the replays really ran on (new positions, new misses)
    return worst, e, len(captured), moved


def _fused_plan_ok(sc, pml, B, H, G, N, k, g) -> bool:
    """The dual-token seg top-k with the miss plan in its merge kernel against the plain top-k and the
    twin plan_misses (sets of (request-head, chunk) and (request-head, slot), count, assembled)."""
    from ddbench.kernels.engine import fastselect
    from ddbench.kernels.engine.transfer import plan_buffers, plan_misses
    pred = torch.rand(B, H, N, device="cuda", generator=g).argsort(-1)[..., :k].sort(-1).values.to(torch.int32)
    want = fastselect.topk_from_scratch(sc, pml, fastselect.TopkShape(B, H, 2, G, N, k),
                                        how=fastselect.TopkMethod(method="seg"))
    mp = plan_buffers(B, H, k, "cuda")
    for t in (mp.bh, mp.chunk, mp.slot, mp.count, mp.assembled):
        t.fill_(-7)
    outs = tuple(torch.full((B, H, k), -7, device="cuda", dtype=torch.int32) for _ in range(2))
    fastselect.topk_from_scratch(sc, pml, fastselect.TopkShape(B, H, 2, G, N, k), outs,
                                 how=fastselect.TopkMethod(method="seg"), plan=(pred, mp))
    a = plan_misses(pred, outs[0])
    n = int(a.count)
    pairs = lambda p, f: sorted(zip(p.bh[:n].tolist(), getattr(p, f)[:n].tolist()))   # noqa: E731
    return (torch.equal(outs[0], want[:, 0]) and torch.equal(outs[1], want[:, 1]) and int(mp.count) == n > 0
            and all(pairs(a, f) == pairs(mp, f) for f in ("chunk", "slot")) and torch.equal(a.assembled, mp.assembled))


def kernel_checks():
    """(name, ok) per kernel variant, fresh random inputs, outputs poisoned first."""
    from ddbench.kernels.engine import fastselect, fused
    from ddbench.kernels.rebuild import RebuildLaunch, rebuild_keys, rebuild_keys_ref
    g = torch.Generator(device="cuda").manual_seed(5)
    res = []
    B, T, R, H, d, n = 5, 4096, 40, 8, 128, 70
    U = torch.randn(B, T, R, device="cuda", generator=g).bfloat16()
    SV = (torch.randn(B, H, R, d, device="cuda", generator=g) / R ** 0.5).bfloat16()
    idx = torch.stack([torch.randperm(T // 8, device="cuda", generator=g)[:n] for _ in range(B * H)]).view(B, H, n)
    idx = idx.sort(-1).values.to(torch.int32)
    ref = rebuild_keys_ref(U, SV, idx, torch.zeros(B, H, n * 8 + 16, d, device="cuda", dtype=torch.float32),
                           slot_offset=8)
    for impl in ("blocks", "resident"):
        out = torch.full((B, H, n * 8 + 16, d), float("nan"), device="cuda", dtype=torch.float32)
        rebuild_keys(U, SV, idx, out, slot_offset=8, launch=RebuildLaunch(impl=impl))
        core = out[:, :, 8:8 + n * 8]
        ok = not core.isnan().any() and out[:, :, :8].isnan().all() and out[:, :, 8 + n * 8:].isnan().all() and \
            torch.allclose(core, ref[:, :, 8:8 + n * 8], rtol=2e-2, atol=2e-2)
        res.append((f"rebuild {impl}", ok))
    Bq, Hk, G, N, k = 3, 8, 4, 5000, 300
    for nq in (1, 2):
        q = torch.randn(Bq, nq, Hk * G, d, device="cuda", generator=g).bfloat16()
        lm = torch.randn(Bq, Hk, N, d, device="cuda", generator=g).bfloat16()
        sc, pml, _ = fastselect.landmark_pass1(q, lm)
        p = fastselect.probs_from_scratch_ref(sc, pml, Bq, Hk, nq, G, N)
        want = p.topk(k, dim=-1).values.sort(-1).values
        for method in ("seg", "stream", "bits"):
            outs = [torch.full((Bq, Hk, k), -7, device="cuda", dtype=torch.int32) for _ in range(nq)]
            fastselect.topk_from_scratch(sc, pml, fastselect.TopkShape(Bq, Hk, nq, G, N, k), tuple(outs),
                                         how=fastselect.TopkMethod(method=method))
            got = torch.stack(outs, 1).transpose(1, 2).reshape(Bq * Hk, nq, k).long()
            ok = bool((got.diff(dim=-1) > 0).all()) and torch.allclose(p.gather(-1, got).sort(-1).values, want,
                                                                       rtol=1e-5, atol=1e-12)
            res.append((f"top-k {method} nq={nq} per-token", ok))
    res.append(("top-k seg with the fused miss plan", _fused_plan_ok(sc, pml, Bq, Hk, G, N, k, g)))
    x = torch.randn(7, 2, 4096, device="cuda", generator=g).bfloat16()
    y = torch.randn(7, 2, 4096, device="cuda", generator=g).bfloat16()
    w = (torch.rand(4096, device="cuda", generator=g) + 0.5).bfloat16()
    s_, h_ = fused.add_rmsnorm(x, y, w)
    s_ref, h_ref = fused.add_rmsnorm_ref(x, y, w)
    res.append(("add_rmsnorm", torch.equal(s_, s_ref) and torch.allclose(h_.float(), h_ref.float(), rtol=1e-2,
                                                                          atol=1e-2)))
    return res


def main():
    bad = 0
    wrong = [a for a in sys.argv[1:] if a not in ("--graph", "--kernels") and (a.startswith("-") or a not in SYSTEMS)]
    if wrong:
        print(f"error: unknown design or option {wrong[0]!r} (designs: {', '.join(SYSTEMS)}; options: --graph, "
              "--kernels)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: selfcheck runs the engine's CUDA path and needs a CUDA GPU", file=sys.stderr)
        return 2
    if "--kernels" in sys.argv:
        for name, ok in kernel_checks():
            bad += not ok
            print(f"{name:32s} {'OK' if ok else 'MISMATCH'}", flush=True)
    args = [a for a in sys.argv[1:] if a not in ("--graph", "--kernels")]
    names = args or [DUALDECODER, DUALDECODER_FIFO, SHADOWKV, SPECACHE, DUALDECODER_CPU_GATHER]
    for name in names:
        worst, e = check(name, steps=2 if len(names) == 1 else 3)
        ok = worst < 3e-2
        bad += not ok
        print(f"{name:24s} max |engine - reference| = {worst:.3g}  {'OK' if ok else 'MISMATCH'}  bytes={e.step_bytes()}", flush=True)
        if "--graph" in sys.argv and SYSTEMS[name].gather != "cpu":
            worst, e, n, moved = check_graph(name)
            ok = worst < 3e-2 and n == 2 * e.L and moved
            bad += not ok
            print(f"{name:24s} graph: {n} captured layers, max |engine - reference| = {worst:.3g}, replays differ: "
                  f"{moved}  {'OK' if ok else 'MISMATCH'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
