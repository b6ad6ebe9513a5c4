"""Seeded RULER-style synthetic long-context tasks, built locally (no data set is downloaded).

    make_prompt(tokenizer, task, context_tokens, seed) -> Prompt(ids, answers, task, seed)

The haystack is RULER's noise ("The grass is green. The sky is blue. ..."); needles sit at seeded
depths between filler sentences; the prompt is exactly `context_tokens` tokens long and ends with
an answer prefix so that the model continues with the value (plain completion, no chat template).

    single       one needle "One of the special magic numbers for {key} is: {value}." (NIAH-1 style)
    multikey     four needles with different keys; the question names one of them (NIAH-2/3 style)
    multivalue   four needles with the same key and different values; any one of them is correct
    vt           variable tracking: "VAR A = 51371.", "VAR B = A.", ... four hops; asked for the
                 value of the last variable

Scoring (`score`): the first number in the generated continuation must equal the needle value
(exact match of the first generated tokens against the value; for multivalue, one of the values).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from ddbench.core.errors import DDBenchError

TASKS = ("single", "multikey", "multivalue", "vt")
HEADER = ("Some special magic numbers are hidden inside the following text. Make sure to memorize them. "
          "I will quiz you about the numbers afterwards.\n")
NOISE = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
WORDS = ("apple", "river", "silver", "garden", "falcon", "marble", "harbor", "violet", "canyon", "lantern",
         "copper", "meadow", "orchid", "glacier", "pepper", "thunder", "walnut", "saffron", "compass", "ember")


@dataclass(frozen=True)
class Prompt:
    ids: list
    answers: tuple        # acceptable values (strings of digits)
    task: str
    seed: int


def _key(rng) -> str:
    return f"{rng.choice(WORDS)}-{rng.choice(WORDS)}"


def _needles(task: str, rng):
    """(needle sentences in order, question + answer prefix, acceptable answers)."""
    if task == "single":
        key, val = _key(rng), str(rng.randint(1_000_000, 9_999_999))
        return ([f" One of the special magic numbers for {key} is: {val}."],
                f"\nWhat is the special magic number for {key} mentioned in the provided text?"
                f" The special magic number for {key} mentioned in the provided text is", (val,))
    if task == "multikey":
        keys = []
        while len(keys) < 4:
            k = _key(rng)
            if k not in keys:
                keys.append(k)
        vals = [str(rng.randint(1_000_000, 9_999_999)) for _ in keys]
        ask = rng.randrange(4)
        return ([f" One of the special magic numbers for {k} is: {v}." for k, v in zip(keys, vals)],
                f"\nWhat is the special magic number for {keys[ask]} mentioned in the provided text?"
                f" The special magic number for {keys[ask]} mentioned in the provided text is", (vals[ask],))
    if task == "multivalue":
        key = _key(rng)
        vals = [str(rng.randint(1_000_000, 9_999_999)) for _ in range(4)]
        return ([f" One of the special magic numbers for {key} is: {v}." for v in vals],
                f"\nWhat are all the special magic numbers for {key} mentioned in the provided text?"
                f" The special magic numbers for {key} mentioned in the provided text are", tuple(vals))
    if task == "vt":
        names = rng.sample([w.upper()[:5] for w in WORDS], 5)
        val = str(rng.randint(10_000, 99_999))
        chain = [f" VAR {names[0]} = {val}."] + [f" VAR {names[i]} = {names[i - 1]}." for i in range(1, 5)]
        return (chain, f"\nQuestion: follow the VAR assignments. What is the value of VAR {names[-1]}?"
                       f" Answer: the value of VAR {names[-1]} is", (val,))
    raise DDBenchError(f"unknown task {task!r}: choose from {', '.join(TASKS)}")


def make_prompt(tokenizer, task: str, context_tokens: int, seed: int) -> Prompt:
    rng = random.Random(f"{task}:{context_tokens}:{seed}")
    needles, question, answers = _needles(task, rng)

    def enc(s):
        return tokenizer.encode(s, add_special_tokens=False)

    bos = [tokenizer.bos_token_id] if getattr(tokenizer, "bos_token_id", None) is not None else []
    head, q, noise = bos + enc(HEADER), enc(question), enc(NOISE)
    nd = [enc(s) for s in needles]
    fill = context_tokens - len(head) - len(q) - sum(map(len, nd))
    if fill < len(noise) * (len(nd) + 1):
        raise DDBenchError(f"context of {context_tokens} tokens is too short for the {task} task")
    units, rest = divmod(fill, len(noise))
    depths = sorted(rng.sample(range(1, units + 1), len(nd)))     # needle i goes after unit depths[i]
    body = list(noise[len(noise) - rest:]) if rest else []
    j = 0
    for u in range(1, units + 1):
        body += noise
        while j < len(nd) and depths[j] == u:
            body += nd[j]
            j += 1
    ids = head + body + q
    assert len(ids) == context_tokens, (len(ids), context_tokens)
    return Prompt(ids=ids, answers=answers, task=task, seed=seed)


def score(text: str, answers) -> bool:
    m = re.search(r"\d+", text)
    return bool(m) and m.group(0) in answers
