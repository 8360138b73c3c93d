"""Label and field selectors with the grammar of ``k8s.io/apimachinery/pkg/labels``."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trainer_sandbox.apiserver.errors import APIError, bad_request


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!":
            return self.key not in labels
        if self.op in ("=", "in"):
            return self.key in labels and labels[self.key] in self.values
        # "!=" and "notin" match objects without the key, as Kubernetes does.
        return self.key not in labels or labels[self.key] not in self.values


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses (``a in (x,y),b`` is two requirements)."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


_SET_RE = re.compile(r"^(\S+)\s+(in|notin)\s*\((.*)\)$")


def parse_label_selector(text: str) -> list[Requirement]:
    reqs = []
    for part in _split_top(text or ""):
        m = _SET_RE.match(part)
        if m:
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(Requirement(m.group(1), m.group(2), values))
        elif "!=" in part:
            k, v = part.split("!=", 1)
            reqs.append(Requirement(k.strip(), "!=", frozenset([v.strip()])))
        elif "==" in part:
            k, v = part.split("==", 1)
            reqs.append(Requirement(k.strip(), "=", frozenset([v.strip()])))
        elif "=" in part:
            k, v = part.split("=", 1)
            reqs.append(Requirement(k.strip(), "=", frozenset([v.strip()])))
        elif part.startswith("!"):
            reqs.append(Requirement(part[1:].strip(), "!", frozenset()))
        elif re.fullmatch(r"[A-Za-z0-9./_-]+", part):
            reqs.append(Requirement(part, "exists", frozenset()))
        else:
            raise bad_request(f"unable to parse requirement: {part!r}")
    return reqs


def selector_from_label_selector(sel: Mapping[str, Any] | None) -> list[Requirement] | None:
    """A ``metav1.LabelSelector`` (webhook selectors); ``None`` for an absent selector (matches all)."""
    if not sel:
        return []
    reqs = [Requirement(k, "=", frozenset([v])) for k, v in (sel.get("matchLabels") or {}).items()]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for expr in sel.get("matchExpressions") or []:
        op = ops.get(expr.get("operator", ""))
        if op is None:
            raise APIError(
                400, "BadRequest", f"{expr.get('operator')!r} is not a valid label selector operator"
            )
        reqs.append(Requirement(expr["key"], op, frozenset(expr.get("values") or [])))
    return reqs


def labels_match(reqs: list[Requirement], labels: Mapping[str, str] | None) -> bool:
    labels = labels or {}
    return all(r.matches(labels) for r in reqs)


# Field selectors: the fields a real server supports for every kind, plus the few per built-in kind.
_COMMON_FIELDS = ("metadata.name", "metadata.namespace")
_KIND_FIELDS: dict[str, tuple[str, ...]] = {
    "pods": (
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    "events": (
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
        "regarding.kind",
        "regarding.name",
        "regarding.namespace",
        "regarding.uid",
    ),
    "secrets": ("type",),
    "namespaces": ("status.phase",),
    "jobs": ("status.successful",),
}


@dataclass(frozen=True)
class FieldRequirement:
    path: str
    negate: bool
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        cur: Any = obj
        for part in self.path.split("."):
            cur = cur.get(part) if isinstance(cur, Mapping) else None
        text = ("true" if cur else "false") if isinstance(cur, bool) else "" if cur is None else str(cur)
        return (text != self.value) if self.negate else (text == self.value)


def parse_field_selector(text: str, resource: str) -> list[FieldRequirement]:
    reqs = []
    allowed = _COMMON_FIELDS + _KIND_FIELDS.get(resource, ())
    for part in _split_top(text or ""):
        if "!=" in part:
            k, v = part.split("!=", 1)
            negate = True
        elif "==" in part:
            k, v = part.split("==", 1)
            negate = False
        elif "=" in part:
            k, v = part.split("=", 1)
            negate = False
        else:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        k = k.strip()
        if k not in allowed:
            raise bad_request(f"field label not supported: {k}")
        reqs.append(FieldRequirement(k, negate, v.strip()))
    return reqs


def make_filter(
    label_selector: str | None, field_selector: str | None, resource: str
) -> Callable[[Mapping[str, Any]], bool] | None:
    """One predicate for a list or watch; ``None`` when nothing filters (the fast path)."""
    labels = parse_label_selector(label_selector) if label_selector else []
    fields = parse_field_selector(field_selector, resource) if field_selector else []
    if not labels and not fields:
        return None

    def predicate(obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        return labels_match(labels, meta.get("labels")) and all(f.matches(obj) for f in fields)

    return predicate
