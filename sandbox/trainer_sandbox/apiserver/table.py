"""``as=Table`` responses, so ``kubectl get`` shows a CRD's additionalPrinterColumns."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
from typing import Any

from trainer_sandbox.apiserver.resources import ResourceType

_NAME_COL = {"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}
_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}

_BUILTIN_COLUMNS: dict[str, list[dict[str, Any]]] = {
    "pods": [
        {"name": "Ready", "type": "string", "special": "pod-ready"},
        {"name": "Status", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Restarts", "type": "integer", "special": "pod-restarts"},
        _AGE,
    ],
    "jobs": [
        {"name": "Status", "type": "string", "special": "job-status"},
        {"name": "Completions", "type": "string", "special": "job-completions"},
        _AGE,
    ],
    "namespaces": [{"name": "Status", "type": "string", "jsonPath": ".status.phase"}, _AGE],
    "configmaps": [{"name": "Data", "type": "integer", "special": "data-count"}, _AGE],
    "secrets": [
        {"name": "Type", "type": "string", "jsonPath": ".type"},
        {"name": "Data", "type": "integer", "special": "data-count"},
        _AGE,
    ],
    "services": [
        {"name": "Type", "type": "string", "jsonPath": ".spec.type"},
        {"name": "Cluster-IP", "type": "string", "jsonPath": ".spec.clusterIP"},
        _AGE,
    ],
    "events": [
        {"name": "Type", "type": "string", "jsonPath": ".type"},
        {"name": "Reason", "type": "string", "jsonPath": ".reason"},
        {"name": "Object", "type": "string", "special": "event-object"},
        {"name": "Message", "type": "string", "jsonPath": ".message"},
        _AGE,
    ],
    "customresourcedefinitions": [
        {"name": "Created At", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    ],
}


def columns_for(rt: ResourceType) -> list[dict[str, Any]]:
    if not rt.builtin:
        return rt.printer_columns or [_AGE]
    return _BUILTIN_COLUMNS.get(rt.plural, [_AGE])


def table(
    rt: ResourceType, objects: list[dict[str, Any]], resource_version: str, include: str
) -> dict[str, Any]:
    cols = columns_for(rt)
    definitions = [_NAME_COL] + [
        {
            "name": c["name"],
            "type": c.get("type", "string"),
            "format": c.get("format", ""),
            "description": c.get("description", ""),
            "priority": c.get("priority", 0),
        }
        for c in cols
    ]
    rows = [row(rt, obj, cols, include) for obj in objects]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    }


def row(rt: ResourceType, obj: dict[str, Any], cols: list[dict[str, Any]], include: str) -> dict[str, Any]:
    cells: list[Any] = [obj.get("metadata", {}).get("name", "")]
    for c in cols:
        cells.append(_cell(obj, c))
    out: dict[str, Any] = {"cells": cells}
    if include == "Object":
        out["object"] = obj
    elif include != "None":
        out["object"] = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata", {}),
        }
    return out


def _cell(obj: dict[str, Any], col: dict[str, Any]) -> Any:
    special = col.get("special")
    if special:
        return _special(obj, special)
    values = jsonpath(obj, col.get("jsonPath", ""))
    if not values:
        return None
    value = values[0] if len(values) == 1 else ",".join(_text(v) for v in values)
    if col.get("type") == "date" and isinstance(value, str):
        return _age(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return value


def _text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def _age(ts: str) -> str:
    try:
        created = dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return ts
    secs = int((dt.datetime.now(dt.UTC) - created).total_seconds())
    if secs < 120:
        return f"{max(secs, 0)}s"
    if secs < 7200:
        return f"{secs // 60}m"
    if secs < 172800:
        return f"{secs // 3600}h"
    return f"{secs // 86400}d"


def _special(obj: dict[str, Any], which: str) -> Any:
    status = obj.get("status") or {}
    if which == "pod-ready":
        total = len((obj.get("spec") or {}).get("containers") or [])
        ready = sum(1 for c in status.get("containerStatuses") or [] if c.get("ready"))
        return f"{ready}/{total}"
    if which == "pod-restarts":
        return sum(int(c.get("restartCount", 0)) for c in status.get("containerStatuses") or [])
    if which == "job-status":
        for cond in status.get("conditions") or []:
            if cond.get("status") == "True" and cond.get("type") in ("Complete", "Failed", "Suspended"):
                return str(cond["type"])
        return "Running"
    if which == "job-completions":
        return f"{status.get('succeeded', 0)}/{(obj.get('spec') or {}).get('completions', 1)}"
    if which == "event-object":
        ref = obj.get("involvedObject") or obj.get("regarding") or {}
        return f"{str(ref.get('kind', '')).lower()}/{ref.get('name', '')}"
    if which == "data-count":
        return len(obj.get("data") or {}) + len(obj.get("binaryData") or {})
    return None


# -- a JSONPath subset: .a.b, [n], [-1:], [*], [?(@.k=="v")] -----------------------------------
_TOKEN = re.compile(r"\.((?:\\.|[^.\[\]\\])+)|\[([^\]]*)\]")


def jsonpath(obj: Any, path: str) -> list[Any]:
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    if path.startswith("$"):
        path = path[1:]
    current = [obj]
    pos = 0
    while pos < len(path):
        m = _TOKEN.match(path, pos)
        if not m:
            return []
        pos = m.end()
        nxt: list[Any] = []
        if m.group(1) is not None:
            key = re.sub(r"\\(.)", r"\1", m.group(1))
            for c in current:
                if isinstance(c, dict) and key in c:
                    nxt.append(c[key])
        else:
            nxt = _bracket(current, m.group(2).strip())
        current = nxt
    return [c for c in current if c is not None]


_FILTER = re.compile(r"^\?\(@\.([A-Za-z0-9_.\-]+)\s*(==|!=)\s*['\"]?(.*?)['\"]?\)$")


def _bracket(current: list[Any], expr: str) -> list[Any]:
    out: list[Any] = []
    fm = _FILTER.match(expr)
    for c in current:
        if not isinstance(c, list):
            if isinstance(c, dict) and expr.strip("'\"") in c:
                out.append(c[expr.strip("'\"")])
            continue
        if expr == "*":
            out.extend(c)
        elif fm:
            key, op, want = fm.groups()
            for item in c:
                got = item
                for part in key.split("."):
                    got = got.get(part) if isinstance(got, dict) else None
                text = _text(got) if got is not None else ""
                if (text == want) == (op == "=="):
                    out.append(item)
        elif ":" in expr:
            a, _, b = expr.partition(":")
            out.extend(c[int(a) if a else None : int(b) if b else None])
        else:
            with contextlib.suppress(ValueError, IndexError):
                out.append(c[int(expr)])
    return out
