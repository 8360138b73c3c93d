"""`trainer run`: start the operator against the cluster in KUBECONFIG or the in-cluster config."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from typing import Any


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
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
        await operator.run(clusterwide=not args.namespace, liveness_endpoint=args.liveness, stop_flag=stop)

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
