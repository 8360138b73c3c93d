"""The real control plane through its Python API: what ``up`` promises, and the pod fates kwok plays.

One cluster serves the module (a namespace per test); each JobSet test waits for a real JobSet
controller, Job controller, scheduler and kwok to move its pods, so these take seconds each.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from trainer_sandbox.cluster import ControlPlane
from trainer_sandbox.cluster.controlplane import SERVICE_ACCOUNT_ISSUER
from trainer_sandbox.cluster.kube import Kube, KubeError

pytestmark = pytest.mark.slow

T = TypeVar("T")
Obj = dict[str, Any]
JOBSET_USER = "system:serviceaccount:jobset-system:jobset-controller-manager"
JOB_CONTROLLER_USER = "system:serviceaccount:kube-system:job-controller"


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


def condition(obj: Obj, kind: str) -> Obj | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return dict(c)
    return None


def jobset(name: str, ns: str, env: dict[str, str], **job_spec: Any) -> Obj:
    containers = [
        {"name": "node", "image": "busybox", "env": [{"name": k, "value": v} for k, v in env.items()]}
    ]
    pod_spec: Obj = {"containers": containers}
    if "restartPolicy" in job_spec:
        pod_spec["restartPolicy"] = job_spec.pop("restartPolicy")
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "node",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": 2,
                            "completions": 2,
                            **job_spec,
                            "template": {"spec": pod_spec},
                        }
                    },
                }
            ]
        },
    }


def pods(kube: Kube, ns: str) -> list[Obj]:
    return list(kube.get(f"/api/v1/namespaces/{ns}/pods").get("items") or [])


def jobset_now(kube: Kube, ns: str, name: str) -> Obj:
    return kube.get(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets/{name}")


@pytest.fixture(scope="module")
def kube(plane: ControlPlane) -> Kube:
    return plane.client()


@pytest.fixture
def ns(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    name = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower().removeprefix("test_"))[:50].strip("-")
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    # The ServiceAccount admission plugin refuses pods until the namespace's default account exists.
    wait_for(
        f"{name}/default ServiceAccount",
        lambda: _exists(kube, f"/api/v1/namespaces/{name}/serviceaccounts/default"),
    )
    yield name
    kube.request("DELETE", f"/api/v1/namespaces/{name}")


def _exists(kube: Kube, path: str) -> bool:
    try:
        kube.get(path)
    except KubeError as e:
        if e.status == 404:
            return False
        raise
    return True


# -- what `up` promises -------------------------------------------------------------------------
def test_start_reports_each_component_once_healthy(started: tuple[ControlPlane, list[str]]) -> None:
    _, lines = started
    names = [re.split(r"\s{2,}", line.strip())[0] for line in lines]
    assert names == [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
        "kwok-logs",
        "jobset",
        "CRDs and runtimes installed",
        "cluster up",
    ]
    assert all(re.search(r"\d+\.\ds$", line) for line in lines)


def test_files_a_client_needs_are_in_the_directory(plane: ControlPlane) -> None:
    for path in (plane.kubeconfig, plane.audit_log, plane.sa_key, plane.sa_pub, plane.pki_dir / "ca.key"):
        assert path.exists(), path
    assert plane.kubectl.name == "kubectl" and plane.kubectl.parent == plane.bin_dir
    assert plane.sa_key.stat().st_mode & 0o077 == 0  # private keys are the owner's alone
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "jobset"):
        assert (plane.logs_dir / f"{name}.log").exists()
    version = plane.run_kubectl("version", "-o", "json")
    assert json.loads(version.stdout)["serverVersion"]["gitVersion"] == "v1.36.3"


def test_four_schedulable_fake_nodes(kube: Kube) -> None:
    nodes = kube.get("/api/v1/nodes")["items"]
    assert len(nodes) == 4
    for node in nodes:
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        assert condition(node, "Ready")
        assert not node["spec"].get("taints")
        assert node["status"]["capacity"] == {
            "cpu": "64",
            "memory": "256Gi",
            "nvidia.com/gpu": "8",
            "pods": "110",
        }


def test_crds_runtimes_and_public_configmap_are_installed(kube: Kube) -> None:
    from trainer_sandbox.sandbox import runtime_files

    crds = {
        c["metadata"]["name"]
        for c in kube.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")["items"]
    }
    assert {
        "jobsets.jobset.x-k8s.io",
        "trainjobs.trainer.kubeflow.org",
        "trainingruntimes.trainer.kubeflow.org",
        "clustertrainingruntimes.trainer.kubeflow.org",
        "podgroups.scheduling.x-k8s.io",
        "podgroups.scheduling.volcano.sh",
    } <= crds
    runtimes = kube.get("/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes")["items"]
    assert len(runtimes) == len(runtime_files()) > 0
    cm = kube.get("/api/v1/namespaces/kubeflow-system/configmaps/kubeflow-trainer-public")
    assert cm["data"]["kubeflow_trainer_version"]


# -- pods through their phases, steered like the stand-in --------------------------------------
def test_jobset_completes_after_its_run_seconds(kube: Kube, ns: str) -> None:
    kube.create(jobset("ok", ns, {"SANDBOX_RUN_SECONDS": "1"}))
    done = wait_for("JobSet Completed", lambda: condition(jobset_now(kube, ns, "ok"), "Completed"))
    assert done["reason"] == "AllJobsCompleted"
    finished = [p for p in pods(kube, ns) if p["status"]["phase"] == "Succeeded"]
    assert len(finished) == 2
    for pod in finished:
        (status,) = pod["status"]["containerStatuses"]
        assert status["state"]["terminated"]["exitCode"] == 0
        assert status["state"]["terminated"]["reason"] == "Completed"
        assert pod["spec"]["nodeName"].startswith("kwok-node-")


def test_jobset_fails_with_the_exit_code(kube: Kube, ns: str) -> None:
    kube.create(jobset("bad", ns, {"SANDBOX_EXIT_CODE": "1"}, restartPolicy="Never", backoffLimit=0))
    failed = wait_for("JobSet Failed", lambda: condition(jobset_now(kube, ns, "bad"), "Failed"))
    assert failed["reason"] == "FailedJobs"
    codes = [
        s["state"]["terminated"]["exitCode"]
        for p in pods(kube, ns)
        if p["status"]["phase"] == "Failed"
        for s in p["status"]["containerStatuses"]
    ]
    assert 1 in codes  # the pod that failed the Job; its sibling may have been stopped (137)


def test_on_failure_pods_restart_in_place_until_the_backoff_limit(kube: Kube, ns: str) -> None:
    """JobSet's webhook defaults restartPolicy to OnFailure; the kubelet (kwok) restarts the
    container, and the Job controller fails the Job when the restarts reach backoffLimit."""
    kube.create(jobset("again", ns, {"SANDBOX_EXIT_CODE": "3", "SANDBOX_RUN_SECONDS": "0.2"}, backoffLimit=2))
    stored = jobset_now(kube, ns, "again")
    assert (
        stored["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["restartPolicy"]
        == "OnFailure"
    )
    wait_for("JobSet Failed", lambda: condition(jobset_now(kube, ns, "again"), "Failed"))
    job = kube.get(f"/apis/batch/v1/namespaces/{ns}/jobs/again-node-0")
    assert (condition(job, "Failed") or {}).get("reason") == "BackoffLimitExceeded"


def test_negative_run_seconds_keep_pods_running(kube: Kube, ns: str) -> None:
    kube.create(jobset("forever", ns, {"SANDBOX_RUN_SECONDS": "-1"}))
    wait_for(
        "2 Running pods",
        lambda: len([p for p in pods(kube, ns) if p["status"].get("phase") == "Running"]) == 2,
    )
    time.sleep(3)  # longer than the default run
    assert [p["status"]["phase"] for p in pods(kube, ns)] == ["Running", "Running"]
    status = jobset_now(kube, ns, "forever").get("status") or {}
    assert not status.get("terminalState")
    # As with the stand-in, a client that sets the phase ends them.
    for pod in pods(kube, ns):
        kube.merge_patch(
            f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}/status",
            {"status": {"phase": "Succeeded"}},
        )
    wait_for("JobSet Completed", lambda: condition(jobset_now(kube, ns, "forever"), "Completed"))


FATES = [
    # (env of the node container, phase, exit code)
    ({}, "Succeeded", 0),
    ({"SANDBOX_RUN_SECONDS": "0.1", "SANDBOX_EXIT_CODE": "3"}, "Failed", 3),
    ({"SANDBOX_RUN_SECONDS": ".5", "SANDBOX_EXIT_CODE": " 4 "}, "Failed", 4),
    ({"SANDBOX_EXIT_CODE": "+5"}, "Failed", 5),
    ({"SANDBOX_EXIT_CODE": "-0"}, "Succeeded", 0),
    ({"SANDBOX_EXIT_CODE": "not a number"}, "Failed", 1),
    ({"SANDBOX_RUN_SECONDS": "not a number", "SANDBOX_EXIT_CODE": "7"}, "Failed", 7),
]


def test_pod_fates_follow_the_env_of_the_node_container(kube: Kube, ns: str) -> None:
    """Bare pods (restartPolicy Never) with the control surface on the ``node`` container, which is
    not the first: the other container's env must not count."""
    for i, (env, _, _) in enumerate(FATES):
        kube.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"fate-{i}", "namespace": ns},
                "spec": {
                    "restartPolicy": "Never",
                    "initContainers": [{"name": "init", "image": "busybox"}],
                    "containers": [
                        {
                            "name": "sidecar",
                            "image": "busybox",
                            "env": [{"name": "SANDBOX_EXIT_CODE", "value": "9"}],
                        },
                        {
                            "name": "node",
                            "image": "busybox",
                            "env": [{"name": k, "value": v} for k, v in env.items()],
                        },
                    ],
                },
            }
        )

    def all_finished() -> list[Obj] | None:
        current = sorted(pods(kube, ns), key=lambda p: int(p["metadata"]["name"].split("-")[1]))
        return current if all(p["status"].get("phase") in ("Succeeded", "Failed") for p in current) else None

    finished = wait_for("every pod finished", all_finished)
    seen = [
        (
            p["status"]["phase"],
            [s["state"]["terminated"]["exitCode"] for s in p["status"]["containerStatuses"]],
        )
        for p in finished
    ]
    assert seen == [(phase, [code, code]) for _, phase, code in FATES]


