"""The chart installed by Helm 4, with the operator started as its Deployment says (command,
arguments, environment, ServiceAccount, mounted ConfigMap and Secret), running TrainJobs: on the
stand-in and on the real control plane (``--backend``), whose RBAC authorizer checks every call the
operator makes against the chart's ClusterRole and Roles.

The operator's ClusterRole must equal what it used here: every call in the audit log (and the
finalizers permission its ownerReferences need), no more, no less; and the real API server must
have refused it nothing (no 403 in its audit log).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import audit_rbac
import chart_harness as h
import helm_python as helm
import pytest
import yaml
from trainer_sandbox import rbac_audit
from trainer_sandbox.apiserver import LocalAPIServer
from trainer_sandbox.apiserver.errors import APIError
from trainer_sandbox.backends import Cluster, RealCluster

from trainer.controller.config import Configuration
from trainer.controller.operator import Operator

Obj = dict[str, Any]

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory, chart_cluster: Cluster) -> Iterator[h.Installed]:
    with h.installed(tmp_path_factory.mktemp("release"), server=chart_cluster) as installed:
        yield installed


@pytest.fixture(scope="module")
def scenario(release: h.Installed) -> h.ScenarioResult:
    return h.run_scenario(release.server, release.operator_user, release.mark)


def test_operator_runs_with_the_deployments_command_and_identity(release: h.Installed) -> None:
    container = release.deployment["spec"]["template"]["spec"]["containers"][0]
    operator = release.operator
    assert Path(operator.argv[0]).name == container["command"][0] == "trainer"
    assert operator.argv[1:] == [operator.translate(a) for a in container["args"]]
    assert operator.env["PYTHONUNBUFFERED"] == "1"
    assert release.operator_user == f"system:serviceaccount:{h.NAMESPACE}:kubeflow-trainer-controller-manager"
    records = release.server.audit_since(release.mark)
    calls = [r for r in records if r.user == release.operator_user]
    assert calls, "the operator talks to the API server as its ServiceAccount"
    assert {r.user for r in records if r.user_agent.startswith("trainer-operator")} == {release.operator_user}


def test_trainjobs_run_through_the_operator(scenario: h.ScenarioResult) -> None:
    final = scenario.final
    for name in ("torch", "suspended", "coscheduled", "volcano", "mpi-gang"):
        assert final[name]["Complete"]["status"] == "True", (name, final[name])
    assert final["suspended"]["Suspended"]["status"] == "False"
    assert final["deadline"]["Failed"]["reason"] == "DeadlineExceeded"
    assert "deepspeed" not in final  # deleted, its children collected


def test_every_installed_runtime_runs_a_trainjob_to_complete(
    release: h.Installed, scenario: h.ScenarioResult
) -> None:
    bundled = sorted(
        yaml.safe_load(p.read_text())["metadata"]["name"] for p in (h.ROOT / "runtimes").glob("*.yaml")
    )
    assert sorted(scenario.runtimes) == h.installed_runtimes(h.render(release.values)) == bundled
    for runtime, job in scenario.runtimes.items():
        assert scenario.final[job]["Complete"]["status"] == "True", (runtime, scenario.final[job])
        assert "Failed" not in scenario.final[job], (runtime, scenario.final[job])


def test_mpi_with_coscheduling_has_its_secret_hostfile_and_podgroup(scenario: h.ScenarioResult) -> None:
    children = scenario.mpi_gang
    assert children["Secret"]["type"] == "kubernetes.io/ssh-auth"
    assert sorted(children["Secret"]["data"]) == ["ssh-privatekey", "ssh-publickey"]
    hosts = children["ConfigMap"]["data"]["hostfile"].splitlines()
    assert len(hosts) == 2 and all(line.startswith("mpi-gang-") for line in hosts), hosts  # numNodes
    assert children["PodGroup"]["spec"]["minMember"] == 2
    for child in children.values():
        owners = child["metadata"]["ownerReferences"]
        assert [(o["kind"], o["name"]) for o in owners] == [("TrainJob", "mpi-gang")]


def test_webhooks_refuse_and_default_through_the_service(scenario: h.ScenarioResult) -> None:
    assert (
        'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request' in scenario.refusal
    )
    assert "no-such-runtime" in scenario.refusal
    # The SDK's float quantity, made a string by the defaulting webhook before the schema saw it.
    assert scenario.defaulted["spec"]["trainer"]["resourcesPerNode"]["requests"]["cpu"] == "500m"


def test_the_webhooks_take_the_largest_objects_the_api_server_stores(release: h.Installed) -> None:
    """Admission requests over 1 MiB (aiohttp's default limit, which kopf's server kept) were refused
    with 413: a TrainJob with a long inline script could not be created, and the garbage
    collector's UPDATE in a foreground delete of a large runtime (old and new object: twice the
    size) failed, so the delete hung. Both go through the chart's webhooks (failurePolicy Fail)."""
    server = release.server
    # 1.2 MiB in all (etcd stores up to 1.5 MiB; the CRD takes 1 MiB per command or args item).
    script, data = "true # " + "x" * (1000 * 1024), "y" * (200 * 1024)
    job = h.trainjob("inline-script", "torch-distributed", suspend=True)
    job["spec"]["trainer"].update(command=["bash", "-c", script], args=[data])
    created = server.create(job)
    assert created["spec"]["trainer"]["command"][2] == script
    # An UPDATE carries the object twice: 2.4 MiB to each webhook.
    server.patch(
        h.TRAINER_API,
        "TrainJob",
        "inline-script",
        {"metadata": {"labels": {"big": "yes"}}},
        h.SCENARIO_NAMESPACE,
    )
    server.delete(h.TRAINER_API, "TrainJob", "inline-script", h.SCENARIO_NAMESPACE)

    runtime = h.gang_runtime("large-runtime", {"coscheduling": {"scheduleTimeoutSeconds": 30}})
    node = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
    node["template"]["spec"]["template"]["spec"]["containers"][0]["command"] = ["true", "z" * (700 * 1024)]
    server.create(runtime)
    server.delete(
        h.TRAINER_API, "TrainingRuntime", "large-runtime", h.SCENARIO_NAMESPACE, propagation="Foreground"
    )
    h.wait_for(
        "the foreground delete of a 0.7 MiB runtime to finish",
        lambda: h._get(server, h.TRAINER_API, "TrainingRuntime", "large-runtime") is None,
        timeout=60,
    )


