"""Chunk selection for the profiler: the project's own rule, from the kernels' torch twins.

    Geometry(prompt_tokens, budget, chunk, local)      which tokens are selectable, k, N
    landmarks(cache, geo) -> per layer [1, H, N, d]     ddbench.kernels.landmarks.build_landmarks_ref
    select(q, lm, k) -> [1, nq, H, k] int32             ddbench.kernels.select.select_chunks_ref
    scores(q, lm) -> [1, nq, H, N] fp32                 ddbench.kernels.select.score_chunks_ref (what select ranks)

Under a smaller selection index (issue 47; `profile --indexes`), the selection is the index's top-k:
    parse_indexes("flat,fp8,two-level:8,1") -> ("flat", "fp8", "two-level:8,1")   flat first, always
    build_indexes(lm, names) -> {name: per layer Index, or None for flat}   once per prefill, from the fp32 landmarks
    select_by(q, lm, ix, k)     flat (ix None): `select`, today's rule, unchanged; else the index's twin
                                (ddbench.kernels.indexkernels.index_select_ref: the landmarks quantized, two levels)
    scores_by(q, lm, ix, k)     what select_by ranks, over all N chunks (two levels: pass 2's probabilities
                                over the kept super-chunks' chunks, 0 for every chunk pass 1 dropped)

The rule (kernels/select.py): landmark = mean of a chunk's post-RoPE keys; score = softmax over
chunks of q . landmark / sqrt(d) per query head; max over the GQA group; top-k of budget/chunk
chunks per KV head.

Resident tokens, as the project's memory model and engine place them (ddbench/core/memory.py
`local_chunks = 4`, kernels/engine/engine.py `local = 32`): the last `local` prompt tokens (plus
the few tokens that do not fill a whole chunk before them) and every generated token stay on the
GPU and are always attended. They are not selectable, so they are excluded from the scored sets.
The project models no attention sinks (no sink term in the memory model or the engine), so none
are added here: the first chunks are selectable like any other. The selectable region is tokens
[0, S) with S = chunk * floor((prompt_tokens - local) / chunk), i.e. N = S / chunk chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddbench.core.errors import DDBenchError

LOCAL_TOKENS = 32     # ShadowKV's 4 local chunks of 8; kernels/engine/engine.py EngineConfig.local


@dataclass(frozen=True)
class Geometry:
    prompt_tokens: int
    budget: int
    chunk: int = 8
    local: int = LOCAL_TOKENS

    @property
    def selectable(self) -> int:          # S: tokens [0, S) are chunked and selectable
        return self.chunk * max(0, (self.prompt_tokens - self.local) // self.chunk)

    @property
    def n_chunks(self) -> int:
        return self.selectable // self.chunk

    @property
    def k(self) -> int:
        return self.budget // self.chunk

    def validate(self) -> "Geometry":
        if self.chunk < 1 or self.budget < 1:
            raise DDBenchError(f"budget and chunk must be positive, got {self.budget}, {self.chunk}")
        if self.budget % self.chunk:
            raise DDBenchError(f"budget {self.budget} is not a multiple of the chunk size {self.chunk}")
        if self.budget >= self.prompt_tokens:
            raise DDBenchError(f"budget {self.budget} is at or above the context of {self.prompt_tokens} tokens")
        if self.k >= self.n_chunks:
            raise DDBenchError(f"budget {self.budget} leaves nothing to select: the context of {self.prompt_tokens}"
                               f" tokens has {self.n_chunks} selectable chunks of {self.chunk} beside the"
                               f" {self.local}-token local window")
        return self


def landmarks(cache, geo: Geometry) -> list:
    """Exact landmarks of every layer from the prefill cache (post-RoPE keys), fp32."""
    from ddbench.kernels.landmarks import build_landmarks_ref
    out = []
    for layer in cache.layers:
        k = layer.keys[:, :, :geo.selectable].float().contiguous()
        out.append(build_landmarks_ref(k, geo.chunk))
    return out


def select(q, lm, k: int):
    """q [1, nq, Hq, d] post-RoPE queries; lm [1, H, N, d]; -> [1, nq, H, k] ascending chunk ids."""
    from ddbench.kernels.select import select_chunks_ref
    return select_chunks_ref(q.float().contiguous(), lm, k)


def scores(q, lm):
    """The landmark scores `select` takes the top-k of: [1, nq, H, N] fp32."""
    from ddbench.kernels.select import score_chunks_ref
    return score_chunks_ref(q.float().contiguous(), lm)


def parse_indexes(names) -> tuple:
    """Canonical index names (ddbench/core/index.py parse_index), flat first (the reference every other index is
    compared with, always measured), duplicates dropped; a bad name is one DDBenchError line."""
    from ddbench.core.index import parse_index
    items = [n for n in (names.split(",") if isinstance(names, str) else names)]
    if isinstance(names, str):          # two-level:G,M,... holds commas: rejoin its parts
        items = _rejoin(items)
    if not items or any(not str(n).strip() for n in items):
        raise DDBenchError(f"--indexes: an empty index name in {names!r}; e.g. flat,fp8,int4,two-level:8,1")
    out = ["flat"]
    for n in items:
        name = parse_index(n).name
        if name not in out:
            out.append(name)
    return tuple(out)


def _rejoin(parts: list) -> list:
    """"flat,two-level:8,1,fp8,int4" split at commas -> ["flat", "two-level:8,1,fp8", "int4"]: a part that
    is a number, or a format right after a two-level's M, continues the two-level name before it."""
    out: list = []
    for p in parts:
        t = p.strip().lower()
        head = out[-1] if out else ""
        n_tail = head.count(",") if head.startswith("two-level:") else -1
        number = t.replace(".", "", 1).isdigit()
        if head.startswith("two-level:") and ((number and n_tail < 1) or (not number and 1 <= n_tail < 3
                                                                          and t in ("fp8", "int4", "bf16"))):
            out[-1] = f"{head},{t}"
        else:
            out.append(t)
    return out


