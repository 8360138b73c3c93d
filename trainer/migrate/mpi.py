"""MPIJob, the MPI Operator's (kubeflow.org/v2beta1) and the Training Operator's (kubeflow.org/v1):
a TrainingRuntime of the job's own with the v2 MPI policy, its Launcher and Workers.

The Launcher becomes the ``launcher`` Job and the Workers the ``node`` Job; each role's first
container (v1: the Workers' ``mainContainer``) is the one v2's MPI plugin mounts the SSH key and
hostfile into, so it takes the name ``node``. ``slotsPerWorker`` becomes numProcPerNode (the
hostfile's slots), ``runLauncherAsWorker`` runLauncherAsNode. v2beta1 already reached the Workers
over SSH, as v2 does; v1 used ``kubectl exec`` instead, so a v1 MPIJob's Workers must run an SSH
server after migration (docs/migration.md §mpijob).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.migrate.common import Notes, Options, Result, finish, read_job
from trainer.migrate.errors import Refusal
from trainer.migrate.policy import restart_policy, run_policy
from trainer.migrate.single import pod_of, replicas
from trainer.migrate.templates import (
    own_runtime_ref,
    pod_template,
    replicated_job,
    training_runtime,
    user_env,
    with_v1_env,
)

BASE = "spec.mpiReplicaSpecs"
IMPLEMENTATIONS = ("OpenMPI", "Intel", "MPICH")
SSHD = ["/usr/sbin/sshd", "-De"]  # what v2beta1 ran on a Worker that has no command
DEFAULT_SSH_PATH = "/root/.ssh"
# What v2's MPI plugin sets on the launcher for each implementation (plugins/mpi.py).
PLUGIN_ENV = {
    "OpenMPI": (
        "OMPI_MCA_orte_default_hostfile",
        "OMPI_MCA_orte_keep_fqdn_hostnames",
        "OMPI_MCA_orte_set_default_slots",
        "OMPI_MCA_plm_rsh_args",
    ),
    "Intel": ("I_MPI_HYDRA_HOST_FILE", "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS"),
    "MPICH": ("HYDRA_HOST_FILE", "HYDRA_LAUNCH_EXTRA_ARGS"),
}


@dataclass(frozen=True)
class Version:
    """What differs between the two APIs."""

    name: str
    launcher_restart: str  # the default restartPolicy of each role
    worker_restart: str
    ssh: bool  # v1 reached the Workers by kubectl exec, v2beta1 by SSH as v2 does


V1 = Version("v1", "Never", "Never", ssh=False)
V2BETA1 = Version("v2beta1", "OnFailure", "Never", ssh=True)


def convert_v2beta1(job: Obj, options: Options) -> Result:
    return _convert(job, options, V2BETA1)


def convert_v1(job: Obj, options: Options) -> Result:
    return _convert(job, options, V1)


def _convert(job: Obj, options: Options, version: Version) -> Result:
    source = read_job(job, options)
    notes, metadata, name, spec = source.notes, source.metadata, source.name, source.spec
    specs = spec.get("mpiReplicaSpecs")
    if not isinstance(specs, dict) or not specs:
        raise Refusal(BASE, "no replica specs")
    for rtype, rspec in specs.items():
        if rtype not in ("Launcher", "Worker"):
            raise Refusal(f"{BASE}.{rtype}", "only Launcher and Worker replicas exist for an MPIJob")
        if not isinstance(rspec, dict):
            raise Refusal(f"{BASE}.{rtype}", "not an object")
    launcher_spec = specs.get("Launcher")
    if launcher_spec is None:
        raise Refusal(f"{BASE}.Launcher", "missing: an MPIJob runs mpirun from its Launcher")
    if replicas(launcher_spec, f"{BASE}.Launcher") != 1:
        raise Refusal(f"{BASE}.Launcher.replicas", "an MPIJob has exactly one Launcher")
    worker_spec = specs.get("Worker")
    workers = replicas(worker_spec, f"{BASE}.Worker") if worker_spec is not None else 0
    if workers < 1 or worker_spec is None:
        raise Refusal(f"{BASE}.Worker.replicas", "no Workers: v2's MPI runtime runs at least one node")

    slots = spec.get("slotsPerWorker", 1)
    if slots is None:
        slots = 1
    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
        raise Refusal("spec.slotsPerWorker", f"{slots!r} is not a number of slots")
    implementation = spec.get("mpiImplementation") or "OpenMPI"
    if implementation not in IMPLEMENTATIONS:
        raise Refusal(
            "spec.mpiImplementation", f"{implementation!r} is not one of {', '.join(IMPLEMENTATIONS)}"
        )
    launcher_template = pod_of(launcher_spec, f"{BASE}.Launcher")
    worker_template = pod_of(worker_spec, f"{BASE}.Worker")
    launcher_main = _first_container(launcher_template, f"{BASE}.Launcher.template")
    worker_main = _worker_container(worker_template, spec.get("mainContainer"), notes)
    if version.ssh:
        as_node = bool(spec.get("runLauncherAsWorker"))
        ssh_path = spec.get("sshAuthMountPath") or DEFAULT_SSH_PATH
        if not isinstance(ssh_path, str) or not ssh_path.startswith("/"):
            raise Refusal("spec.sshAuthMountPath", f"{ssh_path!r} is not an absolute path")
    else:
        # v1 put the Launcher in the hostfile when it had a GPU; there was no mount path to set.
        as_node = _v1_gpu_launcher(launcher_template)
        ssh_path = DEFAULT_SSH_PATH
    pods = 1 + workers
    lifecycle = run_policy(spec, [launcher_template, worker_template], pods, notes)
    launcher_env, worker_env = _env(
        version, implementation, slots, as_node, launcher_main, worker_main, notes
    )

    launcher_restart = restart_policy(
        launcher_spec.get("restartPolicy"), version.launcher_restart, f"{BASE}.Launcher.restartPolicy", notes
    )
    worker_restart = restart_policy(
        worker_spec.get("restartPolicy"), version.worker_restart, f"{BASE}.Worker.restartPolicy", notes
    )
    launcher_pod = pod_template(
        _with_main_first(launcher_template, launcher_main),
        launcher_main.get("name"),
        launcher_env,
        launcher_restart.pod,
        lifecycle.priority_class,
        base=f"{BASE}.Launcher.template",
    )
    worker_pod = pod_template(
        _with_main_first(worker_template, worker_main),
        worker_main.get("name"),
        worker_env,
        worker_restart.pod,
        lifecycle.priority_class,
        base=f"{BASE}.Worker.template",
    )
    worker_node = worker_pod["spec"]["containers"][0]
    if not worker_node.get("command") and not worker_node.get("args"):
        worker_node["command"] = list(SSHD)
        if not version.ssh:
            notes.warn(
                f"{BASE}.Worker.template.spec.containers[{worker_main.get('name')}].command",
                f"v1 ran 'sleep 365d' and reached the Worker by kubectl exec; v2 reaches it over SSH, so "
                f"the Worker runs {' '.join(SSHD)} (its image must have an SSH server)",
            )
    elif not version.ssh:
        notes.warn(
            f"{BASE}.Worker.template.spec.containers[{worker_main.get('name')}].command",
            "v1 reached the Worker by kubectl exec; v2 reaches it over SSH, so this command must run "
            "an SSH server",
        )
    for pod in (launcher_pod, worker_pod):
        if pod["spec"].get("hostNetwork") and not pod["spec"].get("dnsPolicy"):
            pod["spec"]["dnsPolicy"] = "ClusterFirstWithHostNet"  # as the MPI Operator set it
    launcher = replicated_job(
        c.LAUNCHER,
        launcher_pod,
        backoff_limit=lifecycle.backoff_limit,
        pod_failure_policy=launcher_restart.pod_failure_policy,
        trainer=True,
        depends_on=(
            [{"name": c.NODE, "status": "Ready"}]
            if spec.get("launcherCreationPolicy") == "WaitForWorkersReady"
            else None
        ),
    )
    node = replicated_job(c.NODE, worker_pod, pod_failure_policy=worker_restart.pod_failure_policy)
    if launcher.get("dependsOn"):
        rjobs = [node, launcher]  # a replicated job depends only on the ones before it
        if as_node:
            notes.warn(
                "spec.launcherCreationPolicy",
                "with runLauncherAsWorker, the Launcher's hostfile line comes after the Workers' "
                "(v2beta1 put it first), so the Launcher's ranks are the last ones",
            )
    else:
        rjobs = [launcher, node]
    num_nodes = workers + 1 if as_node else workers
    runtime = training_runtime(
        {**metadata, "name": name},
        "mpi",
        {
            # The launcher carries the trainer ancestor label, and a runtime's numNodes is that
            # job's pod count (as in the bundled MPI runtimes); the TrainJob's numNodes sizes the
            # node Job.
            "numNodes": 1,
            "mpi": {
                "numProcPerNode": slots,
                "mpiImplementation": implementation,
                "sshAuthMountPath": ssh_path,
                "runLauncherAsNode": as_node,
            },
        },
        rjobs,
        pod_group_policy=lifecycle.pod_group_policy,
        queue=lifecycle.queue,
        jobset_spec={
            "network": {"publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [c.LAUNCHER]},
        },
    )
    trainer = {"numNodes": num_nodes, "numProcPerNode": slots}
    out_spec: Obj = {"runtimeRef": own_runtime_ref(name), "trainer": trainer}
    out_spec.update(lifecycle.trainjob)
    return finish(job, metadata, name, out_spec, [runtime], notes)


def _v1_gpu_launcher(template: Obj) -> bool:
    """v1's test for a Launcher that runs ranks: any of its containers (not only the first) has a
    resource limit whose name contains ``gpu``, whatever the count, even 0. The same test decided
    both whether the Launcher had a hostfile line and whether NVIDIA_* were blanked on it, so
    migrate applies it as v1 did rather than v2's GPU count."""
    for container in template["spec"].get("containers") or []:
        resources = container.get("resources") if isinstance(container, dict) else None
        limits = resources.get("limits") if isinstance(resources, dict) else None
        if isinstance(limits, dict) and any("gpu" in str(name) for name in limits):
            return True
    return False


