"""``LocalAPIServer``: the in-memory Kubernetes API server stand-in, for tests and demos."""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import json
import secrets
import threading
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import yaml
from aiohttp import web

from trainer.api.objects import Obj, ObjList
from trainer_sandbox.apiserver import kubeconfig
from trainer_sandbox.apiserver.admission import Webhooks
from trainer_sandbox.apiserver.audit import AuditLog, AuditRecord
from trainer_sandbox.apiserver.core import Core, Ctx, clone
from trainer_sandbox.apiserver.errors import APIError
from trainer_sandbox.apiserver.faults import Faults
from trainer_sandbox.apiserver.gc import GarbageCollector
from trainer_sandbox.apiserver.handlers import Handlers
from trainer_sandbox.apiserver.patching import APPLY, MERGE
from trainer_sandbox.apiserver.tls import serving_cert
from trainer_sandbox.ports import free_port

T = TypeVar("T")

ADMIN = "admin"
JOBSET_CONTROLLER_USER = "system:serviceaccount:jobset-system:jobset-controller-manager"


class Controllers(Protocol):
    """What runs beside the server on its event loop, as a cluster's controllers run beside its API
    server: built from the server once it listens, stopped before its garbage collector. The
    server does not know which controllers they are: ``trainer_sandbox.sandbox.local_apiserver``
    passes the simulated JobSet controller, Job controller and kubelet (``trainer_sandbox.controllers``).
    """

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def idle(self) -> None: ...


