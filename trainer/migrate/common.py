"""What every kind's conversion shares: the result, the refusal, names and server fields."""

from __future__ import annotations

import copy
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from trainer.api.objects import Obj
from trainer.migrate import shapes
from trainer.migrate.errors import Refusal

V1_GROUP = "kubeflow.org"
# The Training Operator v1 kinds; only those in CONVERTERS (cmd.py) are converted in this version.
V1_KINDS = ("PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "JAXJob", "PaddleJob")
TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
# The manager of the runtime patch that carries a v1 pod template's extra fields.
PATCH_MANAGER = "trainer.kubeflow.org/migrate"
RFC1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


@dataclass
class Options:
    lossy: bool = False
    suspend_running: bool = True
    fix_names: bool = False
    # The gang scheduler v1's operator ran with (--gang-scheduler-name); None: read it from the
    # pods' schedulerName (volcano), else the scheduler-plugins' coscheduling.
    gang_scheduler: str | None = None


@dataclass
class Result:
    objects: list[Obj] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class Notes:
    """Collects the Warning: lines of one job; with ``lossy`` a would-be refusal becomes one."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.warnings: list[str] = []

    def warn(self, path: str, text: str) -> None:
        self.warnings.append(f"{path}: {text}")

    def loss(self, path: str, text: str, lossy: str | None = None) -> None:
        """A field v2 cannot carry: refused, or with ``--lossy`` a Warning. ``lossy`` says what
        ``--lossy`` makes of it and what is lost; the refusal then names ``--lossy`` as the way
        through, so a user learns the price before choosing it."""
        if not self.options.lossy:
            raise Refusal(path, text if lossy is None else f"{text}; --lossy converts it to {lossy}")
        self.warn(path, f"{text} (--lossy: {lossy or 'dropped'})")


@dataclass
class Source:
    """The v1 job being converted: its notes, metadata, spec and the TrainJob's name."""

    notes: Notes
    metadata: dict[str, Any]
    name: str
    spec: Obj

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace") or "default")


def read_job(job: Obj, options: Options) -> Source:
    shapes.check_job(job)
    notes = Notes(options)
    metadata = job.get("metadata") or {}
    name = check_name(metadata, notes)
    spec = job.get("spec")
    if not isinstance(spec, dict):
        raise Refusal("spec", "not an object")
    shapes.check_run_policy(spec)
    return Source(notes, metadata, name, spec)


def check_name(metadata: dict[str, Any], notes: Notes) -> str:
    """The TrainJob's name: the v1 name, or with ``fix_names`` the nearest valid one (a Warning)."""
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise Refusal("metadata.name", "the job has no name")
    if len(name) <= 63 and RFC1035_LABEL.fullmatch(name):
        return name
    why = (
        f"{name!r} is not a valid TrainJob name (an RFC 1035 label: lower-case letters, digits "
        "and '-', starting with a letter, at most 63 characters)"
    )
    if not notes.options.fix_names:
        raise Refusal("metadata.name", why + "; --fix-names maps it to a valid one")
    fixed = valid_name(name)
    notes.warn("metadata.name", f"{why}: the TrainJob is named {fixed!r} (--fix-names)")
    return fixed


def valid_name(name: str) -> str:
    """A valid RFC 1035 label for ``name``: lower-cased, other characters as '-', a letter first,
    and a short hash of the original, so two v1 names ("Mnist", "mnist") stay two TrainJobs."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not label or not label[0].isalpha():
        label = f"j-{label}".rstrip("-")
    digest = hashlib.sha256(name.encode()).hexdigest()[:6]
    if label != name or len(label) > 63:
        label = f"{label[: 63 - 7].rstrip('-')}-{digest}"
    return label


def carried_metadata(metadata: dict[str, Any], name: str) -> Obj:
    """Namespace, name, labels and annotations; never the server's fields (uid, resourceVersion…)."""
    out: Obj = {"name": name}
    if metadata.get("namespace"):
        out["namespace"] = metadata["namespace"]
    for key in ("labels", "annotations"):
        value = metadata.get(key)
        if isinstance(value, dict) and value:
            if key == "annotations":
                value = {
                    k: v for k, v in value.items() if k != "kubectl.kubernetes.io/last-applied-configuration"
                }
            if value:
                out[key] = copy.deepcopy(value)
    return out


def is_running(status: Any) -> bool:
    """The v1 job has started and not finished, by its conditions."""
    if not isinstance(status, dict):
        return False
    true = {
        c.get("type")
        for c in status.get("conditions") or []
        if isinstance(c, dict) and c.get("status") == "True"
    }
    if true & {"Succeeded", "Failed"}:
        return False
    return bool(true & {"Created", "Running", "Restarting"})


def finish(
    job: Obj, metadata: dict[str, Any], name: str, spec: Obj, objects: list[Obj], notes: Notes
) -> Result:
    """The TrainJob after the objects it needs; a still-running v1 job's comes out suspended."""
    if is_running(job.get("status")):
        if notes.options.suspend_running:
            spec["suspend"] = True
            notes.warn(
                "status.conditions",
                "the v1 job is still running: the TrainJob is suspended so applying it does not start "
                "a second run (set spec.suspend to false to start it; --no-suspend-running to not suspend)",
            )
        else:
            notes.warn(
                "status.conditions", "the v1 job is still running; applying the TrainJob starts a second run"
            )
    trainjob: Obj = {
        "apiVersion": TRAINJOB_API,
        "kind": "TrainJob",
        "metadata": carried_metadata(metadata, name),
        "spec": spec,
    }
    return Result(objects=[*objects, trainjob], warnings=notes.warnings)
