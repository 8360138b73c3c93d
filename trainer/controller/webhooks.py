"""The admission webhooks: a validator and a defaulter for each kind of our API, served by kopf.

The rules are admission's (``trainer.admission``); here they are given the cache and the
framework, and their answers are put the way kopf returns them to the API server. kopf's webhook
server, its certificate and the configurations it manages are the process's
(``controller/operator.py``).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any, cast

import kopf

from trainer.api.objects import Obj
from trainer.apimachinery.errors import AdmissionError, refusal_lines
from trainer.controller.cache import Cache
from trainer.controller.events import object_fields, scrub
from trainer.controller.reconciler import utc_now
from trainer.controller.resources import OWN, validated
from trainer.runtime import framework as fw

logger = logging.getLogger("trainer.webhooks")


@dataclass
class Webhooks:
    cache: Cache
    framework: fw.Framework

    def validate(self, body: kopf.Body, old: kopf.Body | None, warnings: list[str]) -> None:
        """The validating webhook. The API server checked the CRD schema and its CEL rules before
        calling it, so only the rules no CRD states run here (``Mode.WEBHOOK``)."""
        from trainer.admission.admit import Mode, admit

        obj = _plain(body)
        try:
            _, found = admit(
                obj,
                _plain(old) if old is not None else None,
                self.cache,
                self.framework,
                utc_now(),
                mode=Mode.WEBHOOK,
            )
        except AdmissionError as exc:
            warnings.extend(exc.warnings)
            message = _admission_message(exc)
            meta = obj.get("metadata") or {}
            logger.info(
                "refused %s %s/%s: %s",
                obj.get("kind"),
                meta.get("namespace") or "",
                meta.get("name") or meta.get("generateName") or "",
                scrub(message.replace("\n", "; ")),  # one log line per refusal
                extra=object_fields(obj, "Refused"),
            )
            raise kopf.AdmissionError(message, code=403) from exc
        warnings.extend(found)

    def default(
        self, body: kopf.Body, old: kopf.Body | None, patch: kopf.Patch, warnings: list[str] | None = None
    ) -> None:
        """The defaulting webhook: kopf diffs what ``default_object`` changes into a JSON patch.
        Each field of ours an update left out and that is kept gets a warning: the client sees
        that its update did not remove it (docs/decisions.md §extensions-survive)."""
        from trainer.admission.admit import default_object
        from trainer.admission.extensions import keep_extensions

        stored = _plain(old) if old is not None else None
        if warnings is not None:
            for path in keep_extensions(_plain(body), stored):
                warnings.append(
                    f"{path}: not in this update, so kept as it was (clients built on upstream's API "
                    "do not know the field); to change it, set another value"
                )
        now = utc_now()
        # kopf hands each function a deep copy of the body made of plain dicts and lists.
        patch.fns.append(lambda obj: default_object(cast(Obj, obj), stored, now))

    def register(self, registry: kopf.OperatorRegistry) -> None:
        """A validator and a defaulter for each kind of our API. The defaulters write fractions
        given for quantities as quantity strings and keep whole numbers, runtimes included
        (docs/decisions.md §9), and stamp each TrainJob runtime patch with the time it last changed."""

        # Coroutines: kopf would run a plain function in a thread pool, reading the cache while
        # the loop's watch events (controller/informer.py) change it. kopf passes every handler
        # many keyword arguments; each takes the ones it needs.
        async def _validate(
            *, body: kopf.Body, warnings: list[str], old: kopf.Body | None = None, **_: object
        ) -> None:
            self.validate(body, old, warnings)

        async def _default(
            *,
            body: kopf.Body,
            patch: kopf.Patch,
            warnings: list[str],
            old: kopf.Body | None = None,
            **_: object,
        ) -> None:
            self.default(body, old, patch, warnings)

        for resource in validated():
            # A defaulter only for the kinds that take one: an OptimizationJob's trials are
            # defaulted as each TrainJob is, when the operator creates it.
            handlers: list[tuple[Any, Any, str]] = [(kopf.on.validate, _validate, "validator")]
            if resource in OWN:
                handlers.append((kopf.on.mutate, _default, "defaulter"))
            rtype = resource.type
            for register, handler, prefix in handlers:
                register(
                    rtype.group,
                    rtype.version,
                    rtype.plural,
                    registry=registry,
                    id=f"{prefix}.{resource.kind.lower()}",
                    operations=["CREATE", "UPDATE"],
                )(handler)


def _plain(body: kopf.Body) -> Obj:
    return copy.deepcopy(dict(body))


def _admission_message(exc: AdmissionError) -> str:
    """The denial's message: one error per line, as ``trainer render`` prints them.

    The API server passes a webhook's message through whole, after ``admission webhook "<name>"
    denied the request: `` (k8s.io/apiserver's webhook ``ToStatusErr``), and kubectl prints it as
    it is, so each error starts its own line and none is lost in one long ``[a, b]`` line (the form
    of a Go aggregate error, which upstream's webhooks send). kopf sends a message and a code, no
    ``details.causes``, so there are no per-error causes to keep in step. The API server's "rules
    not checked" error, which the webhook never sees (the server refuses the object before
    calling it), would be said in plain words on a last line (``errors.refusal_lines``).
    """
    lines, note = refusal_lines(exc.errors)
    return "\n".join([*lines, *([note] if note else [])])
