"""Task accuracy (Table 1's role): dense, budgeted sparse with exact top-k, and ShadowKV low-rank keys.

    answer(model, probe, tokenizer, cache, prompt, first_logits, plan) -> (correct, text)

Prefill is dense for every method (as in ShadowKV and DualDecoder); the first generated token
therefore comes from the dense prefill. The remaining answer tokens are decoded greedily with:

    dense    exact attention over the whole cache;
    sparse   each decode query attends only to its own exact top-k chunks (budget/chunk per KV
             head, the project's selection rule) plus the resident local window and generated
             tokens: what DualDecoder computes once its misses are fetched, whatever it predicted;
    lowrank  ShadowKV: the same selection (exact landmarks), but the selected chunks' keys are the
             rank-r rebuild of the pre-RoPE keys (ddbench/profile/lowrank.py), values exact.
             ShadowKV's exact outlier chunks are not modelled (a loss it does not have).
    fp8      (with --fp8-error) dualdecoder-cache in fp8: the same exact top-k selection, but the
             selected chunks' keys and values went through bf16 and e4m3 with one scale per
             (chunk, KV head) (kernels/fp8.py), dequantised; the local window and generated tokens
             stay as the model holds them.

Rates: `wilson(correct, total)` is the Wilson score 95 % interval (no continuity correction).

Exact match: the first number in the continuation equals the needle value (tasks.score).
The cache is returned to the prompt length afterwards.
"""

from __future__ import annotations

import math

from ddbench.profile.decode import step, truncate
from ddbench.profile.tasks import score

Z95 = 1.959963984540054          # the standard normal's 97.5 % quantile


def wilson(correct: int, total: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval (low, high) of the rate correct/total; (0, 1) when total is 0."""
    if total <= 0:
        return 0.0, 1.0
    if not 0 <= correct <= total:
        raise ValueError(f"wilson: {correct} correct of {total}")
    p, z2 = correct / total, z * z
    centre = (p + z2 / (2 * total)) / (1 + z2 / total)
    half = z / (1 + z2 / total) * math.sqrt(p * (1 - p) / total + z2 / (4 * total * total))
    return max(0.0, centre - half), min(1.0, centre + half)


def answer(model, probe, tokenizer, cache, prompt, first_logits, plan, extra_tokens: int = 3):
    longest = max(len(tokenizer.encode(" " + a, add_special_tokens=False)) for a in prompt.answers)
    P = len(prompt.ids)
    toks = [int(first_logits.argmax())]
    probe.sparse = plan
    try:
        for i in range(longest + extra_tokens - 1):
            logits = step(model, cache, [toks[-1]], P + i)
            toks.append(int(logits[-1].argmax()))
    finally:
        probe.sparse = None
        probe.selections.clear()
        truncate(cache, P)
    text = tokenizer.decode(toks, skip_special_tokens=True)
    return score(text, prompt.answers), text
