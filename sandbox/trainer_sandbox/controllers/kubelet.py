"""The simulated kubelet of the one node, ``sandbox-node``: pods start, "run", end, and log.

Nothing runs. A pod the Job controller creates starts 0.05 s later (Running, Ready, one log line
per container with its image, command and args), runs for ``SANDBOX_RUN_SECONDS`` and ends with
``SANDBOX_EXIT_CODE``, both read from the env of its container named ``node`` (else its first
container); a failure under ``restartPolicy: OnFailure`` restarts the containers in place. A pod of
a replicatedJob that a JobSet's ``successPolicy`` does not target never ends by itself. A client
that writes a pod's phase takes the pod over: its timer is dropped. The logs are the server's
``pod_logs``, which ``kubectl logs`` reads.
"""

from __future__ import annotations

import asyncio
import shlex

from trainer.api.objects import Obj
from trainer_sandbox.apiserver.core import now
from trainer_sandbox.apiserver.storage import Event
from trainer_sandbox.controllers.common import JOBSETS, PODS, APIServer, WorkQueue, release_pod
from trainer_sandbox.controllers.jobset import JOBSET_NAME, RJOB_NAME

KUBELET_USER = "system:node:sandbox-node"
NODE_NAME = "sandbox-node"

RUN_SECONDS_ENV = "SANDBOX_RUN_SECONDS"
EXIT_CODE_ENV = "SANDBOX_EXIT_CODE"
DEFAULT_RUN_SECONDS = 2.0


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


def main_container(pod_spec: Obj) -> Obj:
    containers = pod_spec.get("containers") or [{}]
    return next((c for c in containers if c.get("name") == "node"), containers[0])


class Kubelet:
    def __init__(self, api: APIServer, work: WorkQueue) -> None:
        self.api = api
        self.core = api.core
        self.work = work
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def start_later(self, pod: Obj) -> None:
        """Start a pod bound to this node, 0.05 s from now."""
        meta = pod["metadata"]
        self._timers[meta["uid"]] = self.work.later(
            0.05, lambda: self.work.spawn(self._start_pod(meta["namespace"], meta["name"], meta["uid"]))
        )

    def stop(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    def on_event(self, ev: Event) -> None:
        """A pod deleted loses its timer; a pod whose phase a client wrote is the client's."""
        if ev.key != PODS:
            return
        uid = ev.obj["metadata"]["uid"]
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
                self.work.spawn(self._mark_finished_by_client(ev.obj, phase))

    async def _mark_finished_by_client(self, pod: Obj, phase: str) -> None:
        meta = pod["metadata"]
        for c in (pod.get("spec") or {}).get("containers") or []:
            self._log(pod, c["name"], f"[sandbox] {phase.lower()} by a client status update")
        if meta.get("finalizers"):
            await release_pod(self.core, meta["namespace"], meta["name"])

    def _log(self, pod: Obj, container: str, line: str) -> None:
        self.api.pod_logs.setdefault((pod["metadata"]["uid"], container), []).append(line)

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
        self._timers[uid] = self.work.later(
            seconds, lambda: self.work.spawn(self._end_pod(meta["namespace"], meta["name"], uid, code))
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
        # The Job controller counted the pod: it drops its tracking finalizer.
        await release_pod(self.core, ns, name)
