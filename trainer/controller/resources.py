"""The resources the operator watches, caches and writes, and the rights they take.

The operator's own kinds (TrainJobs, the two runtime kinds, Events, the CRD it checks at start)
are named here. Every other kind comes from declarations: the render core's and each enabled
plugin's ``kinds`` (``trainer/runtime/kinds.py``). :class:`Resources` turns them into one table,
from which everything else is derived: the reflectors and the label selectors the API server
applies to them, the LIST that fills the cache at start-up, the webhooks (for the kinds of our
own API group), the writer's way from an object's apiVersion and kind to its API path, and the
RBAC rules the chart grants (``charts/tools/sync_chart.py`` writes them, a test compares). A kind
no enabled plugin declares is neither watched nor writable nor granted.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.controller.client import ResourceType
from trainer.runtime.framework import Framework
from trainer.runtime.kinds import Builds, Declaration, Kind, by_kind

Permission = tuple[str, str, str]  # (API group, resource, verb), as an RBAC rule grants it


class Role(enum.Enum):
    """What a watch event of the resource means for the work queue."""

    TRAINJOB = enum.auto()  # reconcile that TrainJob
    RUNTIME = enum.auto()  # reconcile the TrainJobs still waiting for this runtime
    CHILD = enum.auto()  # reconcile the TrainJob that owns it
    OPTIMIZATIONJOB = enum.auto()  # reconcile that OptimizationJob (controller/optimization.py)
    FACT = enum.auto()  # nothing: the cache keeps it for the render core and admission to read


@dataclass(frozen=True)
class Resource:
    kind: str
    type: ResourceType
    role: Role
    # Only objects carrying this label key: the API server filters, so no other ConfigMap or
    # Secret of the cluster (keys and all) reaches the operator.
    label: str | None = None
    # Its API may not be installed (a gang scheduler): a 404 on LIST means "none", not an error.
    optional: bool = False
    patch: bool = False  # a child that differs from what is built is patched
    delete: bool = False  # the render core may delete it
    # Listed and watched. Not for children only ever created (key material): those are known
    # by the operator's own creates, and read by name when a create finds the name taken.
    watched: bool = True

    @property
    def api_version(self) -> str:
        return self.type.api_version

    @property
    def labelled(self) -> bool:
        return self.label is not None


TRAINJOBS = Resource(c.TRAINJOB_KIND, ResourceType(c.GROUP, c.VERSION, "trainjobs"), Role.TRAINJOB)
TRAINING_RUNTIMES = Resource(
    c.TRAINING_RUNTIME_KIND, ResourceType(c.GROUP, c.VERSION, "trainingruntimes"), Role.RUNTIME
)
CLUSTER_TRAINING_RUNTIMES = Resource(
    c.CLUSTER_TRAINING_RUNTIME_KIND,
    ResourceType(c.GROUP, c.VERSION, "clustertrainingruntimes", namespaced=False),
    Role.RUNTIME,
)
OWN: tuple[Resource, ...] = (TRAINJOBS, TRAINING_RUNTIMES, CLUSTER_TRAINING_RUNTIMES)
# Optional: a cluster given our CRDs of an earlier release has none; its searches wait for it.
OPTIMIZATIONJOBS = Resource(
    c.OPTIMIZATIONJOB_KIND,
    ResourceType(c.GROUP, c.VERSION, "optimizationjobs"),
    Role.OPTIMIZATIONJOB,
    optional=True,
)


def validated() -> tuple[Resource, ...]:
    """The kinds the validating webhook admits: our own, and OptimizationJobs. The mutating one
    defaults our own only (controller/webhooks.py)."""
    return (*OWN, OPTIMIZATIONJOBS)


# Events are written (by the recorder), never watched; the JobSet CRD is read once, at start-up.
EVENTS = ResourceType("", "v1", "events")
CRDS = ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
JOBSETS = ResourceType(c.JOBSET_GROUP, c.JOBSET_VERSION, "jobsets")

# What the operator does with its own kinds, whatever the plugins: the TrainJobs' status, their
# deletion when a TTL runs out, and the finalizers subresource that an ownerReference with
# blockOwnerDeletion needs (OwnerReferencesPermissionEnforcement); a patch of a runtime's
# finalizers, to remove the one upstream's earlier releases left (controller/runtime_finalizers.py);
# kopf reads CRDs at start-up.
OWN_PERMISSIONS: frozenset[Permission] = frozenset(
    {
        (c.GROUP, "trainjobs", "list"),
        (c.GROUP, "trainjobs", "watch"),
        (c.GROUP, "trainjobs", "delete"),
        (c.GROUP, "trainjobs/status", "patch"),
        (c.GROUP, "trainjobs/finalizers", "update"),
        # OptimizationJobs (docs/optimization.md): their trials are TrainJobs the operator creates,
        # each owned by its OptimizationJob with blockOwnerDeletion (hence its finalizers).
        (c.GROUP, "trainjobs", "create"),
        (c.GROUP, "optimizationjobs", "list"),
        (c.GROUP, "optimizationjobs", "watch"),
        (c.GROUP, "optimizationjobs/status", "patch"),
        (c.GROUP, "optimizationjobs/finalizers", "update"),
        (c.GROUP, "trainingruntimes", "list"),
        (c.GROUP, "trainingruntimes", "watch"),
        (c.GROUP, "trainingruntimes", "patch"),
        (c.GROUP, "clustertrainingruntimes", "list"),
        (c.GROUP, "clustertrainingruntimes", "watch"),
        (c.GROUP, "clustertrainingruntimes", "patch"),
        ("", "events", "create"),
        (CRDS.group, CRDS.plural, "get"),
        (CRDS.group, CRDS.plural, "list"),
        (CRDS.group, CRDS.plural, "watch"),
    }
)


def _resource(kind: Kind, declarations: Sequence[tuple[str, Declaration]]) -> Resource:
    """One resource for every declaration of a kind (``kinds.by_kind`` checked they agree)."""
    builds = [d for _, d in declarations if isinstance(d, Builds)]
    create_only = len(builds) == len(declarations) and not any(d.patch or d.delete for d in builds)
    return Resource(
        kind.kind,
        ResourceType(kind.group, kind.version, kind.plural, namespaced=kind.namespaced),
        Role.CHILD if builds else Role.FACT,
        label=declarations[0][1].label,
        # Optional only when every declaration can do without the kind's API.
        optional=all(d.optional for _, d in declarations),
        patch=any(d.patch for d in builds),
        delete=any(d.delete for d in builds),
        watched=not create_only,
    )


def permissions_of(resource: Resource) -> set[Permission]:
    """The rights a declared resource takes: read ones are listed and watched, built ones also
    created (an apply that creates asks ``create``), and patched and deleted as declared."""
    group, plural = resource.type.group, resource.type.plural
    if not resource.watched:
        # Created, and read by name when a create finds the name taken: never listed, so the
        # operator's identity cannot enumerate them (a cluster's Secrets, tokens among them).
        return {(group, plural, "create"), (group, plural, "get")}
    verbs = {"list", "watch"}
    if resource.role is Role.CHILD:
        verbs.add("create")
        # An unlabelled child is created by server-side apply, a PATCH the server also checks.
        if resource.patch or not resource.labelled:
            verbs.add("patch")
        if resource.delete:
            verbs.add("delete")
    return {(group, plural, verb) for verb in verbs}


class Resources:
    """One operator's table: its own kinds, then those the render core and its plugins declare."""

    def __init__(self, declarations: Iterable[tuple[str, Declaration]]) -> None:
        declared = tuple(_resource(kind, found) for kind, found in by_kind(declarations).items())
        self._declared = declared
        self.watched: tuple[Resource, ...] = (*OWN, OPTIMIZATIONJOBS, *(r for r in declared if r.watched))
        # What the render core may return: the children it builds.
        self.writable: dict[tuple[str, str], Resource] = {
            (r.api_version, r.kind): r for r in declared if r.role is Role.CHILD
        }

    @classmethod
    def of(cls, framework: Framework) -> Resources:
        """The table for a loaded plugin framework (``Framework.declarations``)."""
        return cls(framework.declarations)

    def resource_of(self, obj: Obj) -> ResourceType:
        """Where an object the render core built is written."""
        return self.writable_resource(obj).type

    def writable_resource(self, obj: Obj) -> Resource:
        found = self.writable.get((obj.get("apiVersion", ""), obj.get("kind", "")))
        if found is None:
            raise UndeclaredKind(
                f"{obj.get('kind')} ({obj.get('apiVersion')}) is built but no enabled plugin declares it "
                "(Builds in the plugin's kinds)"
            )
        return found

    def permissions(self) -> set[Permission]:
        """Every right this table takes: the operator's own, and each declared resource's."""
        return set(OWN_PERMISSIONS).union(*(permissions_of(resource) for resource in self._declared))


class UndeclaredKind(KeyError):
    """The render core built an object of a kind no enabled plugin declared."""

    def __str__(self) -> str:
        return str(self.args[0])
