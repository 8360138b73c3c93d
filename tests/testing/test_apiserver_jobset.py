"""The simulated JobSet controller: defaults, Jobs and Pods, phases, dependsOn, policies, suspend."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from trainer_sandbox.apiserver import APIError, LocalAPIServer
from trainer_sandbox.controllers import JOB_USER, JOBSET_USER, KUBELET_USER

JS = "jobset.x-k8s.io/v1alpha2"


def rjob(
    name: str, *, replicas: int = 1, pods: int = 1, env: dict[str, str] | None = None, **extra: Any
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "node",
        "image": "busybox:1",
        "command": ["python", "train.py"],
        "args": ["--x", "1"],
    }
    container["env"] = [{"name": k, "value": v} for k, v in (env or {"SANDBOX_RUN_SECONDS": "0.2"}).items()]
    job_spec: dict[str, Any] = {
        "parallelism": pods,
        "completions": pods,
        "template": {"spec": {"containers": [container]}},
    }
    job_spec.update(extra.pop("job", {}))
    return {"name": name, "replicas": replicas, "template": {"spec": job_spec}, **extra}


def jobset(name: str, *rjobs: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": JS,
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicatedJobs": list(rjobs), **spec},
    }


def wait_for(fn: Any, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def condition(server: LocalAPIServer, name: str, ctype: str) -> dict[str, Any] | None:
    js = server.get(JS, "JobSet", name)
    for c in (js.get("status") or {}).get("conditions") or []:
        if c["type"] == ctype and c["status"] == "True":
            return dict(c)
    return None


def pods(server: LocalAPIServer, jobset_name: str) -> list[dict[str, Any]]:
    return [
        p
        for p in server.list("v1", "Pod", "default")
        if p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == jobset_name
    ]


def test_defaults_jobs_pods_and_completion(trainer_apiserver: LocalAPIServer) -> None:
    server = trainer_apiserver
    created = server.create(jobset("js", rjob("node", replicas=2, pods=2)))
    spec = created["spec"]
    assert spec["successPolicy"] == {"operator": "All"}
    assert spec["startupPolicy"] == {"startupPolicyOrder": "AnyOrder"}
    assert spec["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    assert "managedBy" not in spec, "JobSet's webhook does not default it"
    rj = spec["replicatedJobs"][0]["template"]["spec"]
    assert rj["completionMode"] == "Indexed" and rj["template"]["spec"]["restartPolicy"] == "OnFailure"

    done = wait_for(lambda: condition(server, "js", "Completed"))
    assert (done["reason"], done["message"]) == ("AllJobsCompleted", "jobset completed successfully")
    status = server.get(JS, "JobSet", "js")["status"]
    assert status["terminalState"] == "Completed"
    assert status["replicatedJobsStatus"] == [
        {"name": "node", "ready": 0, "succeeded": 2, "failed": 0, "active": 0, "suspended": 0}
    ]
    jobs = sorted(server.list("batch/v1", "Job", "default"), key=lambda j: j["metadata"]["name"])
    assert [j["metadata"]["name"] for j in jobs] == ["js-node-0", "js-node-1"]
    labels = jobs[1]["metadata"]["labels"]
    assert labels["jobset.sigs.k8s.io/jobset-name"] == "js"
    assert labels["jobset.sigs.k8s.io/replicatedjob-name"] == "node"
    assert labels["jobset.sigs.k8s.io/job-index"] == "1"
    assert labels["jobset.sigs.k8s.io/replicatedjob-replicas"] == "2"
    assert jobs[1]["metadata"]["ownerReferences"][0]["kind"] == "JobSet"
    all_pods = pods(server, "js")
    assert len(all_pods) == 4 and all(p["status"]["phase"] == "Succeeded" for p in all_pods)
    pod = next(p for p in all_pods if p["metadata"]["name"].startswith("js-node-1-1-"))
    assert pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1"
    assert pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1"
    assert pod["spec"]["hostname"] == "js-node-1-1" and pod["spec"]["subdomain"] == "js"
    svc = server.get("v1", "Service", "js")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["selector"] == {
        "jobset.sigs.k8s.io/jobset-name": "js"
    }
    log = server.pod_logs[(pod["metadata"]["uid"], "node")]
    assert "[sandbox] command: python train.py" in log and "[sandbox] args: --x 1" in log
    assert log[-1] == "[sandbox] exited with code 0"
    users = server.audit.by_user()
    assert users[JOBSET_USER] > 0 and users[JOB_USER] > 0 and users[KUBELET_USER] > 0


def test_depends_on_orders_startup(trainer_apiserver: LocalAPIServer) -> None:
    server = trainer_apiserver
    init = rjob("init", env={"SANDBOX_RUN_SECONDS": "0.5"})
    node = rjob("node", dependsOn=[{"name": "init", "status": "Complete"}])
    server.create(jobset("dep", init, node))
    wait_for(lambda: pods(server, "dep"))
    time.sleep(0.2)
    assert {
        p["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] for p in pods(server, "dep")
    } == {"init"}
    wait_for(lambda: condition(server, "dep", "Completed"))
    first_node = min(
        p["metadata"]["creationTimestamp"] for p in pods(server, "dep") if "node" in p["metadata"]["name"]
    )
    init_pod = next(p for p in pods(server, "dep") if "init" in p["metadata"]["name"])
    finished = init_pod["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"]
    assert first_node >= finished


def test_success_policy_targets_and_running_workers(trainer_apiserver: LocalAPIServer) -> None:
    server = trainer_apiserver
    launcher = rjob("launcher", env={"SANDBOX_RUN_SECONDS": "0.5"})
    worker = rjob("node", pods=2)  # sshd-like: never finishes by itself
    server.create(
        jobset(
            "ds", launcher, worker, successPolicy={"operator": "All", "targetReplicatedJobs": ["launcher"]}
        )
    )
    wait_for(lambda: condition(server, "ds", "Completed"))
    # The active worker Job is deleted once the JobSet is finished.
    wait_for(
        lambda: (
            not [j for j in server.list("batch/v1", "Job", "default") if j["metadata"]["name"] == "ds-node-0"]
        )
    )


def test_failure_policy_restarts_then_fails(trainer_apiserver: LocalAPIServer) -> None:
    server = trainer_apiserver
    failing = rjob(
        "node", env={"SANDBOX_RUN_SECONDS": "0.1", "SANDBOX_EXIT_CODE": "3"}, job={"backoffLimit": 0}
    )
    server.create(jobset("fp", failing, failurePolicy={"maxRestarts": 1}))
    failed = wait_for(lambda: condition(server, "fp", "Failed"))
    assert (failed["reason"], failed["message"]) == (
        "ReachedMaxRestarts",
        "jobset failed due to reaching max number of restarts (first failed job: fp-node-0)",
    )
    status = server.get(JS, "JobSet", "fp")["status"]
    assert status["restarts"] == 1 and status["terminalState"] == "Failed"
    attempts = {
        j["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"]
        for j in server.list("batch/v1", "Job", "default")
    }
    assert attempts == {"1"}
    # Failed Jobs lose their running pods; the logs tell how each attempt ended.
    assert any("[sandbox] exited with code 3" in line for lines in server.pod_logs.values() for line in lines)


def test_failed_without_restarts(trainer_apiserver: LocalAPIServer) -> None:
    server = trainer_apiserver
    failing = rjob(
        "node", env={"SANDBOX_RUN_SECONDS": "0.1", "SANDBOX_EXIT_CODE": "1"}, job={"backoffLimit": 1}
    )
    server.create(jobset("f", failing))
    failed = wait_for(lambda: condition(server, "f", "Failed"))
    assert (failed["reason"], failed["message"]) == (
        "FailedJobs",
        "jobset failed due to one or more job failures (first failed job: f-node-0)",
    )
    assert server.get(JS, "JobSet", "f")["status"]["terminalState"] == "Failed"
    job = server.get("batch/v1", "Job", "f-node-0")
    reasons = {c["type"]: c["reason"] for c in job["status"]["conditions"]}
    assert reasons["Failed"] == "BackoffLimitExceeded"
    # restartPolicy OnFailure restarts the container in place: one pod, restarted until the limit.
    logs = [lines for lines in server.pod_logs.values()]
    assert len(logs) == 1
    assert sum("restarting" in line for line in logs[0]) == 2
    assert job["status"]["failed"] == 2


def test_suspend_and_resume(trainer_apiserver: LocalAPIServer) -> None:
    server = trainer_apiserver
    server.create(jobset("s", rjob("node", env={"SANDBOX_RUN_SECONDS": "0.2"}), suspend=True))
    wait_for(lambda: condition(server, "s", "Suspended"))
    time.sleep(0.3)
    assert pods(server, "s") == []
    assert server.get("batch/v1", "Job", "s-node-0")["spec"]["suspend"] is True
    server.patch(JS, "JobSet", "s", {"spec": {"suspend": False}})
    wait_for(lambda: condition(server, "s", "Completed"))
    suspended = next(
        c for c in server.get(JS, "JobSet", "s")["status"]["conditions"] if c["type"] == "Suspended"
    )
    assert (suspended["status"], suspended["reason"]) == ("False", "ResumeJobs")


def test_replicated_jobs_are_immutable_unless_suspended(trainer_apiserver: LocalAPIServer) -> None:
    server = trainer_apiserver
    js = jobset("im", rjob("node", env={"SANDBOX_RUN_SECONDS": "-1"}))
    server.create(js)
    changed = copy.deepcopy(server.get(JS, "JobSet", "im"))
    changed["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["image"] = (
        "other"
    )
    with pytest.raises(APIError) as err:
        server.patch(JS, "JobSet", "im", {"spec": {"replicatedJobs": changed["spec"]["replicatedJobs"]}})
    assert err.value.code == 422 and "field is immutable" in err.value.message
    labels_only = copy.deepcopy(server.get(JS, "JobSet", "im"))
    labels_only["spec"]["replicatedJobs"][0]["template"]["spec"]["template"].setdefault("metadata", {})[
        "labels"
    ] = {"a": "b"}
    server.patch(
        JS,
        "JobSet",
        "im",
        {"spec": {"suspend": True, "replicatedJobs": labels_only["spec"]["replicatedJobs"]}},
    )


def test_client_phase_wins(trainer_apiserver: LocalAPIServer) -> None:
    server = trainer_apiserver
    server.create(jobset("c", rjob("node", env={"SANDBOX_RUN_SECONDS": "-1"})))
    pod = wait_for(lambda: [p for p in pods(server, "c") if p["status"]["phase"] == "Running"])[0]
    server.patch(
        "v1",
        "Pod",
        pod["metadata"]["name"],
        {"status": {"phase": "Succeeded"}},
        subresource="status",
        user="tester",
    )
    wait_for(lambda: condition(server, "c", "Completed"))


def test_managed_by_other_controller_is_left_alone(trainer_apiserver: LocalAPIServer) -> None:
    server = trainer_apiserver
    server.create(jobset("mk", rjob("node"), managedBy="kueue.x-k8s.io/multikueue"))
    time.sleep(0.5)
    assert server.list("batch/v1", "Job", "default") == []


def running_pod(server: LocalAPIServer, name: str, attempt: int) -> dict[str, Any]:
    """The Running pod of JobSet ``name``'s restart ``attempt``."""
    found: list[dict[str, Any]] = wait_for(
        lambda: [
            p
            for p in pods(server, name)
            if p["status"]["phase"] == "Running"
            and p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] == str(attempt)
        ]
    )
    return found[0]


