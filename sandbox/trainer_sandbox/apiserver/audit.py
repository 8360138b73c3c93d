"""Audit log: one record per request, to count API calls per client and derive RBAC."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class AuditRecord:
    user: str
    verb: str
    group: str
    version: str
    resource: str
    subresource: str
    namespace: str
    name: str
    method: str
    path: str
    content_type: str = ""
    user_agent: str = ""
    status: int = 0
    mutated: bool = False
    fault: str = ""
    time: float = field(default_factory=time.time)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class AuditLog:
    """Records are appended on the server's loop; read them from tests at any time."""

    def __init__(self) -> None:
        self.records: list[AuditRecord] = []

    def add(self, record: AuditRecord) -> None:
        self.records.append(record)

    def clear(self) -> None:
        self.records.clear()

    def select(self, **criteria: Any) -> list[AuditRecord]:
        """Records whose attributes equal every given value, e.g. ``select(user="admin", verb="list")``."""
        out = list(self.records)
        for key, want in criteria.items():
            out = [r for r in out if getattr(r, key) == want]
        return out

    def count(self, **criteria: Any) -> int:
        return len(self.select(**criteria))

    def by_user(self) -> Counter[str]:
        return Counter(r.user for r in list(self.records))

    def by_verb(self, user: str | None = None) -> Counter[str]:
        return Counter(r.verb for r in list(self.records) if user is None or r.user == user)

    def rbac_rules(self, user: str) -> list[dict[str, Any]]:
        """The RBAC rules that would allow everything ``user`` did: (group, resource) -> verbs."""
        verbs: dict[tuple[str, str], set[str]] = {}
        for r in list(self.records):
            if r.user != user or not r.resource:
                continue
            res = f"{r.resource}/{r.subresource}" if r.subresource else r.resource
            verbs.setdefault((r.group, res), set()).add(r.verb)
        return [
            {"apiGroups": [g], "resources": [res], "verbs": sorted(v)}
            for (g, res), v in sorted(verbs.items())
        ]
