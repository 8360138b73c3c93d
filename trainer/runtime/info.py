"""The working record plugins read and change while one TrainJob is rendered.

``Info`` is built from the runtime's template and the TrainJob (runtimePatches applied, trainer
resources merged), then handed to each phase. Pod sets are views over the replicated jobs of the
JobSet spec under construction: a plugin that upserts an env var into a pod set's container
changes the template itself, so the JobSet builder has nothing to copy back.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.api.views import MLPolicy, PodGroupPolicy, TrainingRuntime, TrainJob


class PluginError(Exception):
    """A TrainJob cannot be reconciled as it stands; the message is shown on status and events."""


class ChildConflict(PluginError):
    """A child's name is taken by an object this TrainJob does not control (docs/decisions.md §11)."""

    def __init__(self, message: str, observed: Obj) -> None:
        super().__init__(message)
        self.observed = observed


@dataclass(frozen=True)
class StatusServer:
    """Where training pods report progress (the ``TrainJobStatus`` feature), as a cluster fact.

    The operator fills it from its own configuration and serving certificate; ``trainer render``
    from its flags. ``url`` is the server's base URL (scheme, host and port); ``ca_cert`` the PEM
    of the CA that signed its certificate, empty when it could not be read, and then
    ``ca_error`` says why the certificate could not be looked up at all (None when it could, but
    held no CA).
    """

    url: str
    ca_cert: str = ""
    ca_error: str | None = None


