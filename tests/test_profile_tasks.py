"""The task generators: today's prompts unchanged, RULER-style tasks over the shipped text, and questions that
share one haystack. On the tiny test tokenizer (nothing downloaded)."""

import hashlib
import re

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from test_profile_tiny import _tokenizer  # noqa: E402

from ddbench.core.errors import DDBenchError  # noqa: E402
from ddbench.profile import haystack  # noqa: E402
from ddbench.profile.tasks import TASKS, make_prompt, make_prompts, score  # noqa: E402

# sha256 of str(ids) of the prompts the generator made before shared haystacks existed (commit ce95a61)
BEFORE = {("single", 600, 0): "437f1fc869c304dc", ("single", 1000, 3): "a76ff39bf1a09d30",
          ("multikey", 600, 0): "f40e5f77c5f03c02", ("multikey", 1000, 3): "0c4523e1d53bb153",
          ("multivalue", 600, 0): "6847b28307becdd9", ("multivalue", 1000, 3): "d4a450929ea5a8e0",
          ("vt", 600, 0): "d3bb8d95a45e65ee", ("vt", 1000, 3): "53f9507cca0dc7c3"}


@pytest.fixture(scope="module")
def tok():
    return _tokenizer()


def test_todays_prompts_are_unchanged(tok):
    for (task, c, s), digest in BEFORE.items():
        assert hashlib.sha256(str(make_prompt(tok, task, c, s).ids).encode()).hexdigest()[:16] == digest, task


def test_the_shipped_text_has_no_numbers():
    assert not re.search(r"\d", haystack.TEXT) and len(haystack.TEXT.split()) > 700


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("questions", [1, 3])
def test_every_task_places_its_answers_and_asks_at_the_end(tok, task, questions):
    prompts = make_prompts(tok, task, 3000, 7, questions)
    assert len(prompts) == questions
    P = prompts[0].prefix
    seen = set()
    for p in prompts:
        assert len(p.ids) == 3000 and p.prefix == P and p.ids[:P] == prompts[0].ids[:P]
        text = tok.decode(p.ids)
        body, question = text[:len(tok.decode(p.ids[:P]))], tok.decode(p.ids[P:])
        for a in p.answers:
            assert a in body and a not in question         # the answer is in the haystack, not in the question
            assert score(" " + a + ".", p.answers) and not score(" 1.", p.answers)
        if task.startswith("essay-") or task == "qa":
            assert "The grass is green" not in text and re.search(r"\b(village|orchards|fog|harbour)\b", body)
        key = question.split("for ")[-1].split(" mentioned")[0] if "magic" in question else question
        assert key not in seen                            # questions of one haystack ask different things
        seen.add(key)


def test_qa_asks_about_one_town_among_distractors(tok):
    p = make_prompts(tok, "qa", 2000, 1, 2)
    text = tok.decode(p[0].ids)
    facts = re.findall(r"The harbour of (\w+) was built in the year (\d+)", text)
    assert len(facts) == 2 * 4 and len({t for t, _ in facts}) == 8
    for q in p:
        town = re.search(r"harbour of (\w+) built\?", tok.decode(q.ids[q.prefix:])).group(1)
        assert q.answers == (dict(facts)[town],)


def test_too_short_a_context_and_zero_questions_are_refused(tok):
    with pytest.raises(DDBenchError, match="too short"):
        make_prompts(tok, "qa", 120, 0, 4)
    with pytest.raises(DDBenchError, match="--questions must be at least 1"):
        make_prompts(tok, "single", 1000, 0, 0)
