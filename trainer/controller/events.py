"""Kubernetes Events about TrainJobs: CamelCase reasons, short messages, never key material."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
from datetime import UTC, datetime

import aiohttp

from trainer.api.objects import Obj
from trainer.controller.client import ApiClient, ApiError
from trainer.controller.resources import EVENTS

logger = logging.getLogger("trainer.controller")
transitions = logging.getLogger("trainer.trainjob")


def object_fields(obj: Obj, reason: str | None = None) -> dict[str, str]:
    """A log record's ``extra`` naming ``obj`` (trainer/controller/main.py's OBJECT_FIELDS)."""
    meta = obj.get("metadata") or {}
    fields = {
        "object_kind": str(obj.get("kind") or ""),
        "object_namespace": str(meta.get("namespace") or ""),
        "object_name": str(meta.get("name") or ""),
        "object_uid": str(meta.get("uid") or ""),
    }
    if reason is not None:
        fields["object_reason"] = reason
    return fields


MAX_MESSAGE = 1024
COMPONENT = "trainer-operator"
_PEM = re.compile(r"-----BEGIN [A-Z ]+-----.*?(-----END [A-Z ]+-----|$)", re.DOTALL)
_SSH_KEY = re.compile(r"\b(ssh-(rsa|ed25519)|ecdsa-sha2-nistp\d+) [A-Za-z0-9+/=]{20,}")


def scrub(message: str) -> str:
    """Remove anything shaped like key material and keep Kubernetes' message limit.

    Our own messages never carry keys; this is the second lock on the door, for errors that
    quote what another component sent back.
    """
    message = _PEM.sub("<redacted key>", message)
    message = _SSH_KEY.sub("<redacted key>", message)
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 4] + " ..."
    return message


def event_for(trainjob: Obj, type_: str, reason: str, message: str, now: datetime | None = None) -> Obj:
    meta = trainjob["metadata"]
    moment = now or datetime.now(UTC)
    stamp = moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    # Named as client-go's recorder names them: the object's name and a nanosecond clock in hex.
    name = f"{meta['name']}.{int(moment.timestamp() * 1e9):x}"
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": meta.get("namespace") or "default"},
        "involvedObject": {
            "apiVersion": trainjob.get("apiVersion", "trainer.kubeflow.org/v1alpha1"),
            "kind": trainjob.get("kind") or "TrainJob",  # an OptimizationJob's are its own
            "name": meta["name"],
            "namespace": meta.get("namespace") or "default",
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "type": type_,
        "reason": reason,
        "message": scrub(message),
        "source": {"component": COMPONENT},
        "reportingComponent": "trainer.kubeflow.org/trainjob-controller",
        "reportingInstance": socket.gethostname(),
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class Recorder:
    """Posts Events in the background, on a client budget of its own, as client-go's recorder does.

    A reconcile never waits for an Event, and Events never spend the budget that creates JobSets.
    An Event that cannot be posted is logged and dropped: it is a notice, not state (status is).
    """

    def __init__(self, client: ApiClient, capacity: int = 1000) -> None:
        self.client = client
        self.queue: asyncio.Queue[Obj] = asyncio.Queue(capacity)
        self.dropped = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="event-recorder")

    async def halt(self) -> None:
        """Stop at once, dropping what is queued and cutting a post under way: a replica that
        stopped leading tells nothing more about TrainJobs another replica now reconciles."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        dropped = 0
        while not self.queue.empty():
            self.queue.get_nowait()
            self.queue.task_done()
            dropped += 1
        if dropped:
            self.dropped += dropped
            logger.info("no longer leading: dropped %d queued event(s)", dropped)

    def record(self, trainjob: Obj, type_: str, reason: str, message: str, *, post: bool = True) -> None:
        """Log what happened to a TrainJob and, unless ``post`` is False, post it as an Event.

        Each Event is one log line too, at INFO whatever this replica's role: what happened to a
        TrainJob is in the logs even where Events have expired (an hour by default). A notice
        logged and not posted is one whose API request is not worth it (docs/decisions.md §events).
        """
        meta = trainjob.get("metadata") or {}
        transitions.log(
            logging.WARNING if type_ == "Warning" else logging.INFO,
            "%s %s/%s: %s: %s",
            kind := trainjob.get("kind") or "TrainJob",
            meta.get("namespace"),
            meta.get("name"),
            reason,
            scrub(message),
            extra=object_fields({**trainjob, "kind": kind}, reason),
        )
        if not post:
            return
        try:
            self.queue.put_nowait(event_for(trainjob, type_, reason, message))
        except asyncio.QueueFull:
            self.dropped += 1
            logger.info("event queue full: dropped %s for TrainJob %s", reason, trainjob["metadata"]["name"])

    async def _run(self) -> None:
        while True:
            event = await self.queue.get()
            try:
                await self.client.create(EVENTS, event["metadata"]["namespace"], event)
            except ApiError as exc:
                logger.info("could not post event %s: %s", event["reason"], scrub(str(exc)))
            except (OSError, TimeoutError, aiohttp.ClientError) as exc:
                logger.info("could not post event %s: %s", event["reason"], type(exc).__name__)
            except Exception as exc:  # whatever one Event meets, the Events after it still go out
                logger.warning(
                    "could not post event %s: %s: %s", event["reason"], type(exc).__name__, scrub(str(exc))
                )
            finally:
                self.queue.task_done()

    async def stop(self, flush: float = 2.0) -> None:
        """Post what is queued (for at most ``flush`` seconds), then stop."""
        if self._task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.queue.join(), flush)
        await self.halt()
        await self.client.close()
