"""Beyond the paper: a smaller selection index (issue 47) for every landmark design, at Llama-3-8B 128K on the
H200. Priced from bytes, not measured: no GPU run of an index other than flat yet.

(a) each landmark design at its largest batch (the memory model, `ddbench plan --index`): decode tokens/s by
the simulator's cost model, compute only (the layers' compute terms: what the engine's CUDA-graph steps with
no host reads time) and with the link (the aggregate step at the profile's rates), against the index's bytes
per chunk and KV head; the selection of each level priced from its bytes at the engine fit's bf16 scan rate
(sim/indexcost.py). (b) the recall of the flat top-k on SmolLM2 at its longest measured context
(`python -m ddbench.profile.indexrecall`, traces/accuracy/*.index.csv: the budget's share of 128K), against
the same bytes at SmolLM2's head dim. Not a paper figure: no paper number.
"""

from __future__ import annotations

import json
from functools import lru_cache

import pandas as pd

from ddbench.core.designs import DUALDECODER, DUALDECODER_CACHE, LRU_CACHE, SHADOWKV
from ddbench.core.paths import traces_dir
from ddbench.experiments import FigureResult, register
from ddbench.plotting import SYSTEM_COLORS

INDEXES = ("flat", "fp8", "int4", "two-level:8,1", "two-level:8,1,fp8", "two-level:8,1,int4")
DESIGNS = (SHADOWKV, DUALDECODER, DUALDECODER_CACHE, LRU_CACHE)
MODEL, GPU, CONTEXT = "llama-3-8b", "h200", 131072
RECALL = "SmolLM2-135M-Instruct.Q4_1.index.summary.json"
COLORS = {d: SYSTEM_COLORS[d] for d in (DUALDECODER_CACHE, LRU_CACHE)}   # the registry's colours


@lru_cache(maxsize=None)
def point(design: str, index: str) -> dict:
    """The design's largest batch with `index` and its tokens/s (compute only, and with the link)."""
    from ddbench.core.index import parse_index, resident_bytes
    from ddbench.core.memory import max_batch
    from ddbench.planner.scenario import Scenario, resolve
    from ddbench.sim.run import Point, run
    r = resolve(Scenario.make(model=MODEL, gpu=GPU, design=design, context="128k", index=index))
    b = max_batch(r.design, r.model, r.gpu, r.workload)
    pl = run(Point(r.design, r.model, r.cm, r.workload, b, float(CONTEXT), r.hit, r.reuse, r.lowrank,
                   cache=r.cache_rates), "plan")
    compute = sum(pl.pre) + sum(pl.mid) + sum(pl.att) + sum(pl.post) + pl.lm_s
    n = CONTEXT // r.workload.chunk
    return {"design": design, "index": index, "bytes_per_chunk_head": resident_bytes(parse_index(index), n,
                                                                                      r.model.head_dim) / n,
            "max_batch": b, "tok_s_compute_only": b / compute, "tok_s": b / run(pl, "aggregate").step_s}


def recall_rows() -> list:
    """(index, bytes per chunk and KV head at the model's head dim, mean recall, worst layer) at the longest
    context measured, the budget's share of 128K (1/64)."""
    s = json.loads((traces_dir("accuracy") / RECALL).read_text(encoding="utf-8"))
    key = max((k for k in s["per_context"] if int(k.split("/")[0]) // int(k.split("/")[1]) == 64),
              key=lambda k: int(k.split("/")[0]))
    return [{"index": i, "recall_bytes_per_chunk_head": v["bytes_per_chunk_head"], "recall": v["mean_recall"],
             "recall_worst_layer": v["worst_layer_recall"], "recall_context": int(key.split("/")[0])}
            for i, v in s["per_context"][key].items() if i in INDEXES]


def _draw(res: FigureResult, fig) -> None:
    df = res.data
    fig.set_size_inches(9.0, 3.6)
    ax_a, ax_b = fig.subplots(1, 2)
    for d in DESIGNS:
        s = df[df.design == d].sort_values("bytes_per_chunk_head")
        color = COLORS.get(d) or SYSTEM_COLORS.get(d, "#7f7f7f")
        ax_a.plot(s.bytes_per_chunk_head, s.tok_s_compute_only, ls="none", marker="o", ms=4, color=color,
                  label=f"{d}, compute only")
        ax_a.plot(s.bytes_per_chunk_head, s.tok_s, ls="none", marker="x", ms=5, color=color, label=f"{d}, with the link")
    r = df.dropna(subset=["recall"]).drop_duplicates("index")
    ax_b.plot(r.recall_bytes_per_chunk_head, r.recall, ls="none", marker="o", color="black")
    ax_b.vlines(r.recall_bytes_per_chunk_head, r.recall_worst_layer, r.recall, color="grey", lw=0.8)
    for x, y, name in zip(r.recall_bytes_per_chunk_head, r.recall, r["index"]):
        ax_b.annotate(name, (x, y), fontsize=5, xytext=(3, 2), textcoords="offset points")
    ax_b.axhline(0.95, color="grey", ls=":", lw=0.8)
    ax_a.set_xlabel("index size (bytes per chunk and KV head, d 128)")
    ax_a.set_ylabel("decode throughput (tokens/s)")
    ax_a.set_title("(a) each design at its largest batch, priced from bytes", fontsize=8)
    ax_b.set_xlabel("index size (bytes per chunk and KV head, d 64)")
    ax_b.set_ylabel("recall of the flat top-k (ratio)")
    ax_b.set_title(f"(b) SmolLM2 at {int(r.recall_context.iloc[0]) // 1024}K: mean over layers, line to the worst",
                   fontsize=8)
    ax_a.legend(fontsize=5)
    fig.suptitle("A smaller selection index: Llama-3-8B 128K on one H200 (simulated), recall on SmolLM2 (measured)",
                 fontsize=9)


@register("index", "A smaller selection index per landmark design: tokens/s and recall against index size", draw=_draw)
def compute() -> FigureResult:
    df = pd.DataFrame([point(d, i) for d in DESIGNS for i in INDEXES])
    df = df.merge(pd.DataFrame(recall_rows()), on="index", how="left")
    setup = ("Llama-3-8B at 128K on the H200, budget 2048, each landmark design at its largest batch by the memory model;"
             " tokens/s PRICED FROM BYTES by the simulator (selection per level at the engine fit's bf16 scan rate);"
             " recall of the flat bf16 top-k measured on SmolLM2 (traces/accuracy/" + RECALL + ")")
    return FigureResult(df, setup)
