"""Server-side apply: field ownership in ``metadata.managedFields``, as structured-merge-diff does it.

An object's fields are flattened into paths (``f:spec``, ``f:containers``, ``k:{"name":"x"}``,
``v:"a"``, using the element names of the ``FieldsV1`` format). Each manager owns a set of paths:
an ``Apply`` owns what its last applied configuration set, an ``Update`` what its writes changed.
Applying a configuration that drops a field removes it from the object unless another manager
still owns it; setting a field another manager owns to a different value is a conflict unless
forced. This is what kubectl ``--server-side``, Helm 4 and the operator (field owner ``trainer``,
force) rely on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from trainer_sandbox.apiserver.errors import APIError
from trainer_sandbox.apiserver.schema import ANY, Schema, SchemaView, builtin_view

Path = tuple[str, ...]
ITEM = "."  # marker value of a list item or set member that is owned as such

# Fields the server maintains: never tracked, never applied.
_IGNORED_META = {
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
    "generateName",
}

_META_VIEW: SchemaView | None = None


def _meta_view() -> SchemaView:
    global _META_VIEW
    if _META_VIEW is None:
        pod = builtin_view("v1", "Pod")
        assert pod is not None
        meta = pod.field(pod.root, "metadata") or ANY
        _META_VIEW = SchemaView(meta, pod.definitions)
    return _META_VIEW


def flatten(obj: dict[str, Any], view: SchemaView, scope: str) -> dict[Path, Any]:
    """Leaf paths of ``obj`` with their values; ``scope`` is "main", "status" or "all"."""
    out: dict[Path, Any] = {}
    for key, value in obj.items():
        if key in ("apiVersion", "kind") or value is None:
            continue
        if scope == "main" and key == "status":
            continue
        if scope == "status" and key != "status":
            continue
        if key == "metadata" and isinstance(value, dict):
            mv = _meta_view()
            meta = {k: v for k, v in value.items() if k not in _IGNORED_META}
            if meta:
                _flatten_value(meta, mv, mv.root, ("f:metadata",), out)
            continue
        child = view.field(view.root, key) or ANY
        _flatten_value(value, view, child, ("f:" + key,), out)
    return out


def _flatten_value(value: Any, view: SchemaView, node: Schema, path: Path, out: dict[Path, Any]) -> None:
    if (
        isinstance(value, dict)
        and not view.is_atomic_map(node)
        and not node.get("x-kubernetes-int-or-string")
    ):
        if not value:
            out[path] = {}
            return
        for k, v in value.items():
            if v is None:
                continue
            _flatten_value(v, view, view.field(node, k) or ANY, (*path, "f:" + k), out)
        return
    if isinstance(value, list):
        lt = view.list_type(node) if node is not ANY else "atomic"
        if lt == "set" and all(not isinstance(v, (dict, list)) for v in value):
            if not value:
                out[path] = []
            for v in value:
                out[(*path, "v:" + json.dumps(v))] = ITEM
            return
        keys = view.map_keys(node)
        if lt == "map" and keys and all(isinstance(v, dict) for v in value):
            if not value:
                out[path] = []
            item_node = view.items(node)
            for item in value:
                ipath = (*path, item_key(item, keys, view, item_node))
                out[ipath] = ITEM
                for k, v in item.items():
                    if v is not None:
                        _flatten_value(v, view, view.field(item_node, k) or ANY, (*ipath, "f:" + k), out)
            return
    out[path] = value


def item_key(
    item: dict[str, Any], keys: list[str], view: SchemaView | None = None, item_node: Schema | None = None
) -> str:
    """The ``k:`` element naming a list-map item.

    A key field the item leaves out counts with its schema default, as the real server matches
    items: a container port applied without ``protocol`` is the stored ``TCP`` one, not a second
    port (the defaulted field itself stays unowned).
    """
    values = {}
    for key in keys:
        value = item.get(key)
        if value is None and view is not None and item_node is not None:
            value = (view.field(item_node, key) or {}).get("default")
        if value is not None:
            values[key] = value
    return "k:" + json.dumps(values, separators=(",", ":"))


# -- FieldsV1 encoding ------------------------------------------------------------------------
def to_fields_v1(paths: Iterable[Path]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    marked: list[dict[str, Any]] = []
    for path in sorted(paths):
        cur = tree
        for element in path:
            cur = cur.setdefault(element, {})
        marked.append(cur)
    # An owned node that also has owned children carries the "." member, as in FieldsV1.
    for node in marked:
        if node and "." not in node:
            node["."] = {}
    return tree


def from_fields_v1(tree: dict[str, Any], prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for element, sub in tree.items():
        if element == ".":
            out.add(prefix)
            continue
        path = (*prefix, element)
        if not sub:
            out.add(path)
        else:
            out |= from_fields_v1(sub, path)
    return out


# -- managers ---------------------------------------------------------------------------------
class Managed:
    """The managedFields entries of one object, as path sets keyed by (manager, operation, subresource)."""

    def __init__(self, entries: list[dict[str, Any]] | None) -> None:
        self.entries: list[dict[str, Any]] = []
        self.sets: list[set[Path]] = []
        for e in entries or []:
            if not isinstance(e, dict) or not e.get("manager"):
                continue
            self.entries.append(dict(e))
            self.sets.append(from_fields_v1(e.get("fieldsV1") or {}))

    def find(self, manager: str, operation: str, subresource: str) -> int:
        for i, e in enumerate(self.entries):
            if (e.get("manager"), e.get("operation"), e.get("subresource", "")) == (
                manager,
                operation,
                subresource,
            ):
                return i
        return -1

    def set_for(self, manager: str, operation: str, subresource: str) -> set[Path]:
        i = self.find(manager, operation, subresource)
        return set(self.sets[i]) if i >= 0 else set()

    def put(
        self, manager: str, operation: str, subresource: str, paths: set[Path], api_version: str, now: str
    ) -> None:
        i = self.find(manager, operation, subresource)
        if i < 0:
            entry: dict[str, Any] = {"manager": manager, "operation": operation}
            if subresource:
                entry["subresource"] = subresource
            self.entries.append(entry)
            self.sets.append(set())
            i = len(self.entries) - 1
        if self.sets[i] != paths or self.entries[i].get("apiVersion") != api_version:
            self.entries[i]["time"] = now
        self.entries[i]["apiVersion"] = api_version
        self.sets[i] = set(paths)

    def others_own(self, exclude: int, path: Path) -> bool:
        n = len(path)
        for i, s in enumerate(self.sets):
            if i == exclude:
                continue
            if path in s or any(len(p) > n and p[:n] == path for p in s):
                return True
        return False

    def render(self) -> list[dict[str, Any]]:
        out = []
        for e, s in zip(self.entries, self.sets, strict=True):
            if not s:
                continue
            entry = {
                "manager": e["manager"],
                "operation": e["operation"],
                "apiVersion": e.get("apiVersion", ""),
                "time": e.get("time", ""),
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(s),
            }
            if e.get("subresource"):
                entry["subresource"] = e["subresource"]
            out.append(entry)
        return out


def manager_from_user_agent(user_agent: str) -> str:
    """The manager name Kubernetes derives for writes without ``fieldManager``."""
    head = (user_agent or "unknown").split("/", 1)[0].strip()
    return head[:128] or "unknown"


def record_update(
    old: dict[str, Any] | None,
    new: dict[str, Any],
    view: SchemaView,
    manager: str,
    subresource: str,
    scope: str,
    api_version: str,
    now: str,
) -> list[dict[str, Any]]:
    """managedFields after a non-apply write: the writer takes the fields it changed."""
    managed = Managed((old or {}).get("metadata", {}).get("managedFields"))
    before = flatten(old, view, scope) if old else {}
    after = flatten(new, view, scope)
    changed = {p for p, v in after.items() if p not in before or before[p] != v}
    removed = set(before) - set(after)
    if not changed and not removed:
        return managed.render()
    me = managed.find(manager, "Update", subresource)
    for i, s in enumerate(managed.sets):
        if i != me:
            s -= changed | removed
    mine = (managed.set_for(manager, "Update", subresource) | changed) - removed
    managed.put(manager, "Update", subresource, mine, api_version, now)
    return managed.render()


def apply(
    live: dict[str, Any] | None,
    config: dict[str, Any],
    view: SchemaView,
    manager: str,
    force: bool,
    subresource: str,
    scope: str,
    api_version: str,
    now: str,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Apply ``config`` for ``manager``: the merged object and its new managedFields.

    Raises a 409 Conflict listing the contested fields unless ``force``.
    """
    config = _drop_nulls(config)
    if scope == "main":
        config.pop("status", None)
    elif scope == "status":
        config = {k: v for k, v in config.items() if k in ("apiVersion", "kind", "metadata", "status")}
        config["metadata"] = {
            k: v for k, v in (config.get("metadata") or {}).items() if k in ("name", "namespace")
        }
    managed = Managed((live or {}).get("metadata", {}).get("managedFields"))
    applied = flatten(config, view, scope)
    current = flatten(live, view, scope) if live else {}
    me = managed.find(manager, "Apply", subresource)

    conflicts: list[tuple[str, Path]] = []
    for i, (entry, owned) in enumerate(zip(managed.entries, managed.sets, strict=True)):
        if i == me or entry.get("manager") == manager:
            continue
        for path in owned & applied.keys():
            if path in current and current[path] != applied[path]:
                conflicts.append((str(entry["manager"]), path))
    if conflicts and not force:
        raise _conflict_error(conflicts)
    if conflicts:
        contested = {p for _, p in conflicts}
        for i, s in enumerate(managed.sets):
            if i != me:
                s -= contested

    merged = merge(json.loads(json.dumps(live)), config, view) if live else dict(config)
    previous = managed.set_for(manager, "Apply", subresource)
    removable = set()
    for path in previous - applied.keys():
        n = len(path)
        still_applied = any(len(p) > n and p[:n] == path for p in applied)
        if not still_applied and not managed.others_own(me, path):
            removable.add(path)
    # Remove whole items and fields, not their parts one by one (an item without its key is lost).
    for path in sorted(removable, key=len):
        if any(path[:cut] in removable for cut in range(1, len(path))):
            continue
        remove_path(merged, path)
        # Containers left empty by the removal go too (Kubernetes omits empty maps).
        for cut in range(len(path) - 1, 0, -1):
            parent = path[:cut]
            value = _lookup(merged, parent)
            if value in ({}, []) and parent not in applied and not managed.others_own(me, parent):
                remove_path(merged, parent)
            else:
                break
    managed.put(manager, "Apply", subresource, set(applied), api_version, now)
    return merged, managed.render()


