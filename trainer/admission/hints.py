"""Hints for manifests written against older or imagined versions of the API (docs/decisions.md §7).

Examples and blog posts still show Trainer "v2alpha1" objects, `mlPolicy.pytorch`, torch
`numProcPerNode: auto` and `elasticPolicy`. A schema error alone ("unknown field") does not tell
a user what to write instead, so these are checked on the raw object, before the schema.
"""

from __future__ import annotations

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.apimachinery.errors import FieldError, invalid


def api_version_hint(api_version: str) -> str | None:
    group, _, version = api_version.rpartition("/")
    if group in (c.GROUP, "kubeflow.org") and version != c.VERSION:
        hint = f"apiVersion {api_version} is not served; the current Kubeflow Trainer API is {c.API_VERSION}"
        if version == "v2alpha1":
            hint += " (v2alpha1 was a design-document name and never shipped)"
        return hint
    return None


def hints(obj: Obj) -> list[FieldError]:
    kind = obj.get("kind")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return []
    errors: list[FieldError] = []
    if kind in c.RUNTIME_KINDS:
        policy = spec.get("mlPolicy")
        if isinstance(policy, dict):
            if "pytorch" in policy:
                errors.append(
                    invalid(
                        "spec.mlPolicy.pytorch",
                        "object",
                        "unknown field; the torch policy is spelled mlPolicy.torch",
                    )
                )
            torch = policy.get("torch")
            if isinstance(torch, dict):
                if "numProcPerNode" in torch:
                    errors.append(
                        invalid(
                            "spec.mlPolicy.torch.numProcPerNode",
                            torch["numProcPerNode"],
                            "the torch policy no longer has numProcPerNode; set spec.trainer.numProcPerNode "
                            "(an integer) on the TrainJob, or leave it unset to derive it from the node's "
                            "CPUs or GPUs",
                        )
                    )
                if "elasticPolicy" in torch:
                    errors.append(
                        invalid(
                            "spec.mlPolicy.torch.elasticPolicy",
                            "object",
                            "elastic training is not part of the v1alpha1 API; remove elasticPolicy",
                        )
                    )
            if "elasticPolicy" in policy:
                errors.append(
                    invalid(
                        "spec.mlPolicy.elasticPolicy",
                        "object",
                        "elastic training is not part of the v1alpha1 API; remove elasticPolicy",
                    )
                )
    if kind == c.TRAINJOB_KIND:
        trainer = spec.get("trainer")
        if isinstance(trainer, dict):
            nproc = trainer.get("numProcPerNode")
            if isinstance(nproc, str):
                errors.append(
                    invalid(
                        "spec.trainer.numProcPerNode",
                        nproc,
                        "must be an integer; leave it unset for automatic (one process per CPU, or "
                        "torchrun's own choice with GPUs)",
                    )
                )
        ref = spec.get("runtimeRef")
        if isinstance(ref, dict):
            kind_value = ref.get("kind")
            if (
                isinstance(kind_value, str)
                and kind_value not in c.RUNTIME_KINDS
                and ("-" in kind_value or kind_value.islower())
            ):
                errors.append(
                    invalid(
                        "spec.runtimeRef.kind",
                        kind_value,
                        "kind must be TrainingRuntime or ClusterTrainingRuntime; put the runtime's "
                        "name in spec.runtimeRef.name",
                    )
                )
    return errors
