"""``helm upgrade`` from upstream's chart release to ours, and ``helm rollback`` to it, on real
nodes with TrainJobs running (docs/drop-in.md).

Upstream's chart v2.3.0 comes from its module in the Go module cache (its dependencies dropped:
the cluster runs JobSet already), its image is built from the same module into the nodes'
registry. Both charts run their controller as the same Deployment under the same ServiceAccount;
the pods of one replace the other's. The audit log shows that neither writes a JobSet anew or
deletes a pod, and the TrainJobs finish under the controller that took over.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from node_helpers import Kubectl, helm
from trainer_sandbox.backends import RealCluster
from trainer_sandbox.cluster import ControlPlane, addons, install

pytestmark = pytest.mark.real_nodes
ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kubeflow-trainer"
NAMESPACE = "kubeflow-system"
RELEASE = "trainer"
WORK = "work"
TJ = "trainer.kubeflow.org/v1alpha1"
# Prints, then sleeps through the switch; the TrainJob completes under whoever runs then.
SLEEPER = textwrap.dedent(
    """
    import os, time
    print("start", os.environ["PET_NODE_RANK"], flush=True)
    time.sleep(float(os.environ["SLEEP"]))
    print("end", os.environ["PET_NODE_RANK"], flush=True)
    """
)


@pytest.fixture(scope="module")
def plane(bare_plane: ControlPlane) -> ControlPlane:
    """Upstream's image in the nodes' registry, under the name its chart gives."""
    addons.push_to_nodes(bare_plane, addons.UPSTREAM_IMAGE, addons.upstream_image(bare_plane.bin_dir))
    return bare_plane


def trainjob(name: str, sleep: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": TJ,
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": WORK},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {
                "numNodes": 2,
                "command": ["python3", "-c", SLEEPER],
                "env": [{"name": "SLEEP", "value": sleep}],
                "resourcesPerNode": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            },
            **spec,
        },
    }


def state(kubectl: Kubectl, name: str) -> str:
    conditions = (kubectl.get("trainjob", name).get("status") or {}).get("conditions") or []
    return next(
        (c["type"] for c in conditions if c["type"] in ("Complete", "Failed") and c["status"] == "True"), ""
    )


def running(kubectl: Kubectl, jobset: str) -> int:
    out = kubectl("get", "pods", "-l", f"jobset.sigs.k8s.io/jobset-name={jobset}", "-o", "json")
    return sum(p["status"].get("phase") == "Running" for p in json.loads(out)["items"])


def world(cluster: RealCluster) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for api_version, kind in (("jobset.x-k8s.io/v1alpha2", "JobSet"), ("v1", "Pod"), ("v1", "ConfigMap")):
        for obj in cluster.list(api_version, kind):
            out[f"{kind}/{obj['metadata']['name']}"] = obj["metadata"]["uid"]
    for tj in cluster.list(TJ, "TrainJob"):
        conditions = (tj.get("status") or {}).get("conditions") or []
        out[f"TrainJob/{tj['metadata']['name']}"] = sorted((c["type"], c["status"]) for c in conditions)
    return out


def recreated(cluster: RealCluster, mark: int) -> list[str]:
    return [
        f"{r.user} {r.verb} {r.resource}/{r.name}"
        for r in cluster.audit_since(mark)
        if r.mutated
        and r.namespace == WORK
        and (
            (r.resource == "jobsets" and r.verb in ("create", "delete"))
            or (r.resource == "pods" and r.verb == "delete")
        )
    ]


def manager_pods(plane: ControlPlane) -> list[str]:
    out = plane.run_kubectl("-n", NAMESPACE, "get", "pods", "-o", "json").stdout
    return [
        p["metadata"]["name"]
        for p in json.loads(out)["items"]
        if p["metadata"].get("deletionTimestamp") is None
    ]


def lease_holder(plane: ControlPlane) -> str:
    """Both charts name their Lease trainer.kubeflow.org, in the release's namespace."""
    out = plane.run_kubectl(
        "-n", NAMESPACE, "get", "lease", "trainer.kubeflow.org", "-o", "json", check=False
    )
    return str((json.loads(out.stdout or "{}").get("spec") or {}).get("holderIdentity") or "")


def manager_images(plane: ControlPlane) -> set[str]:
    out = plane.run_kubectl("-n", NAMESPACE, "get", "pods", "-o", "json").stdout
    return {
        c["image"]
        for p in json.loads(out)["items"]
        if p["metadata"].get("deletionTimestamp") is None
        for c in p["spec"]["containers"]
    }


