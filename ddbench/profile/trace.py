"""Accuracy-profile traces: schema and atomic writing (traces/accuracy/).

Three files per model (five with the cache replay), all written only after the whole sweep succeeded (each to a temporary
file in the target folder, then renamed), so a failed run leaves none of them half-written.

`<model>.csv`, schema 1: one row per (layer, context_tokens, task, init, temperature, budget_tokens),
averaged over every measured (step, KV head) sample of that group (and over --samples prompts).
    layer            0-based decoder layer
    context_tokens   prompt tokens
    task             single | multikey | multivalue | vt (ddbench/profile/tasks.py)
    init             t2 (first speculative token = the real T2 from a pre-decoding step) | random
    temperature      sampling temperature of the output token (0 = greedy); the speculative token
                     is always the argmax at the speculative position
    top_p            nucleus cut-off of the output token's sampling (1 = none)
    budget_tokens    sparse budget in tokens (k = budget_tokens / chunk_tokens chunks per KV head)
    chunk_tokens     tokens per chunk (landmark = mean of the chunk's post-RoPE keys)
    local_tokens     always-resident recent prompt tokens (plus generated tokens), not scored
    hit_rate         mean |pred ∩ true| / |true|   pred = step t's speculative-token selection
    reuse_hit_rate   mean |prev ∩ true| / |true|   prev = step t's output-token selection
    union_hit_rate   mean |(pred ∪ prev) ∩ true| / |true|
    new_pred_share   mean |pred \\ prev| / |true|
    token_acc        share of steps whose speculative token equals the next output token
    n                (step, KV head) samples averaged (steps x kv_heads x samples)
    model, layers (the model's layer count), model_sha256 (first 16 hex of the weights file(s)), transformers_version,
    torch_version, git_sha, date (UTC ISO), command                     provenance, same on every row
where true = step t+1's selection from its output token's post-RoPE query. sim/hitrates.py reads
`layer`, `hit_rate`, `reuse_hit_rate` and averages all rows of a layer: filter rows first
(e.g. init == t2, temperature > 0) if the greedy rows (hit 1.0 by construction) should not count.

`<model>.steps.csv`, schema 1: one row per measured step of each run, means over layers and KV heads:
    context_tokens, task, sample, init, temperature, budget_tokens, step (0-based transition t->t+1),
    hit_rate, reuse_hit_rate, union_hit_rate, new_pred_share, token_acc (0/1), output_token,
    spec_token (ids of x_{t+1} and s_t)

`<model>.summary.json`, schema 1:
    schema, model, provenance{...}, config{...}, runtime_s
    per_layer            {basis, rows: [{layer, hit_rate, reuse_hit_rate, union_hit_rate, new_pred_share, n}]}
                         basis: init t2 and temperature > 0 (sampled output, the deployed start), all
                         contexts, tasks and budgets; falls back to all rows when there are none
    by_init_temperature  [{init, temperature, hit_rate, reuse_hit_rate, union_hit_rate,
                           new_pred_share, token_acc, n}]  (all layers, contexts, tasks, budgets)
    by_context_budget    [{context_tokens, budget_tokens, init, hit_rate, reuse_hit_rate, token_acc, n}]
                         (temperature > 0)
    lowrank_layers       {rule, threshold, basis, layers}: §5.3's adaptive key reconstruction set,
                         the layers whose per_layer hit_rate is below threshold
    task_accuracy        [{context_tokens, task, budget_tokens (null for dense), method
                           (dense | sparse | lowrank), rank (lowrank only), correct, total, accuracy}]

With --cache-capacity / --cache-policies, two more files (ddbench/profile/cache.py: the replay of a
GPU chunk cache over the selections of the runs with init t2 and temperature > 0, else of every run):
`<model>.cache.csv`, schema 1: one row per (layer, context_tokens, task, budget_tokens, policy,
capacity, prediction), means over samples, steady steps (step 0, the cold start, is left out) and KV heads:
    prediction       speculative (dualdecoder-cache: the speculative token's selection is prefetched) |
                     none (lru-cache: nothing is prefetched, every chunk of T_t not cached is urgent);
                     files written before it have no such column and are all speculative
    policy           lru | score;  capacity: slots per (layer, KV head) / k (0 = no cache)
    coverage         share of T_t cached when attention needs it (1 - urgent_per_budget)
    prefetched_per_budget  |P_t \\ C_{t-1}| / k   (C_{t-1}: the cache before step t)
    urgent_per_budget      chunks of T_t not cached after the prefetch fill, / k
    moved_per_budget       their sum;  urgent_share = urgent / moved (0 where nothing moved)
    n                (sample, step, KV head) items;  model, git_sha, date, command as in <model>.csv
`<model>.cache.summary.json`, schema 1: {schema, model, provenance, steady_steps_only: true, basis,
note, by_capacity: [{prediction, policy, capacity, context_tokens, budget_tokens, <the five rates>, n}]
(means over layers and tasks), best: {budget: the policy and capacity with the fewest moved chunks with
the speculative prefetch, means over layers, tasks and contexts}, best_without_prediction (the same,
prediction none), evicted_by_prefetch (speculative only)}.

With --fp8-error, two more files (ddbench/profile/fp8error.py: attention output over fp8 K/V against
bf16, and bf16 against fp32, from every run's real output-token decode queries and the prompt's K/V):
`<model>.fp8.csv`, schema 1: one row per (layer, context_tokens, task, budget_tokens, selection, metric):
    layer, context_tokens, task, chunk_tokens   as in <model>.csv (one fp32 scale per chunk-head)
    budget_tokens    the top-k budget (empty for dense)
    selection        dense (all prompt tokens) | topk (the query's exact top-k chunks + the local window)
    metric           fp8_vs_bf16 = ||o_fp8 - o_bf16|| / ||o_bf16|| | bf16_vs_fp32 (the floor) likewise
    median, p95, max over the items: (sample, run, step, query head) output vectors;  n  their count
    model, git_sha, date, command                  provenance, as in <model>.cache.csv
`<model>.fp8.summary.json`, schema 1: {schema, model, provenance, chunk_tokens, note (the method),
by_selection: [{selection, budget_tokens (null for dense), metric, median, p95, max, n, worst_layer:
{layer, median, p95} (the layer with the largest median)}] pooled over layers, contexts and tasks}.

With --prompts, `<model>.tasks.csv`, schema 1: the task accuracy as rates, one row per (context_tokens,
task, budget_tokens (empty for dense), method (dense | sparse | lowrank | fp8 with --fp8-error)):
    rank (lowrank only), correct, total (--prompts seeded prompts), rate = correct / total,
    low, high (Wilson score 95 % interval, ddbench/profile/quality.py wilson);  model, git_sha, date, command
(the same rates, with low and high, are the summary's task_accuracy).

With --indexes (issue 47: the selection under smaller indexes, ddbench/profile/indexrates.py), <model>.csv,
.steps.csv, .cache.csv and .tasks.csv gain an `index` column after budget_tokens (flat, fp8, int4,
two-level:G,M[,COARSE[,FINE]]; flat first): every rate is computed with that index's top-k as the selection
(the true and the speculative token's alike); the run lengths and fp8 error stay flat's; the tasks rows of an
index other than flat are method sparse only. The summary's per_layer, by_* and task_accuracy sections, and
the cache summary, are flat's as before; its `by_index` section holds every index's rates with 95 %
intervals over the prompts (see indexrates.py).
"""