class Facts:
    """What the render core may know about the cluster: objects by kind, namespace and name.

    The operator fills it from its watch caches; ``trainer render`` from the manifests it read.
    Nothing in the core asks the cluster anything. Two API groups may share a kind (the
    scheduler-plugins and Volcano PodGroups), so objects are kept per API group too; ``get``
    without a group returns the one object of that kind and name when only one group has it.
    """

    def __init__(self) -> None:
        self._objects: dict[tuple[str, str, str], dict[str, Obj]] = {}
        # The progress status server's address and CA; None where none is known.
        self.status_server: StatusServer | None = None

    @staticmethod
    def key(kind: str, namespace: str | None, name: str) -> tuple[str, str, str]:
        return (kind, namespace or "", name)

    @staticmethod
    def group_of(obj: Obj) -> str:
        return str(obj.get("apiVersion", "")).rpartition("/")[0]

    def get(self, kind: str, namespace: str | None, name: str, group: str | None = None) -> Obj | None:
        found = self._objects.get(self.key(kind, namespace, name))
        if not found:
            return None
        if group is None:
            return next(iter(found.values()))
        return found.get(group)

    def put(self, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        self._objects.setdefault(self.key(obj["kind"], meta.get("namespace"), meta["name"]), {})[
            self.group_of(obj)
        ] = obj

    def remove(self, kind: str, namespace: str | None, name: str, group: str | None = None) -> None:
        key = self.key(kind, namespace, name)
        if group is None:
            self._objects.pop(key, None)
            return
        found = self._objects.get(key)
        if found is not None:
            found.pop(group, None)
            if not found:
                del self._objects[key]

    def of_kind(self, kind: str) -> Iterator[Obj]:
        return (o for (k, _, _), found in self._objects.items() if k == kind for o in found.values())


@dataclass(frozen=True)
class Endpoints(Sequence[str]):
    """The pods' stable hostnames, ``<prefix>-<replica>-<pod>.<subdomain>``, made when read.

    A TrainJob may ask for any int32 count of nodes; only the MPI hostfile (refused at
    admission when too large) ever needs every name, so none are stored.
    """

    prefix: str = ""
    subdomain: str = ""
    replicas: int = 0
    pods: int = 0  # per replica (``count`` is Sequence's method)

    def __len__(self) -> int:
        return self.replicas * self.pods

    def __getitem__(self, index: int) -> str:  # type: ignore[override]  # no slices: nothing needs them
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        replica, pod = divmod(index % len(self), self.pods)
        return f"{self.prefix}-{replica}-{pod}.{self.subdomain}"

    def __iter__(self) -> Iterator[str]:
        prefix, subdomain = self.prefix, self.subdomain
        return (f"{prefix}-{r}-{p}.{subdomain}" for r in range(self.replicas) for p in range(self.pods))


@dataclass
class PodSet:
    """One replicated job as plugins see it; ``template`` is the job's pod spec dict itself."""

    name: str
    ancestor: str | None
    count: int
    replicated_job: Obj
    endpoints: Sequence[str] = ()

    @property
    def pod_spec(self) -> Obj:
        spec: Obj = self.replicated_job.setdefault("template", {}).setdefault("spec", {})
        pod_template: Obj = spec.setdefault("template", {})
        pod_spec: Obj = pod_template.setdefault("spec", {})
        return pod_spec

    @property
    def containers(self) -> list[Obj]:
        containers: list[Obj] = self.pod_spec.setdefault("containers", [])
        return containers

    @property
    def init_containers(self) -> list[Obj]:
        init: list[Obj] = self.pod_spec.setdefault("initContainers", [])
        return init

    def container(self, name: str) -> Obj | None:
        return next((ct for ct in self.pod_spec.get("containers") or [] if ct.get("name") == name), None)

    def init_container(self, name: str) -> Obj | None:
        return next((ct for ct in self.pod_spec.get("initContainers") or [] if ct.get("name") == name), None)

    @property
    def replicas(self) -> int:
        return int(self.replicated_job.get("replicas") or 1)


@dataclass
class Scheduler:
    """Labels and annotations gang-scheduling plugins ask every pod to carry, and the group a
    replicated job's pods join through their ``spec.schedulingGroup`` (kube-scheduler's own)."""

    pod_labels: dict[str, str] = field(default_factory=dict)
    pod_annotations: dict[str, str] = field(default_factory=dict)
    scheduling_groups: dict[str, str] = field(default_factory=dict)  # replicated job -> PodGroup
    # The group the pods would join is being made again: no pods are made or resumed until then.
    hold_pods: bool = False


@dataclass(frozen=True)
class Failure:
    """A plugin's finding that the TrainJob cannot succeed: it fails with ``reason`` and
    ``message``, and what runs it is stopped (as when its deadline passes)."""

    reason: str
    message: str


@dataclass
class Info:
    """Everything one render of one TrainJob works on."""

    trainjob: TrainJob
    trainjob_obj: Obj
    runtime: TrainingRuntime
    runtime_obj: Obj
    runtime_kind: str
    labels: dict[str, str]
    annotations: dict[str, str]
    jobset_spec: Obj
    pod_sets: list[PodSet]
    facts: Facts
    scheduler: Scheduler = field(default_factory=Scheduler)
    # Filled in by torchtune: the trainer command the builder writes (the stored TrainJob keeps
    # ["tune", "run"], so every reconcile recomputes it).
    trainer_command: list[str] | None = None
    trainer_args_cleared: bool = False
    now: str = "1970-01-01T00:00:00Z"
    # Makes generated key material reproducible (the MPI SSH key, the Flux CURVE key): `trainer
    # render` sets it from the TrainJob's uid so its output is byte-for-byte stable; the operator leaves it
    # None and keys come from the operating system's randomness.
    seed: bytes | None = None
    # Children that exist and are kept as they are rather than built again (key material made
    # once): the core checks each is this TrainJob's, as it checks what is built.
    kept: list[Obj] = field(default_factory=list)
    # Children an update cannot change (a field their API holds immutable): deleted in the
    # foreground and built afresh once gone (``rebuild``; docs/decisions.md §resize).
    rebuilt: list[Obj] = field(default_factory=list)
    # Set by ``fail``: the TrainJob fails now. ``requeue_after``: look again within so many
    # seconds, for a plugin that waits for a time to pass (a gang's schedule timeout).
    failure: Failure | None = None
    requeue_after: float | None = None

    @property
    def name(self) -> str:
        return self.trainjob.name

    @property
    def namespace(self) -> str:
        return self.trainjob.namespace

    @property
    def ml_policy(self) -> MLPolicy | None:
        return self.runtime.spec.ml_policy

    @property
    def pod_group_policy(self) -> PodGroupPolicy | None:
        return self.runtime.spec.pod_group_policy

    def pod_set(self, name: str) -> PodSet | None:
        return next((ps for ps in self.pod_sets if ps.name == name), None)

    def trainer_pod_set(self) -> PodSet | None:
        return next((ps for ps in self.pod_sets if ps.ancestor == c.ANCESTOR_TRAINER), None)

    def scale_trainer(self) -> PodSet | None:
        """The trainer pod set, with the TrainJob's numNodes applied when it sets one.

        What every framework plugin that owns the node count does first.
        """
        trainer_set = self.trainer_pod_set()
        trainer = self.trainjob.spec.trainer
        if trainer_set is not None and trainer is not None and trainer.num_nodes is not None:
            trainer_set.count = trainer.num_nodes
        return trainer_set

    def fail(self, reason: str, message: str) -> None:
        """Fail the TrainJob (a terminal condition; its JobSet is deleted): the first call wins."""
        if self.failure is None:
            self.failure = Failure(reason, message)

    def requeue_within(self, seconds: float) -> None:
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)

    def frozen(self, api_version: str, kind: str, name: str) -> bool:
        """True when a child exists and the TrainJob runs: then it is not rewritten.

        Schedulers act on a PodGroup as soon as it exists; only a suspended TrainJob (no pods)
        may change one. The JobSet has a rule of its own (it also looks at its own suspend).
        """
        group = api_version.rpartition("/")[0]
        return (
            self.facts.get(kind, self.namespace, name, group=group) is not None
            and not self.trainjob.spec.suspend
        )

    def owner_reference(self) -> Obj:
        return owner_reference(self.trainjob)

    def child_metadata(self, name: str) -> Obj:
        return child_metadata(self.trainjob, name)

    def rebuild(self, existing: Obj) -> None:
        """Have ``existing`` (a child found with ``existing_child``) deleted and built again: what
        the plugin would build now is more than an update of it may change. Only a kind its plugin
        declares with ``Builds(..., delete=True)``; the core checks that, and that it is this
        TrainJob's."""
        self.rebuilt.append(existing)

    def existing_child(self, kind: str, name: str, group: str = "") -> Obj | None:
        """The child ``name`` of ``kind`` if it exists, to be kept rather than built again.

        What is returned is recorded in :attr:`kept`: the core refuses to go on when it is not
        this TrainJob's (render.check_control), so a plugin never mounts an object a namespace peer
        planted under the name it would have used.
        """
        found = self.facts.get(kind, self.namespace, name, group=group)
        if found is not None:
            self.kept.append(found)
        return found


