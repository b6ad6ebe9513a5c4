"""Engine measurement sweep on the local CUDA GPU: a model's shapes (--model, default Llama-3-8B), every design.

    python -m ddbench.kernels.engine.sweep [--quick] [--reps 3] [--host-gib 16] [--budget-s 420] [--out DIR]
    python -m ddbench.kernels.engine.sweep --point dualdecoder:131072:16 [--miss 0.33] [--budget 2048] [--chunk 8]
    python -m ddbench.kernels.engine.sweep --phases paper --model qwen2.5-32b --contexts 64k,128k,256k --gpu-mem-cap h100-80gb

Every step is timed as CUDA-graph replays (kernels/timing.event_times: events between back-to-back
replays, no host sync inside or between them) after the pre-decoding step, one eager warm-up step
and one warm-up replay; a graph holds two whole steps (Engine.capture). The CPU-gather ablation
needs the host inside the step and runs eagerly (marked graph=0), beside an eager GPU-gather twin.

Phases (one process, one run):
  floor      compute only (no host reads), graph: every design x {32K, 128K} x batch {1, 16, 64},
             and DualDecoder with one query token (dual/single); each step against its floor =
             HBM bytes of weights + resident selection state + attended KV (Engine.floor_bytes) over
             the device-to-device copy rate measured in this run (read + write counted). Also
             dualdecoder, shadowkv and specache compute-only with 17.4 % forced misses: the
             difference is the harness's cost of drawing them (sim/validate.py adds it).
  mechanism  --reps repetitions, interleaved (rep is the outer loop): priority vs FIFO at 128K, 33 %
             misses, batch 1/4/16 with their compute-only twins (exposed-transfer share); at batch 16:
             two passes (with and without transfers), per-layer buffers, CPU gather and the eager
             GPU gather.
  validation points the floor phase does not measure, for sim/validate.py: dualdecoder, shadowkv and
             specache at 32K and 128K, batch 2/8/32, 25 % misses, each with its compute-only twin;
             full-kv at 32K, batch 2/8; FIFO at 128K, batch 2/8/32; dualdecoder at 128K, batch 8, 10 %.
  reuse-fetch ShadowKV's fetch of one layer alone (kernels/engine/engine.py reuse_fetch, the code of
             _sparse_attention's reuse branch: values only, the engine's chunk and gather launch):
             batch 1/2/4/8/16/32/64 at 32K and batch 16 at 128K, forced miss rates 0, 0.25, 1.0. Each
             of copy, plan (reuse_plan alone), gather (its plan included) and the whole fetch is one
             CUDA graph of the 32 layers' calls back to back; median of the replays / 32 (ms per
             layer). Written to reuse_fetch.csv (not engine.csv: no step to replay); sim/README.md.
  paper      (not in the default list) the paper's own points: every design at the largest batch that fits
             under --gpu-mem-cap at each context of --contexts, with the batches its search measured (the
             throughput-against-batch series), GPU memory by category and the memory model's largest
             batch per row; forced miss rate --miss (default 1 - the core's default hit rate). See
             kernels/engine/paper.py.

--model: a catalog model or a path to a Hugging Face config.json (rows carry its name: `model`).
--gpu-mem-cap GB (or a catalog GPU name, e.g. h100-80gb): emulate a smaller GPU; a point whose planned
bytes exceed it is reported `oom` with them (planned_gib) and not allocated; a cap at or below the
weights, or above the GPU's memory, is one line and exit 2.

--phases floor,validation runs a subset (default all, reuse-fetch last) into <out>/<gpu>-<phases>
(e.g. h200-validation; --folder names it); --seed seeds the weights, the host KV values and the forced-miss draws; meta.json
holds a run_id (kept on --resume), the phases and the seed. An independent validation sweep is a
separate run: `--phases validation --seed 1`.

Writes <out>/<gpu>/engine.csv (one row per step point), reuse_fetch.csv (the reuse-fetch records),
rows.jsonl (every point, resumable: --resume), meta.json and summary.json (floors, ratios with
min/median/max over repetitions, the reuse-fetch records, provenance). A point that does
not fit reports `oom` and the sweep goes on; an invalid --point gives one line and exit 2.

This file is the CLI only. The code: options.py (the flags, as given and as checked), points.py (one
point: its label, config, build and timing), phases.py (each phase's points and the loop that runs
them), paper.py (the paper phase's search), results.py (the files), runner.py (a run on the GPU).
"""

from __future__ import annotations

import sys

from ddbench.core.errors import DDBenchError
from ddbench.kernels.engine.options import SweepOptions, build_parser
from ddbench.kernels.engine.runner import run_options

# the names other code imports from here (devtools, kernels/hostbench.py, breakdown, tests): their homes
# are kernels/engine/points.py (one point), phases.py (the phases) and results.py (the files)
from ddbench.kernels.engine.phases import PHASES, out_folder, parse_phases, plan_points  # noqa: E402,F401
from ddbench.kernels.engine.points import (alloc_host, copy_gbps, design_spec, hbm_gbps, make_config,  # noqa: E402,F401
                                   run_point)


def main(argv=None):
    opts = SweepOptions(**vars(build_parser(__doc__).parse_args(argv)))
    try:
        return run_options(opts)
    except DDBenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