from __future__ import annotations

import os

SCHEMA = 1
ROW_COLUMNS = ["layer", "context_tokens", "task", "init", "temperature", "top_p", "budget_tokens", "chunk_tokens",
               "local_tokens", "hit_rate", "reuse_hit_rate", "union_hit_rate", "new_pred_share", "token_acc", "n"]
PROVENANCE = ["model", "layers", "model_sha256", "transformers_version", "torch_version", "git_sha", "date", "command"]
STEP_COLUMNS = ["context_tokens", "task", "sample", "init", "temperature", "budget_tokens", "step", "hit_rate",
                "reuse_hit_rate", "union_hit_rate", "new_pred_share", "token_acc", "output_token", "spec_token"]
RATES = ("hit_rate", "reuse_hit_rate", "union_hit_rate", "new_pred_share")
CACHE_COLUMNS = ["layer", "context_tokens", "task", "budget_tokens", "chunk_tokens", "prediction", "policy", "capacity",
                 "coverage",
                 "prefetched_per_budget", "urgent_per_budget", "moved_per_budget", "urgent_share", "n"]
CACHE_PROVENANCE = ["model", "git_sha", "date", "command"]
FP8_COLUMNS = ["layer", "context_tokens", "task", "budget_tokens", "chunk_tokens", "selection", "metric", "median",
               "p95", "max", "n"]