def test_upstreams_runtime_finalizer_is_removed_and_no_other(scenario: h.ScenarioResult) -> None:
    """Upstream's v2.0 to v2.2 left trainer.kubeflow.org/resource-in-use on runtimes, and v2.3's
    runtime controllers remove it; without that, such a runtime could never be deleted. Ours
    removes it (a patch of the runtime, within the ClusterRole) and leaves any other finalizer."""
    assert scenario.legacy_finalizers == {"legacy-cluster": [], "legacy": ["example.com/keep"]}


def test_events_tell_what_happened(scenario: h.ScenarioResult) -> None:
    reasons = {(e["involvedObject"]["name"], e["reason"]) for e in scenario.events}
    assert ("torch", "JobSetCreated") not in reasons, "logged, not posted (docs/decisions.md §events)"
    assert ("torch", "TrainJobCompleted") in reasons
    assert ("deadline", "TrainJobFailed") in reasons


GANG_PERMISSIONS = {
    ("scheduling.k8s.io", plural, verb)
    for plural in ("workloads", "podgroups")
    for verb in ("create", "delete", "list", "watch")
}


def test_rbac_is_exactly_what_the_operator_used(release: h.Installed, scenario: h.ScenarioResult) -> None:
    user = release.operator_user
    sa_name = release.deployment["spec"]["template"]["spec"]["serviceAccountName"]
    bound = [
        b
        for b in h.find(release.objects, "ClusterRoleBinding") + h.find(release.objects, "RoleBinding")
        if {"kind": "ServiceAccount", "name": sa_name, "namespace": h.NAMESPACE} in b["subjects"]
        # The webhook certificate's grants are by name (test_certificate_rbac_is_by_name_and_used);
        # the metrics reviews are used by scrapes (test_metrics_are_served_over_https_to_readers_only).
        and b["metadata"]["name"] not in (CERTIFICATE_RBAC, METRICS_AUTH_RBAC)
    ]
    assert sorted((b["kind"], b["roleRef"]["kind"]) for b in bound) == [
        ("ClusterRoleBinding", "ClusterRole"),
        ("RoleBinding", "Role"),
    ]
    cluster_binding, lease_binding = sorted(bound, key=lambda b: str(b["kind"]))
    role = h.one(release.objects, "ClusterRole", cluster_binding["roleRef"]["name"])
    granted = rbac_audit.permissions_from_rules(role["rules"])
    used, lease_used = audit_rbac.split(h.operator_permissions(scenario, user))
    # The leader election Lease: in the release namespace only, by a Role of exactly its calls.
    lease_role = h.one(release.objects, "Role", lease_binding["roleRef"]["name"])
    assert lease_role["metadata"]["namespace"] == lease_binding["metadata"]["namespace"] == h.NAMESPACE
    assert (
        rbac_audit.permissions_from_rules(lease_role["rules"])
        == lease_used
        == {("coordination.k8s.io", "leases", verb) for verb in ("create", "get", "update")}
    )
    assert {r.namespace for r in scenario.audit if r.user == user and r.resource == "leases"} == {h.NAMESPACE}
    refused = [r for r in scenario.audit if r.user == user and r.status == 403]
    assert not refused, "the API server refused the operator:\n" + "\n".join(
        f"{r.verb} {r.path}" for r in refused
    )
    # kube-scheduler's Workload and PodGroup are served only where the gang gates are on, and this
    # cluster has them off: the operator cannot use those rights here. tests/scheduling/test_gang.py
    # runs it with exactly this ClusterRole on a cluster that serves them, and sees each one used.
    assert granted >= GANG_PERMISSIONS
    missing, unused = used - granted, granted - used - GANG_PERMISSIONS
    assert not missing, "the operator made calls its ClusterRole does not grant:\n" + "\n".join(
        rbac_audit.describe(missing)
    )
    assert not unused, "the ClusterRole grants what the operator never used:\n" + "\n".join(
        rbac_audit.describe(unused)
    )
    # And the ClusterRole is what the enabled plugins declare (charts/tools/sync_chart.py writes it).
    assert granted == Operator(config=Configuration()).resources.permissions()


