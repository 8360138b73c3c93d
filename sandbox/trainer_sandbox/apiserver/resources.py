"""The kinds the server knows: built-in kinds and the ones CRDs register at run time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer_sandbox.apiserver.schema import SchemaView, builtin_view

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass
class ResourceType:
    """One served resource (group, version, plural) and what the server needs to serve it."""

    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    has_status: bool = False
    builtin: bool = True
    # Whether objects of the kind carry metadata.generation: custom resources and workloads do;
    # ConfigMaps, Secrets, Namespaces, Events and the like never get one from a real server.
    has_generation: bool = True
    # CRD only: the structural schema of this version, its printer columns, and the CRD's name.
    crd_schema: dict[str, Any] | None = None
    printer_columns: list[dict[str, Any]] = field(default_factory=list)
    crd_name: str = ""
    storage_version: str = ""
    _view: SchemaView | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        """Storage identity: all versions of a kind share one set of objects."""
        return (self.group, self.plural)

    @property
    def view(self) -> SchemaView:
        if self._view is None:
            if self.builtin:
                self._view = builtin_view(self.api_version, self.kind) or SchemaView(None)
            else:
                self._view = SchemaView(self.crd_schema)
        return self._view


def _b(
    group: str,
    version: str,
    plural: str,
    kind: str,
    namespaced: bool = True,
    short: tuple[str, ...] = (),
    categories: tuple[str, ...] = (),
    status: bool = False,
    generation: bool = True,
) -> ResourceType:
    singular = kind.lower()
    return ResourceType(
        group,
        version,
        plural,
        singular,
        kind,
        namespaced,
        list(short),
        list(categories),
        status,
        has_generation=generation,
    )


def builtin_types() -> list[ResourceType]:
    return [
        _b(
            "",
            "v1",
            "namespaces",
            "Namespace",
            namespaced=False,
            short=("ns",),
            status=True,
            generation=False,
        ),
        _b("", "v1", "events", "Event", short=("ev",), generation=False),
        _b("", "v1", "configmaps", "ConfigMap", short=("cm",), generation=False),
        _b("", "v1", "secrets", "Secret", generation=False),
        _b(
            "",
            "v1",
            "services",
            "Service",
            short=("svc",),
            categories=("all",),
            status=True,
            generation=False,
        ),
        _b("", "v1", "serviceaccounts", "ServiceAccount", short=("sa",), generation=False),
        _b("", "v1", "pods", "Pod", short=("po",), categories=("all",), status=True),
        _b("", "v1", "endpoints", "Endpoints", short=("ep",), generation=False),
        _b("", "v1", "nodes", "Node", namespaced=False, short=("no",), status=True, generation=False),
        _b("events.k8s.io", "v1", "events", "Event", short=("ev",), generation=False),
        _b("batch", "v1", "jobs", "Job", categories=("all",), status=True),
        _b("apps", "v1", "deployments", "Deployment", short=("deploy",), categories=("all",), status=True),
        _b("rbac.authorization.k8s.io", "v1", "roles", "Role", generation=False),
        _b("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", generation=False),
        _b(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterroles",
            "ClusterRole",
            namespaced=False,
            generation=False,
        ),
        _b(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            "ClusterRoleBinding",
            namespaced=False,
            generation=False,
        ),
        _b(
            "admissionregistration.k8s.io",
            "v1",
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
            namespaced=False,
        ),
        _b(
            "admissionregistration.k8s.io",
            "v1",
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
            namespaced=False,
        ),
        _b(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            namespaced=False,
            short=("crd", "crds"),
            status=True,
        ),
        _b("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False, short=("pc",)),
        _b("coordination.k8s.io", "v1", "leases", "Lease", generation=False),
        # Stored, never enforced (the stand-in runs no pods and evaluates no policies): the chart
        # installs them.
        _b(
            "admissionregistration.k8s.io",
            "v1",
            "validatingadmissionpolicies",
            "ValidatingAdmissionPolicy",
            namespaced=False,
            status=True,
        ),
        _b(
            "admissionregistration.k8s.io",
            "v1",
            "validatingadmissionpolicybindings",
            "ValidatingAdmissionPolicyBinding",
            namespaced=False,
        ),
        _b("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", short=("netpol",)),
        _b("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", short=("pdb",), status=True),
    ]


class Registry:
    """Lookup of served resources by (group, version, plural) and by (apiVersion, kind)."""

    def __init__(self) -> None:
        self.by_gvr: dict[tuple[str, str, str], ResourceType] = {}
        self.by_gvk: dict[tuple[str, str], ResourceType] = {}
        for rt in builtin_types():
            self.add(rt)

    def add(self, rt: ResourceType) -> None:
        self.by_gvr[(rt.group, rt.version, rt.plural)] = rt
        self.by_gvk[(rt.api_version, rt.kind)] = rt

    def remove_crd(self, crd_name: str) -> list[ResourceType]:
        gone = [rt for rt in self.by_gvr.values() if rt.crd_name == crd_name]
        for rt in gone:
            self.by_gvr.pop((rt.group, rt.version, rt.plural), None)
            self.by_gvk.pop((rt.api_version, rt.kind), None)
        return gone

    def for_key(self, key: tuple[str, str]) -> ResourceType | None:
        """The preferred (storage) version of a stored kind."""
        found = None
        for rt in self.by_gvr.values():
            if rt.key == key:
                if not rt.storage_version or rt.version == rt.storage_version:
                    return rt
                found = rt
        return found

    def get(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self.by_gvr.get((group, version, plural))

    def for_kind(self, api_version: str, kind: str) -> ResourceType | None:
        return self.by_gvk.get((api_version, kind))

    def groups(self) -> dict[str, list[str]]:
        """group -> served versions (preferred first), for discovery."""
        out: dict[str, list[str]] = {}
        for rt in self.by_gvr.values():
            versions = out.setdefault(rt.group, [])
            if rt.version not in versions:
                versions.append(rt.version)
        for group, versions in out.items():
            stored = [
                rt.storage_version for rt in self.by_gvr.values() if rt.group == group and rt.storage_version
            ]
            if stored and stored[0] in versions:
                versions.remove(stored[0])
                versions.insert(0, stored[0])
        return out

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [rt for rt in self.by_gvr.values() if rt.group == group and rt.version == version]