def check_indexes(names: tuple, head_dim: int) -> None:
    """DDBenchError (one line) where an index cannot serve the model's head dim (int4's packing)."""
    from ddbench.core.index import check_index, parse_index
    for n in names:
        check_index(parse_index(n), head_dim)


def build_indexes(lm: list, names: tuple) -> dict:
    """{name: [per layer Index of lm[l] (fp32 [1, H, N, d]) in bf16 storage], None for flat (today's landmarks)}."""
    import torch
    from ddbench.kernels.indexkernels import index_from_landmarks
    return {n: None if n == "flat" else [index_from_landmarks(x, n, torch.bfloat16, kernel=False) for x in lm]
            for n in names}


def select_by(q, lm, ix, k: int):
    """The top-k chunks [1, nq, H, k] (ascending) of q [1, nq, Hq, d] under index `ix` (None: flat, `select`)."""
    if ix is None:
        return select(q, lm, k)
    from ddbench.kernels.indexkernels import index_select_ref
    return index_select_ref(q.float().contiguous(), ix, k)


def scores_by(q, lm, ix, k: int):
    """The scores select_by ranks, [1, nq, H, N] fp32 (flat: `scores`); two levels: pass 2's probabilities over
    the chunks of the k' super-chunks pass 1 kept, 0 for the rest (the step never scored them)."""
    if ix is None:
        return scores(q, lm)
    import torch
    from ddbench.kernels.indexkernels import index_scores_ref
    q = q.float().contiguous()
    if ix.coarse is None:
        return index_scores_ref(q, ix.fine)
    kept = min(ix.spec.kept(k, ix.fine.n), ix.coarse.n)                    # k' super-chunks, as index_select_ref
    sup = index_scores_ref(q, ix.coarse).topk(kept, dim=-1).indices.sort(-1).values
    off = torch.arange(ix.spec.group, device=sup.device)
    cand = (sup[..., None] * ix.spec.group + off).flatten(-2).to(torch.int32)   # their chunks (ids >= N: padding)
    p = index_scores_ref(q, ix.fine, cand)                                   # [1, nq, H, NC], -inf pads -> 0
    out = torch.zeros(*p.shape[:-1], ix.fine.n + ix.spec.group, dtype=torch.float32, device=p.device)
    return out.scatter_(-1, cand.long(), p)[..., :ix.fine.n]
