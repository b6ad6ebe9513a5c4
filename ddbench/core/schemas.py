"""Typed schemas of the trace files (pydantic 2), and one reader that validates a CSV row by row.

Every defect is a one-line DDBenchError naming the file, the line and the field:

    traces/kernels/h200/kernels.csv line 7, field latency_ms: must be positive, got '-1'

    rows = read_csv(path, KernelRow)                  # list of validated model instances
    rows = read_csv(path, AccuracyRow, what="accuracy profile")

Schemas:
  KernelRow     traces/kernels/<gpu>/kernels.csv  (`ddbench bench kernels`)
  EngineRow     traces/engine/<gpu>/engine.csv    (`ddbench bench engine`)
  AccuracyRow   traces/accuracy/<model>.csv       (`ddbench profile --layer-accuracy`)
  CacheRow      traces/accuracy/<model>.cache.csv (`ddbench profile --cache-capacity ...`)
  calibration_row_model(section)   the sections of a calibration bundle (ddbench/core/calibration.py)
  BundleMeta    a calibration bundle's bundle.json
Extra columns are kept (extra="allow") unless a schema fixes its columns. Lines starting with '#'
are comments. Only pydantic and the standard library are used here.
"""

from __future__ import annotations

import csv
import math
from functools import lru_cache
from typing import Annotated, Any, Literal, Optional

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model,
                      field_validator, model_validator)

from ddbench.core.errors import DDBenchError
from ddbench.core.sections import PROVENANCE_KEYS, SECTIONS, STRING_COLUMNS


def _blank_to_none(v):
    return None if isinstance(v, str) and not v.strip() else v


def _int_like(v):
    """'4096', '4096.0' and 4096.0 are the integer 4096; '4096.5' stays a float (and fails)."""
    if isinstance(v, str):
        v = v.strip()
        try:
            f = float(v)
        except ValueError:
            return v
        return int(f) if math.isfinite(f) and f.is_integer() else v
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    return v


def _key_number(v: float):
    return int(v) if v.is_integer() else v


