"""Kubernetes strategic merge patch (``k8s.io/apimachinery/pkg/util/strategicpatch``), standard library only.

Why: TrainJob ``runtimePatches`` are applied to the runtime's JobSet spec with strategic-merge semantics
(docs/upstream-behaviour.md §runtime-patches, §strategic-merge), and the in-memory API server must
accept ``application/strategic-merge-patch+json`` for built-in kinds (docs/upstream-behaviour.md
§local-apiserver).  Both need the same engine; they differ only in how they learn which lists are
merged by which key, so that knowledge is a parameter (:data:`MergeKeys`).  The ``trainer render``
CLI imports this module, hence no third-party imports.

Semantics, following upstream ``mergeMap`` / ``mergeSlice`` with the API server's options
(``MergeParallelList``, ``IgnoreUnmatchedNulls``):

* maps merge key by key, recursively; a ``null`` in the patch deletes the key; scalars (and values whose
  JSON type differs from the original's) are replaced;
* a list is replaced wholesale unless the resolver says ``("merge", key)``; then items are matched by the
  value of ``key`` (first match), matched items are merged recursively and unmatched ones appended;
  ``("merge", None)`` merges lists of scalars as a set union (e.g. ``metadata.finalizers``);
* order of a merged list: patch items in patch order, and each original-only item is inserted before the
  first patch item that comes later than it in the original list (``mergeSortedSlice`` upstream);
  e.g. original ``[INIT_ENV, DATASET_PATH]`` + patch ``[INIT_ENV, NEW_VALUE]`` gives
  ``[INIT_ENV, NEW_VALUE, DATASET_PATH]``;
* directives: ``$patch: replace`` in a map or as a list item replaces the map / list wholesale;
  ``$patch: delete`` in a list item removes the items with that key, and in a map removes the map (its
  key disappears from the parent; upstream leaves an empty ``{}``, which decodes to the same object for
  the optional structs this is used on); ``$retainKeys: [...]`` drops the original keys not listed;
  ``$setElementOrder/<list>`` imposes the final order of a merged list (kubectl client-side apply);
  ``$deleteFromPrimitiveList/<list>`` removes scalars from a merged scalar list.
* values the patch introduces (no counterpart in the original) are cleaned the same way: ``null``
  members are dropped and directives are interpreted, so no ``$patch`` key ever reaches the output.

Inputs are never mutated; the result is made of fresh dicts and lists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, TypeGuard

__all__ = [
    "MergeKeys",
    "jobset_merge_keys",
    "merge_keys_from_openapi",
    "strategic_merge",
]

MergeKeys = Callable[[tuple[str, ...]], tuple[str, str | None] | None]
"""Patch metadata for a field, given its path of field names (list indexes omitted).

