"""The objects ``up`` puts in the fresh cluster: CRDs, runtimes, fake nodes, bindings, webhooks.

JobSet's CRD and webhook manifests are read from the pinned module in the Go module cache at run
time, so they always match the ``jobset`` binary built from the same module; nothing of JobSet is
copied into this repository.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from trainer.api.objects import Obj
from trainer_sandbox.cluster.kube import Kube, KubeError
from trainer_sandbox.cluster.pki import JOBSET_USER, KWOK_USER
from trainer_sandbox.cluster.stages import NODE_ANNOTATION, NODE_ANNOTATION_VALUE

_SANDBOX = Path(__file__).resolve().parent.parent
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

NODE_COUNT = 4
NODE_CAPACITY = {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "8", "pods": "110"}
JOBSET_MODULE = "sigs.k8s.io/jobset"
KWOK_MODULE = "sigs.k8s.io/kwok"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def documents(path: Path) -> list[Obj]:
    if path.suffix == ".json":
        return [json.loads(path.read_text())]
    return [d for d in yaml.load_all(path.read_text(), Loader=_Loader) if isinstance(d, dict)]


def jobset_module_dir(go_module: Path) -> Path:
    """Where the Go module cache holds the JobSet module ``go_module`` (``cluster/``) pins."""
    return module_dir(go_module, JOBSET_MODULE)


def module_dir(go_module: Path, module: str) -> Path:
    """Where the Go module cache holds ``module`` at the version ``go_module`` (``cluster/``) pins:
    manifests are read from there, so they always match the binary built from the same module."""
    env = {**os.environ, "GOFLAGS": "-mod=readonly", "GOPROXY": "off"}
    try:
        out = subprocess.run(
            ["go", "list", "-m", "-f", "{{.Dir}}", module],
            cwd=go_module,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    except FileNotFoundError:
        raise RuntimeError(
            f"`go` is not on PATH: it locates {module}'s manifests in the module cache"
        ) from None
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"`go list -m {module}` in {go_module} failed: {e.stderr.strip()}") from None
    # A module go.mod lists but the cache has not extracted prints an empty directory, exit 0.
    found = out.stdout.strip()
    if not found or not Path(found).is_dir():
        raise RuntimeError(
            f"{module} is not in the module cache ({found or 'not downloaded'}); run cluster/build"
        )
    return Path(found)


def cluster_admin_bindings() -> list[Obj]:
    """kwok and the JobSet controller get cluster-admin by binding (they are not system:masters),
    so their requests go through RBAC like everyone else's."""
    subjects = {
        "kwok": {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": KWOK_USER},
        "jobset": {
            "kind": "ServiceAccount",
            "namespace": JOBSET_USER.split(":")[2],
            "name": JOBSET_USER.split(":")[3],
        },
    }
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"trainer-cluster:{who}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [subject],
        }
        for who, subject in subjects.items()
    ]


def nodes(count: int = NODE_COUNT) -> list[Obj]:
    """Fake nodes kwok manages (selected by its annotation), with room for GPU jobs."""
    out = []
    for i in range(count):
        name = f"kwok-node-{i}"
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {
                        NODE_ANNOTATION: NODE_ANNOTATION_VALUE,
                        "node.alpha.kubernetes.io/ttl": "0",
                    },
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                    },
                },
                "spec": {},
                "status": {"capacity": dict(NODE_CAPACITY), "allocatable": dict(NODE_CAPACITY)},
            }
        )
    return out


VOLUME_COUNT = 64
VOLUME_SIZE = "1Ti"


def volumes(count: int = VOLUME_COUNT) -> list[Obj]:
    """A pool of PersistentVolumes for the PVCs JobSet makes from a runtime's volumeClaimPolicies.

    No storage provisioner runs (nothing would provision a disk for a fake node), so claims are
    bound statically, one volume each, by the controller manager's binder. Volumes are never
    reclaimed: the pool is sized for a session of tests, not for a long-lived cluster.
    """
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"pool-{i:03d}", "labels": {"type": "kwok"}},
            "spec": {
                "capacity": {"storage": VOLUME_SIZE},
                "accessModes": ["ReadWriteOnce", "ReadWriteMany", "ReadOnlyMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": f"/tmp/kwok-volumes/pool-{i:03d}"},
            },
        }
        for i in range(count)
    ]


