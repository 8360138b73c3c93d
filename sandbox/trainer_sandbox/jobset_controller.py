"""A simulated JobSet controller (with the Job controller and kubelet it relies on) for the local server.

It does what an operator observes of real JobSet on a cluster: JobSet's defaults and update rules,
Indexed Jobs and Pods with the labels JobSet and the Job controller set, pods moving through their
phases, logs, ``dependsOn``, ``successPolicy``, ``failurePolicy.maxRestarts``, ``suspend``, and the
conditions JobSet writes when it finishes. Nothing runs: a pod "runs" for ``SANDBOX_RUN_SECONDS``
and ends with ``SANDBOX_EXIT_CODE``, read from the env of the pod's container named ``node`` (else
its first container), so any client can steer it, e.g. through a TrainJob's ``spec.trainer.env``.
A client that writes a pod's phase (``kubectl patch pod --subresource=status``) takes the pod over:
the timer no longer touches it.

Three users write, each audited under its own name: the JobSet controller, the Job controller and the
kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainer.api.objects import Obj
from trainer.apimachinery.errors import FieldError, forbidden, invalid
from trainer_sandbox.apiserver.core import generate_suffix, now
from trainer_sandbox.apiserver.errors import APIError
from trainer_sandbox.apiserver.storage import Event, Key

if TYPE_CHECKING:
    from trainer_sandbox.apiserver.server import LocalAPIServer

log = logging.getLogger(__name__)

JOBSETS: Key = ("jobset.x-k8s.io", "jobsets")
JOBS: Key = ("batch", "jobs")
PODS: Key = ("", "pods")
SERVICES: Key = ("", "services")

JOBSET_USER = "system:serviceaccount:jobset-system:jobset-controller-manager"
JOB_USER = "system:serviceaccount:kube-system:job-controller"
KUBELET_USER = "system:node:sandbox-node"
NODE_NAME = "sandbox-node"
CONTROLLER_NAME = "jobset.sigs.k8s.io/jobset-controller"

# Labels and annotations real JobSet puts on its Jobs and their pods.
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
RJOB_NAME = "jobset.sigs.k8s.io/replicatedjob-name"
RJOB_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOB_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
JOB_KEY = "jobset.sigs.k8s.io/job-key"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"
GLOBAL_REPLICAS = "jobset.sigs.k8s.io/global-replicas"
GROUP_NAME = "jobset.sigs.k8s.io/group-name"
GROUP_REPLICAS = "jobset.sigs.k8s.io/group-replicas"
JOB_GROUP_INDEX = "jobset.sigs.k8s.io/job-group-index"
DEFAULT_GROUP = "default"  # the CRD's default for replicatedJobs[].groupName
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"

# JobSet's condition reasons and messages (sigs.k8s.io/jobset/pkg/constants).
FAILED_JOBS_REASON = "FailedJobs"
FAILED_JOBS_MESSAGE = "jobset failed due to one or more job failures"
REACHED_MAX_RESTARTS_REASON = "ReachedMaxRestarts"
REACHED_MAX_RESTARTS_MESSAGE = "jobset failed due to reaching max number of restarts"

RUN_SECONDS_ENV = "SANDBOX_RUN_SECONDS"
EXIT_CODE_ENV = "SANDBOX_EXIT_CODE"
DEFAULT_RUN_SECONDS = 2.0


# -- JobSet defaulting and validation webhooks -------------------------------------------------
def jobset_defaults(js: Obj) -> None:
    """The defaults of JobSet's mutating webhook (v0.12: registered for CREATE only, so an update
    that drops a defaulted field keeps it dropped, and the update rule then sees the change)."""
    spec = js.setdefault("spec", {})
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    for rjob in spec.get("replicatedJobs") or []:
        jspec = rjob.setdefault("template", {}).setdefault("spec", {})
        jspec.setdefault("completionMode", "Indexed")
        pspec = jspec.setdefault("template", {}).setdefault("spec", {})
        # A batch Job's pods must say how they restart (Job validation refuses none, and Always):
        # JobSet makes the choice for a template that does not.
        if not pspec.get("restartPolicy"):
            pspec["restartPolicy"] = "OnFailure"
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    # A rule's name is defaulted (the CRD requires it); its action is not (required, no default).
    for i, rule in enumerate((spec.get("failurePolicy") or {}).get("rules") or []):
        if not rule.get("name"):
            rule["name"] = f"failurePolicyRule{i}"
    # managedBy is not defaulted: a JobSet without one is the JobSet controller's.


def jobset_validate(js: Obj, old: Obj | None) -> list[FieldError]:
    """JobSet's validating webhook: its create rules, then its update rule."""
    if old is None:
        return _validate_create(js)
    return _validate_update(js, old)


