"""The selection of a landmark design under a smaller index (Workload.index; ddbench/core/index.py),
priced from the bytes each level reads (issue 47), until the GPU run measures it.

    select_index_s(cm, batch, q, context, w, triton) -> seconds of one layer's selection

The flat index is the cost model's own select_s, unchanged. Another index, with the engine fit
(the bundle's kernel breakdown): each level is the engine's selection term at that level's features,
t = f + g q + (landmark and scale bytes read + fp16 scores written) x c_l + top-k candidates x c_t
+ a row's chunks x c_n, with the fit's measured bf16 scan rate c_l applied to the level's bytes
(pass 1: every landmark of the level once for both query tokens; pass 2 of two levels: each token's
candidates, the chunks of its kept super-chunks). Without the fit: the flat price times the ratio of
the index's selection bytes to the flat ones (ddbench.core.index.selection_bytes). Either way a note
says it is priced from bytes: the dequantising scan of fp8 / int4 and the gathered second pass are
assumed to run at the bf16 scan's bytes per second.
"""

from __future__ import annotations

import math

from ddbench.core.index import FLAT, parse_index, selection_bytes, super_chunks, candidates, vector_bytes
from ddbench.sim.costmodel import SCORE_BYTES

NOTE = ("PRICED FROM BYTES: selection with the {name} index, each level's landmark and scale bytes at the engine's"
        " measured bf16 scan rate (no GPU measurement of this index yet)")


def select_index_s(cm, batch: int, q: int, context: int, w, triton: bool = False) -> float:
    spec = parse_index(w.index)
    flat = cm.select_s(batch, q, context, w.chunk, triton=triton)
    if spec == FLAT:
        return flat
    m = cm.model
    n = math.ceil(context / w.chunk)
    k = w.budget // w.chunk
    cm._note(NOTE.format(name=spec.name))
    if cm._theta is None:
        rows = q * m.num_heads // m.num_kv_heads
        ratio = selection_bytes(spec, n, m.head_dim, k, rows, tokens=q) / selection_bytes(FLAT, n, m.head_dim, k, rows,
                                                                                          tokens=q)
        return flat * ratio
    levels = [(n, spec.fmt, 1)] if not spec.two_level else \
        [(super_chunks(spec, n), spec.coarse, 1), (candidates(spec, n, k), spec.fmt, q)]
    t = 0.0
    for rows_n, fmt, reads in levels:
        lm = batch * m.num_kv_heads * rows_n * vector_bytes(fmt, m.head_dim) * reads
        lm += batch * m.num_heads * q * rows_n * SCORE_BYTES
        flops = 2.0 * batch * q * m.num_heads * rows_n * m.head_dim
        t += cm._eng("selection", (1.0, q, lm, 0.0, batch * q * m.num_kv_heads * rows_n, rows_n), flops, lm)
    return t