def access(server: RealCluster, user: str, verb: str, resource: str, namespace: str = "") -> bool:
    """What `kubectl auth can-i <verb> <resource> --as <user>` asks: a SubjectAccessReview."""
    review: Obj = server.http.request(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{h.NAMESPACE}"],
                "resourceAttributes": {"verb": verb, "resource": resource, "namespace": namespace},
            },
        },
    )
    return bool(review["status"].get("allowed"))


def test_the_operator_cannot_list_or_watch_secrets(release: h.Installed) -> None:
    """The chart granted cluster-wide list/watch on Secrets (upstream grants more): the operator's
    identity listed a service-account token Secret in kube-system. It now creates the Secrets it
    makes and reads one by name when a create finds its name taken; nothing lists them."""
    server, user = release.server, release.operator_user
    role = h.one(release.objects, "ClusterRole", "kubeflow-trainer-controller-manager")
    granted = rbac_audit.permissions_from_rules(role["rules"])
    assert {verb for _, resource, verb in granted if resource == "secrets"} == {"create", "get"}
    if not isinstance(server, RealCluster):
        return  # the stand-in answers no SubjectAccessReview: the real authorizer below
    for namespace in ("", "kube-system", h.SCENARIO_NAMESPACE):
        assert not access(server, user, "list", "secrets", namespace), namespace or "cluster-wide"
        assert not access(server, user, "watch", "secrets", namespace), namespace or "cluster-wide"
    assert access(server, user, "create", "secrets", h.SCENARIO_NAMESPACE)
    assert access(server, user, "get", "secrets", "kube-system"), "get by name remains (docs/security.md)"
    for path in ("/api/v1/secrets", "/api/v1/namespaces/kube-system/secrets"):  # a real attempt
        with pytest.raises(APIError) as refused:
            server.http.request("GET", path, headers=server._as(user))
        assert refused.value.code == 403, path