Int = Annotated[int, BeforeValidator(_int_like)]
NonNegInt = Annotated[int, BeforeValidator(_int_like), Field(ge=0)]
PosInt = Annotated[int, BeforeValidator(_int_like), Field(ge=1)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
Rate = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Text = Annotated[str, Field(min_length=1)]
MaybeFloat = Annotated[Optional[float], BeforeValidator(_blank_to_none)]   # NaN allowed: "not measured"
KeyNumber = Annotated[float, Field(allow_inf_nan=False), AfterValidator(_key_number)]


class Row(BaseModel):
    """Base of every CSV row schema: strings are stripped, extra columns kept."""
    model_config = ConfigDict(extra="allow", str_strip_whitespace=True, frozen=True)


# --------------------------------------------------------------------------- error text

_MESSAGES = {
    "greater_than": "must be positive", "greater_than_equal": "must be >= {ge}", "less_than_equal": "must be <= {le}",
    "float_parsing": "is not a number", "int_parsing": "is not an integer", "int_from_float": "is not an integer",
    "finite_number": "must be finite", "missing": "is missing", "string_too_short": "is empty",
    "literal_error": "must be one of {expected}",
}


def describe(err: dict) -> str:
    """'field latency_ms: must be positive, got '-1'' from one pydantic error."""
    loc = ".".join(str(x) for x in err.get("loc", ()) if x != "__root__")
    try:
        msg = _MESSAGES[err["type"]].format(**(err.get("ctx") or {}))
    except (KeyError, IndexError):
        msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    where = f"field {loc}: " if loc else ""
    if err["type"] == "missing" or isinstance(got, dict):
        return f"{where}{msg}"
    return f"{where}{msg}, got {got!r}"


def validate(model: type[BaseModel], data: dict, where: str):
    """model(**data), or a one-line DDBenchError '<where>, <field>: <why>'."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise DDBenchError(f"{where}, {describe(exc.errors()[0])}") from None


def read_csv(path: str, model: type[BaseModel], what: str = "", columns: list[str] | None = None,
             comment: str = "#", allow_empty: bool = False) -> list:
    """Validated rows of the CSV at `path` (lines starting with `comment` skipped).

    columns: the exact header the file must have (else the schema's required fields must be present).
    Errors name `what` (e.g. 'accuracy profile'), the file, the line and the field."""
    label = f"{what} {path}" if what else str(path)
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            lines = [(n, line) for n, line in enumerate(fh, start=1) if not line.startswith(comment)]
    except FileNotFoundError:
        raise DDBenchError(f"cannot read {label}: no such file") from None
    except OSError as exc:
        raise DDBenchError(f"cannot read {label}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise DDBenchError(f"{label}: not UTF-8 text") from None
    try:
        # strict: a file cut inside a quoted field (a torn last row) is an error, not a shorter value
        records = list(csv.reader((line for _, line in lines), strict=True))
    except csv.Error as exc:
        raise DDBenchError(f"{label}: not a CSV, or cut short ({exc})") from None
    if not records:
        raise DDBenchError(f"{label}: empty (no header)")
    header, hdr_line = [h.strip() for h in records[0]], lines[0][0]
    if columns is not None and header != list(columns):
        raise DDBenchError(f"{label} line {hdr_line}: has columns {header}, expected {list(columns)}")
    required = [f.alias or name for name, f in model.model_fields.items() if f.is_required()]
    missing = [c for c in required if c not in header]
    if missing:
        raise DDBenchError(f"{label} line {hdr_line}: missing column(s) {', '.join(missing)}")
    rows = []
    for (lineno, _), rec in zip(lines[1:], records[1:]):
        if not rec or all(not x.strip() for x in rec):
            continue
        if len(rec) != len(header):
            raise DDBenchError(f"{label} line {lineno}: {len(rec)} fields, the header has {len(header)}")
        rows.append(validate(model, dict(zip(header, rec)), f"{label} line {lineno}"))
    if not rows and not allow_empty:
        raise DDBenchError(f"{label}: no rows")
    return rows


# --------------------------------------------------------------------------- measured traces

class KernelRow(Row):
    """One row of traces/kernels/<gpu>/kernels.csv."""
    schema_: PosInt = Field(alias="schema")
    kernel: Text
    variant: Text
    batch: NonNegInt
    bytes: NonNegInt
    latency_ms: Positive
    gpu: Text
    git_sha: Text
    date_utc: Text


ENGINE_STATUSES = ("ok",)


class EngineRow(Row):
    """One row of traces/engine/<gpu>/engine.csv. Rows whose status is not 'ok' (out of memory,
    skipped) may leave the measured columns empty."""
    design: Text
    context: PosInt
    batch: PosInt
    miss_rate: str
    transfers: NonNegInt
    urgent_programs: NonNegInt
    status: Text
    step_ms: MaybeFloat
    prefetch_mib: MaybeFloat
    urgent_mib: MaybeFloat
    link_mib: MaybeFloat
    link_gbps: MaybeFloat
    exposed_ms: MaybeFloat

    @field_validator("design")
    @classmethod
    def _known_design(cls, v: str) -> str:
        from ddbench.core.designs import DESIGNS
        if v not in DESIGNS:
            raise ValueError(f"unknown design {v!r}")
        return v

    @field_validator("miss_rate")
    @classmethod
    def _miss_rate(cls, v: str) -> str:
        v = v.strip()
        if v == "none":
            return v
        try:
            x = float(v)
        except ValueError:
            raise ValueError(f"{v!r} is neither a number nor 'none'") from None
        if not 0.0 <= x <= 1.0:
            raise ValueError(f"{x} is outside [0, 1]")
        return v

    @model_validator(mode="after")
    def _measured_when_ok(self):
        if self.status == "ok":
            for name in ("step_ms", "prefetch_mib", "urgent_mib", "link_mib", "link_gbps", "exposed_ms"):
                v = getattr(self, name)
                if v is None or not math.isfinite(v):
                    raise ValueError(f"{name} is not a number in an 'ok' row")
            if not self.step_ms > 0:
                raise ValueError(f"step_ms must be positive in an 'ok' row, got {self.step_ms}")
        return self


class AccuracyRow(Row):
    """One row of an accuracy profile, traces/accuracy/<model>.csv (see sim/hitrates.py for the
    columns' meaning); the filter axes (context_tokens, task, init, temperature, budget_tokens),
    n and the provenance columns are optional."""
    layer: NonNegInt
    hit_rate: Rate
    reuse_hit_rate: Annotated[Optional[Rate], BeforeValidator(_blank_to_none)] = None
    n: Annotated[Optional[Annotated[float, Field(ge=0, allow_inf_nan=False)]], BeforeValidator(_blank_to_none)] = None
    context_tokens: Annotated[Optional[PosInt], BeforeValidator(_blank_to_none)] = None
    budget_tokens: Annotated[Optional[PosInt], BeforeValidator(_blank_to_none)] = None
    temperature: Annotated[Optional[Annotated[float, Field(ge=0, allow_inf_nan=False)]],
                           BeforeValidator(_blank_to_none)] = None


class CacheRow(Row):
    """One row of a chunk-cache replay, traces/accuracy/<model>.cache.csv (ddbench/profile/trace.py has
    the columns' meaning). A truncated file fails here: every rate and the row's keys are required.
    `prediction` (speculative: dualdecoder-cache's prefetch | none: lru-cache) is optional: files
    written before it are all speculative."""
    layer: NonNegInt
    context_tokens: PosInt
    budget_tokens: PosInt
    prediction: Literal["speculative", "none"] = "speculative"
    policy: Literal["lru", "score"]
    capacity: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    coverage: Rate
    prefetched_per_budget: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    urgent_per_budget: Rate
    moved_per_budget: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    urgent_share: Rate
    n: PosInt
    model: Text


# --------------------------------------------------------------------------- calibration bundles

@lru_cache(maxsize=None)
def calibration_row_model(section: str) -> type[BaseModel]:
    """The row schema of one calibration section, built from sections.SECTIONS: string columns
    as text, key numbers (integers where whole), positive measurements (> 0, finite), other numbers."""
    spec = SECTIONS[section]
    fields: dict[str, Any] = {}
    for c in spec["key"]:
        fields[c] = (Text if c in STRING_COLUMNS else KeyNumber, ...)
    for c in spec["positive"]:
        fields[c] = (Positive, ...)
    for c in spec["other"]:
        fields[c] = (str if c in STRING_COLUMNS else float, ...)
    return create_model(f"Calibration_{section}", __base__=Row, **fields)


class SectionInfo(BaseModel):
    model_config = ConfigDict(extra="allow")
    file: Optional[str] = None
    complete: bool = False
    rows: Optional[NonNegInt] = None
    note: Optional[str] = None


class BundleMeta(BaseModel):
    """bundle.json of a calibration bundle."""
    model_config = ConfigDict(extra="allow")
    schema_version: Literal[1]
    gpu: Text
    provenance: dict[str, Any]
    sections: dict[str, SectionInfo]

    @field_validator("provenance")
    @classmethod
    def _provenance(cls, v: dict) -> dict:
        missing = [k for k in PROVENANCE_KEYS if k not in v]
        if missing:
            raise ValueError(f"provenance lacks {', '.join(missing)}")
        return v

    @field_validator("sections")
    @classmethod
    def _sections(cls, v: dict) -> dict:
        bad = [s for s in v if s not in SECTIONS]
        if bad:
            raise ValueError(f"unknown section '{bad[0]}'")
        return v


# --------------------------------------------------------------------------- files a user writes

def _unquote(v: str) -> str:
    try:
        return " (write it without quotes)" if math.isfinite(float(v)) else ""
    except ValueError:
        return ""


def _not_text(v, what: str):
    if isinstance(v, bool):
        raise ValueError(f"must be {what}, got {str(v).lower()}")
    if isinstance(v, str):
        raise ValueError(f"must be {what}, not the text {v[:40]!r}{_unquote(v)}")
    if isinstance(v, (list, dict)):
        raise ValueError(f"must be {what}, got a {'list' if isinstance(v, list) else 'mapping'}")
    if isinstance(v, int) and abs(v) > 10 ** 300:
        raise ValueError(f"must be {what} of at most 300 digits, got one of {len(str(abs(v)))}")
    return v


def strict_number(v):
    """A number as it was written (an int or a float), never a quoted one, a switch or a list."""
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"must be finite, got {v}")
    return None if v is None else _not_text(v, "a number")


def strict_whole(v):
    """A whole number: an int, or a float that is whole (85.0e+9); never text, a switch or a fraction."""
    if v is None:
        return None
    v = _not_text(v, "a whole number")
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"must be finite, got {v}")
        if not v.is_integer():
            raise ValueError(f"must be a whole number, got {v}")
        return int(v)
    return v


def _num(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _got(v) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:24] + f"...({len(s)} characters)"


def say(err: dict, fields=()) -> str:
    """One pydantic error of a user's file as 'what is wrong, got X' (without the field's name)."""
    t, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    msg = {"missing": "missing", "string_too_short": "is empty",
           "extra_forbidden": f"unknown field (the fields: {', '.join(fields)})" if fields else "unknown field",
           "greater_than": "must be above {gt}", "greater_than_equal": "must be at least {ge}",
           "less_than": "must be below {lt}", "less_than_equal": "must be at most {le}",
           "finite_number": "must be finite", "bool_type": "must be true or false", "string_type": "must be text",
           "int_type": "must be a whole number", "float_type": "must be a number", "dict_type": "must be a mapping",
           "list_type": "must be a list", "literal_error": "must be one of {expected}"}.get(t)
    if msg is None:
        return err["msg"].removeprefix("Value error, ")
    msg = msg.format(**{k: _num(v) for k, v in ctx.items()})
    return msg if t in ("missing", "string_too_short", "extra_forbidden") else f"{msg}, got {_got(got)}"


def validate_all(model: type[BaseModel], raw: dict, where: str) -> dict:
    """model(raw) as a dict, or one DDBenchError '<where>: <field>: <why>; <field>: <why>' naming every bad
    field once (in the schema's order)."""
    try:
        return model.model_validate(raw).model_dump()
    except ValidationError as exc:
        fields = list(model.model_fields)
        bad: dict[str, str] = {}
        for e in exc.errors():
            loc = ".".join(str(x) for x in e["loc"])
            bad.setdefault(loc, say(e, fields))
        order = fields + list(raw)
        keys = sorted(bad, key=lambda k: order.index(k.split(".")[0]) if k.split(".")[0] in order else len(order))
        raise DDBenchError(f"{where}: " + "; ".join(f"{k}: {bad[k]}" if k else bad[k] for k in keys)) from None


def _strict_type(tp, lo_hi_open, blank_ok: bool):
    """The strict pydantic type of one dataclass field's type: numbers (bounded), switches, text."""
    import typing
    optional = typing.get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType", None)) \
        and type(None) in typing.get_args(tp)
    base = next((a for a in typing.get_args(tp) if a is not type(None)), tp) if optional else tp
    if base is bool:
        t = Annotated[bool, Field(strict=True)]
    elif base is str:
        t = Annotated[str, Field(strict=True, min_length=0 if blank_ok else 1)]
    elif base in (int, float):
        bounds = {}
        if lo_hi_open is not None:
            lo, hi, open_lo = lo_hi_open
            bounds = {"gt" if open_lo else "ge": lo, "le": hi}
        check = strict_whole if base is int else strict_number
        t = Annotated[base, BeforeValidator(check), Field(allow_inf_nan=False, **bounds)] if base is float \
            else Annotated[base, BeforeValidator(check), Field(**bounds)]
    else:
        t = base
    return Optional[t] if optional else t


def strict_model(cls, rules: dict, cross=(), blank_ok=()) -> type[BaseModel]:
    """A strict pydantic model of the frozen dataclass `cls` (its fields, types and defaults): rules maps a
    numeric field to (lowest, highest, lowest excluded); cross holds (field, field it must not exceed);
    fields whose name ends in one of blank_ok may be empty text. Unknown fields are refused."""
    import dataclasses
    import typing
    hints = typing.get_type_hints(cls)
    fields = {}
    for f in dataclasses.fields(cls):
        t = _strict_type(hints[f.name], rules.get(f.name), f.name.endswith(tuple(blank_ok)))
        default = ... if f.default is dataclasses.MISSING else f.default
        fields[f.name] = (t, default)

    def _cross(self):
        for a, b in cross:
            if getattr(self, a) > getattr(self, b):
                raise ValueError(f"{a}: must be at most {b} ({_num(getattr(self, b))}), got {_num(getattr(self, a))}")
        return self
    validators = {"_cross": model_validator(mode="after")(_cross)} if cross else {}
    return create_model(f"Strict{cls.__name__}", __config__=ConfigDict(extra="forbid"), __validators__=validators,
                        **fields)


def _bounded_whole(lo: int, hi: int):
    return Annotated[int, BeforeValidator(strict_whole), Field(ge=lo, le=hi)]


class HFConfig(BaseModel):
    """The fields of a Hugging Face config.json that the catalog reads (ddbench.core.catalog.models); the
    others are kept unread. Whole numbers are bounded (1e30 layers is refused before any arithmetic), a
    switch is true or false (`"false"` in quotes is refused), rope_theta is a positive finite number."""
    model_config = ConfigDict(extra="allow")
    num_hidden_layers: _bounded_whole(1, 4096)
    num_attention_heads: _bounded_whole(1, 4096)
    hidden_size: _bounded_whole(1, 1 << 20)
    num_key_value_heads: Optional[_bounded_whole(1, 4096)] = None
    head_dim: Optional[_bounded_whole(1, 1 << 16)] = None
    intermediate_size: _bounded_whole(1, 1 << 22)
    vocab_size: _bounded_whole(1, 1 << 24)
    max_position_embeddings: _bounded_whole(1, 1 << 30) = 131072
    tie_word_embeddings: Annotated[bool, Field(strict=True)] = False
    attention_bias: Optional[Annotated[bool, Field(strict=True)]] = None
    rope_theta: Annotated[float, BeforeValidator(strict_number), Field(gt=0, le=1e15, allow_inf_nan=False)] = 10000.0
    model_type: Annotated[str, Field(strict=True)] = ""

    @model_validator(mode="after")
    def _shapes(self):
        kv = self.num_key_value_heads or self.num_attention_heads
        if self.num_attention_heads % kv:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) is not divisible by"
                             f" num_key_value_heads ({kv})")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(f"head_dim: missing, and hidden_size ({self.hidden_size}) is not divisible by"
                             f" num_attention_heads ({self.num_attention_heads})")
        return self
