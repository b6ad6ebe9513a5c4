"""docs/profiling.md's block `index-rates`: the prediction's hit rate, ShadowKV's reuse, the caches' churn and
urgent share, and the sparse task rate under each selection index (issue 47), from the by_index section of
`ddbench profile --layer-accuracy --indexes ...`'s summary (ddbench/profile/indexrates.py), with 95 % intervals.

    index_rates(root) -> markdown
"""

from __future__ import annotations

import json
from pathlib import Path

from ddbench.doctables.common import ROOT, DocTablesError

RATES = "traces/accuracy/index/SmolLM2-135M-Instruct.Q4_1.summary.json"
GEMMA_RATES = "traces/accuracy/index/gemma-3-270m-q4_k_m.summary.json"
GEMMA_RATES_32K = "traces/accuracy/index/32640/gemma-3-270m-q4_k_m.summary.json"
CAPACITY = 4.0           # the caches' column: LRU, 4x the budget (docs/profiling.md's context trend uses it too)


def _load(path: Path) -> dict:
    if not path.is_file():
        raise DocTablesError(f"{path}: missing")
    return json.loads(path.read_text(encoding="utf-8"))


def _grid(header: list, rows: list) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def _cell(r: dict | None, task: bool = False) -> str:
    if r is None:
        return "-"
    head = f"{r['correct']}/{r['total']}" if task else f"{r['mean']:.3f}"
    hi = r["high"] if r["metric"].endswith("_per_budget") else min(1.0, r["high"])     # a share is at most 1
    return f"{head} [{max(0.0, r['low']):.2f}, {hi:.2f}]{' *' if r['outside_flat'] else ''}"


def _pick(rows: list, **want) -> dict:
    """{index: row} of the rows matching `want`."""
    return {r["index"]: r for r in rows if all(r.get(k) == v for k, v in want.items())}


def _budget_table(bi: dict, indexes: list, c: int, task: str, b: int) -> str:
    cols = [("hit_rate", "rates", {}), ("reuse_hit_rate", "rates", {}), ("union_hit_rate", "rates", {}),
            ("moved_per_budget", "cache", dict(prediction="speculative", capacity=0)),
            ("prefetched_per_budget", "cache", dict(prediction="speculative", capacity=CAPACITY)),
            ("urgent_per_budget", "cache", dict(prediction="speculative", capacity=CAPACITY)),
            ("urgent_share", "cache", dict(prediction="speculative", capacity=CAPACITY)),
            ("urgent_per_budget", "cache", dict(prediction="none", capacity=CAPACITY)),
            ("task_rate", "tasks", {})]
    got = [_pick(bi[part], metric=m, context_tokens=c, task=task, budget_tokens=b,
                 **({"policy": "lru"} if part == "cache" else {}), **kw) for m, part, kw in cols]
    head = ["index", "hit", "reuse (ShadowKV)", "union", "dualdecoder moved / k",
            f"dualdecoder-cache {CAPACITY:g}x: churn (prefetched / k)", "its urgent / k", "its urgent share",
            f"lru-cache {CAPACITY:g}x: urgent / k", "task rate (sparse top-k)"]
    rows = [[f"`{ix}`"] + [_cell(g.get(ix), task=(i == len(cols) - 1)) for i, g in enumerate(got)] for ix in indexes]
    return _grid(head, rows)


