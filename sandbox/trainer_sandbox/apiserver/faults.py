"""Fault injection, seeded and bounded, selected per user, verb and resource.

A rule fires with probability ``rate`` on matching requests until its ``budget`` is spent. Kinds:

- ``latency``: delay the request by ``latency`` seconds.
- ``429``: refuse with 429 and ``Retry-After`` before touching storage.
- ``500``: refuse with 500 before touching storage.
- ``500-after``: perform the write, then answer 500 (the write happened, the response is lost).
- ``409``: a stale-resourceVersion conflict, only on writes that carry a resourceVersion precondition
  (update, or a patch whose body has ``metadata.resourceVersion``), the only place a real server
  returns it.
- ``drop-watch``: end a watch stream after ``after`` seconds, as a load balancer would.
- ``expire-watch``: answer a watch with a 410 Expired ERROR event.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

KINDS = ("latency", "429", "500", "500-after", "409", "drop-watch", "expire-watch")


@dataclass
class FaultRule:
    kind: str
    rate: float = 1.0
    budget: int | None = None
    users: frozenset[str] | None = None
    verbs: frozenset[str] | None = None
    resources: frozenset[str] | None = None
    latency: float = 0.05
    retry_after: int = 1
    after: float = 0.5
    fired: int = field(default=0)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; one of {', '.join(KINDS)}")

    def matches(self, user: str, verb: str, resource: str) -> bool:
        if self.budget is not None and self.fired >= self.budget:
            return False
        return (
            (self.users is None or user in self.users)
            and (self.verbs is None or verb in self.verbs)
            and (self.resources is None or resource in self.resources)
        )


class Faults:
    """The fault rules of one server; ``seed`` makes a run reproducible."""

    def __init__(self, seed: int = 0) -> None:
        self.rules: list[FaultRule] = []
        self.random = random.Random(seed)

    def seed(self, seed: int) -> None:
        self.random = random.Random(seed)

    def add(
        self,
        kind: str,
        *,
        rate: float = 1.0,
        budget: int | None = None,
        users: list[str] | None = None,
        verbs: list[str] | None = None,
        resources: list[str] | None = None,
        latency: float = 0.05,
        retry_after: int = 1,
        after: float = 0.5,
    ) -> FaultRule:
        rule = FaultRule(
            kind,
            rate,
            budget,
            frozenset(users) if users is not None else None,
            frozenset(verbs) if verbs is not None else None,
            frozenset(resources) if resources is not None else None,
            latency,
            retry_after,
            after,
        )
        self.rules.append(rule)
        return rule

    def clear(self) -> None:
        self.rules.clear()

    def draw(self, kinds: tuple[str, ...], user: str, verb: str, resource: str) -> FaultRule | None:
        """The first rule of one of ``kinds`` that fires for this request (and spend its budget)."""
        for rule in self.rules:
            if rule.kind in kinds and rule.matches(user, verb, resource) and self.random.random() < rule.rate:
                rule.fired += 1
                return rule
        return None