def _conflict_error(conflicts: list[tuple[str, Path]]) -> APIError:
    causes = []
    lines = []
    for manager, path in conflicts:
        field = _render_path(path)
        causes.append(
            {"reason": "FieldManagerConflict", "message": f'conflict with "{manager}"', "field": field}
        )
        lines.append(f'conflict with "{manager}": {field}')
    if len(lines) == 1:
        message = f"Apply failed with 1 conflict: {lines[0]}"
    else:
        message = f"Apply failed with {len(lines)} conflicts: " + "\n".join(lines)
    return APIError(409, "Conflict", message, {"causes": causes})


def _render_path(path: Path) -> str:
    out = ""
    for element in path:
        kind, _, rest = element.partition(":")
        if kind == "f":
            out += "." + rest
        elif kind == "k":
            out += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in json.loads(rest).items()) + "]"
        elif kind == "v":
            out += f"[={rest}]"
        else:
            out += f"[{rest}]"
    return out


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def merge(live: dict[str, Any], config: dict[str, Any], view: SchemaView) -> dict[str, Any]:
    out = dict(live)
    for key, value in config.items():
        if key == "metadata" and isinstance(value, dict):
            mv = _meta_view()
            out[key] = _merge_value(out.get(key), value, mv, mv.root)
        else:
            out[key] = _merge_value(out.get(key), value, view, view.field(view.root, key) or ANY)
    return out


