"""What the watches' sink keeps of objects whose TrainJob it does not hold (yet), and drops with it."""

from __future__ import annotations

from trainer.api.objects import Obj
from trainer.controller.cache import Cache
from trainer.controller.reconciler import WorkQueue
from trainer.controller.resources import Resources
from trainer.controller.routing import Router
from trainer.runtime import framework as fw

RESOURCES = Resources.of(fw.default())


def resource(kind: str):  # type: ignore[no-untyped-def]
    return next(r for r in RESOURCES.watched if r.kind == kind)


def trainjob(uid: str) -> Obj:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "tj", "namespace": "ns", "uid": uid, "resourceVersion": "1"},
        "spec": {},
    }


def child(kind: str, name: str, uid: str, api_version: str = "v1") -> Obj:
    ref = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "name": "tj",
        "uid": uid,
        "controller": True,
    }
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "2", "ownerReferences": [ref]},
        "data": {"runtime": "x" * 1000},
    }


def test_a_child_seen_before_its_trainjob_is_read_again_whole_once_it_arrives() -> None:
    """A follower's TrainJob watch may run behind its ConfigMap watch: the snapshot, cached slim
    then, must not stay slim (a new leader would find it without its runtime)."""
    cache = Cache()
    router = Router(cache, WorkQueue(), RESOURCES)
    router.changed(resource("ConfigMap"), "ADDED", child("ConfigMap", "tj-runtime-snapshot", "u1"))
    slim = cache.get("ConfigMap", "ns", "tj-runtime-snapshot")
    assert slim is not None and "data" not in slim
    router.changed(resource("TrainJob"), "ADDED", trainjob("u1"))
    assert cache.get("ConfigMap", "ns", "tj-runtime-snapshot") is None, "to be read again, by name"
    router.changed(resource("ConfigMap"), "MODIFIED", child("ConfigMap", "tj-runtime-snapshot", "u1"))
    whole = cache.get("ConfigMap", "ns", "tj-runtime-snapshot")
    assert whole is not None and whole["data"]["runtime"], "whole, its controller known"


def test_a_deleted_trainjobs_create_only_children_leave_the_cache() -> None:
    """Secrets are never watched: what the cache holds of one goes when its TrainJob does."""
    cache = Cache()
    router = Router(cache, WorkQueue(), RESOURCES)
    router.changed(resource("TrainJob"), "ADDED", trainjob("u1"))
    cache.observe(child("Secret", "tj-mpi-ssh-auth", "u1"))
    cache.observe(child("Secret", "other-mpi-ssh-auth", "u2"))
    router.changed(resource("TrainJob"), "DELETED", trainjob("u1"))
    assert cache.get("Secret", "ns", "tj-mpi-ssh-auth") is None
    assert cache.get("Secret", "ns", "other-mpi-ssh-auth") is not None, "another TrainJob's stays"


def jobset(uid: str, status: Obj) -> Obj:
    obj = child("JobSet", "tj", uid, api_version="jobset.x-k8s.io/v1alpha2")
    del obj["data"]
    obj["spec"] = {"replicatedJobs": [{"name": "node", "replicas": 1}]}
    obj["status"] = status
    return obj


def progress(active: int) -> Obj:
    return {"replicatedJobsStatus": [{"name": "node", "active": active, "ready": 0}]}


def routed(deferring: bool, before: Obj, after: Obj) -> bool:
    """Whether the JobSet's change from ``before`` to ``after`` queues its TrainJob, when a
    reconcile is (or is not) already set for when the TrainJob's progress write goes out."""
    cache, queue = Cache(), WorkQueue()
    router = Router(cache, queue, RESOURCES, deferring=lambda key: deferring and key == ("ns", "tj"))
    router.changed(resource("TrainJob"), "ADDED", trainjob("u1"))
    router.changed(resource("JobSet"), "ADDED", before)
    queue._dirty.clear()
    after["metadata"]["resourceVersion"] = "3"
    router.changed(resource("JobSet"), "MODIFIED", after)
    assert cache.get("JobSet", "ns", "tj", "jobset.x-k8s.io")["metadata"]["resourceVersion"] == "3"
    return ("ns", "tj") in queue._dirty


def test_progress_of_a_jobset_waits_for_the_reconcile_already_set_for_its_trainjobs_write() -> None:
    """docs/decisions.md §batch: while a TrainJob's progress write waits its turn, its JobSet's
    further progress does not each cost a reconcile: the one set for the turn reads it then."""
    assert not routed(True, jobset("u1", progress(1)), jobset("u1", progress(2)))
    assert routed(False, jobset("u1", progress(1)), jobset("u1", progress(2))), "nothing waiting"