For a list field: ``("merge", "<key>")`` merges items by that key, ``("merge", None)`` merges a list of
scalars as a set, and ``None`` / ``("replace", None)`` replaces the list atomically.  For a map field:
``("replace", None)`` replaces the map atomically; anything else (normally ``None``) merges it.
"""

PATCH_DIRECTIVE: Final = "$patch"
RETAIN_KEYS_DIRECTIVE: Final = "$retainKeys"
SET_ELEMENT_ORDER_PREFIX: Final = "$setElementOrder/"
DELETE_FROM_PRIMITIVE_LIST_PREFIX: Final = "$deleteFromPrimitiveList/"


class _Deleted:
    """Marker returned when a patched map carries ``$patch: delete``."""

    __slots__ = ()


_DELETED: Final = _Deleted()


class _Missing:
    """Identity of a list item that lacks the merge key; equal to nothing but itself."""

    __slots__ = ()


_MISSING: Final = _Missing()


def _format_path(path: tuple[str, ...]) -> str:
    return ".".join(path) if path else "<root>"


def _is_list(value: object) -> TypeGuard[list[Any] | tuple[Any, ...]]:
    return isinstance(value, list | tuple)


def _copy(value: Any) -> Any:
    """A fresh deep copy of a JSON-like value (mappings become dicts, sequences become lists)."""
    if isinstance(value, Mapping):
        return {key: _copy(item) for key, item in value.items()}
    if _is_list(value):
        return [_copy(item) for item in value]
    return value


def _is_directive_key(key: str) -> bool:
    return (
        key in (PATCH_DIRECTIVE, RETAIN_KEYS_DIRECTIVE)
        or key.startswith(SET_ELEMENT_ORDER_PREFIX)
        or key.startswith(DELETE_FROM_PRIMITIVE_LIST_PREFIX)
    )


def _wants_merge(strategy: tuple[str, str | None] | None) -> bool:
    # Accept upstream-style combined strategies such as "merge,retainKeys".
    return strategy is not None and "merge" in strategy[0].split(",")


def _wants_replace(strategy: tuple[str, str | None] | None) -> bool:
    return strategy is not None and "replace" in strategy[0].split(",")


# ------------------------------------------------------------------------------------------ engine


def strategic_merge(
    original: Mapping[str, Any],
    patch: Mapping[str, Any],
    merge_keys: MergeKeys,
    *,
    path: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Apply a strategic merge ``patch`` to ``original`` and return the result as a new dict.

    ``path`` is the path of ``original`` itself inside the document that ``merge_keys`` describes, for
    callers that patch a sub-object.  A top-level ``$patch: delete`` yields ``{}``.  Malformed patches
    (unknown ``$patch`` values, keyed-list items without their merge key, objects in a scalar set...)
    raise ``ValueError``.
    """
    merged = _merge_map(original, patch, path, merge_keys)
    if isinstance(merged, _Deleted):
        return {}
    return merged


def _merge_map(
    original: Mapping[str, Any] | None,
    patch: Mapping[str, Any],
    path: tuple[str, ...],
    merge_keys: MergeKeys,
) -> dict[str, Any] | _Deleted:
    if PATCH_DIRECTIVE in patch:
        directive = patch[PATCH_DIRECTIVE]
        if directive == "replace":
            without_directive = {key: value for key, value in patch.items() if key != PATCH_DIRECTIVE}
            return _merge_map(None, without_directive, path, merge_keys)
        if directive == "delete":
            return _DELETED
        raise ValueError(f"unknown $patch directive {directive!r} in the map at {_format_path(path)}")

    result: dict[str, Any] = {key: _copy(value) for key, value in (original or {}).items()}

    if RETAIN_KEYS_DIRECTIVE in patch:
        retained = patch[RETAIN_KEYS_DIRECTIVE]
        if not _is_list(retained):
            raise ValueError(f"$retainKeys at {_format_path(path)} must be a list of field names")
        result = {key: value for key, value in result.items() if key in retained}

    for key, values in patch.items():
        if not key.startswith(DELETE_FROM_PRIMITIVE_LIST_PREFIX):
            continue
        field = key[len(DELETE_FROM_PRIMITIVE_LIST_PREFIX) :]
        if not _is_list(values):
            raise ValueError(f"{key} at {_format_path(path)} must be a list")
        current = result.get(field)
        if _is_list(current):
            result[field] = [item for item in current if item not in values]

    ordered_fields: set[str] = set()
    for key, order in patch.items():
        if not key.startswith(SET_ELEMENT_ORDER_PREFIX):
            continue
        field = key[len(SET_ELEMENT_ORDER_PREFIX) :]
        if not _is_list(order):
            raise ValueError(f"{key} at {_format_path(path)} must be a list")
        if _apply_element_order(result, patch, field, list(order), (*path, field), merge_keys):
            ordered_fields.add(field)

    for key, patch_value in patch.items():
        if _is_directive_key(key) or key in ordered_fields:
            continue
        if patch_value is None:
            result.pop(key, None)
            continue
        child_path = (*path, key)
        if key not in result:
            _store(result, key, _clean(patch_value, child_path, merge_keys))
            continue
        original_value = result[key]
        if isinstance(original_value, Mapping) and isinstance(patch_value, Mapping):
            if _wants_replace(merge_keys(child_path)):
                _store(result, key, _merge_map(None, patch_value, child_path, merge_keys))
            else:
                _store(result, key, _merge_map(original_value, patch_value, child_path, merge_keys))
        elif _is_list(original_value) and _is_list(patch_value):
            result[key] = _merge_list(list(original_value), list(patch_value), child_path, merge_keys)
        else:
            _store(result, key, _clean(patch_value, child_path, merge_keys))
    return result


