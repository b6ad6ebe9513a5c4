"""Replay of `dualdecoder-cache`'s GPU chunk cache over the profiler's real selections.

Per (layer, KV head) the cache holds `slots = round(capacity * k)` chunk ids (k = budget/chunk;
Python's round). Decode step t, with P_t = the chunks predicted for t (step t-1's speculative-token
selection) and T_t = step t's true (output-token) selection:

  1. prefetch fill: chunks of P_t already cached are hits (stamp 2t); every other chunk of P_t is
     prefetched into a slot: an empty one first, else a victim among the slots not stamped >= 2t;
  2. urgent fill: chunks of T_t cached now are covered (stamp 2t+1); every other chunk of T_t is an
     urgent miss and takes a slot, a victim among the slots not stamped 2t+1 (this step's wrong
     predictions included);
  3. attention reads T_t.

Victims are chosen per fill as a set (which victim goes to which new chunk does not matter):
  lru    the smallest stamp; ties: the lowest chunk id
  score  the lowest landmark score under the newest pass's two queries (score_keys below; ties as
         lru). A GPU has these scores inside the step: the dual-token pass scores the output and
         the speculative query together (kernels/select.py score_chunks, nq = 2).
Capacity 0 is no cache (plain DualDecoder): all k of P_t are moved and T_t \\ P_t is urgent.

Without prediction (`lru-cache`, the HiSparse mechanism: prediction "none"), P_t is empty: step 1 is
skipped, every chunk of T_t not cached, T_t \\ C_{t-1}, is urgent, and the fill brings T_t in with the
same victims (score: the output query's landmark scores of pass t alone, the only query a
single-token step has). Capacity 0 without prediction moves all k chunks urgently.

Step 0 (cold: the pre-decoding step fetches T_0 whole) loads T_0 and is not counted. Counts per
counted step are exact: urgent = |T_t \\ C'_t| where C'_t is the cache after the prefetch fill, so
coverage = 1 - urgent/k. `lost` counts chunks of T_t that were cached before step t, not in P_t,
and evicted by the prefetch fill: coverage + lost/k = |T_t ∩ (C_{t-1} ∪ P_t)| / k.
"""

from __future__ import annotations

POLICIES = ("lru", "score")
PREDICTIONS = ("speculative", "none")      # dualdecoder-cache's speculative prefetch | lru-cache: none
CAPACITIES = (0.0, 1.0, 1.5, 2.0, 4.0, 8.0)
COUNTS = ("prefetched", "urgent", "lost")


def slots(capacity: float, k: int) -> int:
    return int(round(capacity * k))


def _mask(idx, n):
    import torch
    m = torch.zeros(*idx.shape[:-1], n, dtype=torch.bool, device=idx.device)
    return m.scatter_(-1, idx.long(), True)


class ChunkCache:
    """The cache of every row (a row = one (layer, KV head)): stamp[row, chunk], -1 = not cached."""

    def __init__(self, rows: tuple, n_chunks: int, k: int, capacity: float, policy: str = "lru", device="cpu"):
        import torch
        if policy not in POLICIES:
            raise ValueError(f"unknown cache policy {policy!r}")
        if capacity < 1:
            raise ValueError("a cache needs capacity >= 1 (0 is no cache: see replay)")
        self.n, self.k, self.slots, self.policy = n_chunks, k, slots(capacity, k), policy
        self.stamp = torch.full((*rows, n_chunks), -1, dtype=torch.long, device=device)
        self._ids = torch.arange(n_chunks, device=device)

    def _fill(self, want, stamp: int, key=None):
        """Bring the chunks of mask `want` in, touch them with `stamp`; -> (missed mask, evicted mask)."""
        import torch
        cached = self.stamp >= 0
        miss = want & ~cached
        free = self.slots - cached.sum(-1)
        evict_n = (miss.sum(-1) - free).clamp(min=0)
        eligible = cached & ~want                   # every cached chunk not wanted now is older than `stamp`
        big = torch.iinfo(torch.long).max
        lru = (self.stamp * self.n + self._ids).masked_fill(~eligible, big)     # (stamp, chunk id)
        order = lru.argsort(-1)
        if key is not None:                         # score: the primary key; stamp and id break ties
            kk = torch.gather(key.masked_fill(~eligible, float("inf")), -1, order)
            order = torch.gather(order, -1, torch.sort(kk, dim=-1, stable=True).indices)
        rank = torch.empty_like(order).scatter_(-1, order, self._ids.expand_as(order))
        evicted = eligible & (rank < evict_n[..., None])
        self.stamp[evicted] = -1
        self.stamp[want] = stamp
        return miss, evicted

    def start(self, true) -> None:
        """Step 0 (cold): load T_0 ([rows..., k] ids)."""
        self._fill(_mask(true, self.n), 1)

    def step(self, t: int, pred, true, prefetch_key=None, urgent_key=None) -> dict:
        """Step t >= 1; pred, true [rows..., k] ids; keys [rows..., n] (score policy). -> counts [rows...]."""
        p, tr = _mask(pred, self.n), _mask(true, self.n)
        had = self.stamp >= 0
        pre, evicted = self._fill(p, 2 * t, prefetch_key if self.policy == "score" else None)
        urg, _ = self._fill(tr, 2 * t + 1, urgent_key if self.policy == "score" else None)
        return {"prefetched": pre.sum(-1), "urgent": urg.sum(-1), "lost": (tr & had & evicted).sum(-1)}

    def step_alone(self, t: int, true, urgent_key=None) -> dict:
        """Step t >= 1 without prediction: every chunk of T_t not cached is urgent; the fill brings T_t in."""
        import torch
        urg, _ = self._fill(_mask(true, self.n), 2 * t + 1, urgent_key if self.policy == "score" else None)
        zero = torch.zeros_like(urg.sum(-1))
        return {"prefetched": zero, "urgent": urg.sum(-1), "lost": zero}


