"""Fields our API adds to upstream's survive a full update by a client that does not know them
(trainer/admission/extensions.py; docs/decisions.md §extensions-survive). Upstream's CRDs say which
fields are ours: every one outside status must be listed, and each is put back by the defaulting
webhook when an update leaves it out. On the real control plane, through the operator's webhook:
tests/operator/test_extensions_e2e.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import reference_data
import yaml

from trainer.admission.admit import default_object
from trainer.admission.extensions import EXTENSIONS, keep_extensions

ROOT = Path(__file__).resolve().parent.parent
KINDS = {
    "trainjobs": "TrainJob",
    "trainingruntimes": "TrainingRuntime",
    "clustertrainingruntimes": "ClusterTrainingRuntime",
}


def fields(schema: dict[str, Any], path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = set()
    for name, sub in (schema.get("properties") or {}).items():
        out.add((*path, name))
        out |= fields(sub, (*path, name))
    if isinstance(schema.get("items"), dict):
        out |= fields(schema["items"], (*path, "[]"))
    return out


def schema_of(path: Path) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


@reference_data.needs_reference("crds/trainer")
@pytest.mark.parametrize("plural", sorted(KINDS))
def test_every_field_we_add_outside_status_is_kept_through_updates(plural: str) -> None:
    ours = fields(schema_of(ROOT / "crds" / f"trainer.kubeflow.org_{plural}.yaml"))
    upstream = fields(
        schema_of(reference_data.reference_dir() / "crds" / "trainer" / f"trainer.kubeflow.org_{plural}.yaml")
    )
    added = {f for f in ours - upstream if f[0] != "status"}
    # The topmost added fields: a field under one of ours comes with it.
    roots = {f for f in added if not any(f[: len(g)] == g for g in added if g != f)}
    assert roots == set(EXTENSIONS[KINDS[plural]]), "list each field beyond upstream's in EXTENSIONS"


def trainjob(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "job", "namespace": "team"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, **spec},
    }


def test_an_update_that_leaves_the_ttl_out_keeps_it() -> None:
    stored = trainjob(ttlSecondsAfterFinished=600, suspend=True)
    # What a client on upstream's types sends: everything it knows, changed, and nothing of ours.
    update = trainjob(suspend=False)
    default_object(update, stored, "2026-11-27T00:00:00Z")
    assert update["spec"] == {
        "runtimeRef": {"name": "torch-distributed"},
        "suspend": False,
        "ttlSecondsAfterFinished": 600,
    }


def test_a_changed_ttl_is_the_new_one_and_a_create_is_left_alone() -> None:
    stored = trainjob(ttlSecondsAfterFinished=600)
    update = trainjob(ttlSecondsAfterFinished=60)
    assert keep_extensions(update, stored) == []
    assert update["spec"]["ttlSecondsAfterFinished"] == 60
    created = trainjob()
    assert keep_extensions(created, None) == [] and "ttlSecondsAfterFinished" not in created["spec"]


def test_a_runtimes_run_policy_is_kept_whole() -> None:
    policy = {"activeDeadlineSeconds": 3600, "ttlSecondsAfterFinished": 60}
    stored = {
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "rt"},
        "spec": {"runPolicy": policy, "mlPolicy": {}},
    }
    update = copy.deepcopy(stored)
    del update["spec"]["runPolicy"]
    assert keep_extensions(update, stored) == ["spec.runPolicy"]
    assert update["spec"]["runPolicy"] == policy and update["spec"]["runPolicy"] is not policy


def test_shapes_it_does_not_expect_are_left_for_the_schema() -> None:
    stored = trainjob(ttlSecondsAfterFinished=600)
    update = {"kind": "TrainJob", "metadata": {}, "spec": "not an object"}
    assert keep_extensions(update, stored) == []
    assert keep_extensions(trainjob(), {"kind": "TrainJob", "spec": None}) == []


def test_a_runtimes_workload_gang_is_kept_unless_the_update_removes_its_parent_or_replaces_it() -> None:
    gang = {"scheduleTimeoutSeconds": 30}

    def runtime(policy: dict[str, Any] | None) -> dict[str, Any]:
        spec = {} if policy is None else {"podGroupPolicy": policy}
        return {"kind": "TrainingRuntime", "metadata": {"name": "rt"}, "spec": spec}

    stored = runtime({"workload": gang})
    # What a client on upstream's types sends back: the policy it read, as an empty object.
    emptied = runtime({})
    assert keep_extensions(emptied, stored) == ["spec.podGroupPolicy.workload"]
    assert emptied["spec"]["podGroupPolicy"] == {"workload": gang}
    # Removed whole (kubectl apply of a manifest without it), or replaced by upstream's sources.
    for update in (runtime(None), runtime({"coscheduling": {}}), runtime({"volcano": {}})):
        before = copy.deepcopy(update)
        assert keep_extensions(update, stored) == []
        assert update == before
