"""The operator's cache behaves like an informer: through watch outages, relists and resyncs.

A TCP proxy (``trainer_sandbox.tcp_proxy``) sits between the operator and the API server, so a
test can cut the operator off while the cluster changes, then restore the link.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_helpers import (
    TJ,
    conditions,
    get_or_none,
    operator_requests,
    operator_writes,
    trainjob,
    wait_for,
    wait_settled,
)
from trainer_sandbox.backends import Cluster, RealCluster
from trainer_sandbox.embedded_operator import EmbeddedOperator
from trainer_sandbox.tcp_proxy import TcpProxy

from trainer.controller.config import Configuration

JS = "jobset.x-k8s.io/v1alpha2"
RUN_FOREVER = [{"name": "SANDBOX_RUN_SECONDS", "value": "-1"}]
RUN_FAST = [{"name": "SANDBOX_RUN_SECONDS", "value": "1"}]
RECOVERY_SECONDS = 30  # from the link's return to the JobSet's
# kube-apiserver's watch cache keeps every event younger than this, however many there are
# (k8s.io/apiserver/pkg/storage/cacher: DefaultEventFreshDuration, 60 s + 15 s).
WATCH_CACHE_FRESH_SECONDS = 75


@pytest.fixture
def proxy(cluster: Cluster, operator_kubeconfig: Path) -> Iterator[TcpProxy]:
    """A proxy to the cluster's API server; the operator's kubeconfig now points at it."""
    config = yaml.safe_load(operator_kubeconfig.read_text())
    entry = config["clusters"][0]["cluster"]
    with TcpProxy.to_url(entry["server"]) as started:
        entry["server"] = started.url  # TLS passes through: the certificate is for 127.0.0.1
        operator_kubeconfig.write_text(yaml.safe_dump(config))
        yield started


@pytest.fixture
def proxied_operator(
    proxy: TcpProxy, operator_kubeconfig: Path, cluster: Cluster
) -> Iterator[EmbeddedOperator]:
    with EmbeddedOperator(operator_kubeconfig, Configuration(), namespaces=[cluster.namespace]) as op:
        assert proxy.accepted > 0, "the operator talks to the server through the proxy"
        yield op


def _new_jobset(cluster: Cluster, name: str, old_uid: str) -> Any:
    js = get_or_none(cluster, JS, "JobSet", name)
    return js if js is not None and js["metadata"]["uid"] != old_uid else None


def _running_and_finished(cluster: Cluster, operator: EmbeddedOperator) -> str:
    """A running TrainJob ("running") and a Complete one ("finished"); the running one's JobSet uid."""
    cluster.create(trainjob("running", trainer={"env": RUN_FOREVER}))
    cluster.create(trainjob("finished", trainer={"env": RUN_FAST}))
    first = wait_for(lambda: get_or_none(cluster, JS, "JobSet", "running"), what="the JobSet")
    wait_for(lambda: conditions(cluster, "finished").get("Complete", ("",))[0] == "True", what="Complete")
    assert operator.idle()
    uid: str = first["metadata"]["uid"]
    return uid


def _after_the_outage(cluster: Cluster, running_uid: str) -> None:
    """The running TrainJob's JobSet is back; the finished one's stays gone."""
    wait_for(
        lambda: _new_jobset(cluster, "running", running_uid),
        timeout=RECOVERY_SECONDS,
        what="the running TrainJob's JobSet re-created after the outage",
    )
    time.sleep(2)
    assert get_or_none(cluster, JS, "JobSet", "finished") is None, "a finished TrainJob re-creates nothing"
    assert conditions(cluster, "finished")["Complete"][0] == "True"


def _delete_jobsets(cluster: Cluster, *names: str) -> None:
    for name in names:
        cluster.delete(JS, "JobSet", name)
    for name in names:
        wait_for(lambda n=name: get_or_none(cluster, JS, "JobSet", n) is None, what=f"JobSet {name} gone")


def test_a_jobset_deleted_while_the_link_is_cut_is_recreated_once_it_returns(
    cluster: Cluster, proxy: TcpProxy, proxied_operator: EmbeddedOperator
) -> None:
    """The watch resumes from the last resourceVersion it saw, and the server sends the deletion."""
    uid = _running_and_finished(cluster, proxied_operator)
    proxy.cut()
    _delete_jobsets(cluster, "running", "finished")
    time.sleep(2)  # the operator's reconnects are refused meanwhile
    proxy.resume()
    _after_the_outage(cluster, uid)


