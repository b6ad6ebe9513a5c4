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

TASKS = ("single", "multikey", "multivalue", "vt", "essay-single", "essay-multikey", "essay-multivalue", "qa")
HEADER = ("Some special magic numbers are hidden inside the following text. Make sure to memorize them. "
          "I will quiz you about the numbers afterwards.\n")
QA_HEADER = "Read the following text carefully. A question about it follows the text.\n"
NOISE = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
WORDS = ("apple", "river", "silver", "garden", "falcon", "marble", "harbor", "violet", "canyon", "lantern",
         "copper", "meadow", "orchid", "glacier", "pepper", "thunder", "walnut", "saffron", "compass", "ember")
QA_FACTS = 4          # statements per qa question: the one that answers it and three distractors of its form


@dataclass(frozen=True)
class Prompt:
    ids: list
    answers: tuple        # acceptable values (strings of digits)
    task: str
    seed: int
    prefix: int = 0       # ids[:prefix] is shared with the other questions of the same make_prompts call


def _key(rng, used=()) -> str:
    while True:
        k = f"{rng.choice(WORDS)}-{rng.choice(WORDS)}"
        if k not in used:
            return k


def _needles(task: str, rng, used: set, tag: str = ""):
    """(needle sentences in order, question + answer prefix, acceptable answers); the keys it names are added
    to `used` and never drawn from it (so that questions sharing a haystack ask about different keys)."""
    base = task.removeprefix("essay-")
    if base == "single":
        key, val = _key(rng, used), str(rng.randint(1_000_000, 9_999_999))
        used.add(key)
        return ([f" One of the special magic numbers for {key} is: {val}."],
                f"\nWhat is the special magic number for {key} mentioned in the provided text?"
                f" The special magic number for {key} mentioned in the provided text is", (val,))
    if base == "multikey":
        keys = []
        while len(keys) < 4:
            k = _key(rng, used)
            if k not in keys:
                keys.append(k)
        used.update(keys)
        vals = [str(rng.randint(1_000_000, 9_999_999)) for _ in keys]
        ask = rng.randrange(4)
        return ([f" One of the special magic numbers for {k} is: {v}." for k, v in zip(keys, vals)],
                f"\nWhat is the special magic number for {keys[ask]} mentioned in the provided text?"
                f" The special magic number for {keys[ask]} mentioned in the provided text is", (vals[ask],))
    if base == "multivalue":
        key = _key(rng, used)
        used.add(key)
        vals = [str(rng.randint(1_000_000, 9_999_999)) for _ in range(4)]
        return ([f" One of the special magic numbers for {key} is: {v}." for v in vals],
                f"\nWhat are all the special magic numbers for {key} mentioned in the provided text?"
                f" The special magic numbers for {key} mentioned in the provided text are", tuple(vals))
    if base == "vt":
        names = [n + tag for n in rng.sample([w.upper()[:5] for w in WORDS], 5)]
        val = str(rng.randint(10_000, 99_999))
        chain = [f" VAR {names[0]} = {val}."] + [f" VAR {names[i]} = {names[i - 1]}." for i in range(1, 5)]
        return (chain, f"\nQuestion: follow the VAR assignments. What is the value of VAR {names[-1]}?"
                       f" Answer: the value of VAR {names[-1]} is", (val,))
    if base == "qa":
        from ddbench.profile.haystack import FACT, QUESTION, STONES, TOWNS
        towns = rng.sample([t for t in TOWNS if t not in used], QA_FACTS)
        used.update(towns)
        years = rng.sample(range(1600, 1900), QA_FACTS)
        facts = [FACT.format(town=t, year=y, stone=rng.choice(STONES)) for t, y in zip(towns, years)]
        ask = rng.randrange(QA_FACTS)
        return facts, QUESTION.format(town=towns[ask]), (str(years[ask]),)
    raise DDBenchError(f"unknown task {task!r}: choose from {', '.join(TASKS)}")


def _units(task: str, enc) -> list:
    """The haystack's units (token lists) in their cycling order; needles go between whole units."""
    if task.startswith("essay-") or task == "qa":
        import re

        from ddbench.profile.haystack import TEXT
        return [enc(" " + x) for x in re.split(r"(?<=\.)\s+", " ".join(TEXT.split())) if x]
    return [enc(NOISE)]


def _stream(units: list, n: int) -> tuple[list, list]:
    """The last n tokens of whole units cycled from the first, and the ends of the whole units among them
    (a unit cut at the front is not whole: no needle goes after it)."""
    out, total, i = [], 0, 0
    while total < n:
        out.append(units[i % len(units)])
        total, i = total + len(out[-1]), i + 1
    skip, pos, bounds = total - n, 0, []
    for u in out:
        if pos >= skip:
            bounds.append(pos + len(u) - skip)
        pos += len(u)
    return [t for u in out for t in u][skip:], bounds


def make_prompt(tokenizer, task: str, context_tokens: int, seed: int) -> Prompt:
    return make_prompts(tokenizer, task, context_tokens, seed, 1)[0]


def make_prompts(tokenizer, task: str, context_tokens: int, seed: int, questions: int = 1) -> list:
    """`questions` prompts of exactly `context_tokens` tokens sharing one haystack (`Prompt.prefix` tokens):
    the haystack holds every question's needles, and each prompt ends with its own question, padded at its
    front with haystack text to the longest question's length. With one question, the prompt RULER's task
    builds (the same as before shared prefixes existed). Questions sharing a haystack are not independent:
    each one's needles are the others' distractors, and they share every token before the questions."""
    if questions < 1:
        raise DDBenchError(f"--questions must be at least 1, got {questions}")
    rng = random.Random(f"{task}:{context_tokens}:{seed}" + (f":q{questions}" if questions > 1 else ""))
    used: set = set()
    drawn = [_needles(task, rng, used, tag=str(j + 1) if questions > 1 else "") for j in range(questions)]

    def enc(s):
        return tokenizer.encode(s, add_special_tokens=False)

    bos = [tokenizer.bos_token_id] if getattr(tokenizer, "bos_token_id", None) is not None else []
    units = _units(task, enc)
    head = bos + enc(QA_HEADER if task == "qa" else HEADER)
    qs = [enc(q) for _, q, _ in drawn]
    width = max(map(len, qs))
    nd = [enc(x) for needles, _, _ in drawn for x in needles]
    fill = context_tokens - len(head) - width - sum(map(len, nd))
    body, bounds = _stream(units, max(fill, 0))
    if fill < min(map(len, units)) * (len(nd) + 1) or len(bounds) < len(nd):
        raise DDBenchError(f"context of {context_tokens} tokens is too short for {questions} {task} question(s)")
    depths = sorted(rng.sample(range(len(bounds)), len(nd)))     # needle i goes after boundary depths[i]
    rng.shuffle(nd) if questions > 1 else None                   # one question's needles stay in order
    prefix, a = list(head), 0
    for i, d in enumerate(depths):
        prefix += body[a:bounds[d]] + nd[i]
        a = bounds[d]
    prefix += body[a:]
    out = []
    for q, (_, _, answers) in zip(qs, drawn):
        pad = _stream(units, width - len(q))[0] if width > len(q) else []
        ids = prefix + pad + q
        assert len(ids) == context_tokens, (len(ids), context_tokens)
        out.append(Prompt(ids=ids, answers=answers, task=task, seed=seed, prefix=len(prefix)))
    return out


def score(text: str, answers) -> bool:
    m = re.search(r"\d+", text)
    return bool(m) and m.group(0) in answers