def test_the_admission_policy_holds_the_operator_to_trainjob_children(release: h.Installed) -> None:
    """What RBAC cannot say: of ConfigMaps and Secrets, the operator's account writes only those a
    TrainJob controls, and never a service-account token Secret (a real attempt of each)."""
    server, user = release.server, release.operator_user
    if not isinstance(server, RealCluster):
        pytest.skip("the stand-in stores ValidatingAdmissionPolicies but does not evaluate them")
    ns = h.SCENARIO_NAMESPACE
    owner = {
        "apiVersion": h.TRAINER_API,
        "kind": "TrainJob",
        "name": "someone",
        "uid": "00000000-0000-0000-0000-000000000001",
        "controller": True,
    }
    plain = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "not-a-child", "namespace": ns}}
    with pytest.raises(APIError) as refused:
        server.create(plain, user=user)
    assert "writes only ConfigMaps and Secrets a TrainJob controls" in str(refused.value)
    token = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "forged-token",
            "namespace": ns,
            "ownerReferences": [owner],
            "annotations": {"kubernetes.io/service-account.name": "default"},
        },
        "type": "kubernetes.io/service-account-token",
    }
    with pytest.raises(APIError) as refused:
        server.create(token, user=user)
    assert "writes only Secrets of the types it makes" in str(refused.value)
    # A stolen token cannot make a TrainJob's child of an existing object by adding a reference:
    # an update keeps the controller the object had (kube-system's ConfigMaps, say).
    server.create(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "not-ours", "namespace": ns}}
    )
    with pytest.raises(APIError) as refused:
        server.patch("v1", "ConfigMap", "not-ours", {"metadata": {"ownerReferences": [owner]}}, ns, user=user)
    assert "only ones it controlled before" in str(refused.value)
    server.delete("v1", "ConfigMap", "not-ours", ns)
    child = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "a-child", "namespace": ns, "ownerReferences": [owner]},
    }
    server.create(child, user=user)  # a TrainJob's child: allowed
    with contextlib.suppress(APIError):  # the garbage collector may be first: its owner does not exist
        server.delete("v1", "ConfigMap", "a-child", ns)


CERTIFICATE_RBAC = "kubeflow-trainer-webhook-certificate"


METRICS_AUTH_RBAC = "kubeflow-trainer-metrics-auth"
METRICS_READER = "kubeflow-trainer-metrics-reader"


def scrape(port: int, ca: str, token: str | None) -> tuple[int, str, list[str]]:
    """GET /metrics over TLS, the certificate checked against ``ca``; its DNS names returned."""
    context = ssl.create_default_context(cadata=ca)
    context.check_hostname = False  # the names are checked by the caller: the Service's, not 127.0.0.1
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    try:
        connection.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
        response = connection.getresponse()
        assert isinstance(connection.sock, ssl.SSLSocket)
        peer = connection.sock.getpeercert() or {}
        names = [str(value) for kind, value in peer.get("subjectAltName", ()) if kind == "DNS"]
        return response.status, response.read().decode(), names
    finally:
        connection.close()


def test_metrics_are_served_over_https_to_readers_only(
    release: h.Installed, scenario: h.ScenarioResult
) -> None:
    """Finding 8: the metrics were plain HTTP to anyone. Now HTTPS with the webhook certificate, and
    only to callers the real API server authenticates and authorizes to get /metrics, with the
    RBAC the chart grants for it, exactly (docs/security.md)."""
    server, user = release.server, release.operator_user
    port = release.operator.port("metrics")
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        plain.request("GET", "/metrics")
        plain.getresponse().read()
    if not isinstance(server, RealCluster):
        return  # the stand-in serves no TokenReview or SubjectAccessReview: the real ones below
    secret = server.get("v1", "Secret", h.webhook_secret_name(release.deployment, server), h.NAMESPACE)
    ca = base64.b64decode(secret["data"]["ca.crt"]).decode()
    ns = h.SCENARIO_NAMESPACE
    for name in ("prometheus", "nosy"):
        with contextlib.suppress(APIError):
            server.create(
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}}
            )
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "scrape-trainer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": METRICS_READER},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": ns}],
    }
    server.create(binding)
    mark = server.audit_mark()
    try:
        tokens = {name: service_account_token(server, ns, name) for name in ("prometheus", "nosy")}
        status, text, names = scrape(port, ca, tokens["prometheus"])
        assert status == 200 and "controller_runtime_reconcile_total" in text, text[:300]
        service = h.one(release.objects, "Service")["metadata"]["name"]
        assert f"{service}.{h.NAMESPACE}.svc" in names, names
        assert scrape(port, ca, tokens["prometheus"])[0] == 200, "kept verdicts"
        status, text, _ = scrape(port, ca, tokens["nosy"])
        assert (status, text) == (403, f"Authorization denied for user system:serviceaccount:{ns}:nosy\n")
        assert scrape(port, ca, None)[:2] == (401, "Unauthorized\n")
        forged = tokens["prometheus"][:-4] + "AAAA"
        assert scrape(port, ca, forged)[:2] == (401, "Unauthorized\n")
    finally:
        server.delete("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "scrape-trainer")
    calls = [r for r in server.audit_since(mark) if r.user == user]
    used = {(r.resource, r.verb) for r in calls if r.resource in ("tokenreviews", "subjectaccessreviews")}
    assert used == {("tokenreviews", "create"), ("subjectaccessreviews", "create")}
    assert not [r for r in calls if r.status == 403]
    # Two tokens reviewed, plus the forged one; each caller's access reviewed once: verdicts kept.
    assert sum(r.resource == "tokenreviews" for r in calls) == 3
    assert sum(r.resource == "subjectaccessreviews" for r in calls) == 2
    role = h.one(release.objects, "ClusterRole", METRICS_AUTH_RBAC)
    assert rbac_audit.permissions_from_rules(role["rules"]) == {
        ("authentication.k8s.io", "tokenreviews", "create"),
        ("authorization.k8s.io", "subjectaccessreviews", "create"),
    }


def service_account_token(server: RealCluster, namespace: str, name: str) -> str:
    """A token as a scraper's pod holds one (TokenRequest, the API server's own audience)."""
    issued: Obj = server.http.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )
    return str(issued["status"]["token"])


