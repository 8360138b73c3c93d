"""The runtime snapshot: the runtime a TrainJob started with, kept beside it in a ConfigMap.

Edits to a runtime after a TrainJob was first reconciled must not change that TrainJob, so the
first reconcile stores the whole runtime object and later ones read it back from here.
"""

from __future__ import annotations

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.api.views import TrainJob
from trainer.runtime.info import ChildConflict, PluginError, child_metadata
from trainer.runtime.kinds import CONFIG_MAP, Builds, Declaration

# What the render core itself builds, declared as a plugin declares its kinds: the snapshot.
CORE_KINDS: tuple[Declaration, ...] = (Builds(CONFIG_MAP, label=c.TRAINJOB_NAME_LABEL),)


def snapshot_name(trainjob_name: str) -> str:
    return trainjob_name + c.RUNTIME_SNAPSHOT_SUFFIX


def _dump(runtime: Obj) -> str:
    import yaml

    kept = {
        "apiVersion": runtime.get("apiVersion", c.API_VERSION),
        "kind": runtime.get("kind"),
        "metadata": {
            k: v
            for k, v in (runtime.get("metadata") or {}).items()
            if k in ("name", "namespace", "labels", "annotations")
        },
        "spec": runtime.get("spec") or {},
    }
    # libyaml when present, as everywhere else in the project: the pure-Python emitter and
    # parser made the snapshot the largest cost of an operator reconcile.
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return str(yaml.dump(kept, Dumper=dumper, sort_keys=False))


def snapshot_configmap(trainjob: TrainJob, runtime: Obj) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(trainjob, snapshot_name(trainjob.name)),
        "data": {c.RUNTIME_SNAPSHOT_KEY: _dump(runtime)},
    }


def read_snapshot(configmap: Obj, trainjob: Obj) -> Obj:
    """The runtime stored in a snapshot ConfigMap, after checking it belongs to this TrainJob."""
    import yaml

    uid = (trainjob.get("metadata") or {}).get("uid")
    owners = (configmap.get("metadata") or {}).get("ownerReferences") or []
    controller = next((o for o in owners if o.get("controller")), None)
    if controller is None or controller.get("uid") != uid:
        # Looked at again by name when retried, and the TrainJob goes on once it is gone.
        raise ChildConflict(
            "invalid runtime snapshot: a snapshot configmap exists but is owned by another object", configmap
        )
    text = (configmap.get("data") or {}).get(c.RUNTIME_SNAPSHOT_KEY)
    if text is None:
        raise PluginError(f"invalid runtime snapshot: key {c.RUNTIME_SNAPSHOT_KEY!r} is missing")
    try:
        runtime = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise PluginError(f"invalid runtime snapshot: cannot parse it: {exc}") from exc
    if not isinstance(runtime, dict):
        raise PluginError("invalid runtime snapshot: it does not hold an object")
    ref = (trainjob.get("spec") or {}).get("runtimeRef") or {}
    name = (runtime.get("metadata") or {}).get("name")
    kind = runtime.get("kind")
    group = str(runtime.get("apiVersion", "")).split("/")[0]
    if (
        name != ref.get("name")
        or (ref.get("kind") and kind != ref.get("kind"))
        or (ref.get("apiGroup") and group != ref.get("apiGroup"))
    ):
        raise PluginError(
            f"invalid runtime snapshot: it holds {kind} {name!r}, not the runtime the TrainJob references"
        )
    return runtime