def fail_pod(server: LocalAPIServer, pod: dict[str, Any]) -> None:
    server.patch(
        "v1", "Pod", pod["metadata"]["name"], {"status": {"phase": "Failed"}}, subresource="status", user="t"
    )


def test_max_restarts_zero_fails_at_once(trainer_apiserver: LocalAPIServer) -> None:
    """A failurePolicy, even with maxRestarts 0, fails with ReachedMaxRestarts, not FailedJobs."""
    server = trainer_apiserver
    failing = rjob(
        "node", env={"SANDBOX_RUN_SECONDS": "0.1", "SANDBOX_EXIT_CODE": "1"}, job={"backoffLimit": 0}
    )
    server.create(jobset("z", failing, failurePolicy={"maxRestarts": 0}))
    failed = wait_for(lambda: condition(server, "z", "Failed"))
    assert (failed["reason"], failed["message"]) == (
        "ReachedMaxRestarts",
        "jobset failed due to reaching max number of restarts (first failed job: z-node-0)",
    )
    status = server.get(JS, "JobSet", "z")["status"]
    assert status["restarts"] == 0 and status["terminalState"] == "Failed"


def test_only_restarts_counting_towards_max_are_compared(trainer_apiserver: LocalAPIServer) -> None:
    """maxRestarts bounds restartsCountTowardsMax: restarts that did not count (a
    RestartJobSetAndIgnoreMaxRestarts rule's, here written by the test) do not fail the JobSet."""
    server = trainer_apiserver
    held = rjob("node", env={"SANDBOX_RUN_SECONDS": "-1"}, job={"backoffLimit": 0})
    server.create(jobset("rc", held, failurePolicy={"maxRestarts": 1}))
    running_pod(server, "rc", 0)
    server.run(server.controllers.idle())
    server.patch(
        JS, "JobSet", "rc", {"status": {"restarts": 2, "restartsCountTowardsMax": 0}}, subresource="status"
    )
    fail_pod(server, running_pod(server, "rc", 2))
    fail_pod(server, running_pod(server, "rc", 3))  # the failure above restarted the JobSet
    failed = wait_for(lambda: condition(server, "rc", "Failed"))
    assert (failed["reason"], failed["message"]) == (
        "ReachedMaxRestarts",
        "jobset failed due to reaching max number of restarts (first failed job: rc-node-0)",
    )
    status = server.get(JS, "JobSet", "rc")["status"]
    assert (status["restarts"], status["restartsCountTowardsMax"]) == (3, 1)


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        (
            {"replicatedJobs": [rjob("init", dependsOn=[{"name": "node", "status": "Ready"}]), rjob("node")]},
            "spec.replicatedJobs[0].dependsOn",
            "DependsOn can't be set for the first ReplicatedJob",
        ),
        (
            {
                "replicatedJobs": [
                    rjob("init"),
                    rjob("node", dependsOn=[{"name": "launcher", "status": "Complete"}]),
                    rjob("launcher"),
                ]
            },
            "spec.replicatedJobs[1].dependsOn[0].name",
            "replicatedJob: node cannot depend on replicatedJob: launcher",
        ),
        (
            {
                "replicatedJobs": [
                    rjob("init"),
                    rjob("node", dependsOn=[{"name": "missing", "status": "Ready"}]),
                ],
            },
            "spec.replicatedJobs[1].dependsOn[0].name",
            "replicatedJob: node cannot depend on replicatedJob: missing",
        ),
        (
            {
                "replicatedJobs": [rjob("node")],
                "successPolicy": {"operator": "All", "targetReplicatedJobs": ["x"]},
            },
            "spec.successPolicy.targetReplicatedJobs[0]",
            "invalid replicatedJob name 'x' does not appear in .spec.ReplicatedJobs",
        ),
    ],
)
def test_webhook_refuses_bad_references_on_create(
    trainer_apiserver: LocalAPIServer, spec: dict[str, Any], field: str, message: str
) -> None:
    obj = jobset("bad", **spec)
    with pytest.raises(APIError) as err:
        trainer_apiserver.create(obj)
    assert (err.value.code, err.value.reason) == (422, "Invalid")
    assert f"{field}: " in err.value.message and message in err.value.message
    assert err.value.details is not None
    assert [c["field"] for c in err.value.details["causes"]] == [field]
    assert trainer_apiserver.list(JS, "JobSet", "default") == []