def _validate_create(js: Obj) -> list[FieldError]:
    """The references between replicatedJobs that JobSet refuses to store: a dependency must name
    an earlier replicatedJob (the first can have none), a success target an existing one.

    The messages are JobSet's; each error names the field it is about.
    """
    spec = js.get("spec") or {}
    rjobs = spec.get("replicatedJobs") or []
    errors: list[FieldError] = []
    if rjobs and rjobs[0].get("dependsOn") is not None:
        errors.append(
            forbidden(
                "spec.replicatedJobs[0].dependsOn", "DependsOn can't be set for the first ReplicatedJob"
            )
        )
    seen: set[str] = set()
    for i, rjob in enumerate(rjobs):
        seen.add(rjob.get("name", ""))  # as JobSet does: the replicatedJob itself counts as seen
        if i == 0:
            continue
        for j, dep in enumerate(rjob.get("dependsOn") or []):
            if dep.get("name") not in seen:
                errors.append(
                    invalid(
                        f"spec.replicatedJobs[{i}].dependsOn[{j}].name",
                        dep.get("name"),
                        f"replicatedJob: {rjob.get('name')} cannot depend on replicatedJob: {dep.get('name')}",
                    )
                )
    names = {r.get("name") for r in rjobs}
    targets = (spec.get("successPolicy") or {}).get("targetReplicatedJobs") or []
    for k, target in enumerate(targets):
        if target not in names:
            errors.append(
                invalid(
                    f"spec.successPolicy.targetReplicatedJobs[{k}]",
                    target,
                    f"invalid replicatedJob name '{target}' does not appear in .spec.ReplicatedJobs",
                )
            )
    return errors


def _validate_update(js: Obj, old: Obj) -> list[FieldError]:
    """JobSet's update rule: replicatedJobs are immutable, except the pod-template fields Kueue needs
    while the JobSet is (or is being) suspended."""
    new_rjobs = (js.get("spec") or {}).get("replicatedJobs") or []
    old_rjobs = (old.get("spec") or {}).get("replicatedJobs") or []
    suspended = bool((old.get("spec") or {}).get("suspend")) or bool((js.get("spec") or {}).get("suspend"))
    munged = []
    for i, rjob in enumerate(new_rjobs):
        if suspended and i < len(old_rjobs):
            rjob = _with_mutable_fields_of(rjob, old_rjobs[i])
        munged.append(rjob)
    if munged != old_rjobs:
        return [invalid("spec.replicatedJobs", new_rjobs, "field is immutable")]
    return []


def _with_mutable_fields_of(rjob: Obj, old: Obj) -> Obj:
    import copy

    out = copy.deepcopy(rjob)
    tmpl = out.get("template", {}).get("spec", {}).get("template", {})
    otmpl = old.get("template", {}).get("spec", {}).get("template", {})
    ometa = otmpl.get("metadata")
    if "metadata" in tmpl or ometa is not None:
        meta = tmpl.setdefault("metadata", {})
        for key in ("annotations", "labels"):
            _copy_key(meta, ometa or {}, key)
        if not meta and ometa is None:
            tmpl.pop("metadata")
    pspec, opspec = tmpl.setdefault("spec", {}), otmpl.get("spec", {})
    for key in ("nodeSelector", "tolerations", "schedulingGates"):
        _copy_key(pspec, opspec, key)
    return out


def _copy_key(dst: Obj, src: Obj, key: str) -> None:
    if key in src:
        dst[key] = src[key]
    else:
        dst.pop(key, None)


def _condition(ctype: str, status: str, reason: str, message: str, old: list[Obj]) -> Obj:
    for c in old:
        if c.get("type") == ctype and c.get("status") == status:
            return {**c, "reason": reason, "message": message}
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now(),
    }


def _set_condition(conditions: list[Obj], cond: Obj) -> list[Obj]:
    out = [c for c in conditions if c.get("type") != cond["type"]]
    for i, c in enumerate(conditions):
        if c.get("type") == cond["type"]:
            out.insert(i, cond)
            return out
    out.append(cond)
    return out


