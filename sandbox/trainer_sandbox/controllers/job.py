"""The simulated Job controller: the pods of a batch Job, and the Job's status.

It runs the Jobs JobSet creates (and any other Job): one pod per index not yet completed for an
Indexed Job, interchangeable pods for a NonIndexed one, up to ``parallelism``; it counts failures
(failed pods and container restarts) against ``backoffLimit``, honours ``suspend``, and writes the
conditions and counts the Job controller writes. Its pods carry its tracking finalizer, which it
drops once it has counted a pod. It hands each new pod to the kubelet (``kubelet``), which runs
it; the Job's owner, if any, is not its business.
"""

from __future__ import annotations

import copy
from typing import Any

from trainer.api.objects import Obj
from trainer_sandbox.apiserver.core import generate_suffix, now
from trainer_sandbox.apiserver.storage import Event
from trainer_sandbox.controllers.common import (
    JOB_USER,
    JOBS,
    PODS,
    TRACKING_FINALIZER,
    APIServer,
    WorkQueue,
    condition,
    delete,
    is_true,
    owned,
    owner_ref,
    release_pod,
    set_condition,
)
from trainer_sandbox.controllers.kubelet import NODE_NAME, Kubelet

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


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


class JobController:
    def __init__(self, api: APIServer, work: WorkQueue, kubelet: Kubelet) -> None:
        self.core = api.core
        self.work = work
        self.kubelet = kubelet
        work.register("job", self._reconcile)

    def on_event(self, ev: Event) -> None:
        """A Job's events, and those of the pods it owns."""
        meta = ev.obj["metadata"]
        ns = meta.get("namespace", "")
        if ev.key == JOBS:
            self.work.add("job", ns, meta["name"])
        elif ev.key == PODS:
            # The owning Job by its controller reference, as the Job controller finds it (a Job
            # with a manual selector gives its pods no job-name label).
            for ref in meta.get("ownerReferences") or []:
                if ref.get("kind") == "Job" and ref.get("controller"):
                    self.work.add("job", ns, ref["name"])
            if meta.get("deletionTimestamp") and TRACKING_FINALIZER in (meta.get("finalizers") or []):
                # The Job controller lets go of pods being deleted (also when their Job is gone).
                self.work.spawn(release_pod(self.core, meta["namespace"], meta["name"]))

    async def _reconcile(self, ns: str, name: str) -> None:
        job = self.core.store.get(JOBS, ns, name)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return
        spec = job.get("spec") or {}
        status = dict(job.get("status") or {})
        conditions: list[Obj] = list(status.get("conditions") or [])
        pods = [p for p in owned(self.core, job, PODS) if not p["metadata"].get("deletionTimestamp")]
        active = [p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        finished = is_true(job, "Complete") or is_true(job, "Failed")
        if finished:
            for pod in active:
                await delete(self.core, JOB_USER, PODS, pod)
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
                await delete(self.core, JOB_USER, PODS, pod)
            status["active"] = 0
            status["ready"] = 0
            conditions = set_condition(
                conditions, condition("Suspended", "True", "JobSuspended", "Job suspended", conditions)
            )
            status["conditions"] = conditions
            await self._job_status(job, status)
            return
        if any(c.get("type") == "Suspended" and c.get("status") == "True" for c in conditions):
            conditions = set_condition(
                conditions, condition("Suspended", "False", "JobResumed", "Job resumed", conditions)
            )
        status.setdefault("startTime", now())
        if failures > backoff:
            for pod in active:
                await delete(self.core, JOB_USER, PODS, pod)
            for ctype in ("FailureTarget", "Failed"):
                conditions = set_condition(
                    conditions,
                    condition(
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
                conditions = set_condition(
                    conditions,
                    condition(
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
                "ownerReferences": [owner_ref(job, "batch/v1", "Job")],
                "finalizers": [TRACKING_FINALIZER],
            },
            "spec": pspec,
        }
        created = await self.core.internal_create(JOB_USER, pod)
        self.kubelet.start_later(created)
