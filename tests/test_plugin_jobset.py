"""JobSet plugin: the builder, initializers, runtime patches, the freeze rule, snapshot, status, admission."""

from __future__ import annotations

import copy
from typing import Any

from render_helpers import ANCESTOR, container, env, only, render, replicated_job, rjob, runtime, trainjob

from trainer.runtime import framework
from trainer.runtime import render as core
from trainer.runtime.info import Facts

TORCH = {"numNodes": 1, "torch": {}}


def init_runtime(**extra: Any) -> dict[str, Any]:
    mount = [{"name": "initializer", "mountPath": "/workspace"}]
    dataset = {
        "name": "dataset-initializer",
        "image": "d",
        "volumeMounts": mount,
        "env": [{"name": "PRE_EXISTING", "value": "runtime"}, {"name": "OTHER", "value": "o"}],
    }
    jobs = [
        replicated_job("dataset-initializer", "dataset-initializer", [dataset]),
        replicated_job(
            "model-initializer",
            "model-initializer",
            [{"name": "model-initializer", "image": "m", "volumeMounts": mount}],
        ),
        replicated_job(
            "node", "trainer", [{"name": "node", "image": "n", "command": ["runtime"], "args": ["a"]}]
        ),
    ]
    return runtime(ml_policy={"numNodes": 2}, jobs=jobs, **extra)