def kwok_logs_crds(module: Path) -> list[Obj]:
    """kwok's ``Logs`` CRD, from the kwok module the binary is built from: kwok, started with
    ``--enable-crds=Logs``, serves each pod's log from the file its ``Logs`` object names
    (``podlogs.py`` writes both)."""
    path = module / "kustomize" / "crd" / "bases" / "kwok.x-k8s.io_logs.yaml"
    return [d for d in documents(path) if d.get("kind") == "CustomResourceDefinition"]


def jobset_crds(module: Path) -> list[Obj]:
    return crds_in(module / "config" / "components" / "crd" / "bases")


def crds_in(directory: Path) -> list[Obj]:
    """The CRDs of a directory of manifests (a module's), in file order."""
    return [
        d
        for p in sorted(directory.glob("*.yaml"))
        for d in documents(p)
        if d.get("kind") == "CustomResourceDefinition"
    ]


def trainer_and_podgroup_crds() -> list[Obj]:
    """The trainer CRDs (packaged as ``trainer.crds``), and the scheduler-plugins and Volcano
    PodGroup CRDs the stand-in serves."""
    from trainer_sandbox.sandbox import trainer_crd_files

    paths = [*trainer_crd_files(), *sorted((_SANDBOX / "crds").glob("scheduling.*_podgroups.json"))]
    return [d for p in paths for d in documents(p) if d.get("kind") == "CustomResourceDefinition"]


def runtimes() -> list[Obj]:
    from trainer_sandbox.sandbox import runtime_files

    return [
        d
        for p in runtime_files()
        for d in documents(p)
        if d.get("kind") in ("ClusterTrainingRuntime", "TrainingRuntime")
    ]


def public_configmap() -> list[Obj]:
    """The namespace and ConfigMap ``trainer sandbox`` installs for the Kubeflow SDK."""
    from trainer_sandbox.sandbox import PUBLIC_CONFIGMAP, SYSTEM_NAMESPACE, TRAINER_VERSION

    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": PUBLIC_CONFIGMAP, "namespace": SYSTEM_NAMESPACE},
            "data": {
                "kubeflow_trainer_version": TRAINER_VERSION,
                "kubeflow_trainer_api_version": TRAINER_VERSION,
            },
        },
    ]


def jobset_webhooks(module: Path, port: int, ca_pem: bytes) -> list[Obj]:
    """JobSet's webhook configurations as its kustomization deploys them (the manifests with its
    patches: the pod webhooks only see pods with a JobSet label), pointed at our out-of-cluster
    webhook server by URL."""
    webhook_dir = module / "config" / "components" / "webhook"
    configs = documents(webhook_dir / "manifests.yaml")
    patches = {
        "MutatingWebhookConfiguration": webhook_dir / "patches" / "mutating-patch.yaml",
        "ValidatingWebhookConfiguration": webhook_dir / "patches" / "validating-patch.yaml",
    }
    for config in configs:
        patch = patches.get(config["kind"])
        if patch is not None and patch.exists():
            for op in yaml.load(patch.read_text(), Loader=_Loader) or []:
                m = re.fullmatch(r"/webhooks/(\d+)", str(op.get("path", "")))
                if op.get("op") == "replace" and m:
                    config["webhooks"][int(m.group(1))] = op["value"]
    return webhooks_by_url(configs, "jobset-", port, ca_pem)


