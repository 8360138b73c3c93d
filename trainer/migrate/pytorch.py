"""PyTorchJob (kubeflow.org/v1) to a TrainJob on the bundled ``torch-distributed`` runtime.

The v1 Master and Workers become the runtime's one ``node`` Job of ``numNodes`` pods: the Master
is completion index 0, Worker ``i`` index ``i + 1``, which is v1's RANK. What v1's controller set
in the environment and the v2 torch plugin does not is added to ``spec.trainer.env`` with v1's
meaning (docs/migration.md has the table).
"""

from __future__ import annotations

import copy
from typing import Any

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.migrate.common import (
    PATCH_MANAGER,
    TRAINJOB_API,
    Notes,
    Options,
    Refusal,
    Result,
    carried_metadata,
    check_name,
    is_running,
)

RUNTIME = "torch-distributed"
CONTAINER = "pytorch"  # v1's training container name
PORT_NAME = "pytorchjob-port"  # v1's master port, by name
DEFAULT_PORT = 23456
SPECS = "spec.pytorchReplicaSpecs"
# What the v2 torch plugin sets in the node container (plugins/torch.py); reserved in a TrainJob.
TORCH_PLUGIN_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")

# Container fields: into spec.trainer, into the runtime patch, or dropped without effect on the pod.
TRAINER_FIELDS = ("name", "image", "command", "args", "env", "resources", "ports")
CONTAINER_PATCH_FIELDS = ("volumeMounts", "securityContext")
# Pod fields a runtime patch carries.
POD_PATCH_FIELDS = (
    "affinity",
    "imagePullSecrets",
    "nodeSelector",
    "schedulingGates",
    "securityContext",
    "serviceAccountName",
    "terminationGracePeriodSeconds",
    "tolerations",
    "volumes",
)


def convert(job: Obj, options: Options) -> Result:
    notes = Notes(options)
    metadata = job.get("metadata") or {}
    name = check_name(metadata)
    spec = job.get("spec") or {}
    if not isinstance(spec, dict):
        raise Refusal("spec", "not an object")

    if spec.get("elasticPolicy") is not None:
        notes.loss(
            "spec.elasticPolicy",
            "elastic training is removed in Trainer v2; the job would run with a fixed number of nodes",
        )
    replica_specs = spec.get("pytorchReplicaSpecs")
    if not isinstance(replica_specs, dict) or not replica_specs:
        raise Refusal(SPECS, "no replica specs")
    for rtype in replica_specs:
        if rtype not in ("Master", "Worker"):
            raise Refusal(f"{SPECS}.{rtype}", "only Master and Worker replicas exist for a PyTorchJob")
    master = replica_specs.get("Master")
    worker = replica_specs.get("Worker")
    master_count = _replicas(master, "Master")
    worker_count = _replicas(worker, "Worker")
    if master is not None and master_count > 1:
        raise Refusal(f"{SPECS}.Master.replicas", f"{master_count}: a PyTorchJob has at most one Master")
    nodes = master_count + worker_count
    if nodes < 1:
        raise Refusal(SPECS, "no replicas: the job runs no pod")

    template = _template(master if master is not None else worker, "Master" if master else "Worker")
    if master is not None and worker is not None and worker_count > 0:
        other = _template(worker, "Worker")
        if _comparable(other) != _comparable(template):
            notes.loss(
                f"{SPECS}.Worker.template",
                "differs from the Master's template; v2 runs every node from one template "
                "(the Master's is used)",
            )
    for rtype, rspec in (("Master", master), ("Worker", worker)):
        if isinstance(rspec, dict) and rspec.get("restartPolicy") is not None:
            notes.warn(
                f"{SPECS}.{rtype}.restartPolicy",
                f"{rspec['restartPolicy']!r} is not carried: the runtime's Job template decides restarts",
            )

    trainer, patch = _pod(template, "Master" if master else "Worker", notes)
    trainer["numNodes"] = nodes
    nproc = spec.get("nprocPerNode")
    nproc_int = 1
    if isinstance(nproc, int) or (isinstance(nproc, str) and nproc.isdigit()):
        nproc_int = int(nproc)
        trainer["numProcPerNode"] = nproc_int
    else:
        notes.warn(
            "spec.nprocPerNode",
            f"{nproc if nproc is not None else 'auto (the default)'!r} is not carried: v2 sets "
            "PET_NPROC_PER_NODE from the GPUs ('auto') or else the CPUs of resourcesPerNode",
        )
    trainer["env"] = _v1_env(trainer.get("env") or [], name, template, nodes, nproc_int, master is not None)

    out_spec: Obj = {"runtimeRef": {"name": RUNTIME}, "trainer": trainer}
    if patch:
        out_spec["runtimePatches"] = [
            {
                "manager": PATCH_MANAGER,
                "trainingRuntimeSpec": {
                    "template": {
                        "spec": {
                            "replicatedJobs": [{"name": c.NODE, "template": {"spec": {"template": patch}}}]
                        }
                    }
                },
            }
        ]
    _run_policy(spec.get("runPolicy"), out_spec, notes)
    if is_running(job.get("status")):
        if options.suspend_running:
            out_spec["suspend"] = True
            notes.warn(
                "status.conditions",
                "the v1 job is still running: the TrainJob is suspended so applying it does not start "
                "a second run (set spec.suspend to false to start it; --no-suspend-running to not suspend)",
            )
        else:
            notes.warn(
                "status.conditions", "the v1 job is still running; applying the TrainJob starts a second run"
            )
    trainjob: Obj = {
        "apiVersion": TRAINJOB_API,
        "kind": "TrainJob",
        "metadata": carried_metadata(metadata, name),
        "spec": out_spec,
    }
    return Result(objects=[trainjob], warnings=notes.warnings)


