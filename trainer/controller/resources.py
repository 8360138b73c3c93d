"""The resources the operator watches, caches and writes, named once.

Everything else is derived from ``WATCHED``: the kopf watches and the label selectors the API
server applies to them, the LIST that fills the cache at start-up, the webhooks (for the kinds of
our own API group), and ``WRITABLE``, the writer's way from an object's apiVersion and kind to its
API path. A kind added here is watched, primed and writable at once; one left out is none of
these, which a test checks against the kinds the plugins build.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.controller.client import ResourceType


class Role(enum.Enum):
    """What a watch event of the resource means for the work queue."""

    TRAINJOB = enum.auto()  # reconcile that TrainJob
    RUNTIME = enum.auto()  # reconcile the TrainJobs still waiting for this runtime
    CHILD = enum.auto()  # reconcile the TrainJob that owns it


@dataclass(frozen=True)
class Resource:
    kind: str
    type: ResourceType
    role: Role
    # Only objects with our trainjob-name label: the API server filters, so no other ConfigMap
    # or Secret of the cluster (keys and all) reaches the operator.
    labelled: bool = False
    # Its API may not be installed (a gang scheduler): a 404 on LIST means "none", not an error.
    optional: bool = False

    @property
    def api_version(self) -> str:
        return self.type.api_version

    @property
    def label_selector(self) -> str | None:
        return c.TRAINJOB_NAME_LABEL if self.labelled else None


TRAINJOBS = Resource(c.TRAINJOB_KIND, ResourceType(c.GROUP, c.VERSION, "trainjobs"), Role.TRAINJOB)
TRAINING_RUNTIMES = Resource(
    c.TRAINING_RUNTIME_KIND, ResourceType(c.GROUP, c.VERSION, "trainingruntimes"), Role.RUNTIME
)
CLUSTER_TRAINING_RUNTIMES = Resource(
    c.CLUSTER_TRAINING_RUNTIME_KIND,
    ResourceType(c.GROUP, c.VERSION, "clustertrainingruntimes", namespaced=False),
    Role.RUNTIME,
)
JOBSETS = Resource(c.JOBSET_KIND, ResourceType(c.JOBSET_GROUP, c.JOBSET_VERSION, "jobsets"), Role.CHILD)
CONFIGMAPS = Resource("ConfigMap", ResourceType("", "v1", "configmaps"), Role.CHILD, labelled=True)
SECRETS = Resource("Secret", ResourceType("", "v1", "secrets"), Role.CHILD, labelled=True)
COSCHEDULING_PODGROUPS = Resource(
    "PodGroup", ResourceType("scheduling.x-k8s.io", "v1alpha1", "podgroups"), Role.CHILD, optional=True
)
VOLCANO_PODGROUPS = Resource(
    "PodGroup", ResourceType("scheduling.volcano.sh", "v1beta1", "podgroups"), Role.CHILD, optional=True
)

WATCHED: tuple[Resource, ...] = (
    TRAINJOBS,
    TRAINING_RUNTIMES,
    CLUSTER_TRAINING_RUNTIMES,
    JOBSETS,
    CONFIGMAPS,
    SECRETS,
    COSCHEDULING_PODGROUPS,
    VOLCANO_PODGROUPS,
)
# Events are written (by the recorder), never watched.
EVENTS = ResourceType("", "v1", "events")
CRDS = ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)

WRITABLE: dict[tuple[str, str], ResourceType] = {
    **{(r.api_version, r.kind): r.type for r in WATCHED},
    (EVENTS.api_version, "Event"): EVENTS,
}


def resource_of(obj: Obj) -> ResourceType:
    """Where an object the render core built is written (KeyError: a kind nobody declared here)."""
    return WRITABLE[(obj["apiVersion"], obj["kind"])]
