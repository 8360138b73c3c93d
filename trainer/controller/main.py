"""`trainer run`: start the operator against the cluster in KUBECONFIG or the in-cluster config."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, str] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out)


def configure_logging(fmt: str, verbosity: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
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
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def liveness_endpoint(explicit: str | None, health_address: str) -> str | None:
    """``--liveness`` when given, else the Configuration's health probe address (as upstream)."""
    if explicit:
        return explicit
    if not health_address:
        return None
    from trainer.controller.config import split_address

    host, port = split_address(health_address)
    return f"http://{host}:{port}/healthz"


def run(args: argparse.Namespace) -> int:
    from trainer.controller.config import load
    from trainer.controller.operator import Operator, StartupError
    from trainer.runtime.framework import PluginConfigError

    configure_logging(args.log_format, args.verbose)
    try:
        config = load(args.config)
        operator = Operator(config=config, namespaces=tuple(args.namespace))
    except (OSError, ValueError, PluginConfigError) as exc:
        print(f"trainer run: {exc}", file=sys.stderr)
        return 2

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await operator.run(
            clusterwide=not args.namespace,
            liveness_endpoint=liveness_endpoint(args.liveness, config.health.health_probe_bind_address),
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
