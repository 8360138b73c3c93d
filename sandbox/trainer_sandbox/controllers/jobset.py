"""The simulated JobSet controller: a JobSet's headless Service, its Jobs, and its status.

It reconciles JobSets as JobSet v0.12 does for what an operator observes: one Job per replica of
each replicatedJob, named ``<jobset>-<rjob>-<i>``, with the labels and annotations real JobSet sets;
``dependsOn`` (Ready or Complete), ``suspend``, ``successPolicy``, ``failurePolicy.maxRestarts``
(a restart deletes the attempt's Jobs and makes new ones), ``managedBy``, and the conditions JobSet
writes when it finishes. It reads the Jobs' status, which the Job controller (``job``) writes; the
pods are not its business. It also registers JobSet's webhooks (``jobset_webhooks``) with the server.
"""

from __future__ import annotations

import copy
import hashlib

from trainer.api.objects import Obj
from trainer_sandbox.apiserver.errors import APIError
from trainer_sandbox.apiserver.storage import Event, Key
from trainer_sandbox.controllers.common import (
    JOBS,
    JOBSETS,
    APIServer,
    WorkQueue,
    condition,
    delete,
    is_true,
    owned,
    owner_ref,
    set_condition,
)
from trainer_sandbox.controllers.jobset_webhooks import jobset_defaults, jobset_validate

SERVICES: Key = ("", "services")

JOBSET_USER = "system:serviceaccount:jobset-system:jobset-controller-manager"
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

# JobSet's condition reasons and messages (sigs.k8s.io/jobset/pkg/constants).
FAILED_JOBS_REASON = "FailedJobs"
FAILED_JOBS_MESSAGE = "jobset failed due to one or more job failures"
REACHED_MAX_RESTARTS_REASON = "ReachedMaxRestarts"
REACHED_MAX_RESTARTS_MESSAGE = "jobset failed due to reaching max number of restarts"


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


class JobSetController:
    def __init__(self, api: APIServer, work: WorkQueue) -> None:
        self.core = api.core
        self.work = work
        self.core.mutators[JOBSETS] = jobset_defaults
        self.core.validators[JOBSETS] = jobset_validate
        work.register("jobset", self._reconcile)
        for js in list(self.core.store.iter(JOBSETS)):
            work.add("jobset", js["metadata"].get("namespace", ""), js["metadata"]["name"])

    def on_event(self, ev: Event) -> None:
        """A JobSet's events, and those of the Jobs it owns (by their jobset-name label)."""
        meta = ev.obj["metadata"]
        ns = meta.get("namespace", "")
        if ev.key == JOBSETS:
            self.work.add("jobset", ns, meta["name"])
        elif ev.key == JOBS:
            owner = (meta.get("labels") or {}).get(JOBSET_NAME)
            if owner:
                self.work.add("jobset", ns, owner)

    async def _reconcile(self, ns: str, name: str) -> None:
        js = self.core.store.get(JOBSETS, ns, name)
        if js is None or js["metadata"].get("deletionTimestamp"):
            return
        spec = js.get("spec") or {}
        if spec.get("managedBy", CONTROLLER_NAME) != CONTROLLER_NAME:
            return
        status = dict(js.get("status") or {})
        conditions: list[Obj] = list(status.get("conditions") or [])
        jobs = owned(self.core, js, JOBS)
        if status.get("terminalState"):
            for job in jobs:
                if not (is_true(job, "Complete") or is_true(job, "Failed")):
                    await delete(self.core, JOBSET_USER, JOBS, job)
            return
        restarts = int(status.get("restarts") or 0)
        current = []
        for job in jobs:
            if (job["metadata"].get("labels") or {}).get(RESTART_ATTEMPT) != str(restarts):
                if not job["metadata"].get("deletionTimestamp"):
                    await delete(self.core, JOBSET_USER, JOBS, job, "Foreground")
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
                    "succeeded": sum(1 for j in jl if is_true(j, "Complete")),
                    "failed": sum(1 for j in jl if is_true(j, "Failed")),
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
                    is_true(current_job, "Complete") or is_true(current_job, "Failed")
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
        failed = [j for j in current if is_true(j, "Failed")]
        if failed:
            verdict = _failure_verdict(spec, status, failed)
            if verdict is None:
                status["restarts"] = restarts + 1
                status["restartsCountTowardsMax"] = int(status.get("restartsCountTowardsMax") or 0) + 1
                await self._write_status(js, status)
                return
            reason, message = verdict
            conditions = set_condition(conditions, condition("Failed", "True", reason, message, conditions))
            status["terminalState"] = "Failed"
        elif self._succeeded(spec, by_rjob):
            conditions = set_condition(
                conditions,
                condition(
                    "Completed", "True", "AllJobsCompleted", "jobset completed successfully", conditions
                ),
            )
            status["terminalState"] = "Completed"
        if suspended:
            conditions = set_condition(
                conditions,
                condition("Suspended", "True", "SuspendedJobs", "jobset is suspended", conditions),
            )
        elif any(c.get("type") == "Suspended" and c.get("status") == "True" for c in conditions):
            conditions = set_condition(
                conditions, condition("Suspended", "False", "ResumeJobs", "jobset is resumed", conditions)
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
        finished = is_true(job, "Complete") or is_true(job, "Failed")
        return int(st.get("ready") or 0) + int(st.get("succeeded") or 0) >= want and not finished

    def _succeeded(self, spec: Obj, by_rjob: dict[str, list[Obj]]) -> bool:
        policy = spec.get("successPolicy") or {}
        rjobs = spec.get("replicatedJobs") or []
        targets = policy.get("targetReplicatedJobs") or [r["name"] for r in rjobs]
        replicas = {r["name"]: int(r.get("replicas", 1)) for r in rjobs}
        if policy.get("operator", "All") == "Any":
            return any(is_true(j, "Complete") for t in targets for j in by_rjob.get(t, []))
        return all(
            sum(1 for j in by_rjob.get(t, []) if is_true(j, "Complete")) >= replicas.get(t, 1)
            for t in targets
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
                "ownerReferences": [owner_ref(js, "jobset.x-k8s.io/v1alpha2", "JobSet")],
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

    async def _create_job(
        self, js: Obj, rjob: Obj, index: int, global_index: int, restarts: int, suspend: bool
    ) -> None:
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
                "ownerReferences": [owner_ref(js, "jobset.x-k8s.io/v1alpha2", "JobSet")],
            },
            "spec": jspec,
        }
        try:
            await self.core.internal_create(JOBSET_USER, job)
        except APIError as err:
            if err.code != 409:
                raise