def _merge_value(live: Any, value: Any, view: SchemaView, node: Schema) -> Any:
    if isinstance(value, dict) and isinstance(live, dict) and not view.is_atomic_map(node):
        out = dict(live)
        for k, v in value.items():
            out[k] = _merge_value(live.get(k), v, view, view.field(node, k) or ANY)
        return out
    if isinstance(value, list) and isinstance(live, list) and node is not ANY:
        lt = view.list_type(node)
        keys = view.map_keys(node)
        if lt == "map" and keys and all(isinstance(v, dict) for v in value + live):
            item_node = view.items(node)
            merged = list(live)
            index = {item_key(item, keys, view, item_node): i for i, item in enumerate(merged)}
            for item in value:
                k = item_key(item, keys, view, item_node)
                if k in index:
                    merged[index[k]] = _merge_value(merged[index[k]], item, view, item_node)
                else:
                    index[k] = len(merged)
                    merged.append(item)
            return merged
        if lt == "set":
            return list(live) + [v for v in value if v not in live]
    return value


def remove_path(obj: Any, path: Path) -> None:
    """Remove the field, list item or set member at ``path`` (absent paths are ignored)."""
    cur = obj
    for element in path[:-1]:
        cur = _step(cur, element)
        if cur is None:
            return
    last = path[-1]
    kind, _, rest = last.partition(":")
    if kind == "f" and isinstance(cur, dict):
        cur.pop(rest, None)
    elif kind == "k" and isinstance(cur, list):
        want = json.loads(rest)
        cur[:] = [i for i in cur if not (isinstance(i, dict) and all(i.get(k) == v for k, v in want.items()))]
    elif kind == "v" and isinstance(cur, list):
        val = json.loads(rest)
        cur[:] = [i for i in cur if i != val]


def _lookup(obj: Any, path: Path) -> Any:
    cur = obj
    for element in path:
        cur = _step(cur, element)
        if cur is None:
            return None
    return cur


def _step(cur: Any, element: str) -> Any:
    kind, _, rest = element.partition(":")
    if kind == "f":
        return cur.get(rest) if isinstance(cur, dict) else None
    if kind == "k" and isinstance(cur, list):
        want = json.loads(rest)
        for item in cur:
            if isinstance(item, dict) and all(item.get(k) == v for k, v in want.items()):
                return item
    return None
