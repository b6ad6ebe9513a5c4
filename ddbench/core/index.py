"""The selection index of the landmark designs (issue 47): its format, its bytes, and the bytes one
selection reads. Torch-free; the kernels are in kernels/indexkernels.py.

    spec = parse_index("two-level:8,1,fp8")   # IndexSpec; DDBenchError (one line) on bad input
    spec.name                                 # "two-level:8,1,fp8" (canonical)
    check_index(spec, head_dim, budget_chunks=None)   # int4 needs head_dim % INT4_GROUP == 0; k' >= budget
    vector_bytes(fmt, head_dim)               # one landmark (one chunk, one KV head), scales included
    resident_bytes(spec, n_chunks, head_dim)  # one (layer, KV head, request): fine + coarse landmarks
    read_bytes(spec, n_chunks, head_dim, budget_chunks)  # what one selection reads of them
    selection_bytes(spec, n_chunks, head_dim, budget_chunks, score_rows, score_bytes=2)
                                              # + pass 1's score writes and the top-k's reads of them

Formats of one level (every landmark: the mean post-RoPE key of a chunk, one per KV head):
  bf16  2 d bytes (today's `flat`).
  fp8   e4m3, d bytes + one fp32 scale per landmark (chunk and KV head): d + 4. One scale per vector, as
        DeepSeek-V3.2's indexer keeps one per 128-dim key: e4m3 is a float format (4 exponent bits), so
        the spread within a vector costs no precision until 2^-6 of its largest value (subnormals), and a
        per-group scale would add 4 bytes per group for no gain there; relative error <= 2^-4 per element.
  int4  symmetric codes -8..7 (scale = the group's max |x| / 7), two per byte, one fp32 scale per group of
        INT4_GROUP dims: d / 2 + 4 d / INT4_GROUP. Per-group scales because a 4-bit integer has no exponent:
        one scale per vector would leave the small dims of a key with 1-2 levels. Error <= scale / 2 per
        element (round to nearest).
Two-level `two-level:G[,M[,COARSE[,FINE]]]`: coarse landmarks (the mean of G consecutive chunk landmarks,
a super-chunk) for the whole context, in COARSE (default bf16), and the chunk landmarks in FINE (default
COARSE). Pass 1 scores the super-chunks and keeps the best k' = M x budget chunks of them (M >= 1, default
1; at most all), pass 2 scores only the chunks inside the kept super-chunks; the top-k comes from those.
Both levels stay resident (pass 2 reads any super-chunk's chunks), so a two-level index saves reads, not
memory, unless its levels are low-bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ddbench.core.errors import DDBenchError

FORMATS = ("bf16", "fp8", "int4")
ALIASES = {"flat": "bf16", "bf16": "bf16", "fp8": "fp8", "int4": "int4"}
INT4_GROUP = 32          # dims per int4 scale
SCALE_BYTES = 4          # fp32 scales
FP8_REL_ERROR = 2.0 ** -4
CHOICES = "flat|fp8|int4|two-level:G[,M[,COARSE[,FINE]]]"


@dataclass(frozen=True)
class IndexSpec:
    fmt: str = "bf16"            # the chunk landmarks' format
    group: int = 0               # G chunks per super-chunk; 0: one level (flat)
    keep: float = 1.0            # two-level: k' = keep x budget chunks super-chunks kept by pass 1
    coarse: str = "bf16"         # the super-chunk landmarks' format

    @property
    def two_level(self) -> bool:
        return self.group > 0

    @property
    def name(self) -> str:
        if not self.two_level:
            return "flat" if self.fmt == "bf16" else self.fmt
        tail = "" if self.fmt == self.coarse else f",{self.fmt}"
        fmts = "" if self.coarse == "bf16" and not tail else f",{self.coarse}{tail}"
        return f"two-level:{self.group},{self.keep:g}{fmts}"

    def kept(self, budget_chunks: int, n_chunks: int) -> int:
        """k': the super-chunks pass 1 keeps (at most all of them)."""
        return min(math.ceil(self.keep * budget_chunks), super_chunks(self, n_chunks))


FLAT = IndexSpec()


def _fmt(text: str, whole: str) -> str:
    key = text.strip().lower()
    if key not in ALIASES:
        raise DDBenchError(f"index {whole!r}: unknown format {text!r}; use flat (bf16), fp8 or int4")
    return ALIASES[key]