def test_a_jobset_change_beyond_progress_is_reconciled_at_once_even_while_a_write_waits() -> None:
    done = {**progress(0), "conditions": [{"type": "Completed", "status": "True"}]}
    assert routed(True, jobset("u1", progress(1)), jobset("u1", done)), "a condition never waits"
    respec = jobset("u1", progress(2))
    respec["spec"]["suspend"] = True
    assert routed(True, jobset("u1", progress(1)), respec), "its spec changed"
    relabelled = jobset("u1", progress(2))
    relabelled["metadata"]["labels"] = {"a": "b"}
    assert routed(True, jobset("u1", progress(1)), relabelled), "its metadata changed"


def test_the_echo_of_a_write_of_ours_reconciles_nothing() -> None:
    """The writer keeps what each write returned (controller/writer.py): when the watch brings
    that same version back, the reconcile that wrote it already had it, so it queues nothing.
    A version the cache did not hold is a change, and is reconciled."""
    cache, queue = Cache(), WorkQueue()
    router = Router(cache, queue, RESOURCES)
    router.changed(resource("TrainJob"), "ADDED", trainjob("u1"))
    queue._dirty.clear()
    written = {**trainjob("u1"), "status": {"conditions": []}}
    written["metadata"] = {**written["metadata"], "resourceVersion": "5"}
    cache.observe(written)  # what the status write returned
    router.changed(resource("TrainJob"), "MODIFIED", {**written, "metadata": dict(written["metadata"])})
    assert not queue._dirty, "its own echo"
    stored = jobset("u1", progress(0))
    cache.observe(stored)
    router.changed(resource("JobSet"), "ADDED", jobset("u1", progress(0)))
    assert not queue._dirty, "the JobSet it created, echoed"
    newer = jobset("u1", progress(1))
    newer["metadata"]["resourceVersion"] = "6"
    router.changed(resource("JobSet"), "MODIFIED", newer)
    assert ("ns", "tj") in queue._dirty, "the JobSet's controller moved it on"


def test_a_trials_every_change_queues_its_search_even_the_echo_of_our_own_write() -> None:
    """A trial's status write by the TrainJob reconciler comes back as an echo, which queues no
    TrainJob reconcile; the trial's OptimizationJob must still hear of it (it reads the trial's
    conditions and metrics). A TrainJob no search owns queues none."""
    from trainer.controller.optimization import OptimizationReconciler
    from trainer.controller.resources import OPTIMIZATIONJOBS

    cache, queue = Cache(), WorkQueue()
    router = Router(cache, queue, RESOURCES)
    router.optimizer = optimizer = OptimizationReconciler(None, cache, None, queue)  # type: ignore[arg-type]
    search = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "OptimizationJob",
        "metadata": {"name": "tune", "namespace": "ns", "uid": "o1", "resourceVersion": "1"},
        "spec": {},
    }
    router.changed(OPTIMIZATIONJOBS, "ADDED", search)
    assert ("ns", "tune") in optimizer.queue._dirty
    optimizer.queue._dirty.clear()
    router.changed(OPTIMIZATIONJOBS, "MODIFIED", {**search, "metadata": dict(search["metadata"])})
    assert not optimizer.queue._dirty, "the echo of its own status write"

    trial = trainjob("u1")
    trial["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "OptimizationJob",
            "name": "tune",
            "uid": "o1",
            "controller": True,
        }
    ]
    router.changed(resource("TrainJob"), "ADDED", trial)
    assert ("ns", "tune") in optimizer.queue._dirty
    optimizer.queue._dirty.clear()
    cache.observe({**trial, "metadata": {**trial["metadata"], "resourceVersion": "7"}})
    router.changed(
        resource("TrainJob"), "MODIFIED", {**trial, "metadata": {**trial["metadata"], "resourceVersion": "7"}}
    )
    assert ("ns", "tune") in optimizer.queue._dirty, "an echo of a trial's status write"
    optimizer.queue._dirty.clear()
    router.changed(
        resource("TrainJob"),
        "MODIFIED",
        {
            **trainjob("u2"),
            "metadata": {**trainjob("u2")["metadata"], "name": "other", "resourceVersion": "9"},
        },
    )
    assert not optimizer.queue._dirty, "no search owns it"