def test_certificate_rbac_is_by_name_and_used(release: h.Installed, scenario: h.ScenarioResult) -> None:
    """The operator's own webhook certificate (the default source): the Secret and the two webhook
    configurations, each granted by name, and every call on them within those grants."""
    user = release.operator_user
    role = h.one(release.objects, "Role", CERTIFICATE_RBAC)
    cluster_role = h.one(release.objects, "ClusterRole", CERTIFICATE_RBAC)
    assert role["metadata"]["namespace"] == h.NAMESPACE
    assert h.one(release.objects, "RoleBinding", CERTIFICATE_RBAC)["roleRef"]["name"] == CERTIFICATE_RBAC
    assert (
        h.one(release.objects, "ClusterRoleBinding", CERTIFICATE_RBAC)["roleRef"]["name"] == CERTIFICATE_RBAC
    )
    granted = {
        (group, resource, name, verb)
        for rule in role["rules"] + cluster_role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for name in rule["resourceNames"]
        for verb in rule["verbs"]
    }
    assert {(g, r, v) for g, r, _, v in granted} == audit_rbac.CERTIFICATE
    used = {
        (r.group, r.resource, r.name, r.verb)
        for r in scenario.audit
        if r.user == user and h.certificate_call(r)
    }
    assert used, "the operator never read its certificate Secret or wrote a caBundle"
    assert used <= granted, f"calls outside the certificate's grants: {sorted(used - granted)}"
    # `update` of the Secret is a renewal (or the fill of the chart's empty Secret, which the real
    # plane's harness fills itself for the loopback address): a run may well make none.
    unused = {(g, r, v) for g, r, _, v in granted - used}
    assert unused <= {("", "secrets", "update")}, sorted(unused)


def test_upgrade_keeps_the_certificate_and_turns_runtimes_off(release: h.Installed) -> None:
    """``helm upgrade`` with changed values: a runtime turned off, the webhooks' timeout changed."""
    server = release.server

    def cert() -> str:
        return str(
            server.get("v1", "Secret", "kubeflow-trainer-webhook-cert", h.NAMESPACE)["data"]["tls.crt"]
        )

    def runtimes() -> list[str]:
        return sorted(o["metadata"]["name"] for o in server.list(h.TRAINER_API, "ClusterTrainingRuntime"))

    before, installed = cert(), runtimes()
    values = h.merge(
        release.values, {"runtimes": {"jaxDistributed": {"enabled": False}}, "webhook": {"timeoutSeconds": 7}}
    )
    upgraded = release.upgrade(values)
    assert upgraded["revision"] == 2
    assert cert() == before  # the webhooks' CA is unchanged: the running operator keeps serving
    assert runtimes() == sorted(set(installed) - {"jax-distributed"})
    for kind in h.WEBHOOK_KINDS:
        for configuration in server.list(h.WEBHOOK_API, kind):
            if configuration["metadata"]["name"].endswith(h.TRAINER_GROUP):
                assert {(w["timeoutSeconds"], w["failurePolicy"]) for w in configuration["webhooks"]} == {
                    (7, "Fail")
                }
    # The operator still admits TrainJobs through the upgraded webhook configurations, and refuses.
    with pytest.raises(APIError) as refused:
        server.create(h.trainjob("refused-after-upgrade", "jax-distributed"))
    assert 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied' in str(refused.value)
    server.create(h.trainjob("after-upgrade", "torch-distributed"))
    h.wait_for(
        "a TrainJob after the upgrade",
        lambda: h.condition_true(server, "after-upgrade", h.SCENARIO_NAMESPACE, "Complete"),
    )


