"""Prefill once, then the dual-token decode loop (paper §4.1, §5.2) with exact attention.

    prefill(model, ids, cache, chunk=1024, bar=None, start=0) -> logits of the last prompt token
        in pieces of `chunk` tokens over one cache (exact causal attention; bounds memory); `start`: the
        tokens already in the cache (a question's suffix after its shared prefix).
    sample(logits, temperature, top_p, gen) -> token id   (temperature 0: argmax)
    dual_run(model, probe, cache, prompt_len, first_logits, DualSampling(steps, init, temperature, top_p,
             seed), *, vocab, bar=None) -> DualRun

One dual-token step at position p feeds [output token x_t, speculative token s_t] at positions
[p, p+1] under a causal mask (the output token never sees the speculative one). x_{t+1} is sampled
from the output position, s_{t+1} is the argmax at the speculative position. The speculative
token's KV is then dropped (`cache.crop(-1)`), so the cache only ever holds prompt and output
tokens and the output token's logits equal a single-token decode's (tests/test_profile_decode.py).

Start: T1 is sampled from the prefill's last logits. init "t2": one pre-decoding step of T1 alone
gives the real T2 (sampled), used as the first speculative token (paper §5.2), its KV is dropped and
the dual loop starts at [T1, T2] with x_2 = T2. init "random": the first speculative token is a
uniformly random vocabulary id (its own seeded generator) and x_2 is sampled at the first dual step
from the same logits and the same generator state, so both inits follow the same output trajectory.

Every step stores the post-RoPE queries of both tokens at every layer: q_out[t], q_spec[t] as
[L, Hq, d]. `steps` dual steps are measured as `steps` transitions t -> t+1, so steps + 1 passes run.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

# transformers 5.2x renames `past_key_values` to `cache`; the old name works through 5.39 and is
# the one every transformers 5 release accepts.
warnings.filterwarnings("ignore", message=".*past_key_values.*is deprecated", category=FutureWarning)


@dataclass
class DualRun:
    q_out: object          # [steps + 1, L, Hq, d] fp32, output token's post-RoPE query
    q_spec: object         # [steps + 1, L, Hq, d] fp32, speculative token's post-RoPE query
    out_tokens: list       # x_1 .. x_{steps+1} (the input output token of each pass)
    spec_tokens: list      # s_1 .. s_{steps+1}
    token_acc: list        # token_acc[t] = (s_t == x_{t+1}), t = 0 .. steps - 1


def prefill(model, ids, cache, chunk: int = 1024, bar=None, start: int = 0):
    """`ids` at positions start.. over the cache (which holds `start` tokens): the last token's logits."""
    import torch
    t = torch.as_tensor(ids, dtype=torch.long, device=model.device).view(1, -1)
    logits = None
    with torch.inference_mode():
        for a in range(0, t.shape[1], chunk):
            piece = t[:, a:a + chunk]
            pos = torch.arange(start + a, start + a + piece.shape[1], device=t.device).view(1, -1)
            logits = model(input_ids=piece, past_key_values=cache, position_ids=pos, use_cache=True,
                           logits_to_keep=1).logits[0, -1].float()
            if bar is not None:
                bar.update(piece.shape[1])
    return logits


def truncate(cache, length: int) -> None:
    """Drop cached tokens beyond `length` (DynamicCache.crop takes a negative count in transformers 5)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def sample(logits, temperature: float, top_p: float, gen) -> int:
    import torch
    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, -1)
    if top_p < 1.0:
        sp, order = probs.sort(descending=True)
        keep = sp.cumsum(-1) - sp < top_p
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sp[keep])
        probs /= probs.sum()
    return int(torch.multinomial(probs.cpu(), 1, generator=gen))


def step(model, cache, tokens, pos):
    """One forward of `tokens` at positions pos.. over the cache; logits [n, vocab] fp32."""
    import torch
    dev = model.device
    ids = torch.tensor([tokens], dtype=torch.long, device=dev)
    p = torch.arange(pos, pos + len(tokens), device=dev).view(1, -1)
    with torch.inference_mode():
        return model(input_ids=ids, past_key_values=cache, position_ids=p, use_cache=True).logits[0].float()


@dataclass(frozen=True)
class DualSampling:
    """How a dual-token run samples: `steps` dual steps, the first speculative token ("t2": the real T2 of
    a pre-decoding step; "random": a random vocabulary id), temperature and top-p of the output token
    (temperature 0: argmax), and the seed of its generator."""
    steps: int
    init: str
    temperature: float
    top_p: float
    seed: int


def dual_run(model, probe, cache, prompt_len, first_logits, sampling: DualSampling, *, vocab, bar=None) -> DualRun:
    import torch
    steps, init, temperature, top_p, seed = (sampling.steps, sampling.init, sampling.temperature, sampling.top_p,
                                             sampling.seed)
    if init not in ("t2", "random"):
        raise ValueError(init)
    gen = torch.Generator().manual_seed(seed)
    x = sample(first_logits, temperature, top_p, gen)
    pending = None
    if init == "t2":
        probe.capture = None
        pre = step(model, cache, [x], prompt_len)[0]
        cache.crop(-1)
        spec = pending = sample(pre, temperature, top_p, gen)
    else:
        spec = int(torch.randint(vocab, (1,), generator=torch.Generator().manual_seed(seed + 7919)))
    q_out, q_spec, outs, specs, acc = [], [], [], [], []
    pos = prompt_len
    L = len(cache.layers)
    for t in range(steps + 1):
        probe.capture = {}
        logits = step(model, cache, [x, spec], pos)
        cache.crop(-1)
        cap = probe.capture
        probe.capture = None
        q = torch.stack([cap[i][0] for i in range(L)])                  # [L, 2, Hq, d]
        q_out.append(q[:, 0])
        q_spec.append(q[:, 1])
        outs.append(x)
        specs.append(spec)
        nxt = pending if pending is not None else sample(logits[0], temperature, top_p, gen)
        pending = None
        if t < steps:
            acc.append(spec == nxt)
        x, spec, pos = nxt, int(logits[1].argmax()), pos + 1
        if bar is not None:
            bar.update(1)
    truncate(cache, prompt_len)
    return DualRun(q_out=torch.stack(q_out), q_spec=torch.stack(q_spec), out_tokens=outs, spec_tokens=specs,
                   token_acc=acc)
