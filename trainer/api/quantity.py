"""Kubernetes resource quantities, exactly as ``k8s.io/apimachinery`` ``resource.Quantity`` behaves.

Why this module exists: the operator must (a) read quantities written by users and SDKs (strings such
as ``"2500m"`` or ``"1.5Gi"``, but also JSON numbers such as ``cpu: 2.0``; docs/decisions.md §9),
(b) turn them into integers for ``PET_NPROC_PER_NODE`` (docs/upstream-behaviour.md §torch-nproc,
§quantities), (c) add and multiply them for PodGroup ``minResources`` (docs/upstream-behaviour.md
§coscheduling, §volcano), and (d) write them back in the canonical form a real API server would
return, so that our objects compare equal to upstream ones.

It is standard-library only and imports nothing heavy: the ``trainer render`` CLI imports it on its
cold-start path.

Representation: every parsed quantity is rounded (away from zero) to a whole number of nano-units at
parse time, exactly like Kubernetes does ("if you want some resources, you should get some
resources"), so the value is stored as an exact integer count of nano-units. No binary floats are
involved anywhere; float inputs are converted through their shortest ``repr`` (which is what a JSON
encoder would have written on the wire).

Each quantity also remembers its *format family*, which only affects serialization:

* ``BinarySI``: parsed with a ``Ki Mi Gi Ti Pi Ei`` suffix;
* ``DecimalSI``: parsed with ``n u m k M G T P E`` or no suffix;
* ``DecimalExponent``: parsed with an ``e<N>`` / ``E<N>`` suffix.

Canonical serialization (``Quantity.String()`` upstream, see :meth:`Quantity.canonical`):

* zero is always ``"0"``;
* ``BinarySI`` values are written with the largest power-of-1024 suffix that keeps an integer mantissa
  (``2048Mi`` -> ``2Gi``, ``2.5Gi`` -> ``2560Mi``, ``1.5Ki`` -> ``1536``); values of magnitude below
  1024 or not whole in bytes are written as ``DecimalSI`` instead (``0.5Ki`` -> ``512``);
* ``DecimalSI`` / ``DecimalExponent`` values are written as ``<integer mantissa><suffix>`` where the
  exponent is the largest multiple of three that keeps the mantissa an integer (``1000`` -> ``1k``,
  ``1.5`` -> ``1500m``, ``1250m`` stays, ``0.0000001`` -> ``100n``, ``1e3`` stays ``1e3``,
  ``12e2`` -> ``1200``).  Because values are whole nano-units, ``n`` is the smallest suffix.

Two deliberate deviations for values no real cluster uses, both where upstream would print garbage:
decimal exponents above 18 keep the ``E`` suffix with a larger mantissa (upstream prints no suffix at
all), and binary values beyond ``Ei`` keep ``Ei``.  Exponent suffixes are limited to ``|N| <= 1000``
so that hostile input cannot make us build astronomically large integers.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

__all__ = [
    "Quantity",
    "QuantityFormat",
    "canonical_quantity",
    "cpu_count",
    "gpu_count",
    "pod_requests",
    "resource_list_canonical",
]


class QuantityFormat(enum.Enum):
    """The serialization family of a quantity (``resource.Format`` upstream)."""

    BINARY_SI = "BinarySI"
    DECIMAL_SI = "DecimalSI"
    DECIMAL_EXPONENT = "DecimalExponent"


# Nano-units per base unit: all values are stored as integer multiples of 1n.
_NANO: Final = 10**9

# Kubernetes caps BinarySI values at the largest int64 (resource.maxAllowed).
_MAX_BINARY_VALUE: Final = 2**63 - 1

# Guard against inputs such as "1e999999999" that would build gigantic integers.
_MAX_EXPONENT: Final = 1000

_DECIMAL_SUFFIX_EXPONENTS: Final[Mapping[str, int]] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_DECIMAL_EXPONENT_SUFFIXES: Final[Mapping[int, str]] = {
    exponent: suffix for suffix, exponent in _DECIMAL_SUFFIX_EXPONENTS.items()
}
_MAX_DECIMAL_SI_EXPONENT: Final = 18

# Power of 1024 for each binary suffix.
_BINARY_SUFFIX_POWERS: Final[Mapping[str, int]] = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_BINARY_POWER_SUFFIXES: Final[Mapping[int, str]] = {
    power: suffix for suffix, power in _BINARY_SUFFIX_POWERS.items()
}
_MAX_BINARY_POWER: Final = 6

# The grammar accepted by resource.ParseQuantity: a signed decimal number (at least one digit, the
# fraction part optional, "5." and ".5" both allowed) followed by at most one suffix.  The exponent
# alternative is tried first so that "1E3" is 1000 while "1E" is one exa.
_QUANTITY_RE: Final = re.compile(
    r"(?P<sign>[+-]?)(?P<integer>[0-9]*)(?:\.(?P<fraction>[0-9]*))?"
    r"(?P<suffix>[eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?",
    re.ASCII,
)

# The wording of upstream's ErrFormatWrong, so admission messages read like a real API server's.
_FORMAT_HINT: Final = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)


def _ceil_div(numerator: int, denominator: int) -> int:
    """Exact ceiling of ``numerator / denominator`` for a non-negative numerator."""
    return -(-numerator // denominator)


class Quantity:
    """An immutable, hashable, totally ordered Kubernetes resource quantity.

    Equality, hashing and ordering use the numeric value only (``Quantity("1Gi") ==
    Quantity("1073741824")``), like ``Quantity.Cmp`` upstream; the format family only affects
    :meth:`canonical`.

    Build instances with :meth:`parse` (or ``Quantity(value)``, which is the same).
    """

    __slots__ = ("_format", "_nanos")

    _nanos: int
    _format: QuantityFormat

    def __init__(self, value: str | int | float | Quantity) -> None:
        parsed = Quantity._parse_value(value)
        object.__setattr__(self, "_nanos", parsed[0])
        object.__setattr__(self, "_format", parsed[1])

    # ----------------------------------------------------------------------------- construction

    @classmethod
    def parse(cls, value: str | int | float | Quantity) -> Quantity:
        """Parse a quantity string, an ``int`` or a ``float``; return ``value`` itself if already one.

        Raises ``ValueError`` (with the offending input in the message) for anything Kubernetes would
        refuse, and for booleans, NaN and infinities.
        """
        if isinstance(value, Quantity):
            return value
        return cls(value)

    @classmethod
    def from_nanos(cls, nanos: int, fmt: QuantityFormat = QuantityFormat.DECIMAL_SI) -> Quantity:
        """Build a quantity from an exact count of nano-units (used by arithmetic and unpickling)."""
        instance = cls.__new__(cls)
        object.__setattr__(instance, "_nanos", int(nanos))
        object.__setattr__(instance, "_format", fmt)
        return instance

    @staticmethod
    def _parse_value(value: object) -> tuple[int, QuantityFormat]:
        if isinstance(value, Quantity):
            return value._nanos, value._format
        # bool is an int subclass; "cpu: true" is a mistake, not one CPU.
        if isinstance(value, bool):
            raise ValueError(f"invalid quantity {value!r}: booleans are not quantities")
        if isinstance(value, int):
            return Quantity._parse_string(str(value), value)
        if isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                raise ValueError(f"invalid quantity {value!r}: not a finite number")
            # repr() gives the shortest string that round-trips, i.e. what a JSON encoder sends
            # ("2.0", "0.1", "1e-05", "1e+16"); Kubernetes parses that text as a quantity.
            return Quantity._parse_string(repr(value), value)
        if isinstance(value, str):
            return Quantity._parse_string(value, value)
        raise ValueError(f"invalid quantity {value!r}: expected a string or a number")

    @staticmethod
    def _parse_string(text: str, original: object) -> tuple[int, QuantityFormat]:
        match = _QUANTITY_RE.fullmatch(text)
        if match is None:
            raise ValueError(f"invalid quantity {original!r}: {_FORMAT_HINT}")
        integer_digits = match.group("integer")
        fraction_digits = match.group("fraction") or ""
        if not integer_digits and not fraction_digits:
            raise ValueError(f"invalid quantity {original!r}: {_FORMAT_HINT}")
        suffix = match.group("suffix") or ""
        try:
            mantissa = int(integer_digits + fraction_digits or "0")
        except ValueError as exc:  # more digits than int() accepts (sys.get_int_max_str_digits)
            raise ValueError(f"invalid quantity {original!r}: too many digits") from exc
        # value = mantissa * 10**-scale * (suffix multiplier)
        scale = len(fraction_digits)

        fmt: QuantityFormat
        if suffix in _BINARY_SUFFIX_POWERS:
            fmt = QuantityFormat.BINARY_SI
            numerator = mantissa * (1024 ** _BINARY_SUFFIX_POWERS[suffix]) * _NANO
            magnitude = _ceil_div(numerator, 10**scale)
        else:
            if suffix in _DECIMAL_SUFFIX_EXPONENTS:
                fmt = QuantityFormat.DECIMAL_SI
                exponent = _DECIMAL_SUFFIX_EXPONENTS[suffix]
            else:  # e<N> / E<N>, guaranteed by the regular expression
                fmt = QuantityFormat.DECIMAL_EXPONENT
                exponent = int(suffix[1:])
                if abs(exponent) > _MAX_EXPONENT:
                    raise ValueError(
                        f"invalid quantity {original!r}: exponent out of the supported range "
                        f"[-{_MAX_EXPONENT}, {_MAX_EXPONENT}]"
                    )
            power = exponent - scale + 9  # power of ten that converts the mantissa to nano-units
            # A negative power rounds up to the next whole nano-unit, like ParseQuantity's inf.RoundUp.
            magnitude = mantissa * 10**power if power >= 0 else _ceil_div(mantissa, 10**-power)

        if fmt is QuantityFormat.BINARY_SI:
            if magnitude > _MAX_BINARY_VALUE * _NANO:
                magnitude = _MAX_BINARY_VALUE * _NANO
            if 0 < magnitude < _NANO:
                # Fractions of a byte cannot be written with binary suffixes.
                fmt = QuantityFormat.DECIMAL_SI

        negative = match.group("sign") == "-"
        return (-magnitude if negative else magnitude), fmt

    # ----------------------------------------------------------------------------- immutability

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Quantity is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Quantity is immutable")

    def __reduce__(self) -> tuple[Any, tuple[int, QuantityFormat]]:
        # __slots__ plus the __setattr__ guard defeat the default copy/pickle protocol.
        return (Quantity.from_nanos, (self._nanos, self._format))

    # ----------------------------------------------------------------------------- accessors

    @property
    def format(self) -> QuantityFormat:
        """The format family the value was parsed with (after Kubernetes' own adjustments)."""
        return self._format

    @property
    def nanos(self) -> int:
        """The exact value as an integer number of nano-units (``1`` == ``10**9`` nanos)."""
        return self._nanos

    @property
    def is_zero(self) -> bool:
        """True when the value is zero, whatever the format (``0``, ``0Gi``, ``0e3``...)."""
        return self._nanos == 0

    def ceil(self) -> int:
        """The value rounded up to an integer, like ``Quantity.Value()`` upstream.

        Positive fractions round up (``2500m`` -> 3, ``0.7`` -> 1, ``3.7`` -> 4), as
        docs/upstream-behaviour.md §quantities says.  Like upstream, rounding is *away from zero*, so
        ``-1.5`` gives ``-2``; negative quantities never appear in valid resource lists.
        """
        if self._nanos >= 0:
            return _ceil_div(self._nanos, _NANO)
        return -_ceil_div(-self._nanos, _NANO)

    # ----------------------------------------------------------------------------- arithmetic

    def __add__(self, other: Quantity) -> Quantity:
        """Exact sum.  The result keeps the *left* operand's format, unless the left operand is zero,
        in which case it takes the right one's; this is what ``Quantity.Add`` does, and it is why a sum
        started from an empty quantity is written in the family of its first non-zero term."""
        if not isinstance(other, Quantity):
            return NotImplemented
        fmt = other._format if self._nanos == 0 else self._format
        return Quantity.from_nanos(self._nanos + other._nanos, fmt)

    def __mul__(self, factor: int) -> Quantity:
        """Exact product with an integer (``Quantity.Mul``); the format is kept."""
        if isinstance(factor, bool) or not isinstance(factor, int):
            return NotImplemented
        return Quantity.from_nanos(self._nanos * factor, self._format)

    def __rmul__(self, factor: int) -> Quantity:
        return self.__mul__(factor)

    # ----------------------------------------------------------------------------- comparisons

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self._nanos == other._nanos

    def __hash__(self) -> int:
        return hash(self._nanos)

    def __lt__(self, other: Quantity) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self._nanos < other._nanos

    def __le__(self, other: Quantity) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self._nanos <= other._nanos

    def __gt__(self, other: Quantity) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self._nanos > other._nanos

    def __ge__(self, other: Quantity) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self._nanos >= other._nanos

    # ----------------------------------------------------------------------------- serialization

    def canonical(self) -> str:
        """The string a Kubernetes API server would write for this quantity (``Quantity.String()``)."""
        nanos = self._nanos
        if nanos == 0:
            return "0"
        sign = "-" if nanos < 0 else ""
        magnitude = -nanos if nanos < 0 else nanos

        fmt = self._format
        if fmt is QuantityFormat.BINARY_SI and (magnitude < 1024 * _NANO or magnitude % _NANO != 0):
            # Small values and fractions of a byte are clearer (and exact) in decimal.
            fmt = QuantityFormat.DECIMAL_SI

        if fmt is QuantityFormat.BINARY_SI:
            mantissa = magnitude // _NANO
            power = 0
            while power < _MAX_BINARY_POWER and mantissa % 1024 == 0:
                mantissa //= 1024
                power += 1
            suffix = _BINARY_POWER_SUFFIXES.get(power, "")
            return f"{sign}{mantissa}{suffix}"

        # Decimal families: strip every factor of ten, then lower the exponent to a multiple of three.
        mantissa = magnitude
        exponent = -9
        while mantissa % 10 == 0:
            mantissa //= 10
            exponent += 1
        while exponent % 3 != 0:
            mantissa *= 10
            exponent -= 1

        if fmt is QuantityFormat.DECIMAL_EXPONENT:
            suffix = "" if exponent == 0 else f"e{exponent}"
            return f"{sign}{mantissa}{suffix}"

        if exponent > _MAX_DECIMAL_SI_EXPONENT:
            mantissa *= 10 ** (exponent - _MAX_DECIMAL_SI_EXPONENT)
            exponent = _MAX_DECIMAL_SI_EXPONENT
        return f"{sign}{mantissa}{_DECIMAL_EXPONENT_SUFFIXES[exponent]}"

    def __str__(self) -> str:
        return self.canonical()

    def __repr__(self) -> str:
        return f"Quantity({self.canonical()!r})"


def canonical_quantity(value: str | int | float | Quantity) -> str:
    """Parse ``value`` and return its canonical Kubernetes string (``cpu: 2.0`` -> ``"2"``)."""
    return Quantity.parse(value).canonical()


def resource_list_canonical(mapping: Mapping[str, Any] | None) -> dict[str, str]:
    """Canonicalize every quantity of a ``ResourceList`` (docs/decisions.md §9).

    Keys are returned in sorted order, which is how an API server serializes Go maps; ``None`` gives
    an empty dict.  Raises ``ValueError`` naming the resource when a value is not a quantity.
    """
    result: dict[str, str] = {}
    if not mapping:
        return result
    for name in sorted(mapping):
        try:
            result[name] = canonical_quantity(mapping[name])
        except ValueError as exc:
            raise ValueError(f"resource {name!r}: {exc}") from exc
    return result


# --------------------------------------------------------------------------------- plugin helpers


def _resource_list(resources: Mapping[str, Any] | None, field: str) -> Mapping[str, Any]:
    """``resources[field]`` as a mapping, tolerating absent and ``null`` blocks."""
    if not resources:
        return {}
    value = resources.get(field)
    if isinstance(value, Mapping):
        return value
    return {}


def _gpu_in(resource_list: Mapping[str, Any]) -> int:
    # Upstream returns whichever GPU-like name Go's map iteration yields first; we take the first in
    # sorted name order so that the result is reproducible.
    for name in sorted(resource_list):
        if "gpu" in name.lower():
            return Quantity.parse(resource_list[name]).ceil()
    return 0


def gpu_count(resources: Mapping[str, Any] | None) -> int:
    """GPUs per node from a ``ResourceRequirements`` mapping (docs/upstream-behaviour.md
    §gpu-and-cpu-count).

    The value, rounded up, of the first resource (in sorted name order) whose lower-cased name
    contains ``gpu`` in ``requests``; if that is zero or absent, the same lookup in ``limits``.
    Returns 0 when neither has one.  Invalid quantities raise ``ValueError``.
    """
    from_requests = _gpu_in(_resource_list(resources, "requests"))
    if from_requests > 0:
        return from_requests
    return _gpu_in(_resource_list(resources, "limits"))


def cpu_count(resources: Mapping[str, Any] | None) -> int:
    """CPUs per node from a ``ResourceRequirements`` mapping (docs/upstream-behaviour.md
    §gpu-and-cpu-count).

    ``requests.cpu`` when present and non-zero, otherwise ``limits.cpu``, rounded up (``2500m`` -> 3);
    0 when neither is set.  Callers apply ``max(1, ...)`` themselves.
    """
    requests = _resource_list(resources, "requests")
    if "cpu" in requests and requests["cpu"] is not None:
        requested = Quantity.parse(requests["cpu"])
        if not requested.is_zero:
            return requested.ceil()
    limits = _resource_list(resources, "limits")
    if "cpu" in limits and limits["cpu"] is not None:
        return Quantity.parse(limits["cpu"]).ceil()
    return 0


# Resources that pod-level ``spec.resources.requests`` override (component-helpers
# IsSupportedPodLevelResource): cpu, memory and hugepages-*.
_POD_LEVEL_RESOURCES: Final = frozenset({"cpu", "memory"})
_HUGEPAGES_PREFIX: Final = "hugepages-"


def _container_requests(container: object) -> dict[str, Quantity]:
    if not isinstance(container, Mapping):
        return {}
    requests = _resource_list(container.get("resources"), "requests")
    return {name: Quantity.parse(value) for name, value in requests.items() if value is not None}


def _add_into(total: dict[str, Quantity], addend: Mapping[str, Quantity]) -> None:
    # addResourceList: a new name takes the addend's quantity (and so its format).
    for name, quantity in addend.items():
        total[name] = total[name] + quantity if name in total else quantity


def _max_into(total: dict[str, Quantity], candidate: Mapping[str, Quantity]) -> None:
    # maxResourceList: replace only when strictly greater, so ties keep the existing format.
    for name, quantity in candidate.items():
        if name not in total or quantity > total[name]:
            total[name] = quantity


def _containers(pod_spec: Mapping[str, Any], field: str) -> Iterable[object]:
    value = pod_spec.get(field)
    return value if isinstance(value, list | tuple) else ()


def pod_requests(pod_spec: Mapping[str, Any]) -> dict[str, Quantity]:
    """Effective resource requests of one pod, as the scheduler computes them (component-helpers
    ``resource.PodRequests`` with default options).  Used for PodGroup ``minResources``.

    * regular containers: their ``requests`` are summed;
    * init containers run one after another, so each contributes its requests plus the requests of
      the sidecars started before it, and the pod needs the maximum of those;
    * sidecars (init containers with ``restartPolicy: Always``) keep running: they are added to the
      sum and accumulate for the init containers that follow them;
    * pod-level ``spec.resources.requests`` (PodLevelResources, beta and on by default since 1.34)
      replace the aggregate for ``cpu``, ``memory`` and ``hugepages-*``;
    * ``overhead`` (RuntimeClass) is added last.

    Limits are never used as a fallback, and resources requested nowhere are absent from the result.
    """
    totals: dict[str, Quantity] = {}
    for container in _containers(pod_spec, "containers"):
        _add_into(totals, _container_requests(container))

    sidecars: dict[str, Quantity] = {}
    init_peak: dict[str, Quantity] = {}
    for container in _containers(pod_spec, "initContainers"):
        own = _container_requests(container)
        if isinstance(container, Mapping) and container.get("restartPolicy") == "Always":
            _add_into(totals, own)
            _add_into(sidecars, own)
            running = dict(sidecars)
        else:
            running = dict(own)
            _add_into(running, sidecars)
        _max_into(init_peak, running)
    _max_into(totals, init_peak)

    pod_level = _resource_list(pod_spec.get("resources"), "requests")
    for name, value in pod_level.items():
        if value is not None and (name in _POD_LEVEL_RESOURCES or name.startswith(_HUGEPAGES_PREFIX)):
            totals[name] = Quantity.parse(value)

    overhead = pod_spec.get("overhead")
    if isinstance(overhead, Mapping):
        _add_into(
            totals, {name: Quantity.parse(value) for name, value in overhead.items() if value is not None}
        )
    return totals
