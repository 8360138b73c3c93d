"""Hints for manifests written against older or imagined versions of the API (docs/decisions.md §7).

Examples and blog posts still show Trainer "v2alpha1" objects, `mlPolicy.pytorch`, torch
`numProcPerNode: auto` and `elasticPolicy`. A schema error alone ("unknown field") does not tell
a user what to write instead, so these are checked on the raw object, before the schema.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.apimachinery.errors import FieldError, invalid


@dataclass(frozen=True)
class Hint:
    """What to write instead of one mistake, in the words of the refusal it explains.

    ``error`` is the wording for a refusal at the mistaken field itself. A mistake can also be
    refused at another field: the parent the webhook names (``spec.runtimeRef``, an unsupported
    runtime) or a sibling the schema names (``spec.runtimeRef.name``, required when the name went
    into ``kind``). ``elsewhere`` has the hint's words for such a field, written to stand after
    that field's path, so the line names no path twice (``admit.with_hints``).
    """

    error: FieldError
    elsewhere: Mapping[str, str] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return self.error.path


def api_version_hint(api_version: str) -> str | None:
    group, _, version = api_version.rpartition("/")
    if group in (c.GROUP, "kubeflow.org") and version != c.VERSION:
        hint = f"apiVersion {api_version} is not served; the current Kubeflow Trainer API is {c.API_VERSION}"
        if version == "v2alpha1":
            hint += " (v2alpha1 was a design-document name and never shipped)"
        return hint
    return None


def hints(obj: Obj) -> list[Hint]:
    """The hints for ``obj`` as written, before any stage of admission has changed it."""
    kind = obj.get("kind")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return []
    errors: list[FieldError] = []
    runtime_ref: list[Hint] = []
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
                kinds = f"{c.TRAINING_RUNTIME_KIND} or {c.CLUSTER_TRAINING_RUNTIME_KIND}"
                put_name = "put the runtime's name in spec.runtimeRef.name"
                runtime_ref.append(
                    Hint(
                        invalid("spec.runtimeRef.kind", kind_value, f"must be {kinds}; {put_name}"),
                        {
                            # The webhook's refusal: the kind names no supported runtime.
                            "spec.runtimeRef": f"kind must be {kinds}; {put_name}",
                            # The schema's, when the name went into kind instead of name.
                            "spec.runtimeRef.name": f"put the runtime's name here, not in kind "
                            f"({json.dumps(kind_value)}), which must be {kinds}",
                        },
                    )
                )
    return [Hint(e) for e in errors] + runtime_ref
