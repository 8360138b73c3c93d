"""One parameter's search space as numbers: its bounds, its lattice (when it has a step), and how
a value is written for the trial.

Bounds and steps arrive as the strings the user wrote (upstream's ``Double``). Lattice points are
computed in :mod:`decimal`, so ``min: "0.1", step: "0.1"`` gives 0.3 and not 0.30000000000000004,
and a point is never past ``max`` because of a float's rounding. Random draws are floats.

How a value is written (docs/optimization.md, "Values"): an Int as an integer (``"3"``); a Float
with 12 significant digits (``format(x, ".12g")``: ``"0.3"``, ``"1e-05"``, ``"3"``), unless that
text would fall outside [min, max] as written, then as Python's shortest round-trip ``repr``, and
if even that falls outside, the bound itself as written. A value never leaves its bounds.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

# Enough digits that a lattice point is exact for any step a user writes, within reason.
_CONTEXT = decimal.Context(prec=60, rounding=decimal.ROUND_HALF_EVEN)
NUMERIC_KINDS = ("uniform", "logUniform")


@dataclass(frozen=True)
class Numeric:
    """A uniform or logUniform space, read from its JSON."""

    low_text: str
    high_text: str
    low: Decimal
    high: Decimal
    is_int: bool
    log: bool
    step: Decimal | None

    @property
    def int_low(self) -> int:
        """The least integer in the space (Int type)."""
        return math.ceil(self.low)

    @property
    def int_high(self) -> int:
        """The greatest integer in the space (Int type)."""
        return math.floor(self.high)

    def lattice_size(self) -> int:
        """How many points the step spans (before an Int logUniform's duplicates are dropped)."""
        assert self.step is not None
        with decimal.localcontext(_CONTEXT):
            if not self.log:
                start = Decimal(self.int_low) if self.is_int else self.low
                end = Decimal(self.int_high) if self.is_int else self.high
                if start > end:
                    return 0
                return int(((end - start) / self.step).to_integral_value(rounding=decimal.ROUND_FLOOR)) + 1
            # The greatest k with low * step**k <= high: a guess from the logarithms, made exact.
            ratio = (self.high / self.low).ln() / self.step.ln()
            k = max(0, int(ratio.to_integral_value(rounding=decimal.ROUND_FLOOR)))
            while k > 0 and self.low * self.step**k > self.high:
                k -= 1
            while self.low * self.step ** (k + 1) <= self.high:
                k += 1
            return k + 1

    def point(self, k: int) -> Decimal | int:
        """The lattice's k-th point (k from 0): an int for the Int type."""
        assert self.step is not None
        with decimal.localcontext(_CONTEXT):
            if not self.log:
                if self.is_int:
                    return self.int_low + k * int(self.step)
                return self.low + k * self.step
            value = self.low * self.step**k
        return self.clip_int(_round_half_up(value)) if self.is_int else value

    def lattice(self) -> Iterator[Decimal | int]:
        """The lattice's points, ascending, each once (an Int logUniform's rounding repeats some)."""
        last: Decimal | int | None = None
        for k in range(self.lattice_size()):
            value = self.point(k)
            if value != last:
                yield value
            last = value

    def clip_int(self, value: int) -> int:
        return min(max(value, self.int_low), self.int_high)

    def text(self, value: Decimal | float | int) -> str:
        """The value as the trial gets it (the module's docstring)."""
        if isinstance(value, int):
            return str(value)
        number = float(value)
        for candidate in (format(number, ".12g"), repr(number)):
            if self.low <= Decimal(candidate) <= self.high:
                return candidate
        return self.low_text if Decimal(repr(number)) < self.low else self.high_text


def numeric(space: Mapping[str, Any], kind: str) -> Numeric:
    """The numeric space of ``searchSpace.<kind>`` (``uniform`` or ``logUniform``)."""
    step = space.get("step")
    return Numeric(
        low_text=str(space["min"]),
        high_text=str(space["max"]),
        low=Decimal(str(space["min"])),
        high=Decimal(str(space["max"])),
        is_int=space.get("type", "Float") == "Int",
        log=kind == "logUniform",
        step=None if step is None else Decimal(str(step)),
    )


def space_of(parameter: Mapping[str, Any]) -> tuple[str, Any]:
    """The one space a parameter's searchSpace sets, as (kind, its JSON)."""
    search_space = parameter.get("searchSpace") or {}
    for kind in (*NUMERIC_KINDS, "categorical"):
        if search_space.get(kind) is not None:
            return kind, search_space[kind]
    raise ValueError(f"parameter {parameter.get('name')!r} has no search space")


def _round_half_up(value: Decimal) -> int:
    return int(value.to_integral_value(rounding=decimal.ROUND_HALF_UP))