def _replicas(rspec: Any, rtype: str) -> int:
    if rspec is None:
        return 0
    if not isinstance(rspec, dict):
        raise Refusal(f"{SPECS}.{rtype}", "not an object")
    value = rspec.get("replicas", 1)  # v1 defaults replicas to 1
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise Refusal(f"{SPECS}.{rtype}.replicas", f"{value!r} is not a replica count")
    return value


def _template(rspec: Any, rtype: str) -> Obj:
    template = rspec.get("template") if isinstance(rspec, dict) else None
    if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
        raise Refusal(f"{SPECS}.{rtype}.template", "no pod template")
    return template


def _comparable(template: Obj) -> Obj:
    return {k: v for k, v in template.items() if k != "metadata" or v}


def _pod(template: Obj, rtype: str, notes: Notes) -> tuple[Obj, Obj]:
    """The TrainJob's trainer fields and the runtime patch's pod template for the v1 template."""
    base = f"{SPECS}.{rtype}.template"
    pod = template["spec"]
    containers = [x for x in pod.get("containers") or [] if isinstance(x, dict)]
    main = next((x for x in containers if x.get("name") == CONTAINER), None)
    if main is None:
        raise Refusal(
            f"{base}.spec.containers", f"no container named {CONTAINER!r} (v1's training container)"
        )
    for other in containers:
        if other is not main:
            notes.loss(
                f"{base}.spec.containers[{other.get('name')}]",
                "a second container: v2's torch runtime runs one container per node",
            )
    trainer: Obj = {}
    for key in ("image", "command", "args"):
        if main.get(key):
            trainer[key] = copy.deepcopy(main[key])
    env = []
    for var in main.get("env") or []:
        if isinstance(var, dict) and var.get("name") in TORCH_PLUGIN_ENV:
            notes.warn(
                f"{base}.spec.containers[{CONTAINER}].env[{var['name']}]",
                "is not carried: v2's torch plugin sets it (a TrainJob may not)",
            )
        else:
            env.append(copy.deepcopy(var))
    if env:
        trainer["env"] = env
    if main.get("resources"):
        trainer["resourcesPerNode"] = copy.deepcopy(main["resources"])
    for port in main.get("ports") or []:
        if isinstance(port, dict) and port.get("name") != PORT_NAME:
            notes.warn(
                f"{base}.spec.containers[{CONTAINER}].ports",
                f"port {port.get('containerPort')} is not declared in v2 (pods reach it all the same)",
            )
    container_patch: Obj = {}
    for key in CONTAINER_PATCH_FIELDS:
        if main.get(key):
            container_patch[key] = copy.deepcopy(main[key])
    if main.get("imagePullPolicy"):
        notes.warn(
            f"{base}.spec.containers[{CONTAINER}].imagePullPolicy",
            f"{main['imagePullPolicy']!r} is not carried: the image is pulled by Kubernetes' default policy",
        )
    for key in main:
        if key not in TRAINER_FIELDS and key not in CONTAINER_PATCH_FIELDS and key != "imagePullPolicy":
            notes.loss(
                f"{base}.spec.containers[{CONTAINER}].{key}", "v2 cannot set it on the trainer container"
            )

    spec_patch: Obj = {}
    for key, value in pod.items():
        if key == "containers":
            continue
        if key in POD_PATCH_FIELDS:
            if value not in (None, [], {}, ""):
                spec_patch[key] = copy.deepcopy(value)
        elif key == "restartPolicy":
            notes.warn(
                f"{base}.spec.restartPolicy",
                f"{value!r} is not carried: the runtime's Job template decides restarts",
            )
        else:
            notes.loss(
                f"{base}.spec.{key}", "a runtime patch cannot set it (a TrainingRuntime could: not yet)"
            )
    if container_patch:
        spec_patch["containers"] = [{"name": c.NODE, **container_patch}]
    patch: Obj = {}
    meta = {
        k: copy.deepcopy(v)
        for k, v in (template.get("metadata") or {}).items()
        if k in ("labels", "annotations") and v
    }
    if meta:
        patch["metadata"] = meta
    if spec_patch:
        patch["spec"] = spec_patch
    return trainer, patch


