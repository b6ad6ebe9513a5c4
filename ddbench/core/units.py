"""Parsing and printing of sizes: contexts like 131072, 128k or 1m; bytes as GB."""

from __future__ import annotations

import re

from ddbench.core.defaults import MAX_TOKENS
from ddbench.core.errors import DDBenchError

GB = 1e9
_SUFFIX = {"": 1, "k": 1024, "m": 1024 ** 2}


def parse_tokens(text: str | int, what: str = "context") -> int:
    """'131072', '128k', '128K' or '1m' -> tokens (k = 1024). Positive and at most MAX_TOKENS, or a DDBenchError."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = re.fullmatch(r"\s*([+-]?\d+)\s*([kKmM]?)\s*", str(text))
        if not match:
            raise DDBenchError(f"cannot parse {what} '{text}': use a token count like 131072, 128k or 1m")
        value = int(match.group(1)) * _SUFFIX[match.group(2).lower()]
    if value <= 0:
        raise DDBenchError(f"{what} must be positive, got '{text}'")
    if value > MAX_TOKENS:
        raise DDBenchError(f"{what} must be at most {MAX_TOKENS} tokens, got '{text}'")
    return value


def fmt_tokens(tokens: int) -> str:
    """131072 -> '128K', 1048576 -> '1M', 1000 -> '1000'."""
    if tokens % (1024 ** 2) == 0:
        return f"{tokens // 1024 ** 2}M"
    if tokens % 1024 == 0:
        return f"{tokens // 1024}K"
    return str(tokens)


def plural(n: int, word: str) -> str:
    """'1 GPU', '2 GPUs': a count and its noun."""
    return f"{n} {word}{'' if n == 1 else 's'}"