@pytest.mark.slow  # on the real control plane: the watch cache must age past its 75 s
def test_a_jobset_deleted_during_an_outage_the_server_forgot_is_recreated(
    cluster: Cluster, proxy: TcpProxy, proxied_operator: EmbeddedOperator
) -> None:
    """The server no longer has the outage's events (410 Gone): the operator lists again, and what
    the listing lacks leaves its cache, its TrainJob reconciled."""
    uid = _running_and_finished(cluster, proxied_operator)
    proxy.cut()
    _delete_jobsets(cluster, "running", "finished")
    _forget_history(cluster)
    mark = cluster.audit_mark()
    proxy.resume()
    _after_the_outage(cluster, uid)
    relists = [r for r in operator_requests(cluster, mark) if (r.verb, r.resource) == ("list", "jobsets")]
    assert relists, "the watch could not resume (410 Gone): the operator listed JobSets again"


def _forget_history(cluster: Cluster) -> None:
    """Make the server forget the JobSet events so far, as a real one does once an outage outlasts
    its watch cache: a watch resuming from before then is answered 410 Gone."""
    if not isinstance(cluster, RealCluster):
        cluster.core.store.compact()  # type: ignore[attr-defined]  # the stand-in's storage
        return
    path = f"/apis/{JS}/namespaces/{cluster.namespace}/jobsets"
    now = str(cluster.http.request("GET", path)["metadata"]["resourceVersion"])
    # Events younger than 75 s are kept whatever their number; older ones go as new ones come.
    time.sleep(WATCH_CACHE_FRESH_SECONDS + 3)
    cluster.create(_ballast_jobset())
    for i in range(1, 20_001):
        cluster.patch(JS, "JobSet", "ballast", {"metadata": {"labels": {"churn": str(i)}}})
        if i % 50 == 0 and _expired(cluster, path, now):
            return
    raise AssertionError(f"the watch cache still had resourceVersion {now} after 20,000 events")


def _expired(cluster: RealCluster, path: str, resource_version: str) -> bool:
    url = f"{cluster.server}{path}?watch=true&resourceVersion={resource_version}&timeoutSeconds=1"
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10, context=cluster.http.context) as response:
            first = response.readline()
    except urllib.error.HTTPError as exc:
        return exc.code == 410
    if not first:
        return False
    event = json.loads(first)
    return bool(event.get("type") == "ERROR" and event["object"].get("code") == 410)


def _ballast_jobset() -> dict[str, Any]:
    """A suspended JobSet no TrainJob owns: its label changes fill the server's watch cache."""
    pod = {"restartPolicy": "Never", "containers": [{"name": "node", "image": "busybox"}]}
    return {
        "apiVersion": JS,
        "kind": "JobSet",
        "metadata": {"name": "ballast"},
        "spec": {
            "suspend": True,
            "replicatedJobs": [
                {"name": "node", "replicas": 1, "template": {"spec": {"template": {"spec": pod}}}}
            ],
        },
    }


def test_a_resync_reconciles_every_trainjob_and_writes_nothing(
    cluster: Cluster, operator_kubeconfig: Path
) -> None:
    config = Configuration.model_validate({"controller": {"syncPeriod": "1s"}})
    with EmbeddedOperator(operator_kubeconfig, config, namespaces=[cluster.namespace]) as operator:
        cluster.create(trainjob("steady", suspend=True))
        cluster.create(trainjob("done", trainer={"env": RUN_FAST}))
        cluster.create(trainjob("running", trainer={"env": RUN_FOREVER}))
        wait_for(lambda: get_or_none(cluster, JS, "JobSet", "running"), what="the running TrainJob's JobSet")
        wait_for(lambda: conditions(cluster, "steady").get("Suspended", ("",))[0] == "True", what="Suspended")
        wait_for(lambda: conditions(cluster, "done").get("Complete", ("",))[0] == "True", what="Complete")
        wait_settled(cluster, operator.idle)
        before = operator.reconciles()
        mark = cluster.audit_mark()
        time.sleep(3.5)
        assert operator.idle()
        resynced = operator.reconciles() - before
        assert resynced >= 3 * 2, f"each TrainJob reconciled twice in 3.5 s of a 1 s resync: {resynced}"
        assert operator_writes(cluster, mark, events=True) == [], "a world as it should be costs no write"
        assert cluster.get(TJ, "TrainJob", "steady")["spec"]["suspend"] is True