def _store(result: dict[str, Any], key: str, value: Any) -> None:
    if isinstance(value, _Deleted):
        result.pop(key, None)
    else:
        result[key] = value


def _clean(value: Any, path: tuple[str, ...], merge_keys: MergeKeys) -> Any:
    """A patch value that has nothing to merge with: drop nulls, interpret directives, copy."""
    if isinstance(value, Mapping):
        return _merge_map(None, value, path, merge_keys)
    if _is_list(value):
        return _merge_list([], list(value), path, merge_keys)
    return value


def _merge_list(
    original: list[Any],
    patch: list[Any],
    path: tuple[str, ...],
    merge_keys: MergeKeys,
) -> list[Any]:
    strategy = merge_keys(path)
    if not _wants_merge(strategy):
        return _replace_list(patch, path, merge_keys)
    assert strategy is not None
    key = strategy[1]
    if key is None:
        return _merge_scalar_list(original, patch, path)
    return _merge_keyed_list(original, patch, key, path, merge_keys)


def _replace_list(patch: list[Any], path: tuple[str, ...], merge_keys: MergeKeys) -> list[Any]:
    """An atomic list: the patch list wins; directive-only items are meaningless here and dropped."""
    result: list[Any] = []
    for item in patch:
        if isinstance(item, Mapping) and PATCH_DIRECTIVE in item:
            continue
        cleaned = _clean(item, path, merge_keys)
        if not isinstance(cleaned, _Deleted):
            result.append(cleaned)
    return result


def _merge_scalar_list(original: list[Any], patch: list[Any], path: tuple[str, ...]) -> list[Any]:
    for item in (*original, *patch):
        if isinstance(item, Mapping) or _is_list(item):
            raise ValueError(f"cannot merge lists without merge key for {_format_path(path)}")
    merged: list[Any] = []
    for item in (*original, *patch):
        if item not in merged:
            merged.append(item)
    return _normalize_order(merged, patch, original, identity=lambda item: _identity(item, None))


def _merge_keyed_list(
    original: list[Any],
    patch: list[Any],
    key: str,
    path: tuple[str, ...],
    merge_keys: MergeKeys,
) -> list[Any]:
    base = [_copy(item) for item in original]
    regular: list[Mapping[str, Any]] = []
    replace = False
    for item in patch:
        if not isinstance(item, Mapping):
            raise ValueError(
                f"items of {_format_path(path)} are merged by {key!r} and must be objects, got {item!r}"
            )
        if PATCH_DIRECTIVE not in item:
            if key not in item:
                raise ValueError(f"an item of {_format_path(path)} in the patch has no merge key {key!r}")
            regular.append(item)
            continue
        directive = item[PATCH_DIRECTIVE]
        if directive == "delete":
            if key not in item:
                raise ValueError(f"a $patch: delete item of {_format_path(path)} has no merge key {key!r}")
            base = [existing for existing in base if _identity(existing, key) != item[key]]
        elif directive == "replace":
            replace = True  # keep scanning: other directive items are still dropped
        elif directive == "merge":
            raise ValueError(f"merging lists cannot yet be specified in the patch ({_format_path(path)})")
        else:
            raise ValueError(f"unknown $patch directive {directive!r} in {_format_path(path)}")

    if replace:
        return [_merge_map(None, item, path, merge_keys) for item in regular]

    merged = list(base)
    for item in regular:
        position = _index_of([_identity(existing, key) for existing in merged], item[key])
        if position is None:
            merged.append(_merge_map(None, item, path, merge_keys))
        else:
            merged[position] = _merge_map(merged[position], item, path, merge_keys)
    return _normalize_order(merged, regular, base, identity=lambda item: _identity(item, key))


