"""Tensor parallelism: the model as one rank of a TP group sees it, sharded as vLLM and SGLang shard it.

One layer on top of the catalog, so that the memory model, the simulator and the planner stay per GPU:
`rank_model(m, tp)` is a ModelSpec of the same name and layers whose heads, KV heads, MLP width and vocabulary
are one rank's share. Every per-GPU formula (ddbench.core.memory, ddbench.sim) then gives one rank's bytes and
time:

    query heads      H / tp per rank (tp must divide H)
    KV heads         H_kv / tp per rank where tp <= H_kv (tp must divide H_kv); where tp > H_kv each rank
                     holds ONE KV head, replicated over tp / H_kv ranks (tp must be a multiple of H_kv), as
                     vLLM's QKVParallelLinear replicates them
    MLP              I / tp per rank (gate/up column-parallel, down row-parallel; tp must divide I)
    vocabulary       ceil(V / tp) rows of the embedding and of the LM head per rank (vocab-parallel); the
                     logits a rank keeps are its shard (the gather of the full logits, b x V, is not counted)
    norms, residual  replicated (hidden h on every rank)

So each rank's landmarks, low-rank keys' SV, quantized copy, sparse-KV buffers and chunk cache hold its KV
heads only, and its host KV (what it fetches over its own PCIe link) is its heads' share. ShadowKV's U
[S, r] is per rank (each rank factorises its own heads' keys), so it is not divided. The ranks of a host
share its DRAM bandwidth, switch uplinks and host memory (ddbench.core.catalog.hosts: all of its GPUs
fetch at once, each GPU's requests get host memory / GPUs). Two all-reduces of the hidden state per layer
(ddbench.core.catalog.interconnect) are added by the cost model.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ddbench.core.catalog.models import ModelSpec
from ddbench.core.errors import DDBenchError

MAX_TP = 8          # one NVLink domain of an HGX board; without --host a TP group is at most this
AUTO = "auto"
DEFAULT_HOSTS = {"h100-80gb": "hgx-h100", "h200": "hgx-h200", "a100-80gb": "dgx-a100",
                 "h100-pcie-80gb": "pcie-8gpu-direct"}


def tp_problem(m: ModelSpec, tp: int, gpus: int | None = None, host: str | None = None) -> str | None:
    """Why `tp` cannot shard `m` (over a host of `gpus` GPUs), as one line; None where it can."""
    limit = gpus if gpus is not None else MAX_TP
    where = f"host {host} has {limit} GPUs" if gpus is not None else f"a TP group is one host's GPUs, at most {MAX_TP}"
    if tp > limit:
        return f"--tp {tp}: {where}"
    if m.num_heads % tp:
        return f"--tp {tp} does not divide {m.name}'s {m.num_heads} attention heads (use {valid_text(m, limit)})"
    kv = m.num_kv_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        return (f"--tp {tp} neither divides {m.name}'s {kv} KV heads nor is a multiple of them"
                f" (use {valid_text(m, limit)})")
    if m.intermediate % tp:
        return f"--tp {tp} does not divide {m.name}'s MLP width {m.intermediate} (use {valid_text(m, limit)})"
    return None


def valid(m: ModelSpec, limit: int = MAX_TP) -> list[int]:
    """The TP sizes that shard `m` on at most `limit` GPUs, smallest first."""
    return [t for t in range(1, limit + 1) if tp_problem(m, t, limit) is None]


def valid_text(m: ModelSpec, limit: int) -> str:
    return "--tp " + ", ".join(str(t) for t in range(1, limit + 1)
                                 if m.num_heads % t == 0 and not m.intermediate % t
                                 and ((m.num_kv_heads >= t and not m.num_kv_heads % t)
                                      or (m.num_kv_heads < t and not t % m.num_kv_heads)))


def check_tp(m: ModelSpec, tp: int, gpus: int | None = None, host: str | None = None) -> None:
    why = tp_problem(m, tp, gpus, host)
    if why:
        raise DDBenchError(why)


def kv_replication(m: ModelSpec, tp: int) -> int:
    """Ranks holding each KV head: 1 where tp <= H_kv, else tp / H_kv."""
    return max(1, tp // m.num_kv_heads)


def rank_model(m: ModelSpec, tp: int) -> ModelSpec:
    """`m` as one rank of a TP group of `tp` sees it (the module's text); `m` itself for tp 1."""
    if tp == 1:
        return m
    check_tp(m, tp, tp)
    return replace(m, num_heads=m.num_heads // tp, num_kv_heads=max(1, m.num_kv_heads // tp),
                   intermediate=m.intermediate // tp, vocab=math.ceil(m.vocab / tp),
                   source=f"{m.source}; one rank of TP {tp}")


def describe(m: ModelSpec, tp: int) -> str:
    """One line: what each rank holds."""
    r = rank_model(m, tp)
    rep = kv_replication(m, tp)
    kv = (f"{r.num_kv_heads} of {m.num_kv_heads} KV heads" if rep == 1
          else f"1 of {m.num_kv_heads} KV heads, each on {rep} ranks")
    return (f"TP {tp}: each GPU holds 1/{tp} of the weights ({r.weight_bytes / 1e9:.1f} of"
            f" {m.weight_bytes / 1e9:.1f} GB), {r.num_heads} of {m.num_heads} query heads, {kv}")


def parse_tp(text: str) -> int | str:
    """--tp's value: a positive integer, or 'auto'."""
    t = str(text).strip().lower()
    if t == AUTO:
        return AUTO
    if not t.isdigit() or int(t) < 1:
        raise DDBenchError(f"--tp must be a positive integer or 'auto', got '{text}'")
    return int(t)