def test_builder_metadata_owner_suspend_and_counts() -> None:
    rt = init_runtime()
    rt["spec"]["template"]["metadata"] = {"labels": {"team": "a"}, "annotations": {"note": "x"}}
    rt["metadata"]["labels"] = {"not": "propagated"}
    cluster = render(
        rt, trainjob(suspend=True, trainer={"image": "mine", "command": ["train"], "args": ["--fast"]})
    )
    jobset = only(cluster, "JobSet")
    tj = only(cluster, "TrainJob")
    assert jobset["metadata"]["labels"] == {"team": "a"}
    assert jobset["metadata"]["annotations"] == {"note": "x"}
    assert jobset["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "name": "job",
            "uid": tj["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert jobset["spec"]["suspend"] is True
    node = container(jobset, "node")
    assert (node["image"], node["command"], node["args"]) == ("mine", ["train"], ["--fast"])
    assert container(jobset, "dataset-initializer", "dataset-initializer")["image"] == "d"
    counts = {
        rj["name"]: (rj["replicas"], rj["template"]["spec"]["parallelism"])
        for rj in jobset["spec"]["replicatedJobs"]
    }
    assert counts == {"dataset-initializer": (1, 1), "model-initializer": (1, 1), "node": (1, 2)}
    assert tj["status"]["conditions"][0]["type"] == "Suspended"


def test_initializer_env_upsert_order_and_secret() -> None:
    cluster = render(
        init_runtime(),
        trainjob(
            initializer={
                "dataset": {
                    "storageUri": "hf://org/data",
                    "env": [
                        {"name": "CUSTOM_FROM_USER", "value": "u"},
                        {"name": "PRE_EXISTING", "value": "user"},
                    ],
                    "secretRef": {"name": "hf-token"},
                }
            }
        ),
    )
    ct = container(only(cluster, "JobSet"), "dataset-initializer", "dataset-initializer")
    assert [(e["name"], e["value"]) for e in ct["env"]] == [
        ("PRE_EXISTING", "user"),
        ("OTHER", "o"),
        ("STORAGE_URI", "hf://org/data"),
        ("CUSTOM_FROM_USER", "u"),
    ]
    assert ct["envFrom"] == [{"secretRef": {"name": "hf-token"}}]


def test_initializer_requires_job_container_and_mount() -> None:
    rt = runtime(ml_policy=TORCH)
    (refusal,) = render(rt, trainjob(initializer={"model": {"storageUri": "hf://m"}})).refusals
    assert "model-initializer job when trainJob is configured with input modelConfig" in refusal.lines()[0]
    unmounted = init_runtime()
    del unmounted["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ][0]["volumeMounts"]
    (refusal,) = render(unmounted, trainjob(initializer={"dataset": {"storageUri": "hf://d"}})).refusals
    assert "must have a volumeMount with name initializer in container" in refusal.lines()[0]
    for job, config in (("dataset-initializer", "dataset"), ("model-initializer", "model")):
        renamed = init_runtime()
        rjobs = renamed["spec"]["template"]["spec"]["replicatedJobs"]
        rjob_template = next(r for r in rjobs if r["name"] == job)["template"]
        del rjob_template["metadata"]  # without the ancestor label the runtime's own rule lets it in
        rjob_template["spec"]["template"]["spec"]["containers"][0]["name"] = "other"
        tj = trainjob(initializer={config: {"storageUri": "hf://x"}})
        (refusal,) = render(renamed, tj).refusals
        assert f"must have a container with name {job} in the {job} job" in refusal.lines()[0]
        assert "job: spec.runtimeRef: Invalid value" in refusal.lines()[0]


def patch(
    manager: str,
    pod_spec: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    job: str = "node",
) -> dict[str, Any]:
    template: dict[str, Any] = {}
    if meta:
        template["metadata"] = meta
    if pod_spec is not None:
        template["spec"] = {
            "replicatedJobs": [{"name": job, "template": {"spec": {"template": {"spec": pod_spec}}}}]
        }
    return {"manager": manager, "trainingRuntimeSpec": {"template": template}}


def test_runtime_patches_apply_in_order_later_wins() -> None:
    rt = runtime(ml_policy=TORCH)
    rt["spec"]["template"]["metadata"] = {"labels": {"a": "runtime", "keep": "k"}}
    patches = [
        patch(
            "one.io/a",
            {"nodeSelector": {"pool": "a", "zone": "z"}, "tolerations": [{"key": "t1"}]},
            {"labels": {"a": "one"}},
        ),
        patch(
            "two.io/b",
            {"nodeSelector": {"pool": "b"}, "tolerations": [{"key": "t2"}]},
            {"labels": {"a": "two"}},
        ),
    ]
    jobset = only(render(rt, trainjob(runtimePatches=patches)), "JobSet")
    pod = rjob(jobset, "node")["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "b", "zone": "z"}
    assert pod["tolerations"] == [{"key": "t2"}]
    assert jobset["metadata"]["labels"] == {"a": "two", "keep": "k"}


def test_runtime_patch_naming_missing_job_or_container_is_refused() -> None:
    rt = runtime(ml_policy=TORCH)
    (refusal,) = render(
        rt, trainjob(runtimePatches=[patch("x.io/y", {"nodeSelector": {"a": "b"}}, job="worker")])
    ).refusals
    assert (
        "replicatedJobs[0].name" in refusal.lines()[0]
        and "must not have a replicated job that doesn't exist in the runtime job template"
        in refusal.lines()[0]
    )
    bad = patch(
        "x.io/y", {"containers": [{"name": "ghost", "volumeMounts": [{"name": "v", "mountPath": "/v"}]}]}
    )
    (refusal,) = render(rt, trainjob(runtimePatches=[bad])).refusals
    assert "must not have a container that doesn't exist in the runtime job node" in refusal.lines()[0]
    env_patch = patch("x.io/y", {"containers": [{"name": "node", "env": [{"name": "A", "value": "1"}]}]})
    (refusal,) = render(rt, trainjob(runtimePatches=[env_patch])).refusals
    assert (
        "must not have envs for the dataset-initializer, model-initializer, node containers"
        in refusal.lines()[0]
    )
    (refusal,) = render(
        rt, trainjob(runtimePatches=[patch("kueue.k8s.io/", {"nodeSelector": {"a": "b"}})])
    ).refusals
    assert "must be a domain-prefixed path" in refusal.lines()[0]


def test_runtime_patch_update_only_while_suspended() -> None:
    rt = runtime(ml_policy=TORCH)
    first = trainjob(suspend=True, runtimePatches=[patch("x.io/y", {"nodeSelector": {"pool": "a"}})])
    second = trainjob(suspend=True, runtimePatches=[patch("x.io/y", {"nodeSelector": {"pool": "b"}})])
    cluster = render(rt, first, second)
    assert not cluster.refusals
    pod = rjob(only(cluster, "JobSet"), "node")["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "b"}, "a suspended JobSet is re-applied with the new patch"
    running = [trainjob(runtimePatches=[patch("x.io/y", {"nodeSelector": {"pool": p}})]) for p in "ab"]
    (refusal,) = render(rt, *running).refusals
    assert "RuntimePatches can only be modified when the TrainJob is suspended" in refusal.lines()[0]


def test_runtime_patch_update_refused_while_jobset_pods_are_active() -> None:
    """Suspending is not enough: pods of the JobSet may still be running (W16)."""
    rt = runtime(ml_policy=TORCH)
    running = trainjob(runtimePatches=[patch("x.io/y", {"nodeSelector": {"pool": "a"}})])
    suspending = trainjob(suspend=True, runtimePatches=[patch("x.io/y", {"nodeSelector": {"pool": "b"}})])
    jobset = copy.deepcopy(only(render(rt, running), "JobSet"))
    jobset["status"] = {
        "replicatedJobsStatus": [
            {"name": "node", "active": 2, "ready": 2, "succeeded": 0, "failed": 0, "suspended": 0}
        ]
    }
    (refusal,) = render(rt, running, jobset, suspending).refusals
    assert "job: spec.runtimePatches: Forbidden" in refusal.lines()[0]
    assert "when the JobSet's ReplicatedJob node is still active" in refusal.lines()[0]
    jobset["status"]["replicatedJobsStatus"][0].update(active=0, suspended=2)
    cluster = render(rt, running, jobset, suspending)
    assert not cluster.refusals, "once no pod is active the patch may change"


def test_running_jobset_is_frozen_and_resume_reapplies() -> None:
    rt = runtime(ml_policy=TORCH)
    suspended = trainjob(suspend=True, trainer={"image": "a"})
    resumed = trainjob(suspend=False, trainer={"image": "a"})
    cluster = render(rt, suspended, resumed)
    jobset = only(cluster, "JobSet")
    assert jobset["spec"]["suspend"] is False
    conds = {c["type"]: (c["status"], c["reason"]) for c in only(cluster, "TrainJob")["status"]["conditions"]}
    assert conds == {"Suspended": ("False", "Resumed")}


def test_snapshot_pins_the_runtime() -> None:
    rt = runtime(ml_policy=TORCH)
    changed = runtime(
        ml_policy=TORCH, jobs=[replicated_job("node", "trainer", [{"name": "node", "image": "changed"}])]
    )
    cluster = render(
        rt,
        trainjob(suspend=True),
        changed,
        trainjob(suspend=True, runtimePatches=[patch("x.io/y", {"nodeSelector": {"a": "b"}})]),
    )
    assert container(only(cluster, "JobSet"), "node")["image"] == "rt:img"
    snapshot = only(cluster, "ConfigMap", "job-runtime-snapshot")
    assert "kind: ClusterTrainingRuntime" in snapshot["data"]["runtime"]
    assert snapshot["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-name": "job"}


def test_a_snapshot_is_read_once_per_version_and_callers_cannot_spoil_it(monkeypatch: Any) -> None:
    """The operator reads the same snapshot on every reconcile: it is parsed once per
    resourceVersion, and what a reconcile does with its copy reaches no other."""
    from trainer.runtime import render as core

    cluster = render(runtime(ml_policy=TORCH), trainjob())
    snapshot = copy.deepcopy(only(cluster, "ConfigMap", "job-runtime-snapshot"))
    snapshot["metadata"].update(uid="cm-1", resourceVersion="7")
    tj = {
        **trainjob(),
        "metadata": {
            "name": "job",
            "namespace": "default",
            "uid": snapshot["metadata"]["ownerReferences"][0]["uid"],
        },
    }
    reads: list[str] = []
    real_read = core.read_snapshot
    monkeypatch.setattr(
        core,
        "read_snapshot",
        lambda cm, t: reads.append(cm["metadata"]["resourceVersion"]) or real_read(cm, t),
    )
    first = core.pinned_runtime(snapshot, tj)
    first["spec"]["template"] = "spoiled"
    second = core.pinned_runtime(snapshot, tj)
    assert second["spec"]["template"] != "spoiled" and reads == ["7"]
    edited = copy.deepcopy(snapshot)
    edited["metadata"]["resourceVersion"] = "8"
    edited["data"]["runtime"] = edited["data"]["runtime"].replace("rt:img", "edited:img")
    assert "edited:img" in str(core.pinned_runtime(edited, tj)) and reads == ["7", "8"]


def _facts_with(*objs: dict[str, Any]) -> Facts:
    facts = Facts()
    for obj in objs:
        facts.put(obj)
    return facts


def test_status_from_jobset_conditions_and_jobs() -> None:
    cluster = render(runtime(ml_policy=TORCH), trainjob())
    tj = only(cluster, "TrainJob")
    jobset = only(cluster, "JobSet")
    jobset["status"] = {
        "conditions": [
            {
                "type": "Completed",
                "status": "True",
                "reason": "AllJobsCompleted",
                "message": "jobset completed successfully",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            },
            {
                "type": "StartupPolicyCompleted",
                "status": "True",
                "reason": "x",
                "message": "y",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            },
        ],
        "replicatedJobsStatus": [
            {"name": "node", "ready": 0, "succeeded": 1, "failed": 0, "active": 0, "suspended": 0}
        ],
    }
    facts = _facts_with(
        jobset, *[o for o in cluster.output() if o["kind"] == "ConfigMap"], runtime(ml_policy=TORCH)
    )
    outcome = core.render(tj, facts, framework.default(), "2026-01-02T00:00:00Z")
    assert outcome.status == {
        # docs/decisions.md §ttl: completed when its JobSet did; its first report came finished,
        # so it started no later than that.
        "startTime": "2026-01-01T00:00:00Z",
        "completionTime": "2026-01-01T00:00:00Z",
        "conditions": [
            {
                "type": "Complete",
                "status": "True",
                "reason": "AllJobsCompleted",
                "message": "jobset completed successfully",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        "jobsStatus": [
            {"name": "node", "ready": 0, "succeeded": 1, "failed": 0, "active": 0, "suspended": 0}
        ],
    }
    # Finished: nothing is built again, even with the JobSet gone (docs/decisions.md §4).
    tj["status"] = outcome.status
    facts.remove("JobSet", "default", "job")
    again = core.render(tj, facts, framework.default(), "2026-01-03T00:00:00Z")
    assert again.objects == [] and again.status == outcome.status


def test_missing_runtime_is_retryable_status_and_recovers() -> None:
    tj = trainjob()
    tj["metadata"]["uid"] = "u1"
    outcome = core.render(tj, Facts(), framework.default(), "2026-01-01T00:00:00Z")
    assert outcome.objects == []
    (cond,) = outcome.status["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        "ReconcileFailed",
        "True",
        "TrainingRuntimeNotFound",
    )
    assert outcome.events[0].reason == "TrainJobResourcesCreationFailed"
    tj["status"] = outcome.status
    recovered = core.render(
        tj, _facts_with(runtime(ml_policy=TORCH)), framework.default(), "2026-01-01T00:01:00Z"
    )
    # ReconcileFailed is gone; it has not started until its Jobs are reported (docs/decisions.md §ttl).
    assert not recovered.status
    assert {o["kind"] for o in recovered.objects} == {"JobSet", "ConfigMap"}


def test_missing_runtime_status_names_the_closest_runtime() -> None:
    """The ReconcileFailed message is upstream's words, then the closest runtime that exists; not
    the list of them, which would change the status of every failing TrainJob whenever a runtime
    is added (docs/decisions.md §3). The admission refusal lists them."""
    tj = trainjob(runtime_name="torch-distributd")
    facts = _facts_with(runtime("torch-distributed", ml_policy=TORCH))
    outcome = core.render(tj, facts, framework.default(), "2026-01-01T00:00:00Z")
    (cond,) = outcome.status["conditions"]
    message = (
        "TrainJob resources reconciliation failed: ClusterTrainingRuntime specified in TrainJob is "
        'not found: clustertrainingruntimes.trainer.kubeflow.org "torch-distributd" not found; '
        'did you mean "torch-distributed"?'
    )
    assert cond["message"] == message
    assert outcome.events[0].message == cond["message"]
    facts.put(runtime("jax-distributed", ml_policy=TORCH))
    again = core.render(tj, facts, framework.default(), "2026-01-01T00:01:00Z")
    assert again.status["conditions"][0]["message"] == message, "another runtime changes nothing"


def test_unsupported_runtime_kind_fails_for_good() -> None:
    tj = trainjob(kind="Foo")
    outcome = core.render(tj, Facts(), framework.default(), "2026-01-01T00:00:00Z")
    (cond,) = outcome.status["conditions"]
    assert (cond["type"], cond["reason"], cond["message"]) == (
        "Failed",
        "TrainingRuntimeNotSupported",
        "unsupported runtime: Foo.trainer.kubeflow.org",
    )


def test_managed_by_multikueue_is_left_alone() -> None:
    cluster = render(runtime(ml_policy=TORCH), trainjob(managedBy="kueue.x-k8s.io/multikueue"))
    assert [o["kind"] for o in cluster.output()] == ["TrainJob"]
    assert "status" not in only(cluster, "TrainJob")


def test_deadline_fails_and_deletes_the_jobset() -> None:
    cluster = render(runtime(ml_policy=TORCH), trainjob(activeDeadlineSeconds=60))
    tj = only(cluster, "TrainJob")
    facts = _facts_with(*[o for o in cluster.output() if o["kind"] != "TrainJob"], runtime(ml_policy=TORCH))
    early = core.render(tj, facts, framework.default(), "1970-01-01T00:00:30Z")
    assert early.requeue_after == 30 and not early.delete
    late = core.render(tj, facts, framework.default(), "1970-01-01T00:01:01Z")
    assert late.delete == [("JobSet", "default", "job")]
    failed = next(c for c in late.status["conditions"] if c["type"] == "Failed")
    assert (failed["reason"], failed["message"]) == (
        "DeadlineExceeded",
        "TrainJob exceeded its active deadline",
    )


def test_quantities_are_written_canonically() -> None:
    """docs/decisions.md §9: numbers the SDK sends become Kubernetes quantity strings."""
    cluster = render(
        runtime(ml_policy=TORCH),
        trainjob(trainer={"resourcesPerNode": {"requests": {"cpu": 2.0, "memory": "2048Mi"}}}),
    )
    assert container(only(cluster, "JobSet"), "node")["resources"]["requests"] == {
        "cpu": "2",
        "memory": "2Gi",
    }
    assert env(container(only(cluster, "JobSet"), "node"))["PET_NPROC_PER_NODE"] == "2"


def test_numbers_are_accepted_wherever_a_runtime_takes_a_quantity() -> None:
    """docs/decisions.md §9 for runtimes too: `cpu: 0.5` is what a YAML author writes."""
    pod = {
        "containers": [
            {"name": "node", "image": "i", "resources": {"requests": {"cpu": 2.5, "memory": 2**31}}}
        ],
        "initContainers": [{"name": "warm", "image": "i", "resources": {"limits": {"cpu": 0.25}}}],
        "overhead": {"cpu": 0.1},
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": 1_000_000}}],
    }
    claims = [
        {"templates": [{"metadata": {"name": "data"}, "spec": {"resources": {"requests": {"storage": 2e9}}}}]}
    ]
    rt = runtime(
        ml_policy=TORCH,
        jobs=[
            {
                "name": "node",
                "template": {
                    "metadata": {"labels": {ANCESTOR: "trainer"}},
                    "spec": {"template": {"spec": pod}},
                },
            }
        ],
    )
    rt["spec"]["template"]["spec"]["volumeClaimPolicies"] = claims
    cluster = render(rt, trainjob(trainer={}))
    assert not cluster.refusals, [r.lines() for r in cluster.refusals]
    stored = cluster.facts.get("ClusterTrainingRuntime", None, "rt")
    stored_pod = stored["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
        "spec"
    ]
    assert stored_pod["containers"][0]["resources"]["requests"] == {"cpu": "2500m", "memory": 2**31}, (
        "the defaulting webhook writes fractions as quantity strings and keeps whole numbers"
    )
    jobset = only(cluster, "JobSet")
    out = rjob(jobset, "node")["template"]["spec"]["template"]["spec"]
    assert out["containers"][0]["resources"]["requests"] == {"cpu": "2500m", "memory": "2147483648"}
    assert out["initContainers"][0]["resources"]["limits"] == {"cpu": "250m"}
    assert out["overhead"] == {"cpu": "100m"}
    assert out["volumes"][0]["emptyDir"]["sizeLimit"] == "1M"
    storage = jobset["spec"]["volumeClaimPolicies"][0]["templates"][0]["spec"]["resources"]["requests"]
    assert storage == {"storage": "2G"}
    assert env(container(jobset, "node"))["PET_NPROC_PER_NODE"] == "3"


def test_trainjob_quantity_fractions_become_strings_and_updates_keep_stored_numbers() -> None:
    from trainer.admission.admit import default_object

    job = trainjob(trainer={"resourcesPerNode": {"requests": {"cpu": 4.5, "memory": 1.5e9}}})
    cluster = render(runtime(ml_policy=TORCH), job)
    requests = only(cluster, "TrainJob")["spec"]["trainer"]["resourcesPerNode"]["requests"]
    # docs/decisions.md §9: a whole number is stored as written, a fraction as its quantity string.
    assert requests == {"cpu": "4500m", "memory": 1500000000}
    # An object stored before the defaulting webhook existed keeps its numbers on update, even a
    # fraction, so the schema's immutability rules do not see a change the user never made.
    stored = trainjob(trainer={"resourcesPerNode": {"requests": {"cpu": 0.5}}})
    update = copy.deepcopy(stored)
    update["spec"]["trainer"]["resourcesPerNode"]["requests"]["memory"] = 0.25
    default_object(update, stored, "1970-01-01T00:00:00Z")
    assert update["spec"]["trainer"]["resourcesPerNode"]["requests"] == {"cpu": 0.5, "memory": "250m"}


def test_runtime_patches_get_the_time_they_last_changed() -> None:
    rt = runtime(ml_policy=TORCH)
    first = trainjob(
        suspend=True,
        runtimePatches=[
            patch("x.io/a", {"nodeSelector": {"pool": "a"}}),
            {**patch("x.io/b", {"nodeSelector": {"zone": "z"}}), "time": "2020-01-01T00:00:00Z"},
        ],
    )
    cluster = render(rt, first, now="2026-01-01T00:00:00Z")
    times = [p.get("time") for p in only(cluster, "TrainJob")["spec"]["runtimePatches"]]
    assert times == ["2026-01-01T00:00:00Z", "2020-01-01T00:00:00Z"], "stamped on create, a given time kept"

    # Re-applied later with a different time but the same content: the stored time stays, so a
    # running TrainJob sees no change of its patches (W15 would refuse one).
    running = trainjob(runtimePatches=[patch("x.io/a", {"nodeSelector": {"pool": "a"}})])
    reapplied = copy.deepcopy(running)
    reapplied["spec"]["runtimePatches"][0]["time"] = "2030-01-01T00:00:00Z"
    cluster = render(rt, running, reapplied, now="2026-01-01T00:00:00Z")
    assert not cluster.refusals, [r.lines() for r in cluster.refusals]
    assert only(cluster, "TrainJob")["spec"]["runtimePatches"][0]["time"] == "2026-01-01T00:00:00Z"

    changed = trainjob(suspend=True, runtimePatches=[patch("x.io/a", {"nodeSelector": {"pool": "b"}})])
    cluster = render(rt, first, changed, now="2026-01-01T00:00:00Z")
    (stamped,) = only(cluster, "TrainJob")["spec"]["runtimePatches"]
    assert stamped["time"] == "2026-01-01T00:00:00Z"


def test_runtime_patch_manager_is_a_domain_prefixed_path() -> None:
    rt = runtime(ml_policy=TORCH)
    for manager in ("acme.io/controller-", "acme.io/team:alpha", "kueue.x-k8s.io/multikueue"):
        cluster = render(rt, trainjob(runtimePatches=[patch(manager, {"nodeSelector": {"a": "b"}})]))
        assert not cluster.refusals, (manager, [r.lines() for r in cluster.refusals])
    refused = {
        "no-slash": 'must be a domain-prefixed path (such as "acme.io/foo")',
        "Acme.io/x": "a lowercase RFC 1123 subdomain",
        "acme.io/a b": "Invalid path (regex used for validation is",
    }
    for manager, words in refused.items():
        (refusal,) = render(
            rt, trainjob(runtimePatches=[patch(manager, {"nodeSelector": {"a": "b"}})])
        ).refusals
        assert words in refusal.lines()[0] and "spec.runtimePatches[0].manager" in refusal.lines()[0]


def test_an_empty_storage_uri_is_still_set() -> None:
    """Upstream tests the pointer: `storageUri: ""` writes an empty STORAGE_URI (T7 allows it)."""
    init = replicated_job(
        "dataset-initializer",
        "dataset-initializer",
        [
            {
                "name": "dataset-initializer",
                "image": "i",
                "volumeMounts": [{"name": "initializer", "mountPath": "/w"}],
            }
        ],
    )
    rt = runtime(ml_policy=TORCH, jobs=[init, replicated_job("node", "trainer")])
    cluster = render(rt, trainjob(initializer={"dataset": {"storageUri": ""}}))
    assert env(container(only(cluster, "JobSet"), "dataset-initializer", "dataset-initializer")) == {
        "STORAGE_URI": ""
    }


def test_a_jobset_given_after_its_trainjob_reaches_the_trainjob_status() -> None:
    """As the operator's JobSet watch does: the TrainJob is reconciled again when its JobSet changes."""
    rt = runtime(ml_policy=TORCH)
    built = copy.deepcopy(only(render(rt, trainjob()), "JobSet"))
    built["status"] = {
        "conditions": [
            {
                "type": "Failed",
                "status": "True",
                "reason": "FailedJobs",
                "message": "jobset failed due to one or more job failures (first failed job: job-node-0)",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        "replicatedJobsStatus": [
            {"name": "node", "ready": 0, "succeeded": 0, "failed": 1, "active": 0, "suspended": 0}
        ],
    }
    unrelated = copy.deepcopy(built)
    unrelated["metadata"]["name"] = "other"
    cluster = render(rt, trainjob(), unrelated)
    assert "conditions" not in (only(cluster, "TrainJob").get("status") or {}), (
        "a JobSet of another name is not this TrainJob's"
    )
    cluster.apply(built)
    status = only(cluster, "TrainJob")["status"]
    assert [(c["type"], c["reason"]) for c in status["conditions"]] == [("Failed", "FailedJobs")]
    assert status["jobsStatus"][0]["failed"] == 1
    assert only(cluster, "JobSet")["spec"]["replicatedJobs"][0]["name"] == "node"


def test_a_finished_trainjob_keeps_no_reconcile_failure() -> None:
    cluster = render(runtime(ml_policy=TORCH), trainjob())
    tj = copy.deepcopy(only(cluster, "TrainJob"))
    stale = {"type": "ReconcileFailed", "status": "True", "reason": "ResourcesRefused", "message": "x"}
    failed = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "y"}
    tj["status"] = {"conditions": [{**stale, "lastTransitionTime": "1970-01-01T00:00:00Z"}, failed]}
    outcome = core.render(tj, Facts(), framework.default(), "1970-01-01T00:00:09Z")
    assert [c["type"] for c in outcome.status["conditions"]] == ["Failed"]
    assert outcome.objects == []