def no_cache_alone(true) -> dict:
    """Capacity 0 without prediction: all k chunks of T_t are urgent every step."""
    import torch
    k = torch.full(true.shape[:-1], true.shape[-1], dtype=torch.long, device=true.device)
    return {"prefetched": torch.zeros_like(k), "urgent": k, "lost": torch.zeros_like(k)}


def no_cache(pred, true, n_chunks: int) -> dict:
    p, tr = _mask(pred, n_chunks), _mask(true, n_chunks)
    import torch
    k = torch.full(p.shape[:-1], pred.shape[-1], dtype=torch.long, device=p.device)
    return {"prefetched": k, "urgent": (tr & ~p).sum(-1), "lost": torch.zeros_like(k)}


def score_keys(scores_prev, scores_now):
    """The score policy's victim keys from the landmark scores [rows..., 2, n] (0 = output, 1 =
    speculative query) of pass t-1 and pass t: the prefetch fill of step t runs before pass t and
    ranks by pass t-1; the urgent fill runs after pass t's selection and ranks by pass t. A chunk's
    key is the sum of its two queries' scores (its mean score: the output query scores what this
    step read, the speculative one what the next step is predicted to read)."""
    return scores_prev.sum(-2), scores_now.sum(-2)


def replay(true, pred, n_chunks: int, capacities, policies, scores=None, predictions=("speculative",)) -> dict:
    """true [S+1, rows..., k] (T_0..T_S), pred [S, rows..., k] (P_1..P_S); scores(t) -> [rows..., 2, n]
    (the landmark scores of pass t; needed by `score`); predictions: a subset of PREDICTIONS. ->
    {(prediction, policy, capacity): {count: [S, rows...]}} over the counted steps 1..S. Capacity 0 is
    the same for every policy."""
    import torch
    bad = [p for p in predictions if p not in PREDICTIONS]
    if bad or not predictions:
        raise ValueError(f"unknown cache prediction {bad[0] if bad else None!r} (choose from {', '.join(PREDICTIONS)})")
    out = {}
    S = pred.shape[0]
    caches = {}
    for how in predictions:
        for pol in policies:
            for cap in capacities:
                if cap == 0:
                    out[(how, pol, cap)] = (no_cache(pred, true[1:], n_chunks) if how == "speculative"
                                            else no_cache_alone(true[1:]))
                else:
                    c = ChunkCache(true.shape[1:-1], n_chunks, true.shape[-1], cap, pol, true.device)
                    c.start(true[0])
                    caches[(how, pol, cap)] = c
    steps = {key: [] for key in caches}
    need = scores is not None and any(pol == "score" for _, pol, _ in caches)
    now = scores(0) if need else None
    for t in range(1, S + 1):
        prev, now = now, (scores(t) if need else None)
        pk, uk = score_keys(prev, now) if need else (None, None)
        for (how, pol, cap), c in caches.items():
            if how == "speculative":
                steps[(how, pol, cap)].append(c.step(t, pred[t - 1], true[t], pk, uk))
            else:       # a single-token step: only the output query (0) scored pass t
                steps[(how, pol, cap)].append(c.step_alone(t, true[t], now[..., 0, :] if need else None))
    for key, rows in steps.items():
        out[key] = {n: torch.stack([r[n] for r in rows]) for n in COUNTS}
    return out


# ---------------------------------------------------------------- aggregation and the two files
RATES = ("coverage", "prefetched_per_budget", "urgent_per_budget", "moved_per_budget", "urgent_share")
NOTE = ("steady steps only: step 0 (cold cache; the pre-decoding step fetches T_0 whole) is left out of every"
        " mean; n counts (sample, step, KV head) items; the *_per_budget rates are chunks moved per step over k;"
        " coverage = 1 - urgent_per_budget; urgent_share = urgent_per_budget / moved_per_budget (0 where nothing"
        " moved); capacity 0 = no cache (plain DualDecoder), the same for every policy; prediction speculative ="
        " dualdecoder-cache's prefetch of the speculative token's selection, none = lru-cache (no prefetch: every"
        " true chunk not cached is urgent; capacity 0 then moves all k urgently)")