def _true(obj: Obj, ctype: str) -> bool:
    return any(
        c.get("type") == ctype and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def _failure_verdict(spec: Obj, status: Obj, failed: list[Obj]) -> tuple[str, str] | None:
    """How JobSet answers failed Jobs: ``None`` to restart, else the Failed condition's reason and
    message.

    Without a failurePolicy the first failure fails the JobSet; with one (``maxRestarts`` 0 too)
    it restarts until ``restartsCountTowardsMax`` reaches ``maxRestarts`` (restarts that do not
    count, from RestartJobSetAndIgnoreMaxRestarts rules, are in ``restarts`` only). Both messages
    name the Job that failed first, as JobSet's do.
    """
    policy = spec.get("failurePolicy")
    first = _first_failed(failed)
    if policy is None:
        return FAILED_JOBS_REASON, f"{FAILED_JOBS_MESSAGE} (first failed job: {first})"
    if int(status.get("restartsCountTowardsMax") or 0) < int(policy.get("maxRestarts") or 0):
        return None
    return REACHED_MAX_RESTARTS_REASON, f"{REACHED_MAX_RESTARTS_MESSAGE} (first failed job: {first})"


def _first_failed(jobs: list[Obj]) -> str:
    """The name of the Job whose Failed condition is the oldest (by name among equal times)."""

    def failed_at(job: Obj) -> str:
        for c in (job.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Failed" and c.get("status") == "True":
                return str(c.get("lastTransitionTime") or "")
        return ""

    return str(min(jobs, key=lambda j: (failed_at(j), j["metadata"]["name"]))["metadata"]["name"])


def _control(container: Obj) -> tuple[float, int]:
    env = {e.get("name"): e.get("value") for e in container.get("env") or [] if isinstance(e, dict)}
    try:
        seconds = float(env.get(RUN_SECONDS_ENV) or DEFAULT_RUN_SECONDS)
    except ValueError:
        seconds = DEFAULT_RUN_SECONDS
    try:
        code = int(env.get(EXIT_CODE_ENV) or 0)
    except ValueError:
        code = 1
    return seconds, code


def _replicated_jobs(js: Obj) -> list[Obj]:
    return list((js.get("spec") or {}).get("replicatedJobs") or [])


def _group_marks(js: Obj, rjob: Obj, index: int) -> dict[str, str]:
    """The group labels of one Job: its replicatedJob's group, the replicas of all the group's
    replicatedJobs, and the Job's index among them (counted in spec order, as the global index is)."""
    group = rjob.get("groupName") or DEFAULT_GROUP
    members = [r for r in _replicated_jobs(js) if (r.get("groupName") or DEFAULT_GROUP) == group]
    before = 0
    for r in members:
        if r.get("name") == rjob.get("name"):
            break
        before += int(r.get("replicas", 1))
    return {
        GROUP_NAME: group,
        GROUP_REPLICAS: str(sum(int(r.get("replicas", 1)) for r in members)),
        JOB_GROUP_INDEX: str(before + index),
    }


def _add_claimed_volumes(js: Obj, pod_spec: Obj) -> None:
    """JobSet's volumeClaimPolicies (v0.12): every template a container of the pod mounts becomes
    a volume of the claim ``<template>-<jobset>``. (The stand-in serves no PersistentVolumeClaims,
    so it does not create the claim itself, as JobSet does.)"""
    mounted = {
        mount.get("name")
        for group in ("initContainers", "containers")
        for container in pod_spec.get(group) or []
        if isinstance(container, dict)
        for mount in container.get("volumeMounts") or []
        if isinstance(mount, dict)
    }
    for policy in (js.get("spec") or {}).get("volumeClaimPolicies") or []:
        for template in policy.get("templates") or []:
            claim = (template.get("metadata") or {}).get("name")
            if claim in mounted:
                pod_spec.setdefault("volumes", []).append(
                    {
                        "name": claim,
                        "persistentVolumeClaim": {"claimName": f"{claim}-{js['metadata']['name']}"},
                    }
                )


def main_container(pod_spec: Obj) -> Obj:
    containers = pod_spec.get("containers") or [{}]
    return next((c for c in containers if c.get("name") == "node"), containers[0])


def _int(value: Any, default: int) -> int:
    return int(value) if value is not None else default


def _ranges(indexes: set[int]) -> str:
    out: list[str] = []
    for i in sorted(indexes):
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == i - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        elif out and "-" not in out[-1] and int(out[-1]) == i - 1:
            out[-1] = f"{out[-1]}-{i}"
        else:
            out.append(str(i))
    return ",".join(out)


class JobSetController:
    def __init__(self, server: LocalAPIServer) -> None:
        self.server = server
        self.core = server.core
        self.core.mutators[JOBSETS] = jobset_defaults
        self.core.validators[JOBSETS] = jobset_validate
        self._pending: set[tuple[str, str, str]] = set()
        self._queue: asyncio.Queue[tuple[str, str, str]] = asyncio.Queue()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._worker: asyncio.Task[None] | None = None
        self.core.store.listeners.append(self._on_event)
        for js in list(self.core.store.iter(JOBSETS)):
            self._enqueue("jobset", js["metadata"].get("namespace", ""), js["metadata"]["name"])

    def start(self) -> None:
        self._worker = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        tasks = [t for t in (self._worker, *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def idle(self) -> None:
        await self._queue.join()

    # -- event routing ---------------------------------------------------------------------------
    def _enqueue(self, kind: str, namespace: str, name: str) -> None:
        item = (kind, namespace, name)
        if item not in self._pending:
            self._pending.add(item)
            self._queue.put_nowait(item)

    def _on_event(self, ev: Event) -> None:
        meta = ev.obj["metadata"]
        ns = meta.get("namespace", "")
        if ev.key == JOBSETS:
            self._enqueue("jobset", ns, meta["name"])
        elif ev.key == JOBS:
            owner = (meta.get("labels") or {}).get(JOBSET_NAME)
            if owner:
                self._enqueue("jobset", ns, owner)
            self._enqueue("job", ns, meta["name"])
        elif ev.key == PODS:
            # The owning Job by its controller reference, as the Job controller finds it (a Job
            # with a manual selector gives its pods no job-name label).
            for ref in meta.get("ownerReferences") or []:
                if ref.get("kind") == "Job" and ref.get("controller"):
                    self._enqueue("job", ns, ref["name"])
            self._pod_event(ev)

    async def _run(self) -> None:
        while True:
            item = await self._queue.get()
            self._pending.discard(item)
            try:
                if item[0] == "jobset":
                    await self._reconcile_jobset(item[1], item[2])
                else:
                    await self._reconcile_job(item[1], item[2])
            except APIError as err:
                log.debug("jobset controller: %s: %s", item, err.message)
                if err.code in (409, 429, 500):
                    self._later(0.2, lambda i=item: self._enqueue(*i))  # type: ignore[misc]
            except Exception:
                log.exception("jobset controller: %s failed", item)
            finally:
                self._queue.task_done()

    def _later(self, delay: float, fn: Callable[[], None]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay, fn)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- JobSet ----------------------------------------------------------------------------------
    def _owned(self, owner: Obj, key: Key) -> list[Obj]:
        return [o for k, o in self.core.store.dependents(owner["metadata"]["uid"]) if k == key]

    async def _reconcile_jobset(self, ns: str, name: str) -> None:
        js = self.core.store.get(JOBSETS, ns, name)
        if js is None or js["metadata"].get("deletionTimestamp"):
            return
        spec = js.get("spec") or {}
        if spec.get("managedBy", CONTROLLER_NAME) != CONTROLLER_NAME:
            return
        status = dict(js.get("status") or {})
        conditions: list[Obj] = list(status.get("conditions") or [])
        jobs = self._owned(js, JOBS)
        if status.get("terminalState"):
            for job in jobs:
                if not (_true(job, "Complete") or _true(job, "Failed")):
                    await self._delete(JOBSET_USER, JOBS, job)
            return
        restarts = int(status.get("restarts") or 0)
        current = []
        for job in jobs:
            if (job["metadata"].get("labels") or {}).get(RESTART_ATTEMPT) != str(restarts):
                if not job["metadata"].get("deletionTimestamp"):
                    await self._delete(JOBSET_USER, JOBS, job, "Foreground")
            else:
                current.append(job)
        by_rjob: dict[str, list[Obj]] = {}
        for job in current:
            by_rjob.setdefault((job["metadata"].get("labels") or {}).get(RJOB_NAME, ""), []).append(job)
        suspended = bool(spec.get("suspend"))
        rjobs = spec.get("replicatedJobs") or []
        network = spec.get("network") or {}
        if network.get("enableDNSHostnames", True) and current is not None:
            await self._ensure_service(js)
        rstatus = []
        for rjob in rjobs:
            rname = rjob["name"]
            jl = by_rjob.get(rname, [])
            rstatus.append(
                {
                    "name": rname,
                    "ready": sum(1 for j in jl if self._job_ready(j)),
                    "succeeded": sum(1 for j in jl if _true(j, "Complete")),
                    "failed": sum(1 for j in jl if _true(j, "Failed")),
                    "active": sum(1 for j in jl if int((j.get("status") or {}).get("active") or 0) > 0),
                    "suspended": sum(1 for j in jl if (j.get("spec") or {}).get("suspend")),
                }
            )
        counts = {r["name"]: r for r in rstatus}
        global_index = 0
        for rjob in rjobs:
            rname = rjob["name"]
            replicas = int(rjob.get("replicas", 1))
            ready_to_start = all(
                self._dependency_met(dep, counts, rjobs) for dep in rjob.get("dependsOn") or []
            )
            existing = {(j["metadata"].get("labels") or {}).get(JOB_INDEX): j for j in by_rjob.get(rname, [])}
            for i in range(replicas):
                current_job = existing.get(str(i))
                if current_job is None:
                    if ready_to_start or suspended:
                        await self._create_job(js, rjob, i, global_index + i, restarts, suspended)
                elif bool((current_job.get("spec") or {}).get("suspend")) != suspended and not (
                    _true(current_job, "Complete") or _true(current_job, "Failed")
                ):
                    if not suspended and not ready_to_start:
                        continue
                    await self.core.internal_patch(
                        JOBSET_USER,
                        JOBS,
                        ns,
                        current_job["metadata"]["name"],
                        {"spec": {"suspend": suspended}},
                    )
            global_index += replicas

        status["replicatedJobsStatus"] = rstatus
        status.setdefault("restarts", restarts)
        failed = [j for j in current if _true(j, "Failed")]
        if failed:
            verdict = _failure_verdict(spec, status, failed)
            if verdict is None:
                status["restarts"] = restarts + 1
                status["restartsCountTowardsMax"] = int(status.get("restartsCountTowardsMax") or 0) + 1
                await self._write_status(js, status)
                return
            reason, message = verdict
            conditions = _set_condition(conditions, _condition("Failed", "True", reason, message, conditions))
            status["terminalState"] = "Failed"
        elif self._succeeded(spec, by_rjob):
            conditions = _set_condition(
                conditions,
                _condition(
                    "Completed", "True", "AllJobsCompleted", "jobset completed successfully", conditions
                ),
            )
            status["terminalState"] = "Completed"
        if suspended:
            conditions = _set_condition(
                conditions,
                _condition("Suspended", "True", "SuspendedJobs", "jobset is suspended", conditions),
            )
        elif any(c.get("type") == "Suspended" and c.get("status") == "True" for c in conditions):
            conditions = _set_condition(
                conditions, _condition("Suspended", "False", "ResumeJobs", "jobset is resumed", conditions)
            )
        if conditions:
            status["conditions"] = conditions
        await self._write_status(js, status)

    def _dependency_met(self, dep: Obj, counts: dict[str, Obj], rjobs: list[Obj]) -> bool:
        target = next((r for r in rjobs if r["name"] == dep.get("name")), None)
        if target is None:
            return False
        replicas = int(target.get("replicas", 1))
        c = counts.get(dep.get("name", ""), {})
        if dep.get("status") == "Complete":
            return int(c.get("succeeded", 0)) >= replicas
        return int(c.get("ready", 0)) + int(c.get("succeeded", 0)) >= replicas

    def _job_ready(self, job: Obj) -> bool:
        st = job.get("status") or {}
        want = int((job.get("spec") or {}).get("parallelism", 1))
        finished = _true(job, "Complete") or _true(job, "Failed")
        return int(st.get("ready") or 0) + int(st.get("succeeded") or 0) >= want and not finished

    def _succeeded(self, spec: Obj, by_rjob: dict[str, list[Obj]]) -> bool:
        policy = spec.get("successPolicy") or {}
        rjobs = spec.get("replicatedJobs") or []
        targets = policy.get("targetReplicatedJobs") or [r["name"] for r in rjobs]
        replicas = {r["name"]: int(r.get("replicas", 1)) for r in rjobs}
        if policy.get("operator", "All") == "Any":
            return any(_true(j, "Complete") for t in targets for j in by_rjob.get(t, []))
        return all(
            sum(1 for j in by_rjob.get(t, []) if _true(j, "Complete")) >= replicas.get(t, 1) for t in targets
        )

    async def _write_status(self, js: Obj, status: Obj) -> None:
        if status == js.get("status"):
            return
        meta = js["metadata"]
        await self.core.internal_patch(
            JOBSET_USER, JOBSETS, meta["namespace"], meta["name"], {"status": status}, subresource="status"
        )

    async def _ensure_service(self, js: Obj) -> None:
        meta = js["metadata"]
        network = (js.get("spec") or {}).get("network") or {}
        name = network.get("subdomain") or meta["name"]
        if self.core.store.get(SERVICES, meta["namespace"], name) is not None:
            return
        svc = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": {JOBSET_NAME: meta["name"]},
                "ownerReferences": [self._owner_ref(js, "jobset.x-k8s.io/v1alpha2", "JobSet")],
            },
            "spec": {
                "clusterIP": "None",
                "selector": {JOBSET_NAME: meta["name"]},
                "publishNotReadyAddresses": bool(network.get("publishNotReadyAddresses", True)),
            },
        }
        try:
            await self.core.internal_create(JOBSET_USER, svc)
        except APIError as err:
            if err.code != 409:
                raise

    @staticmethod
    def _owner_ref(owner: Obj, api_version: str, kind: str) -> Obj:
        return {
            "apiVersion": api_version,
            "kind": kind,
            "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }

    async def _create_job(
        self, js: Obj, rjob: Obj, index: int, global_index: int, restarts: int, suspend: bool
    ) -> None:
        import copy

        meta = js["metadata"]
        ns, jsname = meta["namespace"], meta["name"]
        name = f"{jsname}-{rjob['name']}-{index}"
        template = copy.deepcopy(rjob.get("template") or {})
        tmeta = template.get("metadata") or {}
        jspec = template.get("spec") or {}
        job_key = hashlib.sha1(f"{ns}/{name}".encode()).hexdigest()
        marks = {
            JOBSET_NAME: jsname,
            RJOB_NAME: rjob["name"],
            RJOB_REPLICAS: str(int(rjob.get("replicas", 1))),
            GLOBAL_REPLICAS: str(sum(int(r.get("replicas", 1)) for r in _replicated_jobs(js))),
            JOB_INDEX: str(index),
            JOB_GLOBAL_INDEX: str(global_index),
            JOB_KEY: job_key,
            RESTART_ATTEMPT: str(restarts),
            JOBSET_UID: meta["uid"],
            **_group_marks(js, rjob, index),
        }
        labels = {**(tmeta.get("labels") or {}), **marks}
        annotations = {**(tmeta.get("annotations") or {}), **marks}
        ptmpl = jspec.setdefault("template", {})
        pmeta = ptmpl.setdefault("metadata", {})
        pmeta["labels"] = {**(pmeta.get("labels") or {}), **marks}
        pmeta["annotations"] = {**(pmeta.get("annotations") or {}), **marks}
        network = (js.get("spec") or {}).get("network") or {}
        if network.get("enableDNSHostnames", True):
            ptmpl.setdefault("spec", {})["subdomain"] = network.get("subdomain") or jsname
        jspec["suspend"] = suspend
        _add_claimed_volumes(js, ptmpl.setdefault("spec", {}))
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [self._owner_ref(js, "jobset.x-k8s.io/v1alpha2", "JobSet")],
            },
            "spec": jspec,
        }
        try:
            await self.core.internal_create(JOBSET_USER, job)
        except APIError as err:
            if err.code != 409:
                raise

    # -- Job (the Job controller) ------------------------------------------------------------------
    async def _reconcile_job(self, ns: str, name: str) -> None:
        job = self.core.store.get(JOBS, ns, name)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return
        spec = job.get("spec") or {}
        status = dict(job.get("status") or {})
        conditions: list[Obj] = list(status.get("conditions") or [])
        pods = [p for p in self._owned(job, PODS) if not p["metadata"].get("deletionTimestamp")]
        active = [p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        finished = _true(job, "Complete") or _true(job, "Failed")
        if finished:
            for pod in active:
                await self._delete(JOB_USER, PODS, pod)
            return
        completions = _int(spec.get("completions"), _int(spec.get("parallelism"), 1))
        parallelism = _int(spec.get("parallelism"), 1)
        backoff = _int(spec.get("backoffLimit"), 6)
        indexed = spec.get("completionMode") == "Indexed"
        done = [p for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"]
        # Indexed: the completed indexes; NonIndexed: each succeeded pod counts once.
        succeeded = {self._index(p) for p in done} if indexed else set(range(len(done)))
        failed_pods = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Failed")
        restarts = sum(
            int(c.get("restartCount") or 0)
            for p in pods
            for c in (p.get("status") or {}).get("containerStatuses") or []
        )
        failures = failed_pods + restarts
        if spec.get("suspend"):
            for pod in active:
                await self._delete(JOB_USER, PODS, pod)
            status["active"] = 0
            status["ready"] = 0
            conditions = _set_condition(
                conditions, _condition("Suspended", "True", "JobSuspended", "Job suspended", conditions)
            )
            status["conditions"] = conditions
            await self._job_status(job, status)
            return
        if any(c.get("type") == "Suspended" and c.get("status") == "True" for c in conditions):
            conditions = _set_condition(
                conditions, _condition("Suspended", "False", "JobResumed", "Job resumed", conditions)
            )
        status.setdefault("startTime", now())
        if failures > backoff:
            for pod in active:
                await self._delete(JOB_USER, PODS, pod)
            for ctype in ("FailureTarget", "Failed"):
                conditions = _set_condition(
                    conditions,
                    _condition(
                        ctype,
                        "True",
                        "BackoffLimitExceeded",
                        "Job has reached the specified backoff limit",
                        conditions,
                    ),
                )
            status.update(conditions=conditions, active=0, ready=0, failed=failures, terminating=0)
            await self._job_status(job, status)
            return
        if len(succeeded) >= completions:
            for ctype in ("SuccessCriteriaMet", "Complete"):
                conditions = _set_condition(
                    conditions,
                    _condition(
                        ctype,
                        "True",
                        "CompletionsReached",
                        "Reached expected number of succeeded pods",
                        conditions,
                    ),
                )
            status.update(
                conditions=conditions,
                active=0,
                ready=0,
                succeeded=len(succeeded),
                failed=failures,
                completionTime=now(),
                terminating=0,
            )
            if indexed:
                status["completedIndexes"] = _ranges(succeeded)
            await self._job_status(job, status)
            return
        running = await self._start_pods(job, active, succeeded, completions, parallelism, indexed)
        ready = sum(
            1
            for p in active
            if any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (p.get("status") or {}).get("conditions") or []
            )
        )
        status.update(
            active=running,
            ready=ready,
            succeeded=len(succeeded),
            failed=failures,
            terminating=0,
            uncountedTerminatedPods={},
        )
        if succeeded and indexed:
            status["completedIndexes"] = _ranges(succeeded)
        if conditions:
            status["conditions"] = conditions
        await self._job_status(job, status)

    async def _start_pods(
        self,
        job: Obj,
        active: list[Obj],
        succeeded: set[int],
        completions: int,
        parallelism: int,
        indexed: bool,
    ) -> int:
        """Create the pods the Job lacks, up to ``parallelism`` running; returns how many run.

        An Indexed Job runs one pod per index not yet completed; a NonIndexed one runs as many
        interchangeable pods as completions are still missing.
        """
        if not indexed:
            running = len(active)
            while running < min(parallelism, completions - len(succeeded)):
                await self._create_pod(job, None)
                running += 1
            return running
        active_indexes = {self._index(p) for p in active}
        for index in range(completions):
            if len(active_indexes) >= parallelism:
                break
            if index in succeeded or index in active_indexes:
                continue
            await self._create_pod(job, index)
            active_indexes.add(index)
        return len(active_indexes)

    @staticmethod
    def _index(pod: Obj) -> int:
        return int((pod["metadata"].get("annotations") or {}).get(COMPLETION_INDEX, "0"))

    async def _job_status(self, job: Obj, status: Obj) -> None:
        if status == job.get("status"):
            return
        meta = job["metadata"]
        await self.core.internal_patch(
            JOB_USER, JOBS, meta["namespace"], meta["name"], {"status": status}, "status"
        )

    async def _create_pod(self, job: Obj, index: int | None) -> None:
        """One pod from the Job's template, which carries the Job's selector labels (the API
        server put them there); an Indexed Job's pod (``index`` set) also gets its index and
        the name and hostname it implies."""
        import copy

        meta = job["metadata"]
        tmpl = copy.deepcopy(((job.get("spec") or {}).get("template")) or {})
        pmeta = tmpl.get("metadata") or {}
        pspec = tmpl.get("spec") or {}
        labels = dict(pmeta.get("labels") or {})
        annotations = dict(pmeta.get("annotations") or {})
        name = f"{meta['name']}-{generate_suffix()}"
        if index is not None:
            labels[COMPLETION_INDEX] = annotations[COMPLETION_INDEX] = str(index)
            name = f"{meta['name']}-{index}-{generate_suffix()}"
            if pspec.get("subdomain"):
                pspec["hostname"] = f"{meta['name']}-{index}"
        pspec["nodeName"] = NODE_NAME
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [self._owner_ref(job, "batch/v1", "Job")],
                "finalizers": [TRACKING_FINALIZER],
            },
            "spec": pspec,
        }
        created = await self.core.internal_create(JOB_USER, pod)
        pmeta_created = created["metadata"]
        self._timers[pmeta_created["uid"]] = self._later(
            0.05,
            lambda: self._spawn(
                self._start_pod(meta["namespace"], pmeta_created["name"], pmeta_created["uid"])
            ),
        )

    async def _delete(self, user: str, key: Key, obj: Obj, policy: str = "Background") -> None:
        meta = obj["metadata"]
        if key == PODS and meta.get("finalizers"):
            await self.core.internal_patch(
                user, PODS, meta["namespace"], meta["name"], {"metadata": {"finalizers": None}}
            )
        await self.core.internal_delete(
            user, key, meta.get("namespace", ""), meta["name"], policy, meta["uid"]
        )

    # -- pods (the kubelet) ----------------------------------------------------------------------
    def _pod_event(self, ev: Event) -> None:
        uid = ev.obj["metadata"]["uid"]
        meta = ev.obj["metadata"]
        if meta.get("deletionTimestamp") and TRACKING_FINALIZER in (meta.get("finalizers") or []):
            # The Job controller lets go of pods being deleted (also when their Job is gone).
            self._spawn(
                self.core.internal_patch(
                    JOB_USER, PODS, meta["namespace"], meta["name"], {"metadata": {"finalizers": None}}
                )
            )
        if ev.type == "DELETED":
            handle = self._timers.pop(uid, None)
            if handle is not None:
                handle.cancel()
            return
        if ev.type != "MODIFIED" or ev.old is None:
            return
        phase = (ev.obj.get("status") or {}).get("phase")
        if phase == (ev.old.get("status") or {}).get("phase"):
            return
        phase_owner = ""
        for entry in ev.obj["metadata"].get("managedFields") or []:
            if "f:phase" in ((entry.get("fieldsV1") or {}).get("f:status") or {}):
                phase_owner = str(entry.get("manager"))
        if phase_owner and phase_owner != KUBELET_USER.rsplit(":", 1)[-1]:
            # A client set the phase: it wins over the timer from now on.
            handle = self._timers.pop(uid, None)
            if handle is not None:
                handle.cancel()
            if phase in ("Succeeded", "Failed"):
                self._spawn(self._mark_finished_by_client(ev.obj, phase))

    async def _mark_finished_by_client(self, pod: Obj, phase: str) -> None:
        meta = pod["metadata"]
        for c in (pod.get("spec") or {}).get("containers") or []:
            self._log(pod, c["name"], f"[sandbox] {phase.lower()} by a client status update")
        if meta.get("finalizers"):
            await self.core.internal_patch(
                JOB_USER, PODS, meta["namespace"], meta["name"], {"metadata": {"finalizers": None}}
            )

    def _log(self, pod: Obj, container: str, line: str) -> None:
        self.server.pod_logs.setdefault((pod["metadata"]["uid"], container), []).append(line)

    def _plan(self, pod: Obj) -> tuple[float, int]:
        """How long the pod runs and how it ends; non-target jobs of a successPolicy never end by themselves."""
        seconds, code = _control(main_container(pod.get("spec") or {}))
        labels = pod["metadata"].get("labels") or {}
        js = self.core.store.get(JOBSETS, pod["metadata"]["namespace"], labels.get(JOBSET_NAME, ""))
        if js is not None and code == 0:
            targets = ((js.get("spec") or {}).get("successPolicy") or {}).get("targetReplicatedJobs") or []
            if targets and labels.get(RJOB_NAME) not in targets:
                seconds = -1
        return seconds, code

    async def _start_pod(self, ns: str, name: str, uid: str) -> None:
        self._timers.pop(uid, None)
        pod = self.core.store.get(PODS, ns, name)
        if (
            pod is None
            or pod["metadata"]["uid"] != uid
            or (pod.get("status") or {}).get("phase") != "Pending"
        ):
            return
        ts = now()
        spec = pod.get("spec") or {}
        statuses = []
        for c in spec.get("containers") or []:
            statuses.append(
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": ts}},
                }
            )
            self._log(
                pod, c["name"], f"[sandbox] pod {ns}/{name} container {c['name']} image {c.get('image', '')}"
            )
            if c.get("command"):
                self._log(pod, c["name"], "[sandbox] command: " + shlex.join(str(x) for x in c["command"]))
            if c.get("args"):
                self._log(pod, c["name"], "[sandbox] args: " + shlex.join(str(x) for x in c["args"]))
        conditions = [
            {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": ts}
            for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
        ]
        status = {
            "phase": "Running",
            "conditions": conditions,
            "containerStatuses": statuses,
            "startTime": ts,
            "hostIP": "10.0.0.1",
            "podIP": f"10.244.{(hash(uid) >> 8) % 250}.{hash(uid) % 250 + 2}",
            "qosClass": "BestEffort",
        }
        patched = await self.core.internal_patch(KUBELET_USER, PODS, ns, name, {"status": status}, "status")
        if patched is None:
            return
        self._schedule_end(patched)

    def _schedule_end(self, pod: Obj) -> None:
        seconds, code = self._plan(pod)
        uid = pod["metadata"]["uid"]
        if seconds < 0:
            return
        meta = pod["metadata"]
        self._timers[uid] = self._later(
            seconds, lambda: self._spawn(self._end_pod(meta["namespace"], meta["name"], uid, code))
        )

    async def _end_pod(self, ns: str, name: str, uid: str, code: int) -> None:
        self._timers.pop(uid, None)
        pod = self.core.store.get(PODS, ns, name)
        if (
            pod is None
            or pod["metadata"]["uid"] != uid
            or (pod.get("status") or {}).get("phase") != "Running"
        ):
            return
        ts = now()
        spec = pod.get("spec") or {}
        old_statuses = {c["name"]: c for c in (pod.get("status") or {}).get("containerStatuses") or []}
        restart = code != 0 and spec.get("restartPolicy") == "OnFailure"
        statuses = []
        for c in spec.get("containers") or []:
            prev = old_statuses.get(c["name"], {})
            started = ((prev.get("state") or {}).get("running") or {}).get("startedAt", ts)
            terminated = {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": started,
                "finishedAt": ts,
            }
            if restart:
                statuses.append(
                    {
                        **prev,
                        "restartCount": int(prev.get("restartCount") or 0) + 1,
                        "lastState": {"terminated": terminated},
                        "state": {"running": {"startedAt": ts}},
                    }
                )
                self._log(
                    pod, c["name"], f"[sandbox] exited with code {code}; restarting (restartPolicy OnFailure)"
                )
            else:
                statuses.append(
                    {**prev, "ready": False, "started": False, "state": {"terminated": terminated}}
                )
                self._log(pod, c["name"], f"[sandbox] exited with code {code}")
        if restart:
            patched = await self.core.internal_patch(
                KUBELET_USER, PODS, ns, name, {"status": {"containerStatuses": statuses}}, "status"
            )
            if patched is not None:
                self._schedule_end(patched)
            return
        conditions = [
            {**c, "status": "False", "lastTransitionTime": ts, "reason": "PodCompleted"}
            if c.get("type") in ("Ready", "ContainersReady")
            else c
            for c in (pod.get("status") or {}).get("conditions") or []
        ]
        await self.core.internal_patch(
            KUBELET_USER,
            PODS,
            ns,
            name,
            {
                "status": {
                    "phase": "Succeeded" if code == 0 else "Failed",
                    "containerStatuses": statuses,
                    "conditions": conditions,
                }
            },
            "status",
        )
        # The Job controller counted the pod: drop its tracking finalizer.
        await self.core.internal_patch(JOB_USER, PODS, ns, name, {"metadata": {"finalizers": None}})