def test_group_and_global_replica_labels(trainer_apiserver: LocalAPIServer) -> None:
    server = trainer_apiserver
    held = {"SANDBOX_RUN_SECONDS": "-1"}
    server.create(
        jobset(
            "g",
            rjob("a", replicas=2, env=held, groupName="slice"),
            rjob("b", replicas=1, env=held, groupName="slice"),
            rjob("c", replicas=2, env=held),
        )
    )
    wait_for(lambda: len(pods(server, "g")) == 5)
    marks = {
        "jobset.sigs.k8s.io/global-replicas",
        "jobset.sigs.k8s.io/group-name",
        "jobset.sigs.k8s.io/group-replicas",
        "jobset.sigs.k8s.io/job-group-index",
    }
    expected = {
        "g-a-1": ("5", "slice", "3", "1"),
        "g-b-0": ("5", "slice", "3", "2"),
        "g-c-1": ("5", "default", "2", "1"),
    }
    jobs = {j["metadata"]["name"]: j for j in server.list("batch/v1", "Job", "default")}
    by_job = {p["metadata"]["labels"]["batch.kubernetes.io/job-name"]: p for p in pods(server, "g")}
    for name, values in expected.items():
        want = dict(zip(sorted(marks), values, strict=True))
        job = jobs[name]
        for where in (job["metadata"]["labels"], job["metadata"]["annotations"]):
            assert {k: where[k] for k in marks} == want, name
        pod = by_job[name]["metadata"]
        assert {k: pod["labels"][k] for k in marks} == want, name
        assert {k: pod["annotations"][k] for k in marks} == want, name


def test_volume_claim_policies_give_the_jobs_their_claims(cluster: Any) -> None:
    """JobSet (v0.12) turns each volumeClaimPolicies template a container mounts into a volume of
    the claim `<template>-<jobset>`; the stand-in does the same (the real one also makes the
    claim), so a Job mounting it is valid on both."""
    node = rjob("node", pods=1)
    node["template"]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "initializer", "mountPath": "/workspace"}
    ]
    claims = {
        "templates": [
            {
                "metadata": {"name": "initializer"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            }
        ]
    }
    body = jobset("claims", node, volumeClaimPolicies=[claims])
    body["metadata"]["namespace"] = cluster.namespace
    cluster.create(body)
    [job] = wait_for(lambda: cluster.list("batch/v1", "Job"), timeout=60)
    volumes = job["spec"]["template"]["spec"]["volumes"]
    assert volumes == [{"name": "initializer", "persistentVolumeClaim": {"claimName": "initializer-claims"}}]
