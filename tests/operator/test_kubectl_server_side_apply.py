"""``kubectl apply --server-side`` of every bundled runtime and every example, as a user does it, with
the operator running (its webhooks called, its status and children written), then an update of a
TrainJob by a second field manager: no conflict comes from our objects or from the operator's writes.

Server-side apply refuses a change to a field another manager owns with a different value. Our
objects could cause that in three ways, each checked here: a defaulting webhook that rewrites what
the user applied (a number made a quantity string, a time stamped), so that the next apply of the
same file differs from what is stored; an operator that writes the TrainJob's spec or metadata
(it may write only its status); and a second manager (Kueue, a platform's labeller) that cannot add
its own fields without taking the user's. A deliberate conflict shows the check can fail.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from backend_plugin import kubeconfig_for, kubectl_program
from operator_helpers import TJ, get_or_none, wait_for
from trainer_sandbox.backends import Cluster
from trainer_sandbox.embedded_operator import EmbeddedOperator

from trainer.controller.config import Configuration

ROOT = Path(__file__).resolve().parents[2]
RUNTIMES = sorted((ROOT / "runtimes").glob("*.yaml"))
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
JS = "jobset.x-k8s.io/v1alpha2"

pytestmark = pytest.mark.timeout(300)


class Kubectl:
    def __init__(self, program: str, kubeconfig: Path, home: Path) -> None:
        self.program = program
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(home)}

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.program, *args], env=self.env, input=stdin, capture_output=True, text=True, timeout=60
        )

    def apply(self, text: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return self.run("apply", "--server-side", *extra, "-f", "-", stdin=text)


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"kubectl failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}"
    return proc.stdout


@pytest.fixture
def kubectl(cluster: Cluster, tmp_path: Path) -> Kubectl:
    program = kubectl_program(cluster)
    if program is None:
        pytest.skip("no kubectl for this backend")
    return Kubectl(program, kubeconfig_for(cluster, tmp_path), tmp_path)


@pytest.fixture
def operator_with_webhooks(operator_kubeconfig: Path, cluster: Cluster) -> Iterator[EmbeddedOperator]:
    """The operator with its defaulting and validating webhooks registered: applies go through them."""
    with EmbeddedOperator(operator_kubeconfig, Configuration(), [cluster.namespace], webhooks=True) as op:
        yield op


def _examples(namespace: str) -> dict[str, str]:
    """Each example as written, but in the test's namespace (kubectl refuses a namespace that differs
    from the one its context names)."""
    out = {}
    for path in EXAMPLES:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        for doc in docs:
            doc["metadata"]["namespace"] = namespace
        assert [d["kind"] for d in docs] == ["TrainJob"], path
        out[docs[0]["metadata"]["name"]] = yaml.safe_dump_all(docs, sort_keys=False)
    return out


def _managers(obj: dict[str, Any]) -> dict[tuple[str, str, str], Any]:
    return {
        (f["manager"], f["operation"], f.get("subresource", "")): f.get("fieldsV1")
        for f in obj["metadata"].get("managedFields") or []
    }


def test_runtimes_apply_server_side_and_again_without_change(
    cluster: Cluster, kubectl: Kubectl, operator_with_webhooks: EmbeddedOperator
) -> None:
    assert len(RUNTIMES) >= 8
    names = [yaml.safe_load(p.read_text())["metadata"]["name"] for p in RUNTIMES]
    for path in RUNTIMES:
        _ok(kubectl.apply(path.read_text()))
    first = {n: cluster.get(TJ, "ClusterTrainingRuntime", n, "") for n in names}
    for name, runtime in first.items():
        assert any(m == "kubectl" for m, _, _ in _managers(runtime)), (name, list(_managers(runtime)))
    # The same files again: nothing to do, so nothing is written (no webhook rewrites them back and forth).
    for path in RUNTIMES:
        out = _ok(kubectl.apply(path.read_text()))
        assert "serverside-applied" in out
    for name in names:
        again = cluster.get(TJ, "ClusterTrainingRuntime", name, "")
        assert again["metadata"]["resourceVersion"] == first[name]["metadata"]["resourceVersion"], name


def test_examples_apply_server_side_and_a_second_manager_updates_a_trainjob(
    cluster: Cluster, kubectl: Kubectl, operator_with_webhooks: EmbeddedOperator
) -> None:
    examples = _examples(cluster.namespace)
    assert set(examples) >= {"mnist-ddp", "ds-finetune", "llama-tune"}
    for text in examples.values():
        _ok(kubectl.apply(text))
    # The operator reconciles each: a JobSet, and a status it writes (its own field manager).
    for name in examples:
        wait_for(
            lambda name=name: get_or_none(cluster, JS, "JobSet", name), timeout=60, what=f"{name}'s JobSet"
        )
        wait_for(
            lambda name=name: (cluster.get(TJ, "TrainJob", name).get("status") or {}).get("conditions"),
            timeout=60,
            what=f"{name}'s status",
        )
    stored = {name: cluster.get(TJ, "TrainJob", name) for name in examples}
    # The defaulting webhook keeps the example's whole number as the user applied it (§9).
    mnist_requests = stored["mnist-ddp"]["spec"]["trainer"]["resourcesPerNode"]["requests"]
    assert mnist_requests["cpu"] == 2
    for name, obj in stored.items():
        managers = _managers(obj)
        assert ("kubectl", "Apply", "") in managers, (name, list(managers))
        # The operator writes the status and nothing else of a TrainJob: every other manager's
        # fields are the status subresource's.
        others = [k for k in managers if k != ("kubectl", "Apply", "")]
        assert others and all(k[2] == "status" for k in others), (name, list(managers))
        assert {k[0] for k in others} <= {"trainer", "trainer-operator"}, (name, list(managers))

    # The user applies the same files again, after the operator's writes: no conflict, no change.
    for name, text in examples.items():
        _ok(kubectl.apply(text))
        assert cluster.get(TJ, "TrainJob", name)["spec"] == stored[name]["spec"], name

    # A second manager adds its own fields to a TrainJob the user applied.
    other = {
        "apiVersion": TJ,
        "kind": "TrainJob",
        "metadata": {
            "name": "mnist-ddp",
            "namespace": cluster.namespace,
            "labels": {"kueue.x-k8s.io/queue-name": "research"},
            "annotations": {"example.com/cost-center": "ml-platform"},
        },
    }
    _ok(kubectl.apply(yaml.safe_dump(other), "--field-manager", "other"))
    updated = cluster.get(TJ, "TrainJob", "mnist-ddp")
    assert updated["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "research"
    assert updated["spec"] == stored["mnist-ddp"]["spec"]
    assert ("other", "Apply", "") in _managers(updated)
    # The user's next apply of the unchanged file neither conflicts nor takes the other's fields away.
    _ok(kubectl.apply(examples["mnist-ddp"]))
    after = cluster.get(TJ, "TrainJob", "mnist-ddp")
    assert after["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "research"
    assert after["metadata"]["annotations"]["example.com/cost-center"] == "ml-platform"
    # And the second manager changes its own field again, without conflict.
    other["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "production"
    _ok(kubectl.apply(yaml.safe_dump(other), "--field-manager", "other"))
    assert cluster.get(TJ, "TrainJob", "mnist-ddp")["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == (
        "production"
    )

    # The check can fail: the second manager taking a field the user applied is a conflict.
    taken = {**other, "spec": {"trainer": {"numNodes": 5}}}
    refused = kubectl.apply(yaml.safe_dump(taken), "--field-manager", "other")
    assert refused.returncode != 0
    assert "conflict" in refused.stderr.lower() and "kubectl" in refused.stderr, refused.stderr
    assert cluster.get(TJ, "TrainJob", "mnist-ddp")["spec"]["trainer"]["numNodes"] == 2
