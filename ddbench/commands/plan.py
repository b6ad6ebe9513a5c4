"""`ddbench plan`: what-if capacity planning (memory part).

For each design: the largest batch that fits and the GPU memory breakdown at
that batch (or at --batch, if given).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from ddbench.core.catalog import get_gpu, get_model
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import CATEGORIES, Workload, max_batch, memory_breakdown
from ddbench.core.systems import resolve_systems
from ddbench.core.units import GB, fmt_tokens, parse_tokens

EXAMPLE = """examples:
  ddbench plan --model llama-3-8b --gpu h100-80gb --context 128k --system all
  ddbench plan --model qwen2.5-32b --gpu h200 --context 1m --system dualdecoder,shadowkv --json
  ddbench plan --model ./my-model/config.json --gpu a100-80gb --context 65536 --batch 8"""


def register(sub) -> None:
    p = sub.add_parser("plan", help="max batch and GPU memory breakdown per design",
                       description=__doc__, epilog=EXAMPLE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="catalog name or path to a Hugging Face config.json")
    p.add_argument("--gpu", required=True, help="catalog GPU name, e.g. h100-80gb, h200")
    p.add_argument("--context", required=True, help="prompt tokens per request: 131072, 128k or 1m")
    p.add_argument("--system", default="all",
                   help="'all' (the paper's four designs), 'every' (whole registry) or a comma list")
    p.add_argument("--batch", type=int, help="show the breakdown at this batch instead of the maximum")
    p.add_argument("--budget", default="2048", help="sparse budget in tokens (default 2048)")
    p.add_argument("--chunk", type=int, default=8, help="tokens per chunk (default 8)")
    p.add_argument("--rank", type=int, default=160, help="low-rank key rank (default 160)")
    p.add_argument("--gen-tokens", type=int, default=128, help="generated-token slots on the GPU (default 128)")
    p.add_argument("--lowrank-layers", type=int, default=0,
                   help="DualDecoder layers with low-rank key reconstruction (default 0)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def plan(args) -> dict:
    model = get_model(args.model)
    gpu = get_gpu(args.gpu)
    systems = resolve_systems(args.system)
    workload = Workload(context=parse_tokens(args.context), budget=parse_tokens(args.budget, "budget"),
                        chunk=args.chunk, rank=args.rank, gen_tokens=args.gen_tokens,
                        lowrank_layers=args.lowrank_layers)
    workload.validate(model)
    if args.batch is not None and args.batch < 1:
        raise DDBenchError(f"--batch must be at least 1, got {args.batch}")
    rows = []
    for sys in systems:
        best = max_batch(sys, model, gpu, workload)
        shown = args.batch if args.batch is not None else max(best, 1)
        bd = memory_breakdown(sys, model, gpu, replace(workload, batch=shown))
        rows.append({"system": sys.name, "max_batch": best, "breakdown_batch": shown,
                     "fits": bd.fits, "bytes": {c: getattr(bd, c) for c in CATEGORIES} | {"total": bd.total}})
    return {"model": model.name, "gpu": gpu.name, "capacity_bytes": gpu.hbm_bytes,
            "context": workload.context, "workload": workload.__dict__, "systems": rows}


def render(result: dict) -> str:
    cap = result["capacity_bytes"]
    head = (f"{result['model']} on {result['gpu']} ({cap / GB:.1f} GB), context {fmt_tokens(result['context'])}, "
            f"budget {result['workload']['budget']}, chunk {result['workload']['chunk']}  [GB = 1e9 bytes]")
    cols = ["system", "max batch", "at batch"] + [c.replace("_", " ") for c in CATEGORIES] + ["total", "of GPU"]
    table = [cols]
    for r in result["systems"]:
        b = r["bytes"]
        table.append([r["system"], str(r["max_batch"]), str(r["breakdown_batch"])]
                     + [f"{b[c] / GB:.2f}" for c in CATEGORIES]
                     + [f"{b['total'] / GB:.2f}", f"{100 * b['total'] / cap:.0f}%" + ("" if r["fits"] else " OOM")])
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = [head] + ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
                      for row in table]
    return "\n".join(lines)


def run(args) -> int:
    result = plan(args)
    print(json.dumps(result, indent=1) if args.json else render(result))
    return 0