def controller_ref(obj: Obj, kind: str | None = None, group: str | None = None) -> Obj | None:
    """``obj``'s controller ownerReference (the API server allows one), or None; given ``kind``
    and ``group``, only when it names an object of that kind in that API group ("" the core)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") is True:
            if kind is not None and ref.get("kind") != kind:
                return None
            if group is not None:
                api_version = str(ref.get("apiVersion", ""))
                ref_group = api_version.rpartition("/")[0] if "/" in api_version else ""
                if ref_group != group:
                    return None
            found: Obj = ref
            return found
    return None


def trainjob_controller(obj: Obj) -> Obj | None:
    """``obj``'s controller ownerReference when it names a TrainJob (of any uid), else None."""
    return controller_ref(obj, c.TRAINJOB_KIND, c.GROUP)


def controlled_by(obj: Obj, trainjob_obj: Obj) -> bool:
    """Whether ``obj`` has this TrainJob (by uid) as its controller: the only children we write,
    mount or delete."""
    uid = (trainjob_obj.get("metadata") or {}).get("uid")
    ref = trainjob_controller(obj)
    return bool(uid) and ref is not None and ref.get("uid") == uid


def owner_reference(trainjob: TrainJob) -> Obj:
    """The one owner reference every child of a TrainJob carries, so deletion cascades."""
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.TRAINJOB_KIND,
        "name": trainjob.name,
        "uid": trainjob.metadata.get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(trainjob: TrainJob, name: str) -> Obj:
    """Metadata for an object a TrainJob owns: the owner and the label the operator watches."""
    return {
        "name": name,
        "namespace": trainjob.namespace,
        "labels": {c.TRAINJOB_NAME_LABEL: trainjob.name},
        "ownerReferences": [owner_reference(trainjob)],
    }


@dataclass
class ValidationContext:
    """What a validation hook sees: the TrainJob as admitted, its previous version, the runtime."""

    trainjob: TrainJob
    trainjob_obj: Obj
    old: TrainJob | None
    old_obj: Obj | None
    runtime: TrainingRuntime
    info: Info | None
    facts: Facts
    warnings: list[str] = field(default_factory=list)