TASK_COLUMNS = ["context_tokens", "task", "budget_tokens", "method", "rank", "correct", "total", "rate", "low",
                "high"]


def _fmt(v):
    return f"{v:.6f}" if isinstance(v, float) else v


def _csv(columns, rows) -> str:
    from ddbench.core.io import rows_csv
    return rows_csv(rows, columns, fmt=_fmt, strict=True)


def names(model: str, cache: bool = False, fp8: bool = False, tasks: bool = False, runs: bool = False) -> dict:
    """The files of one model's profile, by role (the two cache files with `cache`, the two fp8-error files
    with `fp8`, the task rates with `tasks`, the selections' run lengths with `runs`)."""
    n = {"csv": f"{model}.csv", "steps": f"{model}.steps.csv", "summary": f"{model}.summary.json"}
    if cache:
        n |= {"cache_csv": f"{model}.cache.csv", "cache_summary": f"{model}.cache.summary.json"}
    if fp8:
        n |= {"fp8_csv": f"{model}.fp8.csv", "fp8_summary": f"{model}.fp8.summary.json"}
    if tasks:
        n |= {"tasks_csv": f"{model}.tasks.csv"}
    if runs:
        n |= {"runs_csv": f"{model}.runs.csv"}
    return n


def with_index(columns: list) -> list:
    """`columns` with the index column after budget_tokens (a profile with --indexes)."""
    i = columns.index("budget_tokens") + 1
    return columns[:i] + ["index"] + columns[i:]


def task_rows(task_accuracy: list) -> list:
    """The summary's task_accuracy as <model>.tasks.csv rows."""
    return [{"context_tokens": a["context_tokens"], "task": a["task"],
             "budget_tokens": "" if a["budget_tokens"] is None else a["budget_tokens"],
             **({"index": a["index"]} if "index" in a else {}), "method": a["method"],
             "rank": a.get("rank", ""), "correct": a["correct"], "total": a["total"], "rate": a["accuracy"],
             "low": a["low"], "high": a["high"]} for a in task_accuracy]


def write(w, model: str, rows: list, step_rows: list, summary: dict, provenance: dict, cache=None, fp8=None,
          tasks=None, runs=None) -> dict:
    """Stage the files in the output guard's writer `w` (they move in together); their paths.
    `cache`: (cache rows, cache summary) or None; `fp8`: (fp8 rows, fp8 summary) or None; `tasks`: the
    summary's task_accuracy for <model>.tasks.csv, or None. Rows that carry an `index` (--indexes): the rows,
    step rows, cache rows and task rows get an index column."""
    n = names(model, cache is not None, fp8 is not None, tasks is not None, runs is not None)
    ix = with_index if rows and "index" in rows[0] else list
    w.write_text(n["csv"], _csv(ix(ROW_COLUMNS) + PROVENANCE, [r | provenance for r in rows]))
    w.write_text(n["steps"], _csv(ix(STEP_COLUMNS), step_rows))
    w.write_json(n["summary"], summary)
    if cache is not None:
        w.write_text(n["cache_csv"], _csv(ix(CACHE_COLUMNS) + CACHE_PROVENANCE, [r | provenance for r in cache[0]]))
        w.write_json(n["cache_summary"], cache[1])
    prov = {k: provenance[k] for k in CACHE_PROVENANCE}
    if fp8 is not None:
        w.write_text(n["fp8_csv"], _csv(FP8_COLUMNS + CACHE_PROVENANCE, [r | prov for r in fp8[0]]))
        w.write_json(n["fp8_summary"], fp8[1])
    if tasks is not None:
        w.write_text(n["tasks_csv"], _csv(ix(TASK_COLUMNS) + CACHE_PROVENANCE, [r | prov for r in task_rows(tasks)]))
    if runs is not None:
        from ddbench.profile.runlengths import COLUMNS as RUN_COLUMNS
        w.write_text(n["runs_csv"], _csv(RUN_COLUMNS + CACHE_PROVENANCE, [r | prov for r in runs]))
    return {k: os.path.join(str(w.folder), v) for k, v in n.items()}