def _v1_env(env: list[Obj], name: str, template: Obj, nodes: int, nproc: int, has_master: bool) -> list[Obj]:
    """The user's env, then what v1's controller set that the v2 torch plugin does not.

    The plugin sets PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR and
    PET_MASTER_PORT itself (with v1's meaning); v1 set the rest only when the job had a Master.
    """
    added: list[Obj] = [{"name": "PYTHONUNBUFFERED", "value": "0"}]
    if has_master:
        added += [
            {"name": "MASTER_ADDR", "value": f"{name}-{c.NODE}-0-0.{name}"},
            {"name": "MASTER_PORT", "value": str(_master_port(template))},
            {"name": "WORLD_SIZE", "value": str(nodes * nproc)},
            {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": c.JOB_COMPLETION_INDEX_FIELD}}},
        ]
    # v1 appended its env after the user's: the container saw v1's value for a duplicated name.
    ours = {a["name"] for a in added}
    return [*[e for e in env if e.get("name") not in ours], *added]


def _master_port(template: Obj) -> int:
    for container in template["spec"].get("containers") or []:
        if isinstance(container, dict) and container.get("name") == CONTAINER:
            for port in container.get("ports") or []:
                if isinstance(port, dict) and port.get("name") == PORT_NAME and port.get("containerPort"):
                    return int(port["containerPort"])
    return DEFAULT_PORT


def _run_policy(policy: Any, out: Obj, notes: Notes) -> None:
    if not isinstance(policy, dict):
        return
    base = "spec.runPolicy"
    for key in ("activeDeadlineSeconds", "ttlSecondsAfterFinished"):
        if policy.get(key) is not None:
            out[key] = policy[key]
    if policy.get("suspend"):
        out["suspend"] = True
    clean = policy.get("cleanPodPolicy")
    if clean not in (None, "None"):
        notes.warn(
            f"{base}.cleanPodPolicy",
            f"{clean!r} is not carried: v2 keeps a finished job's pods until the TrainJob is deleted "
            "(ttlSecondsAfterFinished deletes it)",
        )
    if policy.get("backoffLimit") is not None:
        notes.warn(
            f"{base}.backoffLimit",
            f"{policy['backoffLimit']} is not carried: the runtime's JobSet failurePolicy decides restarts",
        )
    if policy.get("schedulingPolicy"):
        notes.warn(
            f"{base}.schedulingPolicy",
            "is not carried: gang scheduling needs a TrainingRuntime with podGroupPolicy (not yet generated)",
        )
    managed = policy.get("managedBy")
    if managed not in (None, "kubeflow.org/training-operator"):
        notes.warn(f"{base}.managedBy", f"{managed!r} is not carried: the TrainJob is managed by the trainer")