def parse_index(text) -> IndexSpec:
    """The IndexSpec of `--index`: flat, bf16, fp8, int4 or two-level:G[,M[,COARSE[,FINE]]]."""
    if isinstance(text, IndexSpec):
        return text
    whole = str(text).strip().lower()
    if not whole.startswith("two-level"):
        return IndexSpec(fmt=_fmt(whole, whole))
    head, _, rest = whole.partition(":")
    if head != "two-level" or not rest:
        raise DDBenchError(f"index {whole!r}: two-level needs its super-chunk size, two-level:G[,M[,COARSE[,FINE]]]")
    parts = [p.strip() for p in rest.split(",")]
    if len(parts) > 4:
        raise DDBenchError(f"index {whole!r}: at most G, M, COARSE and FINE after two-level:")
    try:
        group = int(parts[0])
        keep = float(parts[1]) if len(parts) > 1 else 1.0
    except ValueError:
        raise DDBenchError(f"index {whole!r}: G must be an integer and M a number") from None
    if group < 2:
        raise DDBenchError(f"index {whole!r}: a super-chunk must hold at least 2 chunks (G >= 2), got {group}")
    if not 1.0 <= keep <= 1e6:
        raise DDBenchError(f"index {whole!r}: k' = M x budget must keep at least the budget (M >= 1), got M = {keep:g}")
    coarse = _fmt(parts[2], whole) if len(parts) > 2 else "bf16"
    fine = _fmt(parts[3], whole) if len(parts) > 3 else coarse
    return IndexSpec(fmt=fine, group=group, keep=keep, coarse=coarse)


def check_index(spec: IndexSpec, head_dim: int, budget_chunks: int | None = None) -> None:
    """DDBenchError (one line) where the index cannot serve this head dim (int4 packs INT4_GROUP dims
    per scale) or keeps fewer super-chunks than the budget."""
    for fmt in {spec.fmt, spec.coarse if spec.two_level else spec.fmt}:
        if fmt == "int4" and head_dim % INT4_GROUP:
            raise DDBenchError(f"index {spec.name}: int4 packs groups of {INT4_GROUP} dims; head_dim {head_dim}"
                               f" is not a multiple of {INT4_GROUP}")
    if spec.two_level and budget_chunks is not None and spec.keep * budget_chunks < budget_chunks:
        raise DDBenchError(f"index {spec.name}: keeps fewer super-chunks than the budget's {budget_chunks} chunks")


def vector_bytes(fmt: str, head_dim: int) -> int:
    """Bytes of one landmark (one chunk or super-chunk, one KV head), scales included."""
    if fmt == "bf16":
        return 2 * head_dim
    if fmt == "fp8":
        return head_dim + SCALE_BYTES
    if fmt == "int4":
        return head_dim // 2 + SCALE_BYTES * math.ceil(head_dim / INT4_GROUP)
    raise DDBenchError(f"unknown index format {fmt!r}; use {', '.join(FORMATS)}")


def super_chunks(spec: IndexSpec, n_chunks: int) -> int:
    return math.ceil(n_chunks / spec.group) if spec.two_level else 0


def resident_bytes(spec: IndexSpec, n_chunks: int, head_dim: int) -> int:
    """Landmark bytes of one (layer, KV head, request): the chunk landmarks, plus the super-chunks'."""
    coarse = super_chunks(spec, n_chunks) * vector_bytes(spec.coarse, head_dim) if spec.two_level else 0
    return n_chunks * vector_bytes(spec.fmt, head_dim) + coarse


def candidates(spec: IndexSpec, n_chunks: int, budget_chunks: int) -> int:
    """Chunks pass 2 scores per (request, KV head, query token): all of them for one level."""
    if not spec.two_level:
        return n_chunks
    return min(n_chunks, spec.kept(budget_chunks, n_chunks) * spec.group)


def read_bytes(spec: IndexSpec, n_chunks: int, head_dim: int, budget_chunks: int, tokens: int = 1) -> int:
    """Landmark bytes one selection reads per (layer, KV head, request): every landmark of one level;
    for two levels every super-chunk once and the kept super-chunks' chunks for each query token (the
    dual-token step's two tokens keep their own super-chunks)."""
    if not spec.two_level:
        return n_chunks * vector_bytes(spec.fmt, head_dim)
    coarse = super_chunks(spec, n_chunks) * vector_bytes(spec.coarse, head_dim)
    return coarse + tokens * candidates(spec, n_chunks, budget_chunks) * vector_bytes(spec.fmt, head_dim)


def selection_bytes(spec: IndexSpec, n_chunks: int, head_dim: int, budget_chunks: int, score_rows: int,
                    tokens: int = 1, score_bytes: int = 2) -> int:
    """HBM bytes of one selection per (layer, KV head, request): the landmark reads, and each pass's
    scores (score_rows = query tokens x GQA group rows, stored as `score_bytes` each) written once and
    read once by the top-k. The floor of the selection is this over the HBM bandwidth."""
    scored = candidates(spec, n_chunks, budget_chunks) + super_chunks(spec, n_chunks)
    return read_bytes(spec, n_chunks, head_dim, budget_chunks, tokens) + 2 * score_rows * scored * score_bytes


def index_name(text) -> str:
    """The canonical name of an index (a Workload's `index`); DDBenchError on bad input."""
    return parse_index(text).name


def scored_chunks(spec: IndexSpec, n_chunks: int, budget_chunks: int) -> int:
    """Scores one query row of a selection holds: every landmark of one level; two levels, the
    super-chunks and the candidates (for the transient memory of the scores)."""
    return candidates(spec, n_chunks, budget_chunks) + super_chunks(spec, n_chunks)