def _identity(item: Any, key: str | None) -> Any:
    """What a list item is matched by: its merge-key value, or the item itself in a scalar set."""
    if key is None:
        return item
    if isinstance(item, Mapping) and key in item:
        return item[key]
    return _MISSING


def _index_of(identities: list[Any], wanted: Any) -> int | None:
    """First position of ``wanted`` (compared with ``==``; identities may be unhashable)."""
    if wanted is _MISSING:
        return None
    for position, identity in enumerate(identities):
        if identity is not _MISSING and identity == wanted:
            return position
    return None


def _normalize_order(
    merged: list[Any],
    patch_order: list[Any],
    server_order: list[Any],
    *,
    identity: Callable[[Any], Any],
) -> list[Any]:
    """Order ``merged`` like upstream ``normalizeElementOrder``.

    Items present in ``patch_order`` come in that order; the others (server-only items) keep their
    ``server_order``; the two sequences are then interleaved by ``mergeSortedSlice``: a server-only item
    is emitted before the next patch item only if both appear in ``server_order`` and the server-only
    item comes first there.
    """
    patch_ids = [identity(item) for item in patch_order]
    server_ids = [identity(item) for item in server_order]

    def server_position(item: Any) -> int | None:
        return _index_of(server_ids, identity(item))

    patch_items: list[tuple[int, Any]] = []
    server_items: list[tuple[int, Any]] = []
    unplaced = len(merged) + len(server_ids)
    for item in merged:
        patch_position = _index_of(patch_ids, identity(item))
        if patch_position is not None:
            patch_items.append((patch_position, item))
        else:
            position = server_position(item)
            server_items.append((unplaced if position is None else position, item))
    # list.sort is stable, so ties keep their order in ``merged``.
    patch_items.sort(key=lambda pair: pair[0])
    server_items.sort(key=lambda pair: pair[0])
    right = [item for _, item in patch_items]
    left = [item for _, item in server_items]

    result: list[Any] = []
    i = j = 0
    while i < len(left) or j < len(right):
        if i >= len(left):
            result.append(right[j])
            j += 1
        elif j >= len(right):
            result.append(left[i])
            i += 1
        else:
            left_position = server_position(left[i])
            right_position = server_position(right[j])
            if left_position is not None and right_position is not None and left_position < right_position:
                result.append(left[i])
                i += 1
            else:
                result.append(right[j])
                j += 1
    return result


def _apply_element_order(
    result: dict[str, Any],
    patch: Mapping[str, Any],
    field: str,
    order: list[Any],
    path: tuple[str, ...],
    merge_keys: MergeKeys,
) -> bool:
    """Handle ``$setElementOrder/<field>``: merge the field, then order it by ``order``.

    Returns True when the field was fully handled here (so the main loop must skip it).  The directive
    is ignored for atomic lists (the patch list, if any, replaces the original anyway), when the patch
    deletes the field, and when neither side has the list.
    """
    strategy = merge_keys(path)
    if not _wants_merge(strategy):
        return False
    assert strategy is not None
    key = strategy[1]
    patch_list = patch.get(field, _MISSING)
    if patch_list is None:
        return False
    current = result.get(field)
    base: list[Any] = list(current) if _is_list(current) else []
    if _is_list(patch_list):
        merged = _merge_list(base, list(patch_list), path, merge_keys)
    elif _is_list(current):
        merged = base
    else:
        return False

    result[field] = _normalize_order(merged, order, base, identity=lambda item: _identity(item, key))
    return True


# ------------------------------------------------------------------------------ JobSet merge keys

