"""Run the operator in a background thread: for the demo, the sandbox and integration tests.

On a cluster the operator is its own process (`trainer run`); here it shares a process with the
local API server, with its own event loop, and stops promptly when asked. Nothing on a cluster
runs the operator this way, so this lives in the sandbox's distribution, not the operator's.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Collection
from pathlib import Path

from trainer.controller.config import Configuration
from trainer.controller.operator import Operator
from trainer_sandbox.ports import free_port


class EmbeddedOperator:
    def __init__(
        self,
        kubeconfig: str | Path,
        config: Configuration | None = None,
        namespaces: Collection[str] = (),
        *,
        webhooks: bool = False,
        liveness_endpoint: str | None = None,
    ) -> None:
        config = config or Configuration()
        self.liveness_endpoint = liveness_endpoint
        if webhooks:
            # No certDir: the operator makes a self-signed certificate for 127.0.0.1 itself.
            config = config.model_copy(
                update={
                    "webhook": config.webhook.model_copy(
                        update={
                            "enabled": True,
                            "host": "127.0.0.1",
                            "port": free_port(),
                            "cert_dir": None,
                            "manage_configuration": True,
                            "advertise_host": "127.0.0.1",
                        }
                    )
                }
            )
        elif config.webhook.enabled and not webhooks:
            config = config.model_copy(
                update={"webhook": config.webhook.model_copy(update={"enabled": False})}
            )
        self.operator = Operator(
            config=config, namespaces=tuple(namespaces), serve_metrics=False, kubeconfig=str(kubeconfig)
        )
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    def start(self, timeout: float = 30) -> EmbeddedOperator:
        self._thread = threading.Thread(target=self._run, name="trainer-operator", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError(f"the operator did not start within {timeout} s: {self._error!r}")
        if self._error is not None:
            raise RuntimeError(f"the operator failed to start: {self._error}") from self._error
        if self.operator.config.webhook.enabled and self.operator.config.webhook.manage_configuration:
            self._wait_for_webhook_configurations(timeout)
        return self

    def _wait_for_webhook_configurations(self, timeout: float) -> None:
        """kopf writes the webhook configurations after start-up; admission is on only once they exist."""
        import time

        from trainer.controller.client import ApiError

        running, loop = self.operator.running, self._loop
        if running is None or loop is None:
            raise RuntimeError("the operator is not running")
        deadline = time.monotonic() + timeout
        for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
            path = f"/apis/admissionregistration.k8s.io/v1/{kind}/trainer.kubeflow.org"
            while True:
                future = asyncio.run_coroutine_threadsafe(running.client.request("GET", path), loop)
                try:
                    found = future.result(timeout)
                    if found.get("webhooks"):
                        break
                except ApiError as exc:
                    if exc.code != 404:
                        raise
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{kind}/trainer.kubeflow.org did not appear within {timeout} s")
                time.sleep(0.1)

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            ready = asyncio.Event()

            async def watch_ready() -> None:
                await self.operator.ready.wait()
                await ready.wait()
                self._started.set()

            waiter = asyncio.create_task(watch_ready())
            try:
                await self.operator.run(
                    clusterwide=not self.operator.namespaces,
                    liveness_endpoint=self.liveness_endpoint,
                    stop_flag=self._stop,
                    ready_flag=ready,
                )
            finally:
                waiter.cancel()

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported to the thread that waits in start()
            self._error = exc
        finally:
            self._started.set()

    def stop(self, timeout: float = 15) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> EmbeddedOperator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def reconciles(self) -> float:
        """The reconciles it has finished without an error (``trainer_reconcile_total``): a test
        that something costs no write shows first that a reconcile happened."""
        registry = self.operator.metrics.registry
        return registry.get_sample_value("trainer_reconcile_total", {"result": "success"}) or 0.0

    def idle(self, timeout: float = 10) -> bool:
        """True once the work queue is empty (no reconcile pending or running) and no status
        write is waiting for progress to settle (controller.progressBatchPeriod)."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            running = self.operator.running
            if running is not None and self.operator.queue.idle and not running.reconciler.progress.waiting:
                return True
            time.sleep(0.05)
        return False
