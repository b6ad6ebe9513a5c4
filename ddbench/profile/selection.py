"""Chunk selection for the profiler: the project's own rule, from the kernels' torch twins.

    Geometry(prompt_tokens, budget, chunk, local)      which tokens are selectable, k, N
    landmarks(cache, geo) -> per layer [1, H, N, d]     ddbench.kernels.landmarks.build_landmarks_ref
    select(q, lm, k) -> [1, nq, H, k] int32             ddbench.kernels.select.select_chunks_ref
    scores(q, lm) -> [1, nq, H, N] fp32                 ddbench.kernels.select.score_chunks_ref (what select ranks)

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