def _first_container(template: Obj, base: str) -> Obj:
    containers = [x for x in template["spec"].get("containers") or [] if isinstance(x, dict)]
    if not containers:
        raise Refusal(f"{base}.spec.containers", "no container")
    return containers[0]


def _worker_container(template: Obj, main: object, notes: Notes) -> Obj:
    base = f"{BASE}.Worker.template"
    if main:
        for container in template["spec"].get("containers") or []:
            if isinstance(container, dict) and container.get("name") == main:
                return container
        raise Refusal("spec.mainContainer", f"no Worker container is named {main!r}")
    return _first_container(template, base)


def _with_main_first(template: Obj, main: Obj) -> Obj:
    """The template with ``main`` as its first container (the one the v2 plugin serves)."""
    out = copy.deepcopy(template)
    containers = out["spec"]["containers"]
    index = next(i for i, x in enumerate(template["spec"]["containers"]) if x is main)
    containers.insert(0, containers.pop(index))
    return out


def _env(
    version: Version,
    implementation: str,
    slots: int,
    as_node: bool,
    launcher: Obj,
    worker: Obj,
    notes: Notes,
) -> tuple[list[Obj], list[Obj]]:
    """Each role's env: the user's, then what the v1 operator set that v2's plugin does not."""
    lpath = f"{BASE}.Launcher.template.spec.containers[{launcher.get('name')}]"
    wpath = f"{BASE}.Worker.template.spec.containers[{worker.get('name')}]"
    launcher_added: list[Obj] = []
    worker_added: list[Obj] = []
    if version.ssh:
        launcher_added.append({"name": "K_MPI_JOB_ROLE", "value": "launcher"})
        worker_added.append({"name": "K_MPI_JOB_ROLE", "value": "worker"})
        if implementation == "Intel":
            launcher_added.append({"name": "I_MPI_PERHOST", "value": str(slots)})
    else:
        notes.warn(
            "spec",
            "v1's launcher reached the Workers by kubectl exec (OMPI_MCA_plm_rsh_agent and, for Intel MPI, "
            "I_MPI_HYDRA_BOOTSTRAP=rsh with I_MPI_HYDRA_BOOTSTRAP_EXEC, both /etc/mpi/kubexec.sh; a "
            "kubectl-delivery init container and a <job>-launcher ServiceAccount); v2 uses SSH with a key "
            f"mounted at {DEFAULT_SSH_PATH}, so none of these is carried",
        )
    if not as_node:  # the launcher runs no ranks, so it is given no GPU
        launcher_added += [
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": ""},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": ""},
        ]
    reserved = PLUGIN_ENV.get(implementation, ())
    launcher_env = with_v1_env(user_env(launcher, reserved, lpath, notes), launcher_added)
    worker_env = with_v1_env(user_env(worker, (), wpath, notes), worker_added)
    return launcher_env, worker_env
