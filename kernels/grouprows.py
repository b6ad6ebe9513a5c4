"""Shared Triton prologue of the kernels where one program owns one (request, KV head, split):
the rows of the program are the nq query tokens x the G query heads of the KV head's GQA group.

    group_rows(H, G, NQ, GP, BLOCK_M) -> bh, sp, b, h, r, t, g, rv
        bh = program_id(0) = b*H + h, sp = program_id(1); row r = t*GP + g (token t, group member g);
        rv marks the real rows (t < NQ, g < G; GP is G rounded up to a power of two)
    load_group_queries(q, b, h, t, g, rv, s_qb, s_qt, s_qh, G, D) -> [BLOCK_M, D] queries, 0 in padding rows
    sm_count(device) -> the device's SMs (4 off CUDA: the interpreter), which the launchers size their splits by
"""

import torch
import triton
import triton.language as tl


@triton.jit
def group_rows(H, G, NQ, GP: tl.constexpr, BLOCK_M: tl.constexpr):
    bh = tl.program_id(0)
    sp = tl.program_id(1)
    b = bh // H
    h = bh % H
    r = tl.arange(0, BLOCK_M)
    t = r // GP
    g = r % GP
    rv = (t < NQ) & (g < G)
    return bh, sp, b, h, r, t, g, rv


@triton.jit
def load_group_queries(q, b, h, t, g, rv, s_qb, s_qt, s_qh, G, D: tl.constexpr):
    dd = tl.arange(0, D)
    return tl.load(q + b * s_qb + t[:, None] * s_qt + (h * G + g)[:, None] * s_qh + dd[None, :],
                   mask=rv[:, None], other=0.0)


def sm_count(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
