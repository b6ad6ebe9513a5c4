"""GPU check of ShadowKV's in-place step (issue 31): the miss-only key rebuild, then whole engine steps.

    PYTHONPATH=. python3 -m devtools.devcheck_shadowkv [--out FILE.json] [--points 131072:46,65536:80,...]
        [--miss 0.12] [--reps 5] [--host-gib 8] [--no-profile]

(a) kernels/rebuild.py rebuild_changed (the keys of the slots whose chunk changed) against its fp32 twin
    on fresh random bf16 factors with NaN-poisoned keys (r=160, H=8, d=128, C=8, n=256, `--miss` of the
    slots changed), then timed with CUDA events after warm-up beside rebuild_keys of every slot, at
    each point's batch and context. Floor: the changed chunks' U rows + SV + the K written, at the HBM
    copy rate of this run.
(b) the engine's shadowkv at each point (kernels/engine/sweep.run_point: CUDA-graph replays, Llama-3-8B,
    --miss forced misses against the previous step), compute only and with transfers: step, tokens/s,
    the HBM floor (Engine.floor_bytes at the copy rate), the link floor (the step's fetched bytes at the
    pinned host-to-device copy rate of this run) and the step over each; with profiling, one replay's
    kernel time by category (kernels/engine/breakdown.py).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys

import torch

from devtools._common import command, context_batches, refusal

POINTS = "131072:46,65536:80,32768:126,131072:1"


def rebuild_rows(points, miss, hbm, log):
    from ddbench.kernels.rebuild import rebuild_changed, rebuild_changed_ref, rebuild_keys
    from ddbench.kernels.timing import event_times
    R, H, d, C, n = 160, 8, 128, 8, 256
    rows = []
    for ctx, B in points:
        g = torch.Generator(device="cuda").manual_seed(B)
        U = (torch.randn(B, ctx, R, device="cuda", generator=g) / math.sqrt(R)).bfloat16()
        SV = torch.randn(B, H, R, d, device="cuda", generator=g).bfloat16()
        perm = torch.rand(B, H, ctx // C, device="cuda", generator=g).argsort(-1)
        old = perm[..., :n].int()
        chg = torch.rand(B, H, n, device="cuda", generator=g) < miss
        new = torch.where(chg, perm[..., n:2 * n].int(), old)
        out = torch.full((B, H, n * C, d), float("nan"), device="cuda", dtype=torch.bfloat16)
        ref = out.clone()
        rebuild_changed(U, SV, old, new, out)
        rebuild_changed_ref(U[:2], SV[:2], old[:2], new[:2], ref[:2])
        tok = chg.repeat_interleave(C, -1)
        a, b = out[:2][tok[:2]].float(), ref[:2][tok[:2]].float()
        err = float((a - b).norm() / b.norm())
        ok = bool(torch.equal(out.isnan().all(-1), ~tok)) and err < 1e-2
        t_chg = statistics.median(event_times(lambda: rebuild_changed(U, SV, old, new, out), 20, warmup=3))
        t_all = statistics.median(event_times(lambda: rebuild_keys(U, SV, new, out), 20, warmup=3))
        m = int(chg.sum())
        floor_us = (m * C * R * 2 + B * H * R * d * 2 + m * C * d * 2 + 2 * B * H * n * 4) / (hbm * 1e9) * 1e6
        rows.append(dict(kind="rebuild", context=ctx, batch=B, changed=m, err=err, ok=ok, changed_us=t_chg * 1e3,
                         all_us=t_all * 1e3, floor_us=floor_us, over_floor=t_chg * 1e3 / floor_us))
        log(f"rebuild ctx={ctx:6d} B={B:3d} changed={m:6d} err={err:.2e} ok={ok} changed={t_chg * 1e3:8.1f} us "
            f"all={t_all * 1e3:8.1f} us floor={floor_us:6.1f} us x{t_chg * 1e3 / floor_us:.2f}")
        del U, SV, out, ref
        torch.cuda.empty_cache()
    return rows


def engine_rows(points, miss, reps, host_gib, profile, hbm, cg, log):
    import gc

    from ddbench.core.catalog import get_model
    from ddbench.kernels.engine import breakdown
    from ddbench.kernels.engine.model import Weights
    from ddbench.kernels.engine.points import PointSetup, PointTiming, alloc_host, run_point
    model = get_model("llama-3-8b")
    weights = Weights.random(model, "cuda", seed=0)
    flat = alloc_host(host_gib)[0]
    rows = []
    for ctx, B in points:
        for transfers in (False, True):
            r = run_point(PointSetup(model, weights, flat if transfers else None, hbm, log=log), "shadowkv", ctx, B,
                          PointTiming(miss, transfers, reps=reps), keep=True)
            if not isinstance(r, tuple):
                rows.append(dict(kind="engine", context=ctx, batch=B, transfers=int(transfers), status=r["status"]))
                log(f"engine ctx={ctx} B={B} transfers={int(transfers)}: {r['status']}")
                continue
            row, e = r
            link_ms = row["link_mib"] * 2 ** 20 / (cg * 1e9) * 1e3
            out = dict(kind="engine", context=ctx, batch=B, transfers=int(transfers), status="ok",
                       step_ms=row["step_ms"], step_ms_min=row["step_ms_min"], step_ms_max=row["step_ms_max"],
                       tok_s=row["tok_s"], floor_ms=row["floor_ms"], step_over_floor=row["step_over_floor"],
                       link_mib=row["link_mib"], floor_link_ms=link_ms,
                       step_over_link_floor=row["step_ms"] / link_ms if link_ms else None,
                       peak_gib=row["peak_gib"])
            if profile:
                s = breakdown.summarize(row, breakdown.profile_replay(e, e.graph_steps), e.graph_steps, hbm)
                out.update(busy_ms=s["busy_ms"], categories=s["categories"], top_kernels_ms=s["top_kernels_ms"])
            rows.append(out)
            cats = " ".join(f"{k}={v['ms']:.2f}" for k, v in out.get("categories", {}).items())
            log(f"engine ctx={ctx:6d} B={B:3d} xfer={int(transfers)} step={row['step_ms']:7.2f} ms "
                f"tok/s={row['tok_s']:7.1f} hbm_floor={row['floor_ms']:6.2f} x{row['step_over_floor']:.2f} "
                f"link_floor={link_ms:6.2f}" + (f" x{row['step_ms'] / link_ms:.2f}" if link_ms else "") + f" | {cats}")
            del e, r                  # the engine's memory, before the next point's
            gc.collect()
            torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--points", default=POINTS)
    ap.add_argument("--miss", type=float, default=0.12)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--host-gib", type=float, default=8.0)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--skip-rebuild", action="store_true")
    a = ap.parse_args(argv)
    why = refusal("devcheck_shadowkv", a.reps)
    if not why:
        pts, why = context_batches("devcheck_shadowkv", a.points)
    if why:
        print(why, file=sys.stderr)
        return 2
    from ddbench.kernels.engine.sweep import copy_gbps, hbm_gbps
    from ddbench.kernels.timing import provenance
    hbm, cg = hbm_gbps(), copy_gbps()
    print(f"HBM copy {hbm:.0f} GB/s, pinned H2D {cg:.1f} GB/s", flush=True)
    log = lambda t: print(t, flush=True)   # noqa: E731
    rows = [] if a.skip_rebuild else rebuild_rows(pts, a.miss, hbm, log)
    if not a.skip_engine:
        rows += engine_rows(pts, a.miss, a.reps, a.host_gib, not a.no_profile, hbm, cg, log)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(dict(provenance=provenance(command("devcheck_shadowkv", argv)), hbm_copy_gbps=hbm,
                           copy_h2d_gbps=cg, rows=rows), f, indent=1)
    return 0 if all(r.get("ok", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