def webhooks_by_url(configs: Iterable[Obj], prefix: str, port: int, ca_pem: bytes) -> list[Obj]:
    """Webhook configurations as a project's manifests write them (``clientConfig.service``), for
    its controller run out of cluster: each hook called by URL on loopback ``port``, its server's
    certificate checked against ``ca_pem``, the configuration named with ``prefix``."""
    bundle = base64.b64encode(ca_pem).decode()
    out = []
    for config in configs:
        config = {**config, "metadata": {"name": prefix + config["metadata"]["name"]}}
        hooks = []
        for hook in config["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hooks.append(
                {**hook, "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}}
            )
        out.append({**config, "webhooks": hooks})
    return out


def create_all(kube: Kube, objs: Iterable[Obj]) -> None:
    for obj in objs:
        kube.create(obj, exist_ok=True)


def wait_established(kube: Kube, names: Iterable[str], deadline: float) -> None:
    """Until every CRD in ``names`` is Established (its resources are then served)."""
    pending = set(names)
    while pending:
        for name in sorted(pending):
            crd = kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conditions = (crd.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                pending.discard(name)
        if pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRDs not established: {', '.join(sorted(pending))}")
            time.sleep(0.1)


def create_when_served(kube: Kube, objs: Iterable[Obj], deadline: float) -> None:
    """Create objects of kinds whose CRD was just established: the API server may answer 404 for a
    moment until its discovery catches up."""
    for obj in objs:
        while True:
            try:
                kube.create(obj, exist_ok=True)
                break
            except KubeError as e:
                if e.status != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def nodes_ready(kube: Kube, count: int = NODE_COUNT) -> bool:
    """Whether ``count`` nodes are Ready and schedulable.

    The API server taints every new Node ``node.kubernetes.io/not-ready:NoSchedule``; the
    node-lifecycle controller that would lift it once the node reports Ready is not running (it
    would need kwok to renew node leases, steady traffic in the audit log for nothing), so the
    taint is lifted here, once, after kwok has made the node Ready.
    """
    items = kube.get("/api/v1/nodes").get("items") or []
    return sum(schedulable(kube, node) for node in items) >= count


def schedulable(kube: Kube, node: Obj) -> bool:
    """Whether ``node`` is Ready; if it is, its registration taint is lifted (once) here."""
    conditions = (node.get("status") or {}).get("conditions") or []
    if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
        return False
    taints = (node.get("spec") or {}).get("taints") or []
    kept = [t for t in taints if t.get("key") != NOT_READY_TAINT]
    if kept != taints:
        kube.merge_patch(f"/api/v1/nodes/{node['metadata']['name']}", {"spec": {"taints": kept or None}})
    return True


_PROBE_JOBSET: Obj = {
    "apiVersion": "jobset.x-k8s.io/v1alpha2",
    "kind": "JobSet",
    "metadata": {"name": "trainer-cluster-webhook-probe", "namespace": "default"},
    "spec": {
        "replicatedJobs": [
            {
                "name": "probe",
                "template": {
                    "spec": {"template": {"spec": {"containers": [{"name": "probe", "image": "probe"}]}}}
                },
            }
        ]
    },
}


def jobset_webhooks_active(kube: Kube) -> bool:
    """Whether the API server calls JobSet's webhooks yet: a dry-run JobSet comes back defaulted by
    the mutating one, and one naming an unknown success target is refused by the validating one.

    Registering a webhook configuration takes effect a moment later (the API server's informer);
    a JobSet created in between would skip JobSet's defaulting.
    """
    defaulted = kube.create(_PROBE_JOBSET, dry_run=True)
    rjob = defaulted["spec"]["replicatedJobs"][0]
    if rjob["template"]["spec"]["template"]["spec"].get("restartPolicy") != "OnFailure":
        return False
    invalid = json.loads(json.dumps(_PROBE_JOBSET))
    invalid["spec"]["successPolicy"] = {"operator": "All", "targetReplicatedJobs": ["not-a-replicated-job"]}
    try:
        kube.create(invalid, dry_run=True)
    except KubeError as e:
        return "vjobset.kb.io" in e.message
    return False
