"""HTTP: parse a Kubernetes API request, run it through ``Core``, render the answer."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any, Protocol

import yaml
from aiohttp import web

from trainer.api.objects import Obj
from trainer_sandbox.apiserver import discovery, errors, patching, protobuf, table
from trainer_sandbox.apiserver.core import Core, Ctx
from trainer_sandbox.apiserver.errors import APIError
from trainer_sandbox.apiserver.resources import ResourceType
from trainer_sandbox.apiserver.selectors import make_filter
from trainer_sandbox.apiserver.storage import Event

JSON = "application/json"
_PATCH_TYPES = (patching.MERGE, patching.JSON_PATCH, patching.STRATEGIC, patching.APPLY, patching.APPLY_CBOR)
# The media types of the body of a create, an update or a delete the stand-in reads for any kind.
_BODY_TYPES = (JSON, "application/yaml")


def _json_response(data: Any, status: int = 200, warnings: list[str] | None = None) -> web.Response:
    resp = web.Response(
        body=json.dumps(data, separators=(",", ":")).encode(), status=status, content_type=JSON
    )
    for w in warnings or []:
        resp.headers.add("Warning", f'299 - "{w}"')
    return resp


def _error_response(err: APIError) -> web.Response:
    resp = _json_response(err.status(), err.code)
    for k, v in err.headers.items():
        resp.headers[k] = v
    return resp


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


class Server(Protocol):
    """What the handlers use of the server that mounts them (``LocalAPIServer``): its core, its
    settings, its users' tokens, the container logs it serves, whether it is stopping, and its
    count of open watches, which they keep."""

    core: Core
    minor_version: int
    tokens: dict[str, tuple[str, list[str]]]
    watch_timeout: float
    bookmark_interval: float
    open_watches: int
    pod_logs: dict[tuple[str, str], list[str]]
    stopping: bool


class Handlers:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.core: Core = server.core

    # -- entry point -----------------------------------------------------------------------------
    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if path == "/version":
            return _json_response(discovery.version_info(self.server.minor_version))
        try:
            user, groups = self._authenticate(request)
        except APIError as err:
            return _error_response(err)
        ctx = Ctx(
            user=user,
            groups=groups,
            verb=request.method.lower(),
            rt=None,
            method=request.method,
            path=request.path_qs,
            content_type=request.headers.get("Content-Type", ""),
            user_agent=request.headers.get("User-Agent", ""),
        )
        try:
            if path.startswith("/api/") or path.startswith("/apis/"):
                parsed = self._parse_resource_path(path)
                if parsed is not None:
                    return await self._resource(request, ctx, *parsed)
            return await self.core.call(ctx, lambda: self._non_resource(request, path))
        except APIError as err:
            return _error_response(err)

    def _authenticate(self, request: web.Request) -> tuple[str, list[str]]:
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            found = self.server.tokens.get(header[len("Bearer ") :].strip())
            if found is not None:
                return found
        raise errors.unauthorized()

    async def _non_resource(self, request: web.Request, path: str) -> web.StreamResponse:
        if request.method != "GET":
            raise errors.method_not_allowed()
        registry = self.core.registry
        if path == "/api":
            return _json_response(discovery.api_versions(f"{request.host}"))
        if path == "/apis":
            return _json_response(discovery.api_group_list(registry))
        if path == "/api/v1":
            return _json_response(discovery.resource_list(registry, "", "v1"))
        parts = path.strip("/").split("/")
        if parts[0] == "apis" and len(parts) == 2:
            doc = discovery.api_group(registry, parts[1])
            if doc is not None:
                return _json_response(doc)
        if parts[0] == "apis" and len(parts) == 3:
            doc = discovery.resource_list(registry, parts[1], parts[2])
            if doc is not None:
                return _json_response(doc)
        if path == "/openapi/v3":
            return _json_response(discovery.openapi_root(registry, self.core.openapi_generation))
        if path.startswith("/openapi/v3/"):
            rest = path[len("/openapi/v3/") :].split("/")
            group, version = (
                ("", rest[1])
                if rest[0] == "api" and len(rest) == 2
                else ((rest[1], rest[2]) if rest[0] == "apis" and len(rest) == 3 else ("", ""))
            )
            doc = (
                discovery.openapi_gv(registry, group, version, f"v1.{self.server.minor_version}.0")
                if version
                else None
            )
            if doc is not None:
                return _json_response(doc)
        raise APIError(404, "NotFound", "the server could not find the requested resource")

    # -- resources -----------------------------------------------------------------------------
    def _parse_resource_path(self, path: str) -> tuple[str, str, list[str]] | None:
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 3:
            return "", parts[1], parts[2:]
        if parts[0] == "apis" and len(parts) >= 4:
            return parts[1], parts[2], parts[3:]
        return None

    async def _resource(
        self, request: web.Request, ctx: Ctx, group: str, version: str, rest: list[str]
    ) -> web.StreamResponse:
        namespace = ""
        if (
            rest[0] == "namespaces"
            and len(rest) >= 3
            and not (len(rest) == 3 and rest[2] in ("status", "finalize"))
        ):
            namespace, rest = rest[1], rest[2:]
        plural, name, sub = rest[0], rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else ""
        if len(rest) > 3:
            raise APIError(404, "NotFound", "the server could not find the requested resource")
        rt = self.core.registry.get(group, version, plural)
        q = request.query
        method = request.method
        if method == "GET":
            verb = "get" if name else ("watch" if _truthy(q.get("watch")) else "list")
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, "")
            if method == "DELETE":
                verb = "delete" if name else "deletecollection"
        ctx.verb = verb or method.lower()
        ctx.rt = rt
        ctx.namespace = namespace
        ctx.name = name
        ctx.subresource = sub
        if rt is None:
            return await self.core.call(ctx, self._not_found)
        if rt.namespaced is False and namespace:
            return await self.core.call(ctx, self._not_found)
        ctx.dry_run = "All" in q.getall("dryRun", [])
        ctx.field_manager = q.get("fieldManager", "")
        ctx.field_validation = q.get("fieldValidation", "Warn") or "Warn"
        if ctx.field_validation not in ("Strict", "Warn", "Ignore"):
            return _error_response(
                errors.bad_request(f"fieldValidation parameter unsupported: {ctx.field_validation}")
            )
        body = await request.read() if method in ("POST", "PUT", "PATCH", "DELETE") else b""
        if method == "PUT" or (method == "PATCH" and request.content_type != patching.APPLY):
            ctx.has_precondition = method == "PUT" or b'"resourceVersion"' in body
        if verb == "watch":
            return await self.core.call(ctx, lambda: self._watch(request, ctx, rt))
        if sub == "log" and plural == "pods" and not group:
            return await self.core.call(ctx, lambda: self._log(request, ctx))
        return await self.core.call(ctx, lambda: self._operate(request, ctx, rt, body))

    async def _not_found(self) -> web.StreamResponse:
        raise APIError(404, "NotFound", "the server could not find the requested resource")

    def _decode_body(self, request: web.Request, rt: ResourceType, body: bytes, delete: bool = False) -> Any:
        """The body of a create, an update or a delete: JSON, YAML, or, for built-in kinds (and
        a delete's DeleteOptions, of any kind), protobuf, as client-go sends them, with no JSON
        fallback on a 415. CBOR stays a 415, on which client-go falls back to JSON."""
        ctype = request.content_type
        if ctype == protobuf.CONTENT_TYPE and (rt.builtin or delete):
            if not body:
                return None
            try:
                decoded = protobuf.decode(body)
            except protobuf.UnsupportedKind as err:
                raise errors.unsupported_media_type(
                    f"{ctype}: the stand-in decodes protobuf bodies of the built-in kinds it serves, not {err}",
                    _BODY_TYPES,
                ) from None
            except protobuf.DecodeError as err:
                raise errors.bad_request(f"error decoding request body: {err}") from None
            if delete and decoded["kind"] != "DeleteOptions":
                raise errors.bad_request(f"a delete takes DeleteOptions, not {decoded['kind']}")
            return decoded
        if "protobuf" in ctype or "cbor" in ctype:
            raise errors.unsupported_media_type(
                ctype, (*_BODY_TYPES, protobuf.CONTENT_TYPE) if rt.builtin else _BODY_TYPES
            )
        if not body:
            return None
        try:
            if ctype in ("application/yaml", "application/x-yaml"):
                return yaml.safe_load(body.decode())
            return json.loads(body)
        except (ValueError, yaml.YAMLError) as err:
            raise errors.bad_request(f"error decoding request body: {err}") from None

    async def _operate(
        self, request: web.Request, ctx: Ctx, rt: ResourceType, body: bytes
    ) -> web.StreamResponse:
        q = request.query
        accept = request.headers.get("Accept", "")
        core = self.core
        if ctx.verb == "get":
            if ctx.subresource and not (ctx.subresource == "status" and rt.has_status):
                raise APIError(404, "NotFound", "the server could not find the requested resource")
            obj = await core.get(ctx)
            return self._render_one(rt, obj, accept)
        if ctx.verb == "list":
            predicate = make_filter(q.get("labelSelector"), q.get("fieldSelector"), rt.plural)
            limit = int(q.get("limit") or 0)
            items, rv, token = await core.list(ctx, predicate, limit, q.get("continue", ""))
            return self._render_list(rt, items, rv, token, accept, q.get("includeObject", ""))
        if ctx.verb == "create":
            if ctx.subresource:
                raise errors.method_not_allowed()
            obj = await core.create(ctx, self._decode_body(request, rt, body))
            return _json_response(obj, ctx.status, ctx.warnings)
        if ctx.verb == "update":
            obj = await core.update(ctx, self._decode_body(request, rt, body))
            return _json_response(obj, 200, ctx.warnings)
        if ctx.verb == "patch":
            ptype = request.content_type
            if ptype not in _PATCH_TYPES:
                raise errors.unsupported_media_type(ptype)
            obj = await core.patch(ctx, ptype, body, _truthy(q.get("force")))
            return _json_response(obj, ctx.status, ctx.warnings)
        if ctx.verb in ("delete", "deletecollection"):
            options = self._decode_body(request, rt, body, delete=True) or {}
            if not isinstance(options, dict):
                raise errors.bad_request("DeleteOptions must be an object")
            if q.get("propagationPolicy"):
                options["propagationPolicy"] = q["propagationPolicy"]
            if ctx.verb == "delete":
                obj = await core.delete(ctx, options)
                # An object deleted at once (or that a dry run would delete at once) is answered
                # with a Status for built-in kinds; one left to its finalizers is returned as is.
                if rt.builtin and not obj["metadata"].get("deletionTimestamp"):
                    meta = obj["metadata"]
                    return _json_response(
                        {
                            "kind": "Status",
                            "apiVersion": "v1",
                            "metadata": {},
                            "status": "Success",
                            "details": {
                                "name": ctx.name,
                                "group": rt.group,
                                "kind": rt.plural,
                                "uid": meta["uid"],
                            },
                        },
                        200,
                        ctx.warnings,
                    )
                return _json_response(obj, 200, ctx.warnings)
            predicate = make_filter(q.get("labelSelector"), q.get("fieldSelector"), rt.plural)
            items = await core.delete_collection(ctx, options, predicate)
            return _json_response(
                {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": {}, "items": items}
            )
        raise errors.method_not_allowed()

    def _render_one(self, rt: ResourceType, obj: Obj, accept: str) -> web.Response:
        if "as=Table" in accept:
            return _json_response(table.table(rt, [obj], obj["metadata"].get("resourceVersion", ""), ""))
        if "as=PartialObjectMetadata" in accept:
            return _json_response(_partial(obj))
        return _json_response(obj)

    def _render_list(
        self, rt: ResourceType, items: list[Obj], rv: str, token: str, accept: str, include: str
    ) -> web.Response:
        if "as=Table" in accept:
            doc = table.table(rt, items, rv, include)
            if token:
                doc["metadata"]["continue"] = token
            return _json_response(doc)
        meta: dict[str, Any] = {"resourceVersion": rv}
        if token:
            meta["continue"] = token
        if "as=PartialObjectMetadataList" in accept:
            return _json_response(
                {
                    "kind": "PartialObjectMetadataList",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": meta,
                    "items": [_partial(o) for o in items],
                }
            )
        return _json_response(
            {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta, "items": items}
        )

    # -- watch ---------------------------------------------------------------------------------
    async def _watch(self, request: web.Request, ctx: Ctx, rt: ResourceType) -> web.StreamResponse:
        q = request.query
        accept = request.headers.get("Accept", "")
        as_table = "as=Table" in accept
        predicate = make_filter(q.get("labelSelector"), q.get("fieldSelector"), rt.plural)
        namespace = ctx.namespace if rt.namespaced and ctx.namespace else None
        name_filter = ctx.name
        timeout = float(q.get("timeoutSeconds") or 0) or self.server.watch_timeout
        bookmarks = _truthy(q.get("allowWatchBookmarks"))
        send_initial = _truthy(q.get("sendInitialEvents"))
        rv_param = q.get("resourceVersion", "")
        store = self.core.store
        watcher = store.subscribe(rt.key)
        self.server.open_watches += 1
        resp = web.StreamResponse(status=200, headers={"Content-Type": JSON, "Transfer-Encoding": "chunked"})
        await resp.prepare(request)
        drop = (
            self.core.faults.draw(("drop-watch",), ctx.user, "watch", rt.plural)
            if self.core.faults.rules
            else None
        )
        expire = (
            self.core.faults.draw(("expire-watch",), ctx.user, "watch", rt.plural)
            if self.core.faults.rules
            else None
        )
        if ctx.record is not None and (drop or expire):
            ctx.record.fault = ",".join(rule.kind for rule in (drop, expire) if rule is not None)

        def visible(obj: Obj) -> bool:
            meta = obj["metadata"]
            if namespace is not None and meta.get("namespace") != namespace:
                return False
            if name_filter and meta.get("name") != name_filter:
                return False
            return predicate is None or predicate(obj)

        async def send(kind: str, obj: Obj) -> None:
            payload: Any = obj
            if as_table and kind != "ERROR" and kind != "BOOKMARK":
                payload = table.table(rt, [obj], obj["metadata"].get("resourceVersion", ""), "")
            elif kind != "ERROR" and kind != "BOOKMARK":
                payload = self.core.view(rt, obj)
            await resp.write(
                json.dumps({"type": kind, "object": payload}, separators=(",", ":")).encode() + b"\n"
            )

        def bookmark(extra: dict[str, str] | None = None) -> Obj:
            meta: dict[str, Any] = {"resourceVersion": str(store.rv)}
            if extra:
                meta["annotations"] = extra
            return {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}

        try:
            if expire is not None:
                await send("ERROR", errors.gone("too old resource version: injected fault").status())
                return resp
            start = store.rv
            if rv_param not in ("", "0"):
                try:
                    since = int(rv_param)
                except ValueError:
                    raise errors.bad_request(f"invalid resource version: {rv_param}") from None
                if store.too_old(rt.key, since):
                    await send(
                        "ERROR",
                        errors.gone(f"too old resource version: {since} ({store.rv})").status(),
                    )
                    return resp
                for ev in store.events_since(rt.key, since):
                    if ev.rv <= start:
                        await self._send_event(ev, visible, send)
            else:
                for obj in list(store.iter(rt.key, namespace)):
                    if visible(obj):
                        await send("ADDED", obj)
                if send_initial and bookmarks:
                    await send("BOOKMARK", bookmark({"k8s.io/initial-events-end": "true"}))
            deadline = time.monotonic() + timeout
            drop_at = time.monotonic() + drop.after if drop is not None else None
            interval = self.server.bookmark_interval
            while True:
                now = time.monotonic()
                limit = deadline
                if drop_at is not None:
                    limit = min(limit, drop_at)
                wait = limit - now
                if bookmarks:
                    wait = min(wait, interval)
                if wait <= 0:
                    break
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if bookmarks and time.monotonic() < limit:
                        await send("BOOKMARK", bookmark())
                    continue
                if item is None:
                    break
                if item.rv <= start:
                    continue
                await self._send_event(item, visible, send)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            store.unsubscribe(watcher)
            self.server.open_watches -= 1
        return resp

    @staticmethod
    async def _send_event(ev: Event, visible: Callable[[Obj], bool], send: Callable[[str, Obj], Any]) -> None:
        now_visible = visible(ev.obj)
        was_visible = ev.old is not None and visible(ev.old)
        if ev.type == "MODIFIED":
            if now_visible and was_visible:
                await send("MODIFIED", ev.obj)
            elif now_visible:
                await send("ADDED", ev.obj)
            elif was_visible:
                await send("DELETED", ev.obj)
        elif now_visible:
            await send(ev.type, ev.obj)

    # -- pod logs --------------------------------------------------------------------------------
    async def _log(self, request: web.Request, ctx: Ctx) -> web.StreamResponse:
        pods = self.core.registry.get("", "v1", "pods")
        assert pods is not None
        pod = self.core.store.get(pods.key, ctx.namespace, ctx.name)
        if pod is None:
            raise errors.not_found("pods", "", ctx.name)
        containers = [c["name"] for c in (pod.get("spec") or {}).get("containers") or []]
        container = request.query.get("container") or (containers[0] if len(containers) == 1 else "")
        if not container:
            raise errors.bad_request(
                f"a container name must be specified for pod {ctx.name}, choose one of: [{' '.join(containers)}]"
            )
        if container not in containers and container not in [
            c["name"] for c in (pod.get("spec") or {}).get("initContainers") or []
        ]:
            raise errors.bad_request(f"container {container} is not valid for pod {ctx.name}")
        uid = pod["metadata"]["uid"]
        tail = request.query.get("tailLines")
        follow = _truthy(request.query.get("follow"))
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        sent = 0
        while True:
            lines = self.server.pod_logs.get((uid, container), [])
            chunk = lines[sent:]
            if sent == 0 and tail:
                chunk = chunk[-int(tail) :] if int(tail) else []
            if chunk:
                await resp.write("".join(line + "\n" for line in chunk).encode())
            sent = len(lines)
            if not follow:
                break
            current = self.core.store.get(pods.key, ctx.namespace, ctx.name)
            if current is None or current["metadata"]["uid"] != uid:
                break
            if (current.get("status") or {}).get("phase") in ("Succeeded", "Failed") and sent == len(
                self.server.pod_logs.get((uid, container), [])
            ):
                break
            if self.server.stopping:
                break
            await asyncio.sleep(0.1)
        return resp


def _partial(obj: Obj) -> Obj:
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata", {}),
    }
