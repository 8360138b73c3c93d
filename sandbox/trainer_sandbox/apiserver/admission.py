"""Calling admission webhooks the way kube-apiserver does (AdmissionReview v1).

Mutating webhooks run first (in configuration-name order, each seeing the previous one's result),
then the server's schema and CEL validation, then validating webhooks. Matching follows the real
rules: operations, API groups and versions, resources (with ``*`` and ``pods/status`` forms),
scope, namespace and object selectors. ``failurePolicy`` decides whether an unreachable or broken
webhook fails the request; ``timeoutSeconds`` bounds each call; a webhook that may have side effects
refuses dry-run requests. ``service`` references resolve through a table the test fixture fills.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import uuid
from typing import Any

import aiohttp

from trainer.api.objects import Obj
from trainer_sandbox.apiserver import patching
from trainer_sandbox.apiserver.core import Core, Ctx, clone
from trainer_sandbox.apiserver.errors import APIError
from trainer_sandbox.apiserver.resources import ResourceType
from trainer_sandbox.apiserver.selectors import labels_match, selector_from_label_selector

MUTATING = ("admissionregistration.k8s.io", "mutatingwebhookconfigurations")
VALIDATING = ("admissionregistration.k8s.io", "validatingwebhookconfigurations")


class Webhooks:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.services: dict[tuple[str, str, int], str] = {}
        self._session: aiohttp.ClientSession | None = None

    def register_service(self, namespace: str, name: str, port: int, url: str) -> None:
        self.services[(namespace, name, port)] = url.rstrip("/")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _configs(self, key: tuple[str, str]) -> list[Obj]:
        return sorted(self.core.store.iter(key), key=lambda o: str(o["metadata"]["name"]))

    async def mutate(self, ctx: Ctx, rt: ResourceType, operation: str, obj: Obj, old: Obj | None) -> Obj:
        if not ctx.rt or (self.core.store.count(MUTATING) == 0):
            return obj
        for config in self._configs(MUTATING):
            for hook in config.get("webhooks") or []:
                if not self._matches(hook, ctx, rt, operation, obj, old):
                    continue
                response = await self._call(hook, ctx, rt, operation, obj, old, None)
                if response is None:
                    continue
                ctx.warnings.extend(response.get("warnings") or [])
                patch = response.get("patch")
                if patch:
                    ops = json.loads(base64.b64decode(patch))
                    obj = patching.json_patch(obj, ops)
        return obj

    async def validate(
        self,
        ctx: Ctx,
        rt: ResourceType,
        operation: str,
        obj: Obj | None,
        old: Obj | None,
        options: dict[str, Any] | None = None,
    ) -> None:
        if self.core.store.count(VALIDATING) == 0:
            return
        calls = []
        for config in self._configs(VALIDATING):
            for hook in config.get("webhooks") or []:
                if self._matches(hook, ctx, rt, operation, obj, old):
                    calls.append(self._call(hook, ctx, rt, operation, obj, old, options))
        # kube-apiserver calls validating webhooks in parallel; the first refusal wins.
        for response in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(response, BaseException):
                raise response
            if response is not None:
                ctx.warnings.extend(response.get("warnings") or [])

    # -- matching -------------------------------------------------------------------------------
    def _matches(
        self,
        hook: dict[str, Any],
        ctx: Ctx,
        rt: ResourceType,
        operation: str,
        obj: Obj | None,
        old: Obj | None,
    ) -> bool:
        resource = f"{rt.plural}/{ctx.subresource}" if ctx.subresource else rt.plural
        if not any(self._rule_matches(rule, rt, resource, operation) for rule in hook.get("rules") or []):
            return False
        ns_sel = selector_from_label_selector(hook.get("namespaceSelector"))
        if ns_sel and rt.namespaced:
            ns = self.core.store.get(("", "namespaces"), "", ctx.namespace)
            if not labels_match(ns_sel, (ns or {}).get("metadata", {}).get("labels")):
                return False
        if ns_sel and rt.plural == "namespaces" and not rt.group:
            target = obj or old or {}
            if not labels_match(ns_sel, target.get("metadata", {}).get("labels")):
                return False
        obj_sel = selector_from_label_selector(hook.get("objectSelector"))
        if obj_sel:
            candidates = [o for o in (obj, old) if o is not None]
            if not any(labels_match(obj_sel, o.get("metadata", {}).get("labels")) for o in candidates):
                return False
        return True

    @staticmethod
    def _rule_matches(rule: dict[str, Any], rt: ResourceType, resource: str, operation: str) -> bool:
        ops = rule.get("operations") or []
        if "*" not in ops and operation not in ops:
            return False
        groups = rule.get("apiGroups") or []
        if "*" not in groups and rt.group not in groups:
            return False
        versions = rule.get("apiVersions") or []
        if "*" not in versions and rt.version not in versions:
            return False
        scope = rule.get("scope", "*")
        if (scope == "Namespaced" and not rt.namespaced) or (scope == "Cluster" and rt.namespaced):
            return False
        main, _, sub = resource.partition("/")
        for pattern in rule.get("resources") or []:
            pmain, _, psub = pattern.partition("/")
            if pattern == "*/*":
                return True
            if pmain in ("*", main) and (psub == sub or (psub == "*" and sub)):
                return True
        return False

    # -- calling --------------------------------------------------------------------------------
    def _url(self, hook: dict[str, Any]) -> str:
        cc = hook.get("clientConfig") or {}
        if cc.get("url"):
            return str(cc["url"])
        svc = cc.get("service") or {}
        key = (svc.get("namespace", ""), svc.get("name", ""), int(svc.get("port", 443)))
        base = self.services.get(key)
        if base is None:
            raise ConnectionError(
                f'service "{key[1]}" in namespace "{key[0]}" port {key[2]} is not registered with the local'
                " API server (LocalAPIServer.register_webhook_service)"
            )
        return base + (svc.get("path") or "")

    def _ssl(self, hook: dict[str, Any]) -> ssl.SSLContext | bool:
        ca = (hook.get("clientConfig") or {}).get("caBundle")
        if not ca:
            return False if not self._url_is_https(hook) else ssl.create_default_context()
        context = ssl.create_default_context(cadata=base64.b64decode(ca).decode())
        context.check_hostname = False  # the table maps service names to local addresses
        return context

    def _url_is_https(self, hook: dict[str, Any]) -> bool:
        try:
            return self._url(hook).startswith("https:")
        except ConnectionError:
            return False

    def _review(
        self,
        ctx: Ctx,
        rt: ResourceType,
        operation: str,
        obj: Obj | None,
        old: Obj | None,
        options: dict[str, Any] | None,
    ) -> dict[str, Any]:
        kind = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        resource = {"group": rt.group, "version": rt.version, "resource": rt.plural}
        opts = options or {}
        options_kind = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}[
            operation
        ]
        request: dict[str, Any] = {
            "uid": str(uuid.uuid4()),
            "kind": kind,
            "resource": resource,
            "requestKind": kind,
            "requestResource": resource,
            "name": ctx.name,
            "operation": operation,
            "userInfo": {"username": ctx.user, "groups": ctx.groups or ["system:authenticated"]},
            "object": obj,
            "oldObject": old,
            "dryRun": ctx.dry_run,
            "options": {"kind": options_kind, "apiVersion": "meta.k8s.io/v1", **opts},
        }
        if ctx.subresource:
            request["subResource"] = ctx.subresource
        if rt.namespaced:
            request["namespace"] = ctx.namespace
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}

    async def _call(
        self,
        hook: dict[str, Any],
        ctx: Ctx,
        rt: ResourceType,
        operation: str,
        obj: Obj | None,
        old: Obj | None,
        options: dict[str, Any] | None,
    ) -> dict[str, Any] | None:
        name = hook.get("name", "")
        fail = hook.get("failurePolicy", "Fail") == "Fail"
        if ctx.dry_run and hook.get("sideEffects") not in ("None", "NoneOnDryRun"):
            raise APIError(400, "BadRequest", f'admission webhook "{name}" does not support dry run')
        review = self._review(ctx, rt, operation, clone(obj) if obj else None, old, options)
        timeout = float(hook.get("timeoutSeconds") or 10)
        try:
            url = self._url(hook)
            if self._session is None:
                self._session = aiohttp.ClientSession()
            async with self._session.post(
                url, json=review, ssl=self._ssl(hook), timeout=aiohttp.ClientTimeout(total=timeout)
            ) as resp:
                if resp.status != 200:
                    raise ConnectionError(f"expected response code 200, got {resp.status}")
                body = await resp.json(content_type=None)
            response = body.get("response") if isinstance(body, dict) else None
            if not isinstance(response, dict):
                raise ValueError("webhook response was absent")
            if response.get("uid") != review["request"]["uid"]:
                raise ValueError(
                    f"expected response.uid={review['request']['uid']!r}, got {response.get('uid')!r}"
                )
        except (aiohttp.ClientError, ConnectionError, ValueError, TimeoutError, ssl.SSLError) as err:
            if not fail:
                return None
            why = "context deadline exceeded" if isinstance(err, TimeoutError) else str(err)
            raise APIError(
                500, "InternalError", f'Internal error occurred: failed calling webhook "{name}": {why}'
            ) from None
        if not response.get("allowed"):
            status = dict(response.get("status") or {})
            code = int(status.get("code") or 0)
            if code < 400:
                code = 400
            deny = f'admission webhook "{name}" denied the request'
            if status.get("message"):
                message = f"{deny}: {status['message']}"
            elif status.get("reason"):
                message = f"{deny}: {status['reason']}"
            else:
                message = f"{deny} without explanation"
            raise APIError(code, str(status.get("reason") or ""), message, status.get("details"))
        return response