def index_rates(root: Path = ROOT, path: str = RATES) -> str:
    s = _load(root / path)
    bi, cfg, prov = s.get("by_index"), s["config"], s["provenance"]
    if not bi:
        raise DocTablesError(f"{root / path}: no by_index section (a profile run with --indexes)")
    indexes = list(cfg["indexes"])
    settings = sorted({(r["context_tokens"], r["task"], r["budget_tokens"]) for r in bi["rates"]})
    n = max(r["n"] for r in bi["rates"])
    parts = [
        f"`ddbench profile --layer-accuracy --indexes {','.join(indexes)}` on {s['model']} (sha256"
        f" {prov['model_sha256']}, git {prov['git_sha']}; `{path.rsplit('/', 1)[0]}/`, its command in the files):"
        f" {', '.join(cfg['tasks'])} task, {cfg['prompts']} prompts of {cfg['questions']} questions each ({n}"
        f" samples), {cfg['steps']} dual-token steps per sample, init T2, temperature"
        f" {'/'.join(f'{t:g}' for t in cfg['temperatures'])}, one prefill per prompt serving every index"
        f" ({s['runtime_s'] / 60:.0f} min on one shared CPU thread). Each index selects (the true and the speculative"
        f" token's top-k alike) with its torch twin over the same landmarks and queries; flat is today's rule. Cells:"
        f" mean over samples [Student 95 % interval over samples; the questions of one prompt share its haystack, so"
        f" read it as a spread]; task rate: correct/total [Wilson 95 %], sparse exact top-k under the index; cache"
        f" columns LRU, steady steps; `*`: outside flat's interval."]
    for c, task, b in settings:
        parts.append(f"Context {c}, budget {b} tokens (k {b // cfg['chunk']} chunks, 1/{round(c / b)} of the"
                     f" context):\n\n" + _budget_table(bi, indexes, c, task, b))
    out = bi["outside_flat"]
    parts.append(f"Outside flat's interval ({len(out)}: every rate, cache setting and task rate measured, shown"
                 " above or not):"
                 if out else "No setting's rate or task rate falls outside flat's interval.")
    return "\n\n".join(parts) + ("\n\n" + "\n".join(f"- {o}" for o in out) if out else "")


def index_rates_gemma(root: Path = ROOT) -> str:
    """docs/profiling.md's block `index-rates-gemma`: the same table for Gemma 3's run."""
    return index_rates(root, GEMMA_RATES)


def index_rates_gemma_32k(root: Path = ROOT) -> str:
    """docs/profiling.md's block `index-rates-gemma-32k`: Gemma 3's run at 32,640 tokens."""
    return index_rates(root, GEMMA_RATES_32K)


GEMMA_RECALL = "traces/accuracy/gemma-3-270m-q4_k_m.index.summary.json"


def index_recall_gemma(root: Path = ROOT, path: str = GEMMA_RECALL) -> str:
    """docs/profiling.md's block `index-recall-gemma`: the recall table of a second model's indexrecall run."""
    from ddbench.core.index import parse_index
    s = _load(root / path)
    per = s["per_context"]
    keys = sorted(per, key=lambda k: (int(k.split("/")[1]) / int(k.split("/")[0]), int(k.split("/")[0])))
    specs = list(next(iter(per.values())))
    head = ["index", f"bytes per chunk and KV head (d {s['head_dim']})"] + \
        [f"{int(k.split('/')[0]) // 1024}K, k {int(k.split('/')[1]) // s['chunk']}" for k in keys]

    def whole(x, k):        # a two-level index that keeps every super-chunk selects what flat does
        c, b = (int(v) for v in k.split("/"))
        ix, n = parse_index(x), (c - 32) // s["chunk"]
        return ix.two_level and ix.kept(b // s["chunk"], n) * ix.group >= n
    rows = [[f"`{x}`", f"{per[keys[0]][x]['bytes_per_chunk_head']:g}"]
            + [f"{per[k][x]['mean_recall']:.3f} ({per[k][x]['worst_layer_recall']:.2f}){' =' if whole(x, k) else ''}"
               for k in keys] for x in specs]
    good = [f"{x} {per[k][x]['mean_recall']:.3f} (k {int(k.split('/')[1]) // s['chunk']})" for k in keys for x in specs
            if x != "flat" and per[k][x]["mean_recall"] >= 0.95 and not whole(x, k)]
    return (f"`python -m ddbench.profile.indexrecall` on {s['model']} (sha256 {s['sha256']}), its global layers only:"
            f" the {s['task']} task, {s['prompts']} prompts, {s['steps']} greedy decode steps each, budget = context /"
            f" {' and / '.join(map(str, s['shares']))}; cells: mean recall of the flat bf16 top-k over the global"
            f" layers (the worst of them), each the mean over prompts x steps x KV heads ({s['runtime_s']:.0f} s on"
            f" one shared CPU thread). Few items (one KV head, three layers): a spread, not a test. `=`: the"
            f" two-level index keeps every super-chunk there (flat's selection up to bf16 rounding).\n\n"
            + _grid(head, rows) + "\n\nAt 0.95 or above, every super-chunk kept aside: "
            + ("; ".join(good) if good else "none") + ".")