# List fields of a core PodSpec carrying ``patchStrategy:"merge"`` (k8s.io/api/core/v1 types.go).
_POD_SPEC_LIST_KEYS: Final[Mapping[str, str]] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "imagePullSecrets": "name",
    "schedulingGates": "name",
    "resourceClaims": "name",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
}

# List fields of a core Container / EphemeralContainer, relative to the container.
_CONTAINER_LIST_KEYS: Final[Mapping[tuple[str, ...], str]] = {
    ("env",): "name",
    ("ports",): "containerPort",
    ("volumeMounts",): "mountPath",
    ("volumeDevices",): "devicePath",
    # Not a patch key in core (listType=map only), but resourcesPerNode claims merge by name
    # (docs/upstream-behaviour.md §resources-merge).
    ("resources", "claims"): "name",
}

_CONTAINER_FIELDS: Final = frozenset({"containers", "initContainers", "ephemeralContainers"})


def _object_meta_merge_keys(rest: tuple[str, ...]) -> tuple[str, str | None] | None:
    """ObjectMeta lists: ``finalizers`` is a merged set, ``ownerReferences`` merge by ``uid``."""
    if rest == ("finalizers",):
        return ("merge", None)
    if rest == ("ownerReferences",):
        return ("merge", "uid")
    return None


def jobset_merge_keys(path: tuple[str, ...]) -> tuple[str, str | None] | None:
    """Merge keys for a JobSet spec, the target of TrainJob ``runtimePatches``
    (docs/upstream-behaviour.md §runtime-patches, §strategic-merge).

    ``replicatedJobs`` merge by ``name``; inside each replicated job the Job template follows the core
    types' patch tags: in the pod spec ``containers``, ``initContainers``, ``ephemeralContainers``,
    ``volumes``, ``imagePullSecrets``, ``schedulingGates`` and ``resourceClaims`` by ``name``,
    ``hostAliases`` by ``ip``, ``topologySpreadConstraints`` by ``topologyKey``; in containers ``env`` by
    ``name``, ``ports`` by ``containerPort``, ``volumeMounts`` by ``mountPath``, ``volumeDevices`` by
    ``devicePath``.  Every other list (``tolerations``, ``command``, ``args``, ``nodeSelectorTerms``,
    ``volumeClaimPolicies``...) is atomic.

    The path may be rooted at the JobSetSpec (``("replicatedJobs", ...)``) or at any object that embeds
    one (``("spec", "replicatedJobs", ...)``, ``("spec", "template", "spec", "replicatedJobs", ...)``):
    everything before the first ``replicatedJobs`` is ignored.
    """
    if "replicatedJobs" not in path:
        return None
    rest = path[path.index("replicatedJobs") + 1 :]
    if not rest:
        return ("merge", "name")
    if rest[:2] == ("template", "metadata"):
        return _object_meta_merge_keys(rest[2:])
    if rest[:4] == ("template", "spec", "template", "metadata"):
        return _object_meta_merge_keys(rest[4:])
    if rest[:4] != ("template", "spec", "template", "spec"):
        return None
    pod_path = rest[4:]
    if len(pod_path) == 1 and pod_path[0] in _POD_SPEC_LIST_KEYS:
        return ("merge", _POD_SPEC_LIST_KEYS[pod_path[0]])
    if len(pod_path) > 1 and pod_path[0] in _CONTAINER_FIELDS:
        key = _CONTAINER_LIST_KEYS.get(pod_path[1:])
        if key is not None:
            return ("merge", key)
    return None


# ---------------------------------------------------------------------------- OpenAPI merge keys

_MAX_REF_HOPS: Final = 64


def _ref_name(ref: str) -> str:
    """``#/definitions/io.k8s.api.core.v1.Pod`` or ``#/$defs/...`` -> ``io.k8s.api.core.v1.Pod``."""
    return ref.rsplit("/", 1)[-1]


