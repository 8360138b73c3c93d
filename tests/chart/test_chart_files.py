"""The chart's generated files are in step with their sources, and the RBAC helper does what it says."""

from __future__ import annotations

import pytest
import sync_chart
from trainer_sandbox import rbac_audit


def test_generated_files_are_current() -> None:
    stale = sync_chart.stale_files()
    assert stale == [], f"stale chart files {stale}: run python charts/tools/sync_chart.py"


def test_readme_documents_every_value() -> None:
    readme = (sync_chart.CHART / "README.md").read_text()
    for doc in sync_chart.value_docs((sync_chart.CHART / "values.yaml").read_text()):
        assert f"| `{doc.key}` |" in readme


def test_value_docs_follow_keys_and_comments() -> None:
    text = """# header, not a value's
# -- First line.
# second line.
a:
  # -- Nested.
  b: 1
  c: 2
list:
  - x: 1
# -- After a list.
d: {}
"""
    docs = [(d.key, d.description) for d in sync_chart.value_docs(text)]
    assert docs == [("a", "First line. second line."), ("a.b", "Nested."), ("d", "After a list.")]


def test_rules_round_trip_and_compact() -> None:
    used = {
        ("", "configmaps", "create"),
        ("", "secrets", "create"),
        ("", "events", "create"),
        ("", "configmaps", "list"),
    }
    rules = rbac_audit.rules_from_permissions(used)
    assert rbac_audit.permissions_from_rules(rules) == used
    assert {"apiGroups": [""], "resources": ["events", "secrets"], "verbs": ["create"]} in rules


@pytest.mark.parametrize(
    "rule",
    [
        {"apiGroups": ["*"], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["*"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceNames": ["one"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["escalate-ish"]},
    ],
)
def test_rules_that_are_not_exact_are_refused(rule: dict[str, list[str]]) -> None:
    with pytest.raises(ValueError):
        rbac_audit.permissions_from_rules([rule])


def test_owner_references_that_block_deletion_need_the_owners_finalizers() -> None:
    owners = {
        ("trainer.kubeflow.org/v1alpha1", "TrainJob"): rbac_audit.OwnerKind(
            "trainer.kubeflow.org", "trainjobs"
        )
    }
    ref = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "x", "uid": "u"}
    blocking = {"metadata": {"ownerReferences": [{**ref, "blockOwnerDeletion": True}]}}
    plain = {"metadata": {"ownerReferences": [ref]}}
    assert rbac_audit.owner_finalizer_permissions([plain], owners) == set()
    assert rbac_audit.owner_finalizer_permissions([blocking], owners) == {
        ("trainer.kubeflow.org", "trainjobs/finalizers", "update")
    }
    with pytest.raises(KeyError):
        rbac_audit.owner_finalizer_permissions([blocking], {})