@pytest.fixture(scope="module")
def upgraded(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Upstream's chart with TrainJobs finished, running and suspended; then ``helm upgrade``."""
    chart = addons.upstream_chart(tmp_path_factory.mktemp("upstream-chart"))
    helm(
        plane, "install", RELEASE, str(chart), "--namespace", NAMESPACE, "--create-namespace",
        "--set", "jobset.install=false", "--wait", "--timeout", "5m",
    )  # fmt: skip
    assert manager_images(plane) == {addons.UPSTREAM_IMAGE}
    # Upstream's runtimes, applied from its manifests as its docs say (its chart's are off by default).
    module = addons.module_dir(addons.UPSTREAM_MODULE)
    runtime = install.documents(module / "manifests" / "base" / "runtimes" / "torch_distributed.yaml")
    plane.run_kubectl("apply", "--server-side", "-f", "-", input=json.dumps(runtime[0]))
    cluster = RealCluster(plane.kubeconfig, plane.audit_log, ca_dir=plane.pki_dir, kubectl=str(plane.kubectl))
    cluster = cluster.for_test(WORK)
    kubectl = Kubectl(plane, WORK)
    kubectl.apply(trainjob("done", "0"), trainjob("running", "90"), trainjob("held", "0", suspend=True))
    kubectl.wait_for("done to complete", lambda: state(kubectl, "done") == "Complete", timeout=240)
    kubectl.wait_for("running's two pods to run", lambda: running(kubectl, "running") == 2, timeout=240)
    before = world(cluster)
    holder = lease_holder(plane)
    assert holder.startswith(tuple(manager_pods(plane))), holder  # upstream's holds the Lease ours uses
    mark = cluster.audit_mark()
    # docs/drop-in.md, "With Helm": our chart installs a runtime of the same name, so it takes
    # over the one applied by hand (Helm adopts an object that names its release).
    plane.run_kubectl(
        "annotate", "clustertrainingruntime", "torch-distributed", "--overwrite",
        f"meta.helm.sh/release-name={RELEASE}", f"meta.helm.sh/release-namespace={NAMESPACE}",
    )  # fmt: skip
    plane.run_kubectl(
        "label", "clustertrainingruntime", "torch-distributed", "app.kubernetes.io/managed-by=Helm"
    )
    helm(plane, "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--wait", "--timeout", "5m")
    return {"cluster": cluster, "kubectl": kubectl, "before": before, "mark": mark}


def test_helm_upgrade_from_upstreams_release_recreates_nothing(
    plane: ControlPlane, upgraded: dict[str, Any]
) -> None:
    cluster: RealCluster = upgraded["cluster"]
    kubectl: Kubectl = upgraded["kubectl"]
    images = manager_images(plane)
    assert addons.UPSTREAM_IMAGE not in images and len(images) == 1, images
    # Ours took the Lease upstream's held: one of them reconciles at a time.
    kubectl.wait_for(
        "one of our pods to lead",
        lambda: lease_holder(plane).startswith(tuple(manager_pods(plane))),
        timeout=60,
    )
    after = world(cluster)
    assert after == upgraded["before"], "the same JobSets, pods and ConfigMaps, the same status"
    # The TrainJob that ran through the upgrade completes under ours.
    kubectl.wait_for("running to complete", lambda: state(kubectl, "running") == "Complete", timeout=240)
    assert recreated(cluster, upgraded["mark"]) == []
    out = kubectl("logs", "-l", "jobset.sigs.k8s.io/jobset-name=running", "--prefix")
    assert "end 0" in out and "end 1" in out, out
    # Still suspended, with its one JobSet.
    assert kubectl.get("trainjob", "held")["spec"]["suspend"] is True
    assert (
        cluster.get("jobset.x-k8s.io/v1alpha2", "JobSet", "held")["metadata"]["uid"]
        == upgraded["before"]["JobSet/held"]
    )


def test_helm_rollback_to_upstreams_release_recreates_nothing(
    plane: ControlPlane, upgraded: dict[str, Any]
) -> None:
    cluster: RealCluster = upgraded["cluster"]
    kubectl: Kubectl = upgraded["kubectl"]
    kubectl.apply(trainjob("ours", "60"))
    kubectl.wait_for("ours's two pods to run", lambda: running(kubectl, "ours") == 2, timeout=240)
    before = world(cluster)
    mark = cluster.audit_mark()
    helm(plane, "rollback", RELEASE, "1", "--namespace", NAMESPACE, "--wait", "--timeout", "5m")
    assert manager_images(plane) == {addons.UPSTREAM_IMAGE}
    after = world(cluster)
    assert {k: v for k, v in after.items() if not k.startswith("TrainJob/")} == {
        k: v for k, v in before.items() if not k.startswith("TrainJob/")
    }
    kubectl.wait_for(
        "ours to complete under upstream's", lambda: state(kubectl, "ours") == "Complete", timeout=240
    )
    assert recreated(cluster, mark) == []
    # Our chart's runtimes are hooks, not objects of the release: the rollback leaves them.
    names = plane.run_kubectl("get", "clustertrainingruntimes", "-o", "name").stdout.split()
    assert "clustertrainingruntime.trainer.kubeflow.org/torch-distributed" in names, names
