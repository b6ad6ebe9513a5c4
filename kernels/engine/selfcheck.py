"""Small CUDA run of the engine's Triton path against the torch reference, for compute-sanitizer.

    python -m kernels.engine.selfcheck   -> prints one line per design, exits 1 on a mismatch
"""

from __future__ import annotations

import sys

import torch

from ddbench.core.catalog.models import ModelSpec
from ddbench.core.systems import SYSTEMS

SMALL = ModelSpec("gpu-small", 3, 32, 8, 128, 1024, 2048, 1000)


def build(name, miss_rate=0.33, B=3, ctx=8192, budget=512, seed=0, lowrank=(1,), debug=True):
    from kernels.engine.engine import Engine, EngineConfig
    from kernels.engine.model import Weights
    from kernels.layout import alloc_host_kv
    g = torch.Generator(device="cuda").manual_seed(seed)
    host = alloc_host_kv(SMALL.num_layers, B, 8, ctx // 8, 8, 128)
    tmp = torch.empty(host.shape, device="cuda", dtype=host.dtype).normal_(generator=g)
    host.copy_(tmp)
    w = Weights.random(SMALL, "cuda", seed)
    cfg = EngineConfig.of(context=ctx, batch=B, budget=budget, local_chunks=4, gen_tokens=16, rank=32, outliers_per_1k=16,
                          miss_rate=miss_rate, lowrank_layers=lowrank, seed=seed, prefetch_programs=8, urgent_programs=16)
    return Engine(SMALL, SYSTEMS[name], cfg, w, "cuda", host_kv=host, debug=debug), host


def reference_output(e, rec, host):
    from kernels.attention import dual_sparse_attention_ref
    from kernels.gather import gather_ref
    from kernels.rebuild import rebuild_keys_ref
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


def check_graph(name, miss_rate=0.33, replays=2):
    """Two eager steps, capture two steps into a CUDA graph, replay: the captured layers' outputs
    (debug copies are graph nodes too, so they hold the last replay's values) against the reference."""
    e, host = build(name, miss_rate)
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


def main():
    bad = 0
    args = [a for a in sys.argv[1:] if a != "--graph"]
    names = args or ["dualdecoder", "dualdecoder-fifo", "shadowkv", "specache", "dualdecoder-cpu-gather"]
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
