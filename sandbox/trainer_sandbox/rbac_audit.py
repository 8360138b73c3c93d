"""The operator's RBAC as the audit log shows it: audit records in, permissions and rules out.

The chart's ClusterRole is derived from what the operator and its plugins declare they read and
build (``charts/tools/sync_chart.py``); this reads what the operator really did in the chart's
audited test run (``tests/chart``), plus the permissions the API server's admission checks imply
for what it wrote (an ownerReference with ``blockOwnerDeletion`` needs ``update`` on the owner's
``finalizers`` subresource where OwnerReferencesPermissionEnforcement is enabled; a server-side
apply that creates its object, audited as a ``patch`` answered 201, needs ``create`` as well). A
test fails when the two differ in either direction; ``charts/tools/audit_rbac.py`` prints both.

A permission here is one ``(apiGroup, resource, verb)`` triple, ``resource`` being
``plural`` or ``plural/subresource``. Rules are grouped the way a reviewer reads them: one rule per
API group and verb set, resources sorted.

This is test and tooling code, not the operator's, so it lives in the sandbox's distribution, with
the control planes whose audit logs it reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

Permission = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)
Rule = dict[str, list[str]]

# Verbs of the RBAC API; anything else in a record (or a rule) is a mistake worth failing on.
VERBS = frozenset({"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"})


class AuditRecordLike(Protocol):
    user: str
    verb: str
    group: str
    resource: str
    subresource: str
    status: int


@dataclass(frozen=True)
class OwnerKind:
    """How an owner's apiVersion and kind map to its API group and plural."""

    group: str
    plural: str


def permissions_from_audit(records: Iterable[AuditRecordLike], user: str) -> set[Permission]:
    """Every (group, resource, verb) ``user`` exercised; non-resource requests (discovery) are not RBAC
    on resources and are allowed to every authenticated user by the default ``system:discovery`` role."""
    found: set[Permission] = set()
    for record in records:
        if record.user != user or not record.resource:
            continue
        if record.verb not in VERBS:
            raise ValueError(f"unexpected verb {record.verb!r} in the audit log")
        resource = f"{record.resource}/{record.subresource}" if record.subresource else record.resource
        found.add((record.group, resource, record.verb))
        if record.verb == "patch" and record.status == 201:
            # A server-side apply that created its object: the API server authorizes it as a patch
            # and then asks for create too (403 without it), while the audit log says patch only.
            found.add((record.group, resource, "create"))
    return found


def owner_finalizer_permissions(
    created: Iterable[Mapping[str, Any]], owners: Mapping[tuple[str, str], OwnerKind]
) -> set[Permission]:
    """What OwnerReferencesPermissionEnforcement asks of the objects a client created.

    Setting ``blockOwnerDeletion`` on an ownerReference requires ``update`` on the owner's
    ``finalizers`` subresource. ``owners`` maps ``(apiVersion, kind)`` to the owner's resource;
    an owner kind missing from it is an error (the caller must say what it is).
    """
    found: set[Permission] = set()
    for obj in created:
        for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
            if not ref.get("blockOwnerDeletion"):
                continue
            key = (str(ref.get("apiVersion", "")), str(ref.get("kind", "")))
            if key not in owners:
                raise KeyError(f"no resource known for owner kind {key}")
            owner = owners[key]
            found.add((owner.group, f"{owner.plural}/finalizers", "update"))
    return found


def permissions_from_rules(rules: Iterable[Mapping[str, Any]]) -> set[Permission]:
    """Expand ClusterRole rules into permissions; wildcards, resourceNames and nonResourceURLs are refused
    (the chart must name exactly what it grants)."""
    found: set[Permission] = set()
    for rule in rules:
        if rule.get("nonResourceURLs") or rule.get("resourceNames"):
            raise ValueError(f"rule {dict(rule)} is narrower or wider than (group, resource, verb)")
        groups, resources, verbs = (list(rule.get(k) or []) for k in ("apiGroups", "resources", "verbs"))
        for value in (*groups, *resources, *verbs):
            if "*" in value:
                raise ValueError(f"wildcard {value!r} in rule {dict(rule)}")
        for verb in verbs:
            if verb not in VERBS:
                raise ValueError(f"unknown verb {verb!r} in rule {dict(rule)}")
        found.update((g, r, v) for g in groups for r in resources for v in verbs)
    return found


def rules_from_permissions(permissions: Iterable[Permission]) -> list[Rule]:
    """Compact permissions into rules: per API group, resources that share a verb set share a rule."""
    verbs_of: dict[tuple[str, str], set[str]] = {}
    for group, resource, verb in permissions:
        verbs_of.setdefault((group, resource), set()).add(verb)
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (group, resource), verbs in verbs_of.items():
        grouped.setdefault((group, tuple(sorted(verbs))), []).append(resource)
    return [
        {"apiGroups": [group], "resources": sorted(resources), "verbs": list(verbs)}
        for (group, verbs), resources in sorted(
            grouped.items(), key=lambda item: (item[0][0], sorted(item[1]))
        )
    ]


def describe(permissions: Iterable[Permission]) -> list[str]:
    """One readable line per permission, sorted, e.g. ``patch jobsets.jobset.x-k8s.io``."""
    lines = []
    for group, resource, verb in sorted(permissions):
        main, _, sub = resource.partition("/")
        name = f"{main}.{group}" if group else main
        lines.append(f"{verb} {name}{'/' + sub if sub else ''}")
    return lines


def render_rules_yaml(rules: Iterable[Rule], indent: int = 2) -> str:
    """Rules as block YAML in flow lists (one line per field), the way the chart's template writes them."""
    pad = " " * indent
    out = []
    for rule in rules:
        groups = ", ".join(f'"{g}"' for g in rule["apiGroups"])
        out.append(f"{pad}- apiGroups: [{groups}]")
        out.append(f"{pad}  resources: [{', '.join(rule['resources'])}]")
        out.append(f"{pad}  verbs: [{', '.join(rule['verbs'])}]")
    return "\n".join(out) + "\n"