def test_a_client_that_sets_the_phase_takes_the_pod_over(kube: Kube, ns: str) -> None:
    """As with the stand-in: kwok's timer (here 3 s to Succeeded) does not undo a phase a client
    wrote while the pod ran."""
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "taken", "namespace": ns},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "node",
                        "image": "busybox",
                        "env": [{"name": "SANDBOX_RUN_SECONDS", "value": "3"}],
                    }
                ],
            },
        }
    )
    path = f"/api/v1/namespaces/{ns}/pods/taken"
    wait_for("pod Running", lambda: kube.get(path)["status"].get("phase") == "Running")
    kube.merge_patch(path + "/status", {"status": {"phase": "Failed"}})
    time.sleep(4)
    assert kube.get(path)["status"]["phase"] == "Failed"


def test_a_deleted_pod_goes_away(kube: Kube, ns: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "doomed", "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "node", "image": "busybox", "env": [{"name": "SANDBOX_RUN_SECONDS", "value": "-1"}]}
            ],
        },
    }
    kube.create(pod)
    path = f"/api/v1/namespaces/{ns}/pods/doomed"
    wait_for("pod Running", lambda: kube.get(path)["status"].get("phase") == "Running")
    kube.request("DELETE", path)  # the default grace period: the kubelet (kwok) has to finish it
    wait_for("pod gone", lambda: not _exists(kube, path), timeout=20)


