"""Kubernetes Events about TrainJobs: CamelCase reasons, short messages, never key material."""

from __future__ import annotations

import re
import socket
from datetime import UTC, datetime
from typing import Any

from trainer.controller.client import ApiClient, ResourceType

Obj = dict[str, Any]

EVENTS = ResourceType("", "v1", "events")
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
            "kind": "TrainJob",
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


async def post(client: ApiClient, trainjob: Obj, type_: str, reason: str, message: str) -> None:
    event = event_for(trainjob, type_, reason, message)
    await client.create(EVENTS, event["metadata"]["namespace"], event)
