"""What every bench script shares: the machine it ran on, percentiles, and target lines.

Bench scripts are not tests: they print figures. A target line says the figure, the target,
PASS or MISS and by how much, so a reader (or a diff of two runs) sees the margin at once.
"""

from __future__ import annotations

import os
import platform
import statistics
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def machine() -> str:
    """One line naming the machine: CPU model and count, memory, OS, Python."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f", {kib / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return (
        f"machine: {cpu}, {os.cpu_count()} CPUs{memory}; {platform.system()} {platform.release()}; "
        f"Python {platform.python_version()} ({platform.python_implementation()})"
    )


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..100) of ``values``; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil without floats drifting
    return ordered[int(rank) - 1]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass
class Target:
    """A figure with an upper bound: ``value <= limit`` passes."""

    name: str
    value: float
    limit: float
    unit: str = ""
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.value <= self.limit

    def line(self) -> str:
        def fmt(x: float) -> str:
            return (
                f"{x:.3g}{self.unit}" if isinstance(x, float) and not x.is_integer() else f"{x:g}{self.unit}"
            )

        if self.passed:
            verdict = f"PASS (margin {fmt(self.limit - self.value)})"
        else:
            over = self.value - self.limit
            ratio = f", {self.value / self.limit:.2f}x" if self.limit else ""
            verdict = f"MISS by {fmt(over)}{ratio}"
        note = f"  [{self.note}]" if self.note else ""
        return f"TARGET {self.name}: {fmt(self.value)} <= {fmt(self.limit)}: {verdict}{note}"


@dataclass
class Report:
    """Collects target lines and prints them together at the end; exit code 1 on any miss."""

    targets: list[Target] = field(default_factory=list)

    def add(self, target: Target) -> Target:
        self.targets.append(target)
        print(target.line(), flush=True)
        return target

    def summary(self) -> int:
        print()
        print("targets:")
        for target in self.targets:
            print("  " + target.line())
        missed = [t for t in self.targets if not t.passed]
        print(f"{len(self.targets) - len(missed)} of {len(self.targets)} targets met")
        return 1 if missed else 0