# -- identities, audit, tokens -----------------------------------------------------------------
def test_the_audit_log_names_each_writer(plane: ControlPlane, kube: Kube, ns: str) -> None:
    kube.create(jobset("audited", ns, {"SANDBOX_RUN_SECONDS": "0"}))
    wait_for("JobSet Completed", lambda: condition(jobset_now(kube, ns, "audited"), "Completed"))
    seen: set[tuple[str, str, str, str, int]] = set()

    def scan() -> bool:
        for line in plane.audit_log.read_text().splitlines():
            event = json.loads(line)
            ref = event.get("objectRef") or {}
            if ref.get("namespace") != ns:
                continue
            seen.add(
                (
                    event["user"]["username"],
                    event["verb"],
                    ref.get("resource", "") + ("/" + ref["subresource"] if ref.get("subresource") else ""),
                    ref.get("name", ""),
                    event["responseStatus"]["code"],
                )
            )
        return any(u == "kwok-controller" and r == "pods/status" for u, _, r, _, _ in seen)

    wait_for("kwok's status patches in the audit log", scan, timeout=10)
    who = {(u, v, r, c) for u, v, r, _, c in seen}
    assert ("kubernetes-admin", "create", "jobsets", 201) in who
    assert ("kubernetes-admin", "create", "jobsets", 201) in {
        (u, v, r, c) for u, v, r, n, c in seen if n == "audited"
    }
    assert (JOBSET_USER, "create", "jobs", 201) in who
    assert (JOB_CONTROLLER_USER, "create", "pods", 201) in who
    assert ("system:kube-scheduler", "create", "pods/binding", 201) in who
    assert ("kwok-controller", "patch", "pods/status", 200) in who


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_service_account_tokens_work_and_tests_can_sign_their_own(
    plane: ControlPlane, kube: Kube, ns: str
) -> None:
    issued = kube.request(
        "POST",
        f"/api/v1/namespaces/{ns}/serviceaccounts/default/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    account = kube.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default")
    now = int(time.time())
    claims = {
        "iss": SERVICE_ACCOUNT_ISSUER,
        "aud": [SERVICE_ACCOUNT_ISSUER],
        "sub": f"system:serviceaccount:{ns}:default",
        "iat": now,
        "nbf": now,
        "exp": now + 600,
        "kubernetes.io": {
            "namespace": ns,
            "serviceaccount": {"name": "default", "uid": account["metadata"]["uid"]},
        },
    }
    key = serialization.load_pem_private_key(plane.sa_key.read_bytes(), None)
    assert isinstance(key, rsa.RSAPrivateKey)
    signing_input = (
        _b64(json.dumps({"alg": "RS256", "typ": "JWT"}).encode()) + "." + _b64(json.dumps(claims).encode())
    )
    signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    ours = signing_input + "." + _b64(signature)
    for token in (issued["status"]["token"], ours):
        review = kube.create(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        )
        assert review["status"].get("authenticated") is True, review["status"]
        assert review["status"]["user"]["username"] == f"system:serviceaccount:{ns}:default"
