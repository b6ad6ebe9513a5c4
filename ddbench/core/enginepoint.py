"""An engine point's design as a typed record: the registry design, a chunk-cache design's capacity, the bits of
the host KV and of the GPU chunk cache, and whether the dual-token step runs with one query token.

    p = EnginePoint.parse("dualdecoder-cache@8192+fp8")   # EnginePoint(design, cache_tokens=8192, kv_bits=8)
    str(p)                                                 # the label, as committed rows' design_label column reads
    EnginePoint("dualdecoder-single").single, .base        # True, "dualdecoder"
    p.spec()                                               # the registry's DesignSpec (one query token where single)

The one place a label is written (str) and read (parse); the engine's --designs, its paper phase, the calibration
bundle's engine section and the simulator's engine fits take these records."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from ddbench.core.errors import DDBenchError

FP8 = "+fp8"
FP8_CACHE = "+fp8cache"
SINGLE = "-single"       # a dual-token design run with one query token per step (the engine's own variant)


class EnginePoint(NamedTuple):
    design: str                       # a registry design, or '<design>-single'
    cache_tokens: int | None = None   # a chunk-cache design's capacity in tokens per (layer, KV head)
    kv_bits: int = 16                 # the KV on the host (8: fp8 e4m3)
    cache_bits: int = 16              # the GPU chunk cache (8: fp8, with kv_bits 8)

    def __str__(self) -> str:
        return (f"{self.design}@{self.cache_tokens}" if self.cache_tokens else self.design) + \
            (FP8_CACHE if self.cache_bits == 8 else FP8 if self.kv_bits == 8 else "")

    @classmethod
    def parse(cls, text: str) -> "EnginePoint":
        for suffix, bits in ((FP8_CACHE, (8, 8)), (FP8, (8, 16)), ("", (16, 16))):
            if text.endswith(suffix):
                base = text[:len(text) - len(suffix)]
                break
        d, _, t = base.partition("@")
        try:
            return cls(d, int(t) if t else None, *bits)
        except ValueError:
            raise DDBenchError(f"design label {text!r}: the cache capacity after '@' must be a whole number"
                               " of tokens") from None

    @classmethod
    def named(cls, design: str, single: bool = False) -> "EnginePoint":
        """The point of a registry design, with one query token per step where `single`."""
        return cls(design + SINGLE if single else design)

    @property
    def single(self) -> bool:
        return self.design.endswith(SINGLE)

    @property
    def base(self) -> str:
        """The registry design's name."""
        return self.design[:-len(SINGLE)] if self.single else self.design

    def spec(self):
        """The registry's DesignSpec; where single, its switches with one query token per step (named as the
        point). A DDBenchError for a design the registry does not know."""
        from ddbench.core.designs import DESIGNS
        if self.base not in DESIGNS:
            raise DDBenchError(f"unknown design {self.design!r}; known: {', '.join(DESIGNS)} (or <design>{SINGLE})")
        d = DESIGNS[self.base]
        return dataclasses.replace(d, name=self.design, tokens_per_step=1) if self.single else d
