"""The admission pipeline's two modes (trainer/admission/admit.py, docs/architecture.md,
Admission).

``Mode.FULL`` is a whole cluster's admission, for ``trainer render``; ``Mode.WEBHOOK`` is our
validating webhook, called by an API server that has already checked the CRD schema and its CEL
rules. The objects here are ones no API server would send a webhook (it refuses them first): the
webhook mode lets them through, since those stages are the server's, and the full pipeline still
refuses them with the field the server names. The webhook's own rules refuse in both modes.
"""

from __future__ import annotations

import copy
from importlib import resources
from typing import Any

import pytest
import yaml

from trainer.admission.admit import Mode, admit
from trainer.apimachinery.errors import AdmissionError
from trainer.offline.cluster import OfflineCluster
from trainer.runtime import framework as fw
from trainer.runtime.info import Facts

Obj = dict[str, Any]
TJ = "trainer.kubeflow.org/v1alpha1"
NOW = "2026-01-01T00:00:00Z"
RUNTIME: Obj = yaml.safe_load(
    resources.files("trainer.runtimes").joinpath("torch_distributed.yaml").read_text()
)


def trainjob(runtime: str = "torch-distributed", **spec: Any) -> Obj:
    """A TrainJob with the CRD's defaults written out, as the server sends it to a webhook."""
    ref = {"name": runtime, "kind": "ClusterTrainingRuntime", "apiGroup": "trainer.kubeflow.org"}
    return {
        "apiVersion": TJ,
        "kind": "TrainJob",
        "metadata": {"name": "job", "namespace": "default"},
        "spec": {"runtimeRef": ref, **spec},
    }


def verdict(obj: Obj, mode: Mode, old: Obj | None = None) -> list[str]:
    """The paths refused, [] when admitted."""
    facts = Facts()
    facts.put(copy.deepcopy(RUNTIME))
    try:
        admit(copy.deepcopy(obj), old, facts, fw.default(), NOW, mode=mode)
    except AdmissionError as exc:
        return sorted({e.path for e in exc.errors})
    return []


def stored(obj: Obj) -> Obj:
    """``obj`` as the full pipeline stores it (what an update's old object is)."""
    facts = Facts()
    facts.put(copy.deepcopy(RUNTIME))
    admitted, _ = admit(copy.deepcopy(obj), None, facts, fw.default(), NOW)
    return admitted


# (what the server refuses, the object, the path it names)
SERVER_REFUSES = [
    (
        "unknown field",
        trainjob(trainer={"numNodes": 1, "fieldOfAFutureVersion": 1}),
        "spec.trainer.fieldOfAFutureVersion",
    ),
    ("CEL rule", trainjob(trainer={"numProcPerNode": 0}), "spec.trainer.numProcPerNode"),
    ("CEL enum", trainjob(managedBy="example.com/elsewhere"), "spec.managedBy"),
    ("minimum", trainjob(trainer={"numNodes": -1}), "spec.trainer.numNodes"),
    ("type", trainjob(suspend="yes"), "spec.suspend"),
]


@pytest.mark.parametrize(("case", "obj", "path"), SERVER_REFUSES, ids=[c[0] for c in SERVER_REFUSES])
def test_the_webhook_mode_skips_what_the_server_checked(case: str, obj: Obj, path: str) -> None:
    assert path in verdict(obj, Mode.FULL), f"{case}: the full pipeline must refuse it at {path}"
    assert verdict(obj, Mode.WEBHOOK) == [], f"{case}: the webhook repeats the server's check"


def test_an_offline_render_still_refuses_what_the_server_would() -> None:
    cluster = OfflineCluster(framework=fw.default())
    cluster.apply(copy.deepcopy(RUNTIME))
    for _, obj, _path in SERVER_REFUSES:
        cluster.apply(copy.deepcopy(obj))
    refused = [{e.path for e in r.errors} for r in cluster.refusals]
    assert len(refused) == len(SERVER_REFUSES)
    for paths, (_, _, path) in zip(refused, SERVER_REFUSES, strict=True):
        assert path in paths


