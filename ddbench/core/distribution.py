"""The one grammar of request lengths (contexts and outputs): `128k` (fixed), `uniform:LO:HI`, `exp:MEAN`.

    d = Distribution.parse("uniform:64k:128k", "context")    # one-line DDBenchError on bad text
    d.low, d.high        # the shortest and longest it draws (None for exp:MEAN: any length)
    d.sample(rng)        # one draw (random.Random); exp draws at least 1
    d.tokens("context")  # the one length of a fixed distribution (a DDBenchError for the others)
    str(d)               # the text it was parsed from, as the user wrote it

The CLI parses --context and --output once into this type (ddbench.planner.scenario_args); the scenario,
the serving simulator and every output take it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddbench.core.errors import DDBenchError
from ddbench.core.units import parse_tokens


@dataclass(frozen=True)
class Distribution:
    kind: str                 # fixed | uniform | exp
    a: int                    # the value, LO, or the mean
    b: int | None = None      # HI of uniform
    text: str = field(default="", compare=False, repr=False)   # as written (equal distributions compare equal)

    @classmethod
    def parse(cls, spec, what: str = "context") -> "Distribution":
        s = str(spec).strip().lower()
        text = str(spec).strip()
        if s.startswith("uniform:"):
            parts = s.split(":")
            if len(parts) != 3:
                raise DDBenchError(f"cannot parse {what} '{spec}': use uniform:LO:HI")
            lo, hi = parse_tokens(parts[1], what), parse_tokens(parts[2], what)
            if lo > hi:
                raise DDBenchError(f"{what} '{spec}': LO is larger than HI")
            return cls("uniform", lo, hi, text)
        if s.startswith("exp:"):
            return cls("exp", parse_tokens(s[4:], what), None, text)
        return cls("fixed", parse_tokens(s, what), None, text)

    @classmethod
    def of(cls, value, what: str = "context") -> "Distribution":
        """`value` itself where it is a Distribution already, else parsed (a scenario built from keywords)."""
        return value if isinstance(value, Distribution) else cls.parse(value, what)

    def __str__(self) -> str:
        if self.text:
            return self.text
        return {"fixed": f"{self.a}", "uniform": f"uniform:{self.a}:{self.b}", "exp": f"exp:{self.a}"}[self.kind]

    def tokens(self, what: str = "context") -> int:
        """The one length of a fixed distribution; a DDBenchError where it draws more than one."""
        if self.kind != "fixed":
            raise DDBenchError(f"cannot parse {what} '{self}': use a token count like 131072, 128k or 1m")
        return self.a

    @property
    def low(self) -> int | None:
        return None if self.kind == "exp" else self.a

    @property
    def high(self) -> int | None:
        return {"fixed": self.a, "uniform": self.b, "exp": None}[self.kind]

    def sample(self, rng) -> int:
        if self.kind == "uniform":
            return rng.randint(self.a, self.b)
        if self.kind == "exp":
            return max(1, int(round(rng.expovariate(1.0 / self.a))))
        return self.a