def test_uninstall_leaves_only_the_crds(release: h.Installed) -> None:
    server = release.server
    release.operator.stop()
    # Over the release's whole life (the workload, the upgrade): the API server refused it nothing.
    # (Not the tests' own attempts in its name, refused on purpose: urllib's user agent.)
    refused = [
        f"{r.verb} {r.path}"
        for r in server.audit_since(release.mark)
        if r.user == release.operator_user
        and r.status == 403
        and not r.user_agent.startswith("Python-urllib")
    ]
    assert refused == []
    release.helm.uninstall(h.RELEASE, timeout=120)
    instance = "app.kubernetes.io/instance"
    leftovers = []
    for api_version, kind, namespace in [
        ("v1", "ConfigMap", h.NAMESPACE),
        ("v1", "Secret", h.NAMESPACE),
        ("v1", "Service", h.NAMESPACE),
        ("v1", "ServiceAccount", h.NAMESPACE),
        ("apps/v1", "Deployment", h.NAMESPACE),
        ("rbac.authorization.k8s.io/v1", "Role", h.NAMESPACE),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", h.NAMESPACE),
        ("rbac.authorization.k8s.io/v1", "ClusterRole", None),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", None),
        ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration", None),
        ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", None),
        (h.TRAINER_API, "ClusterTrainingRuntime", None),
    ]:
        for obj in server.list(api_version, kind, namespace):
            if (obj["metadata"].get("labels") or {}).get(
                instance
            ) == h.RELEASE or kind == "ClusterTrainingRuntime":
                leftovers.append(f"{kind} {obj['metadata']['name']}")
    assert leftovers == []
    crds = [
        c
        for c in server.list("apiextensions.k8s.io/v1", "CustomResourceDefinition")
        if c["spec"]["group"] == "trainer.kubeflow.org"
    ]
    assert len(crds) == 4  # kept: deleting them would delete every TrainJob
    assert server.list(h.TRAINER_API, "TrainJob", h.SCENARIO_NAMESPACE), (
        "the users' TrainJobs are still there"
    )


@pytest.mark.standin_only("the real control plane's JobSet CRD serves its running controller")
def test_operator_refuses_to_start_without_jobset(tmp_path: Path) -> None:
    with h.installed(tmp_path, start_operator=False, jobset=False) as release:
        release.operator.start(register_webhooks=False)
        code = release.operator.wait_exit(60)
        assert code != 0
        assert "the JobSet CRD (jobsets.jobset.x-k8s.io) is not installed" in release.operator.logs()


@pytest.mark.standin_only("the stand-in can claim to be an older Kubernetes")
def test_the_admission_policy_refuses_kubernetes_older_than_1_30(tmp_path: Path) -> None:
    server = LocalAPIServer(minor_version=29).start()
    try:
        with h.helm_config(server, tmp_path) as cfg, pytest.raises(helm.HelmError) as refused:
            cfg.install(str(h.CHART), h.RELEASE, create_namespace=True)
        assert "manager.admissionPolicy.enabled needs Kubernetes 1.30 or later" in str(refused.value)
    finally:
        server.stop()


@pytest.mark.standin_only("the stand-in can claim to be an older Kubernetes")
def test_install_refuses_kubernetes_older_than_supported(tmp_path: Path) -> None:
    server = LocalAPIServer(minor_version=28).start()
    try:
        with h.helm_config(server, tmp_path) as cfg, pytest.raises(helm.HelmError) as refused:
            cfg.install(str(h.CHART), h.RELEASE, create_namespace=True)
        assert "kubeVersion" in str(refused.value) or "1.29" in str(refused.value)
        assert server.list("apiextensions.k8s.io/v1", "CustomResourceDefinition") == []
    finally:
        server.stop()
