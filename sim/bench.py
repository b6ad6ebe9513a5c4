"""Speed benchmark of the simulator (not a timed test): `python -m ddbench.sim.bench`.

1. serving mode: batch steps simulated per second of wall time, and the wall time of a
   1,000-request Poisson run of Qwen2.5-32B at 128K context on the H200;
2. timeline mode: batch steps per second for a 32-layer model (Llama-3-8B), per design;
3. agreement of the aggregate with the timeline over a batch sweep (the transition region).
"""

from __future__ import annotations

import time

from ddbench.core.catalog import get_gpu, get_model
from ddbench.core.memory import Workload
from ddbench.core.designs import DESIGNS, DUALDECODER, DUALDECODER_CPU_GATHER, FULL_KV, SHADOWKV, SPECACHE
from ddbench.sim.aggregate import aggregate_step
from ddbench.sim.steplayers import step_layers
from ddbench.core.distribution import Distribution
from ddbench.sim.serving import draw_requests, run_serving
from ddbench.sim.factory import cost_model


def serving(model, context, output, rate, n, system=DUALDECODER, seed=0):
    m, g = get_model(model), get_gpu("h200")
    cm = cost_model(model, "h200")
    reqs = draw_requests(n, rate, Distribution.parse(context, "context"), Distribution.parse(output, "output"), seed)
    t0 = time.perf_counter()
    res = run_serving(DESIGNS[system], m, g, cm, Workload(context=131072), reqs, [0.88] * m.num_layers,
                      [0.88] * m.num_layers)
    wall = time.perf_counter() - t0
    return wall, res


def main() -> None:
    from ddbench.sim.timeline import run_timeline
    print("serving mode (wall on this machine):")
    for model, ctx, out, rate, n, system in [
        ("qwen2.5-32b", "128k", "256", 1.0, 1000, DUALDECODER),
        ("qwen2.5-32b", "128k", "256", 1.0, 1000, SHADOWKV),
        ("llama-3-8b", "uniform:16k:64k", "exp:512", 0.5, 1000, DUALDECODER),
        ("llama-3-8b", "32k", "exp:1024", 0.2, 1000, FULL_KV),
    ]:
        wall, res = serving(model, ctx, out, rate, n, system)
        print(f"  {system:12s} {model:12s} ctx {ctx:16s} out {out:9s} rate {rate:4} n {n}: wall {wall:6.2f} s,"
              f" {res.decode_steps} batch steps in {len(res.segments)} events ->"
              f" {res.decode_steps / wall:9.0f} batch-steps/s, {len(res.segments) / wall:7.0f} events/s")
    print("timeline mode, Llama-3-8B (32 layers), 128K, 200 steps:")
    m = get_model("llama-3-8b")
    cm = cost_model("llama-3-8b", "h200")
    w = Workload(context=131072)
    for system in (DUALDECODER, SHADOWKV, SPECACHE, FULL_KV, DUALDECODER_CPU_GATHER):
        for b in (1, 32):
            plan = step_layers(DESIGNS[system], m, cm, w, b, 131072, [0.88] * 32, [0.88] * 32)
            t0 = time.perf_counter()
            run_timeline(plan, steps=200, warmup=2)
            wall = time.perf_counter() - t0
            print(f"  {system:24s} batch {b:3d}: {200 / wall:7.0f} steps/s")
    print("aggregate vs timeline, dualdecoder, Llama-3-8B 128K, hit 0.88:")
    worst = 0.0
    for b in (1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128):
        plan = step_layers(DESIGNS[DUALDECODER], m, cm, w, b, 131072, [0.88] * 32, [0.88] * 32)
        tl = run_timeline(plan, steps=7, warmup=3).steady_step_s
        ag = aggregate_step(plan).step_s
        worst = max(worst, abs(ag / tl - 1))
        print(f"  batch {b:3d}: timeline {tl * 1e3:8.2f} ms, aggregate {ag * 1e3:8.2f} ms ({ag / tl - 1:+.1%})")
    print(f"  worst |error| {worst:.1%}")


if __name__ == "__main__":
    main()