class LocalAPIServer:
    """An in-memory Kubernetes API server on a local port.

    ``start()`` runs it in a background thread with its own event loop (for synchronous tests and
    clients); ``await start_async()`` runs it inside the caller's loop. Every bearer token of
    ``tokens`` is one named user; ``admin`` exists from the start. ``controllers`` builds, from the
    server, the controllers that run with it (``Controllers``); without it none run.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        minor_version: int = 32,
        seed: int = 0,
        bookmark_interval: float = 1.0,
        watch_timeout: float = 1800.0,
        history_size: int = 5000,
        controllers: Callable[[LocalAPIServer], Controllers] | None = None,
    ) -> None:
        if not 27 <= minor_version <= 33:
            raise ValueError("the reported Kubernetes version must be between 1.27 and 1.33")
        self.host = host
        self.port = port
        self.minor_version = minor_version
        self.bookmark_interval = bookmark_interval
        self.watch_timeout = watch_timeout
        self.faults = Faults(seed)
        self.audit = AuditLog()
        self.core = Core(self.faults, self.audit, history_size)
        self.webhooks = Webhooks(self.core)
        self.core.webhooks = self.webhooks
        self.tokens: dict[str, tuple[str, list[str]]] = {}
        self.users: dict[str, str] = {}  # user -> token
        self.pod_logs: dict[tuple[str, str], list[str]] = {}
        self.open_watches = 0
        self.stopping = False
        self.gc = GarbageCollector(self.core)
        self._controllers_factory = controllers
        self.controllers: Controllers | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.add_user(ADMIN, ["system:masters"])

    # -- users ---------------------------------------------------------------------------------
    def add_user(self, name: str, groups: Iterable[str] = (), token: str | None = None) -> str:
        """Register a user and return its bearer token (an existing user keeps its token)."""
        if name in self.users and token is None:
            return self.users[name]
        token = token or secrets.token_hex(16)
        self.tokens[token] = (name, [*groups, "system:authenticated"])
        self.users[name] = token
        return token

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    @property
    def ca_pem(self) -> bytes:
        """The CA that signed the serving certificate (kubeconfigs embed it)."""
        return serving_cert().ca_pem

    async def start_async(self) -> LocalAPIServer:
        self._loop = asyncio.get_running_loop()
        if not self.port:
            self.port = free_port(self.host)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        handlers = Handlers(self)
        app.router.add_route("*", "/{tail:.*}", handlers.dispatch)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            self.host,
            self.port,
            reuse_address=True,
            ssl_context=serving_cert().server_context(),
        )
        await site.start()
        self.gc.start()
        if self._controllers_factory is not None:
            self.controllers = self._controllers_factory(self)
            self.controllers.start()
        return self

    async def stop_async(self) -> None:
        self.stopping = True
        self.core.store.close_watchers()
        if self.controllers is not None:
            await self.controllers.stop()
        await self.gc.stop()
        await self.webhooks.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def start(self) -> LocalAPIServer:
        """Start in a background thread; returns when the port accepts connections."""
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start_async())
            except BaseException as err:
                ready.set_exception(err)
                loop.close()
                return
            ready.set_result(None)
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=run, name="local-apiserver", daemon=True)
        self._thread.start()
        ready.result(timeout=30)
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if loop.is_running():
            asyncio.run_coroutine_threadsafe(self.stop_async(), loop).result(timeout=15)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=15)
        self._thread = None

    def __enter__(self) -> LocalAPIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """Run a coroutine on the server's loop from another thread and return its result."""
        assert self._loop is not None, "server not started"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # -- configuration -----------------------------------------------------------------------------
    def write_kubeconfig(self, path: str | Path, user: str = ADMIN, namespace: str | None = None) -> Path:
        token = self.add_user(user)
        return kubeconfig.write(path, self.url, token, user, self.ca_pem, namespace or self.namespace)

    # -- the backend-neutral face (trainer_sandbox.backends.Cluster) ------------------------------
    backend = "standin"
    namespace = "default"
    start_mark = 0  # a fresh server per test: its whole audit log is the test's
    serves_logs = True  # the simulated kubelet's lines (README: control surface)

    def grant(self, user: str, cluster_role: str = "cluster-admin") -> None:
        """The stand-in authorizes nothing: every user may do everything already."""

    def audit_mark(self) -> int:
        return len(self.audit.records)

    def audit_since(self, mark: int) -> builtins.list[AuditRecord]:
        return list(self.audit.records[mark:])

    def register_webhook_service(self, namespace: str, name: str, port: int, url: str) -> None:
        """Where a webhook's ``clientConfig.service`` (namespace, name, port) really listens."""
        self.webhooks.register_service(namespace, name, port, url)

    # -- in-process helpers (background-thread mode) ---------------------------------------------
    def _rt(self, api_version: str, kind: str) -> Any:
        rt = self.core.registry.for_kind(api_version, kind)
        if rt is None:
            raise APIError(404, "NotFound", f"no kind {kind!r} is registered for version {api_version!r}")
        return rt

    def create(self, obj: Obj, user: str = ADMIN) -> Obj:
        rt = self._rt(obj["apiVersion"], obj["kind"])
        ctx = self._ctx(user, "create", rt, obj.get("metadata", {}).get("namespace", "default"), "")

        async def go() -> Obj:
            return await self.core.call(ctx, lambda: self.core.create(ctx, obj))

        return clone(self.run(go()))

    def apply(self, obj: Obj, user: str = ADMIN, field_manager: str = "test", force: bool = True) -> Obj:
        """Server-side apply of ``obj`` (creates it when absent)."""
        rt = self._rt(obj["apiVersion"], obj["kind"])
        meta = obj.get("metadata", {})
        ctx = self._ctx(user, "patch", rt, meta.get("namespace", "default"), meta["name"])
        ctx.field_manager = field_manager
        body = json.dumps(obj).encode()

        async def go() -> Obj:
            return await self.core.call(ctx, lambda: self.core.patch(ctx, APPLY, body, force))

        return clone(self.run(go()))

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None, user: str = ADMIN
    ) -> Obj:
        rt = self._rt(api_version, kind)
        ctx = self._ctx(user, "get", rt, self.namespace if namespace is None else namespace, name)

        async def go() -> Obj:
            return await self.core.call(ctx, lambda: self.core.get(ctx))

        return clone(self.run(go()))

    def list(self, api_version: str, kind: str, namespace: str | None = None, user: str = ADMIN) -> list[Obj]:
        rt = self._rt(api_version, kind)
        ctx = self._ctx(user, "list", rt, namespace or "", "")

        async def go() -> list[Obj]:
            items, _, _ = await self.core.call(ctx, lambda: self.core.list(ctx, None))
            return items

        return clone(self.run(go()))

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        patch: Any,
        namespace: str | None = None,
        subresource: str = "",
        user: str = ADMIN,
    ) -> Obj:
        """A JSON merge patch."""
        rt = self._rt(api_version, kind)
        ctx = self._ctx(
            user, "patch", rt, self.namespace if namespace is None else namespace, name, subresource
        )
        body = json.dumps(patch).encode()

        async def go() -> Obj:
            return await self.core.call(ctx, lambda: self.core.patch(ctx, MERGE, body, False))

        return clone(self.run(go()))

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        user: str = ADMIN,
        propagation: str | None = None,
    ) -> None:
        rt = self._rt(api_version, kind)
        ctx = self._ctx(user, "delete", rt, self.namespace if namespace is None else namespace, name)
        options = {"propagationPolicy": propagation} if propagation else {}

        async def go() -> Obj:
            return await self.core.call(ctx, lambda: self.core.delete(ctx, options))

        self.run(go())

    def load(self, source: str | Path, user: str = ADMIN) -> ObjList:
        """Create every object of a YAML or JSON file (or string), CRDs first."""
        text = (
            Path(source).read_text() if isinstance(source, Path) or "\n" not in str(source) else str(source)
        )
        if str(source).endswith(".json") and "\n" not in str(source):
            docs = [json.loads(text)]
        else:
            docs = [d for d in yaml.safe_load_all(text) if d]
        docs.sort(key=lambda d: d.get("kind") != "CustomResourceDefinition")
        return [self.create(d, user) for d in docs]

    def idle(self, timeout: float = 10) -> None:
        """Wait until garbage collection has processed everything queued so far."""

        async def go() -> None:
            await asyncio.wait_for(self.gc.idle(), timeout)

        self.run(go(), timeout + 1)

    def _ctx(self, user: str, verb: str, rt: Any, namespace: str, name: str, subresource: str = "") -> Ctx:
        self.add_user(user)
        ctx = self.core.internal_ctx(user, verb, rt, namespace, name, subresource)
        ctx.internal = False  # a test acting as a client: faults apply as to any client
        ctx.user_agent = "local-apiserver-helper"
        ctx.field_manager = ""
        return ctx
