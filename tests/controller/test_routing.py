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
