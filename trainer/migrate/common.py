"""What every kind's conversion shares: the result, the refusal, names and server fields."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from trainer.api.objects import Obj

V1_GROUP = "kubeflow.org"
# The Training Operator v1 kinds; only those in CONVERTERS (cmd.py) are converted in this version.
V1_KINDS = ("PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "JAXJob", "PaddleJob")
TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
# The manager of the runtime patch that carries a v1 pod template's extra fields.
PATCH_MANAGER = "trainer.kubeflow.org/migrate"
RFC1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


class Refusal(Exception):
    """The job cannot be converted faithfully: ``field`` is the v1 field, ``reason`` why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass
class Options:
    lossy: bool = False
    suspend_running: bool = True


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

    def loss(self, path: str, text: str) -> None:
        if not self.options.lossy:
            raise Refusal(path, text)
        self.warn(path, f"{text} (--lossy: dropped)")


def check_name(metadata: dict[str, Any]) -> str:
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise Refusal("metadata.name", "the job has no name")
    if len(name) > 63 or not RFC1035_LABEL.fullmatch(name):
        raise Refusal(
            "metadata.name",
            f"{name!r} is not a valid TrainJob name (an RFC 1035 label: lower-case letters, digits "
            "and '-', starting with a letter, at most 63 characters)",
        )
    return name


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