def accumulate(groups: dict, key: tuple, counts: dict, layer_ids=None) -> None:
    """Add one replay's counts [S, L, H] into groups[key + (layer,)] sums (per layer); `layer_ids` names
    the model layer of each of the L (default 0..L-1; Gemma 3's global layers otherwise)."""
    for i in range(counts["urgent"].shape[1]):
        l = int(layer_ids[i]) if layer_ids is not None else i
        g = groups.setdefault(key + (l,), {"prefetched": 0.0, "urgent": 0.0, "lost": 0.0, "n": 0})
        for name in COUNTS:
            g[name] += float(counts[name][:, i].sum())
        g["n"] += counts["urgent"][:, i].numel()


def _rates(prefetched: float, urgent: float, n: int, k: int) -> dict:
    pre, urg = prefetched / (n * k), urgent / (n * k)
    moved = pre + urg
    return {"coverage": 1.0 - urg, "prefetched_per_budget": pre, "urgent_per_budget": urg,
            "moved_per_budget": moved, "urgent_share": urg / moved if moved > 0 else 0.0}


def rows(groups: dict, chunk: int) -> list:
    """groups[(context, task, budget, prediction, policy, capacity, layer)] -> the cache CSV's rows (sorted)."""
    out = []
    for (c, task, b, how, pol, cap, l), g in sorted(groups.items()):
        out.append({"layer": l, "context_tokens": c, "task": task, "budget_tokens": b, "chunk_tokens": chunk,
                    "prediction": how, "policy": pol, "capacity": f"{cap:g}", **_rates(g["prefetched"], g["urgent"], g["n"], b // chunk),
                    "lost": g["lost"], "n": int(g["n"])})
    return out


def _merge(rs: list, by: tuple, chunk: int) -> list:
    acc = {}
    for r in rs:
        key = tuple(r[k] for k in by)
        a = acc.setdefault(key, {"prefetched": 0.0, "urgent": 0.0, "lost": 0.0, "n": 0, "contexts": set()})
        k = r["budget_tokens"] // chunk
        a["prefetched"] += r["prefetched_per_budget"] * r["n"] * k
        a["urgent"] += r["urgent_per_budget"] * r["n"] * k
        a["lost"] += r["lost"]
        a["n"] += r["n"]
        a["contexts"].add(r["context_tokens"])
    out = []
    for key, a in sorted(acc.items()):
        d = dict(zip(by, key))
        k = d["budget_tokens"] // chunk
        out.append({**d, **{n: round(v, 6) for n, v in _rates(a["prefetched"], a["urgent"], a["n"], k).items()},
                    "n": a["n"], "lost_per_budget": round(a["lost"] / (a["n"] * k), 6), "contexts": sorted(a["contexts"])})
    return out


def summary(cache_rows: list, model: str, provenance: dict, chunk: int, basis: str) -> dict:
    """<model>.cache.summary.json: means over layers and tasks per (prediction, policy, capacity, context,
    budget); `best` per budget: the fewest moved chunks with the speculative prefetch (dualdecoder-cache),
    `best_without_prediction` the same without it (lru-cache); means over layers, tasks and contexts."""
    for r in cache_rows:
        r["capacity_f"] = float(r["capacity"])
        r.setdefault("prediction", "speculative")
    keys = ("prediction", "policy", "capacity", "context_tokens", "budget_tokens")
    by = _merge(cache_rows, ("prediction", "policy", "capacity_f", "context_tokens", "budget_tokens"), chunk)
    by_capacity = [{"prediction": e["prediction"], "policy": e["policy"], "capacity": e["capacity_f"],
                    **{k: e[k] for k in keys[3:]}, **{n: e[n] for n in RATES}, "n": e["n"]} for e in by]
    best = {how: {} for how in PREDICTIONS}
    for e in _merge(cache_rows, ("prediction", "budget_tokens", "policy", "capacity_f"), chunk):
        b, into = str(e["budget_tokens"]), best[e["prediction"]]
        if b not in into or e["moved_per_budget"] < into[b]["moved_per_budget"] - 1e-12:
            into[b] = {"policy": e["policy"], "capacity": e["capacity_f"], "budget_tokens": e["budget_tokens"],
                       "contexts": e["contexts"], **{n: e[n] for n in RATES}, "n": e["n"]}
    for r in cache_rows:
        del r["capacity_f"]
    spec = [e for e in by if e["prediction"] == "speculative"]
    return {"schema": 1, "model": model, "provenance": provenance, "steady_steps_only": True,
            "basis": basis, "note": NOTE,
            "by_capacity": by_capacity,
            "best": dict(sorted(best["speculative"].items(), key=lambda kv: int(kv[0]))),
            "best_without_prediction": dict(sorted(best["none"].items(), key=lambda kv: int(kv[0]))),
            "evicted_by_prefetch": {
                "what": "chunks of T_t that were cached before step t, not in P_t, and evicted by step t's prefetch"
                        " fill, per k: coverage + this = |T_t ∩ (C_{t-1} ∪ P_t)| / k",
                "rows": [{"policy": e["policy"], "capacity": e["capacity_f"], "context_tokens": e["context_tokens"],
                          "budget_tokens": e["budget_tokens"], "per_budget": e["lost_per_budget"]} for e in spec]}}