def test_transition_rules_are_the_servers_too() -> None:
    """``spec.runtimeRef`` is immutable by a CEL transition rule: the server's to check."""
    old = stored(trainjob(suspend=True))
    new = copy.deepcopy(old)
    new["spec"]["runtimeRef"]["name"] = "another"
    assert "spec.runtimeRef" in verdict(new, Mode.FULL, old)
    # The webhook only looks the runtime up, and "another" does not exist.
    assert verdict(new, Mode.WEBHOOK, old) == ["spec.runtimeRef"]
    new["spec"]["runtimeRef"]["name"] = "torch-distributed"
    new["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    assert "spec.managedBy" in verdict(new, Mode.FULL, old)
    assert verdict(new, Mode.WEBHOOK, old) == []


WEBHOOK_REFUSES = [
    ("runtime lookup", trainjob("nowhere"), "spec.runtimeRef"),
    ("plugin rule", trainjob(trainer={"env": [{"name": "PET_NODE_RANK", "value": "0"}]}), "spec.trainer.env"),
]


@pytest.mark.parametrize(("case", "obj", "path"), WEBHOOK_REFUSES, ids=[c[0] for c in WEBHOOK_REFUSES])
def test_the_webhooks_own_rules_run_in_both_modes(case: str, obj: Obj, path: str) -> None:
    assert verdict(obj, Mode.WEBHOOK) == [path], case
    assert verdict(obj, Mode.FULL) == [path], case


def test_an_update_rule_outside_cel_runs_in_the_webhook() -> None:
    """runtimePatches change only while suspended: a plugin rule on the update, not a CEL one."""
    old = stored(trainjob(suspend=False))
    new = copy.deepcopy(old)
    new["spec"]["runtimePatches"] = [{"manager": "example.com/m", "time": NOW}]
    assert verdict(new, Mode.WEBHOOK, old) == ["spec.runtimePatches"]
    assert verdict(new, Mode.FULL, old) == ["spec.runtimePatches"]


def test_the_webhook_mode_returns_the_object_as_it_came() -> None:
    """No defaults of ours are applied after the server's: what the server stores is its own."""
    obj = trainjob(trainer={"numNodes": 1})
    facts = Facts()
    facts.put(copy.deepcopy(RUNTIME))
    admitted, _ = admit(copy.deepcopy(obj), None, facts, fw.default(), NOW, mode=Mode.WEBHOOK)
    assert admitted == obj
    full, _ = admit(copy.deepcopy(obj), None, facts, fw.default(), NOW)
    assert full != obj  # the CRD's defaults (runtimeRef's kind and apiGroup)


def test_an_integer_beyond_its_format_is_refused_by_both() -> None:
    """kube-apiserver 1.36 refuses an int32 field's overflow itself, at the root; the webhook keeps
    its own check (upstream's decode into Go structs) for servers that store it."""
    obj = trainjob(trainer={"numNodes": 2**31})
    assert verdict(obj, Mode.FULL) == ["<nil>"]
    assert verdict(obj, Mode.WEBHOOK) == ["spec.trainer.numNodes"]


def test_a_mutating_patch_turns_integral_floats_into_ints() -> None:
    """The API server re-decodes an object a mutating webhook patched from Go's JSON, which writes
    1.0 as 1: an integer field's CEL rule then sees an int. Unpatched, it sees a float64 and fails."""
    unpatched = trainjob(trainer={"numProcPerNode": 1.0})
    assert verdict(unpatched, Mode.FULL) == ["spec.trainer.numProcPerNode"]
    # A fraction for a quantity is written as a quantity string by our defaulting webhook: a patch.
    patched = trainjob(trainer={"numProcPerNode": 1.0, "resourcesPerNode": {"requests": {"cpu": 0.5}}})
    assert verdict(patched, Mode.FULL) == []
    assert stored(patched)["spec"]["trainer"]["numProcPerNode"] == 1
    assert isinstance(stored(patched)["spec"]["trainer"]["numProcPerNode"], int)
    assert stored(patched)["spec"]["trainer"]["resourcesPerNode"]["requests"]["cpu"] == "500m"


def test_defaulting_keeps_the_whole_numbers_a_user_wrote_at_quantities() -> None:
    """docs/decisions.md §9: ``cpu: 2`` is an int-or-string's integer, stored as written, so the
    same manifest applied again is no change; only a fraction, which no schema stores as a number,
    becomes a quantity string."""
    job = trainjob(trainer={"resourcesPerNode": {"requests": {"cpu": 2, "memory": 1024.0, "gpu": 0.25}}})
    assert verdict(job, Mode.FULL) == []
    requests = stored(job)["spec"]["trainer"]["resourcesPerNode"]["requests"]
    assert requests == {"cpu": 2, "memory": 1024, "gpu": "250m"}
    assert isinstance(requests["cpu"], int)


def test_a_number_sent_again_for_a_quantity_stored_as_a_string_keeps_the_string() -> None:
    """A TrainJob stored when the webhook still wrote ``cpu: 4`` as ``"4"``: the same manifest
    applied again sends ``4``. Kept as ``"4"``, the update changes nothing, and spec.trainer's
    immutability rule does not refuse it; a different amount is still a change."""
    old = stored(trainjob(trainer={"resourcesPerNode": {"requests": {"cpu": "4", "memory": "1Gi"}}}))
    again = copy.deepcopy(old)
    again["spec"]["trainer"]["resourcesPerNode"]["requests"] = {"cpu": 4, "memory": 1073741824}
    assert verdict(again, Mode.FULL, old) == []
    facts = Facts()
    facts.put(copy.deepcopy(RUNTIME))
    admitted, _ = admit(copy.deepcopy(again), old, facts, fw.default(), NOW)
    assert admitted["spec"]["trainer"]["resourcesPerNode"]["requests"] == {"cpu": "4", "memory": "1Gi"}
    changed = copy.deepcopy(old)
    changed["spec"]["trainer"]["resourcesPerNode"]["requests"]["cpu"] = 5
    assert verdict(changed, Mode.FULL, old) == ["spec.trainer"]


def test_hints_reword_the_refusal_and_keep_its_paths() -> None:
    """docs/decisions.md §7: a hint is the wording of the error the server would give at that field,
    not a refusal of its own (the CEL rules blocked by the type error stay reported)."""
    facts = Facts()
    facts.put(copy.deepcopy(RUNTIME))
    with pytest.raises(AdmissionError) as refused:
        admit(trainjob(trainer={"numProcPerNode": "auto"}), None, facts, fw.default(), NOW)
    assert {e.path for e in refused.value.errors} == {"spec.trainer.numProcPerNode", "<nil>"}
    assert "leave it unset for automatic" in str(refused.value)
    job = trainjob("torch-distributed")
    job["spec"]["runtimeRef"]["kind"] = "torch-distributed"
    with pytest.raises(AdmissionError) as refused:
        admit(job, None, facts, fw.default(), NOW)
    # The webhook refuses the runtime (spec.runtimeRef); the hint says what the kind is for.
    assert [e.path for e in refused.value.errors] == ["spec.runtimeRef"]
    assert "put the runtime's name in spec.runtimeRef.name" in str(refused.value)


def test_metadata_type_errors_are_one_the_first_in_sorted_key_order() -> None:
    """The server decodes metadata from a map it marshals again (keys sorted) and stops at the
    first type error: `labels` before `name`, one error, as the differential test found."""
    bad = copy.deepcopy(RUNTIME)
    bad["metadata"] = {"name": [], "labels": {"z": 1, "a": []}}
    with pytest.raises(AdmissionError) as refused:
        admit(bad, None, Facts(), fw.default(), NOW)
    assert [e.path for e in refused.value.errors] == ["metadata.labels"]
    assert '"a"' in str(refused.value)
