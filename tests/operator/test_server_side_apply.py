"""Children are written with server-side apply: what other managers set on them survives our writes.

Kueue, a scheduler or a provisioning controller may set node selectors and tolerations on a
suspended JobSet's pod templates (JobSet's webhook lets those change while suspended). Our resume
must leave them in place, and a field we stop wanting goes while theirs stay.
"""

from __future__ import annotations

from typing import Any

from operator_helpers import (
    TJ,
    conditions,
    get_or_none,
    operator_writes,
    trainjob,
    wait_for,
    wait_settled,
)
from trainer_sandbox.backends import Cluster
from trainer_sandbox.embedded_operator import EmbeddedOperator

JS = "jobset.x-k8s.io/v1alpha2"
KUEUE_TOLERATION = {
    "key": "kueue.x-k8s.io/flavor",
    "operator": "Equal",
    "value": "spot",
    "effect": "NoSchedule",
}


def _pod_spec(jobset: dict[str, Any], job: str = "node") -> dict[str, Any]:
    rjob = next(r for r in jobset["spec"]["replicatedJobs"] if r["name"] == job)
    spec: dict[str, Any] = rjob["template"]["spec"]["template"]["spec"]
    return spec


def _as_kueue(cluster: Cluster, name: str, pod_spec: dict[str, Any]) -> None:
    """Another field manager sets pod-template fields of the suspended JobSet's node job."""
    cluster.apply(
        {
            "apiVersion": JS,
            "kind": "JobSet",
            "metadata": {"name": name, "namespace": cluster.namespace},
            "spec": {
                "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": pod_spec}}}}]
            },
        },
        field_manager="kueue",
        force=False,
    )


def _node_selector_patch(manager: str, selector: dict[str, str]) -> dict[str, Any]:
    pod = {"spec": {"nodeSelector": selector}}
    job = {"name": "node", "template": {"spec": {"template": pod}}}
    return {"manager": manager, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [job]}}}}


def test_resume_keeps_what_another_manager_set_on_the_suspended_jobset(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    # Its pods keep running once resumed: a world that settles and stays settled (pods that end
    # would complete the JobSet, a status the forced reconcile below would rightly copy).
    running = {"env": [{"name": "SANDBOX_RUN_SECONDS", "value": "-1"}]}
    cluster.create(trainjob("queued", suspend=True, trainer=running))
    wait_for(
        lambda: (get_or_none(cluster, JS, "JobSet", "queued") or {}).get("spec", {}).get("suspend") is True,
        what="the suspended JobSet",
    )
    wait_for(lambda: "Suspended" in conditions(cluster, "queued"), what="Suspended")
    _as_kueue(cluster, "queued", {"nodeSelector": {"pool": "spot"}, "tolerations": [KUEUE_TOLERATION]})
    assert operator.idle()

    cluster.patch(TJ, "TrainJob", "queued", {"spec": {"suspend": False}})
    wait_for(
        lambda: cluster.get(JS, "JobSet", "queued")["spec"]["suspend"] is False, what="the JobSet resumed"
    )
    assert operator.idle()
    pod_spec = _pod_spec(cluster.get(JS, "JobSet", "queued"))
    assert pod_spec.get("nodeSelector") == {"pool": "spot"}
    assert pod_spec.get("tolerations") == [KUEUE_TOLERATION]
    wait_for(lambda: conditions(cluster, "queued").get("Suspended") == ("False", "Resumed"), what="Resumed")
    # On the real control plane JobSet's controller goes on reporting the resumed pods, and the
    # operator copies each report to the TrainJob's status: start from a settled world.
    wait_settled(cluster, operator.idle)

    # Compare first: a reconcile that finds what it wants among others' fields writes nothing.
    mark = cluster.audit_mark()
    before = operator.reconciles()
    loop = operator._loop
    assert loop is not None
    loop.call_soon_threadsafe(operator.operator.queue.add, (cluster.namespace, "queued"))
    wait_for(lambda: operator.reconciles() > before, what="the forced reconcile")
    assert operator.idle()
    assert [(r.verb, r.resource) for r in operator_writes(cluster, mark)] == []


def test_a_selector_we_stop_wanting_goes_while_another_managers_toleration_stays(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    """Kueue moves a suspended TrainJob to another flavor: its runtime patch now selects other nodes.

    The first flavor's selector is no longer wanted and must go (a merge patch only adds keys, and
    the pods would then need nodes of both flavors), while a toleration another manager put on the
    JobSet stays. A node selector is an atomic map: whoever sets it owns it whole.
    """
    first = _node_selector_patch("kueue.x-k8s.io/manager", {"flavor-a": "true"})
    cluster.create(trainjob("moved", suspend=True, runtimePatches=[first]))
    jobset = wait_for(lambda: get_or_none(cluster, JS, "JobSet", "moved"), what="the JobSet")
    assert _pod_spec(jobset).get("nodeSelector") == {"flavor-a": "true"}
    wait_for(lambda: "Suspended" in conditions(cluster, "moved"), what="Suspended")
    _as_kueue(cluster, "moved", {"tolerations": [KUEUE_TOLERATION]})
    assert operator.idle()

    second = _node_selector_patch("kueue.x-k8s.io/manager", {"flavor-b": "true"})
    cluster.patch(TJ, "TrainJob", "moved", {"spec": {"suspend": False, "runtimePatches": [second]}})
    wait_for(
        lambda: cluster.get(JS, "JobSet", "moved")["spec"]["suspend"] is False, what="the JobSet resumed"
    )
    assert operator.idle()
    pod_spec = _pod_spec(cluster.get(JS, "JobSet", "moved"))
    assert pod_spec.get("nodeSelector") == {"flavor-b": "true"}
    assert pod_spec.get("tolerations") == [KUEUE_TOLERATION]


def test_an_item_applied_without_its_defaulted_key_is_the_stored_item(cluster: Cluster) -> None:
    """A container port we write without ``protocol`` is matched with the stored ``TCP`` port, as
    structured-merge-diff matches list-map items: applying it again is not a second port."""

    def jobset(suspend: bool) -> dict[str, Any]:
        pod = {"containers": [{"name": "node", "image": "img", "ports": [{"containerPort": 29500}]}]}
        job = {"name": "node", "replicas": 1, "template": {"spec": {"template": {"spec": pod}}}}
        return {
            "apiVersion": JS,
            "kind": "JobSet",
            "metadata": {"name": "ported", "namespace": cluster.namespace},
            "spec": {"suspend": suspend, "replicatedJobs": [job]},
        }

    cluster.apply(jobset(True), field_manager="trainer", force=False)
    resumed = cluster.apply(jobset(False), field_manager="trainer", force=True)
    assert _pod_spec(resumed)["containers"][0]["ports"] == [{"containerPort": 29500, "protocol": "TCP"}]
    owned = next(m for m in resumed["metadata"]["managedFields"] if m["manager"] == "trainer")["fieldsV1"]
    rjob = owned["f:spec"]["f:replicatedJobs"]['k:{"name":"node"}']
    container = rjob["f:template"]["f:spec"]["f:template"]["f:spec"]["f:containers"]['k:{"name":"node"}']
    assert container["f:ports"] == {
        'k:{"containerPort":29500,"protocol":"TCP"}': {".": {}, "f:containerPort": {}}
    }
