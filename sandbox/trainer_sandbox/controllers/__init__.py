"""The JobSet simulator: the controllers a cluster runs behind a JobSet, simulated for the local server.

It does what an operator observes of real JobSet on a cluster: JobSet's defaults and update rules,
Indexed Jobs and Pods with the labels JobSet and the Job controller set, pods moving through their
phases, logs, ``dependsOn``, ``successPolicy``, ``failurePolicy.maxRestarts``, ``suspend``, and the
conditions JobSet writes when it finishes. Nothing runs: a pod "runs" for ``SANDBOX_RUN_SECONDS``
and ends with ``SANDBOX_EXIT_CODE``, read from the env of the pod's container named ``node`` (else
its first container), so any client can steer it, e.g. through a TrainJob's ``spec.trainer.env``.
A client that writes a pod's phase (``kubectl patch pod --subresource=status``) takes the pod over:
the timer no longer touches it.

A cluster runs three controllers for this, and so does the simulator, one module each, each writing
under its own user's name in the audit log: the JobSet controller (``jobset``, with JobSet's
webhooks in ``jobset_webhooks``), the Job controller (``job``) and the kubelet (``kubelet``). They
share one work queue (``common``): one worker reconciles JobSets and Jobs in the order their
events arrive.

The controllers see the server through ``common.APIServer`` only, and the API server does not know
them: ``trainer_sandbox.sandbox.local_apiserver`` hands ``JobSetSimulator`` to a ``LocalAPIServer``,
which starts it after itself and stops it before its garbage collector.
"""

from __future__ import annotations

from trainer_sandbox.controllers.common import JOB_USER, APIServer, WorkQueue
from trainer_sandbox.controllers.job import JobController
from trainer_sandbox.controllers.jobset import JOBSET_USER, JobSetController
from trainer_sandbox.controllers.kubelet import KUBELET_USER, Kubelet

__all__ = ["JOBSET_USER", "JOB_USER", "KUBELET_USER", "JobSetSimulator"]


class JobSetSimulator:
    """The JobSet controller, the Job controller and the kubelet of one local server, on one queue."""

    def __init__(self, api: APIServer) -> None:
        self.work = WorkQueue()
        self.kubelet = Kubelet(api, self.work)
        self.job = JobController(api, self.work, self.kubelet)
        self.jobset = JobSetController(api, self.work)
        # In this order: a Job's event queues its JobSet before the Job itself, and the Job
        # controller sees a pod's event before the kubelet does.
        api.core.store.listeners.extend([self.jobset.on_event, self.job.on_event, self.kubelet.on_event])

    def start(self) -> None:
        self.work.start()

    async def stop(self) -> None:
        self.kubelet.stop()
        await self.work.stop()

    async def idle(self) -> None:
        """Wait until every item queued so far has been reconciled."""
        await self.work.idle()