def merge_keys_from_openapi(definitions: Mapping[str, Any], root_ref: str) -> MergeKeys:
    """A :data:`MergeKeys` resolver reading Kubernetes OpenAPI v2 definitions.

    ``definitions`` maps definition names (``io.k8s.api.core.v1.PodSpec``...) to schemas; a whole
    document holding them under ``definitions`` or ``$defs`` is accepted too.  ``root_ref`` names the
    schema of the patched object, as a ``$ref`` (``#/definitions/io.k8s.api.apps.v1.Deployment``) or a
    bare name.  Patch metadata comes from the ``x-kubernetes-patch-strategy`` and
    ``x-kubernetes-patch-merge-key`` extensions of the field's own schema, walking ``$ref`` / ``allOf``,
    array ``items`` and ``additionalProperties``; fields without the extensions, and paths the schema
    does not know, are atomic (``None``).  Results are cached per path.
    """
    defs: Mapping[str, Any] = definitions
    root_name = _ref_name(root_ref)
    if root_name not in defs:
        for container in ("definitions", "$defs"):
            inner = definitions.get(container)
            if isinstance(inner, Mapping) and root_name in inner:
                defs = inner
                break
    root = defs.get(root_name)
    if not isinstance(root, Mapping):
        raise ValueError(f"unknown OpenAPI definition {root_ref!r}")

    cache: dict[tuple[str, ...], tuple[str, str | None] | None] = {}

    def resolve(path: tuple[str, ...]) -> tuple[str, str | None] | None:
        if path not in cache:
            cache[path] = _openapi_patch_meta(defs, root, path)
        return cache[path]

    return resolve


def _deref(defs: Mapping[str, Any], schema: Any) -> Mapping[str, Any] | None:
    """Follow ``$ref`` (and single-reference ``allOf`` wrappers) to a concrete schema."""
    for _ in range(_MAX_REF_HOPS):
        if not isinstance(schema, Mapping):
            return None
        if isinstance(schema.get("$ref"), str):
            schema = defs.get(_ref_name(schema["$ref"]))
            continue
        all_of = schema.get("allOf")
        if "properties" not in schema and "items" not in schema and _is_list(all_of) and len(all_of) == 1:
            schema = all_of[0]
            continue
        return schema
    return None


def _element_schema(defs: Mapping[str, Any], schema: Any) -> Mapping[str, Any] | None:
    """The schema describing an object reached through ``schema``, skipping array levels."""
    resolved = _deref(defs, schema)
    while resolved is not None and "items" in resolved and "properties" not in resolved:
        resolved = _deref(defs, resolved["items"])
    return resolved


def _openapi_patch_meta(
    defs: Mapping[str, Any], root: Mapping[str, Any], path: tuple[str, ...]
) -> tuple[str, str | None] | None:
    if not path:
        return None
    field_schema: Any = root
    for segment in path:
        container = _element_schema(defs, field_schema)
        if container is None:
            return None
        properties = container.get("properties")
        additional = container.get("additionalProperties")
        if isinstance(properties, Mapping) and segment in properties:
            field_schema = properties[segment]
        elif isinstance(additional, Mapping):
            field_schema = additional
        else:
            return None
    return _patch_meta_of(defs, field_schema)


def _patch_meta_of(defs: Mapping[str, Any], schema: Any) -> tuple[str, str | None] | None:
    # The extensions live on the field's schema, which may wrap a $ref; look there first.
    candidates = [schema, _deref(defs, schema)]
    for candidate in candidates:
        if not isinstance(candidate, Mapping):
            continue
        strategy = candidate.get("x-kubernetes-patch-strategy")
        if not isinstance(strategy, str):
            continue
        strategies = strategy.split(",")
        if "merge" in strategies:
            merge_key = candidate.get("x-kubernetes-patch-merge-key")
            return ("merge", merge_key if isinstance(merge_key, str) else None)
        if "replace" in strategies:
            return ("replace", None)
        return None
    return None
