"""`trainer run`: start the operator against the cluster in KUBECONFIG or the in-cluster config."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import logging
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer.controller.config import Health

# What a line may carry about the object it is about, as fields of their own (JSON): set through
# ``extra=`` as ``object_<field>`` (a LogRecord has a ``name`` of its own), written as ``<field>``
# (trainer.controller.events.object_fields).
OBJECT_FIELDS = ("kind", "namespace", "name", "uid", "reason")


def rfc3339(created: float) -> str:
    """A record's time in RFC 3339, UTC, to the millisecond: what log pipelines parse unaided."""
    moment = datetime.datetime.fromtimestamp(created, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, str] = {
            "time": rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in OBJECT_FIELDS:
            value = record.__dict__.get(f"object_{key}")
            if value is not None:
                out[key] = str(value)
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return rfc3339(record.created)


def configure_logging(fmt: str, verbosity: int) -> None:
    """The levels (docs/configuration.md, "Logs"): by default, one INFO line per TrainJob
    transition and per refusal, and warnings; ``-v``, every reconcile, watch and write of ours;
    ``-vv``, kopf's and the HTTP libraries' debug lines too."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbosity > 1 else logging.INFO if verbosity == 1 else logging.WARNING)
    logging.getLogger("trainer").setLevel(logging.DEBUG if verbosity else logging.INFO)
    # kopf reports every handler call at INFO; ours are watch feeders, so that is noise.
    logging.getLogger("kopf").setLevel(logging.DEBUG if verbosity > 1 else logging.WARNING)
    handler.addFilter(RefusalsAreNotErrors())


class RefusalsAreNotErrors(logging.Filter):
    """kopf logs a webhook that refuses an object as a handler failing permanently (ERROR); a
    refusal is the webhook working. Such records go out at INFO, so the error log means errors.
    (A webhook handler that crashes is logged with its traceback, and stays an ERROR.)"""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        refusal = message.startswith("Webhook ") and " failed permanently: " in message
        if (
            record.name.startswith("kopf")
            and record.levelno >= logging.ERROR
            and refusal
            and not record.exc_info
        ):
            # Our validator logs each refusal itself, naming the object (controller/webhooks.py).
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


def liveness_endpoint(explicit: str | None, health: Health, in_cluster: bool) -> str | None:
    """``--liveness`` when given, else the Configuration's health probe address and liveness
    endpoint name (as upstream; outside a cluster an unset address is loopback's)."""
    if explicit:
        return explicit
    if health.health_probe_bind_address in ("", "0"):  # upstream's two ways of serving no health probe
        return None
    host, port = health.listen_address(in_cluster)
    return f"http://{host}:{port}/{health.liveness_endpoint_name}"


def run(args: argparse.Namespace) -> int:
    from trainer.controller.config import load
    from trainer.controller.operator import Operator, StartupError
    from trainer.exit_codes import EXIT_USAGE
    from trainer.runtime.framework import PluginConfigError

    configure_logging(args.log_format, args.verbose)
    try:
        config = load(args.config)
        operator = Operator(config=config, namespaces=tuple(args.namespace))
    except (OSError, ValueError, PluginConfigError) as exc:
        # A ConfigError (a ValueError) is already one paragraph naming the file and each key at
        # fault (controller/config.py, explain): printed as it is, never as a traceback.
        print(f"trainer run: {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await operator.run(
            clusterwide=not args.namespace,
            liveness_endpoint=liveness_endpoint(args.liveness, config.health, operator.placed_in_cluster),
            stop_flag=stop,
        )

    try:
        asyncio.run(main())
    except StartupError as exc:
        print(f"trainer run: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # kopf wraps a failed start-up (ActivityError); say why and exit
        cause = exc.__cause__ or exc
        print(f"trainer run: the operator stopped: {cause}", file=sys.stderr)
        return 1
    return 0
