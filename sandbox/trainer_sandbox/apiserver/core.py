"""The API semantics: what a create, update, patch, delete, get or list does to stored state.

HTTP handlers and in-process callers (the simulated controllers, test helpers) both come through
``Core.call``, so every request is audited, subject to fault injection, admitted and validated the
same way. Everything runs on the server's event loop.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import secrets
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import yaml

from trainer.api.objects import Obj, ObjList
from trainer.apimachinery.errors import FieldError, GoValue, forbidden, invalid, required
from trainer_sandbox.apiserver import defaults, errors, patching, ssa, validation
from trainer_sandbox.apiserver.audit import AuditLog, AuditRecord
from trainer_sandbox.apiserver.errors import APIError
from trainer_sandbox.apiserver.faults import FaultRule, Faults
from trainer_sandbox.apiserver.resources import Registry, ResourceType
from trainer_sandbox.apiserver.storage import Key, Store

T = TypeVar("T")
ManagedFields = list[dict[str, Any]]

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
GC_USER = "system:serviceaccount:kube-system:generic-garbage-collector"
NAMESPACE_CONTROLLER_USER = "system:serviceaccount:kube-system:namespace-controller"


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def clone(obj: T) -> T:
    """A deep copy; JSON round trip is the fastest one for JSON-shaped data."""
    result: T = json.loads(json.dumps(obj))
    return result


_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"


def generate_suffix() -> str:
    return "".join(secrets.choice(_NAME_CHARS) for _ in range(5))


@dataclass
class Ctx:
    """One request: who, what, where, and the options that change how it is handled."""

    user: str
    verb: str
    rt: ResourceType | None
    namespace: str = ""
    name: str = ""
    subresource: str = ""
    groups: list[str] = field(default_factory=list)
    method: str = ""
    path: str = ""
    content_type: str = ""
    user_agent: str = ""
    dry_run: bool = False
    field_manager: str = ""
    field_validation: str = "Warn"
    internal: bool = False
    has_precondition: bool = False
    warnings: list[str] = field(default_factory=list)
    mutated: bool = False
    status: int = 200
    record: AuditRecord | None = None  # this request's audit record, once the request is running


class Core:
    def __init__(self, faults: Faults, audit: AuditLog, history_size: int = 5000) -> None:
        self.registry = Registry()
        self.store = Store(history_size)
        self.faults = faults
        self.audit = audit
        self.openapi_generation = 1
        self.webhooks: Any = None  # admission.Webhooks, set by the server
        # Simulated defaulting webhooks, called on CREATE only, as JobSet registers its own.
        self.mutators: dict[Key, Callable[[Obj], None]] = {}
        self.validators: dict[
            Key, Callable[[Obj, Obj | None], list[FieldError]]
        ] = {}  # simulated validating ones
        for ns in SYSTEM_NAMESPACES:
            self._store_new(self.registry.get("", "v1", "namespaces"), self._namespace_obj(ns))  # type: ignore[arg-type]

    # -- request wrapper -----------------------------------------------------------------------
    async def call(self, ctx: Ctx, op: Callable[[], Awaitable[T]]) -> T:
        """Run one request: faults before, the operation, faults after, and its audit record."""
        rt = ctx.rt
        resource = rt.plural if rt else ""
        record = AuditRecord(
            user=ctx.user,
            verb=ctx.verb,
            group=rt.group if rt else "",
            version=rt.version if rt else "",
            resource=resource,
            subresource=ctx.subresource,
            namespace=ctx.namespace,
            name=ctx.name,
            method=ctx.method,
            path=ctx.path,
            content_type=ctx.content_type,
            user_agent=ctx.user_agent,
        )
        self.audit.add(record)
        ctx.record = record
        try:
            await self._faults_before(ctx, resource, record)
            result = await op()
            record.status = ctx.status
            if ctx.mutated and self._fault(ctx, ("500-after",), resource, record):
                raise errors.internal("the server was unable to return a response in the time allotted")
            return result
        except APIError as err:
            record.status = err.code
            raise
        except Exception as err:  # an unexpected failure is still an answer a client can read
            record.status = 500
            raise errors.internal(repr(err)) from err
        finally:
            record.mutated = ctx.mutated
            record.name = ctx.name or record.name  # a create learns its name from the body
            record.namespace = ctx.namespace or record.namespace

    def _fault(
        self, ctx: Ctx, kinds: tuple[str, ...], resource: str, record: AuditRecord
    ) -> FaultRule | None:
        """The injected fault for this request, if one fires; internal callers are exempt unless named."""
        if not self.faults.rules:
            return None
        rule = self.faults.draw(kinds, ctx.user, ctx.verb, resource)
        if rule is None:
            return None
        if ctx.internal and (rule.users is None or ctx.user not in rule.users):
            rule.fired -= 1
            return None
        record.fault = rule.kind
        return rule

    async def _faults_before(self, ctx: Ctx, resource: str, record: AuditRecord) -> None:
        if not self.faults.rules:
            return
        rule = self._fault(ctx, ("latency",), resource, record)
        if rule is not None:
            await asyncio.sleep(rule.latency)
        rule = self._fault(ctx, ("429",), resource, record)
        if rule is not None:
            raise errors.too_many_requests(rule.retry_after)
        if self._fault(ctx, ("500",), resource, record):
            raise errors.internal("injected fault")
        if ctx.has_precondition and self._fault(ctx, ("409",), resource, record):
            raise errors.conflict(resource, record.group, ctx.name)

    # -- helpers -------------------------------------------------------------------------------
    def _namespace_obj(self, name: str) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }

    def _store_new(self, rt: ResourceType, obj: Obj) -> Obj:
        meta = obj["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now())
        if rt.has_generation:
            meta["generation"] = 1
        meta["resourceVersion"] = str(self.store.next_rv())
        self.store.put(rt.key, obj, None)
        return obj

    def resource(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self.registry.get(group, version, plural)
        if rt is None:
            raise APIError(404, "NotFound", "the server could not find the requested resource")
        return rt

    def view(self, rt: ResourceType, obj: Obj) -> Obj:
        """The stored object as seen through ``rt``'s version (CRD versions share storage)."""
        if obj.get("apiVersion") == rt.api_version:
            return obj
        out = dict(obj)
        out["apiVersion"] = rt.api_version
        return out

    def _existing(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        obj = self.store.get(rt.key, namespace if rt.namespaced else "", name)
        if obj is None:
            raise errors.not_found(rt.plural, rt.group, name)
        return obj

    def _check_namespace(self, rt: ResourceType, namespace: str, name: str) -> None:
        """A namespaced create needs its namespace, and one that is not being terminated.

        The refusal names the object, as NamespaceLifecycle admission does, so a client can tell
        which of its creates was refused.
        """
        if not rt.namespaced:
            return
        ns = self.store.get(("", "namespaces"), "", namespace)
        if ns is None:
            raise errors.not_found("namespaces", "", namespace)
        if ns["metadata"].get("deletionTimestamp"):
            err = errors.forbidden(
                rt.plural,
                rt.group,
                name,
                f"unable to create new content in namespace {namespace} because it is being terminated",
            )
            assert err.details is not None
            err.details["causes"] = [
                {
                    "reason": "NamespaceTerminating",
                    "message": f"namespace {namespace} is being terminated",
                    "field": "metadata.namespace",
                }
            ]
            raise err

    def _manager(self, ctx: Ctx) -> str:
        return ctx.field_manager or ssa.manager_from_user_agent(ctx.user_agent)

    @staticmethod
    def _scope(rt: ResourceType, subresource: str) -> str:
        if subresource == "status":
            return "status"
        return "main" if rt.has_status else "all"

    # -- reads ---------------------------------------------------------------------------------
    async def get(self, ctx: Ctx) -> Obj:
        assert ctx.rt is not None
        return self.view(ctx.rt, self._existing(ctx.rt, ctx.namespace, ctx.name))

    async def list(
        self,
        ctx: Ctx,
        predicate: Callable[[Obj], bool] | None,
        limit: int = 0,
        continue_token: str = "",
    ) -> tuple[list[Obj], str, str]:
        """(items, list resourceVersion, continue token)."""
        rt = ctx.rt
        assert rt is not None
        ns = ctx.namespace if rt.namespaced and ctx.namespace else None
        items = [o for o in self.store.iter(rt.key, ns) if predicate is None or predicate(o)]
        rv = str(self.store.rv)
        token = ""
        if limit or continue_token:
            items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
            if continue_token:
                try:
                    state = json.loads(bytes.fromhex(continue_token))
                except ValueError:
                    raise errors.bad_request("invalid continue token") from None
                after = tuple(state["after"])
                rv = state["rv"]
                items = [
                    o for o in items if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > after
                ]
            if limit and len(items) > limit:
                last = items[limit - 1]["metadata"]
                token = (
                    json.dumps({"rv": rv, "after": [last.get("namespace", ""), last["name"]]}).encode().hex()
                )
                items = items[:limit]
        return [self.view(rt, o) for o in items], rv, token

    # -- create --------------------------------------------------------------------------------
    async def create(self, ctx: Ctx, body: Obj, managed_fields: ManagedFields | None = None) -> Obj:
        rt = ctx.rt
        assert rt is not None
        if ctx.subresource:
            raise errors.method_not_allowed()
        obj = self._decode(rt, body)
        meta = obj.setdefault("metadata", {})
        if rt.namespaced:
            body_ns = meta.get("namespace")
            if body_ns and ctx.namespace and body_ns != ctx.namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = ctx.namespace or body_ns or "default"
            ctx.namespace = meta["namespace"]
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + generate_suffix()
        ctx.name = meta.get("name", "")
        self._check_namespace(rt, ctx.namespace, ctx.name)
        for k in ("uid", "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            meta.pop(k, None)
        meta["creationTimestamp"] = now()
        if rt.has_generation:
            meta["generation"] = 1
        else:
            meta.pop("generation", None)
        if rt.has_status:
            obj.pop("status", None)
            if rt.plural == "pods" and not rt.group:
                obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
            if rt.plural == "namespaces":
                obj["status"] = {"phase": "Active"}
        if rt.plural == "namespaces" and not rt.group:
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta.get("name", "")
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj = await self._admit(ctx, rt, obj, None, "CREATE")
        meta = obj["metadata"]
        if self.store.get(rt.key, meta.get("namespace", ""), meta["name"]) is not None:
            raise errors.already_exists(rt.plural, rt.group, meta["name"])
        managed_in = meta.pop("managedFields", None)
        if managed_fields is not None:
            meta["managedFields"] = managed_fields
        elif managed_in and managed_in != [{}]:
            meta["managedFields"] = managed_in
        else:
            meta["managedFields"] = ssa.record_update(
                None, obj, rt.view, self._manager(ctx), "", self._scope(rt, ""), rt.api_version, now()
            )
        if not meta["managedFields"]:
            meta.pop("managedFields")
        ctx.status = 201
        if ctx.dry_run:
            return self.view(rt, obj)
        self._before_store(rt, obj, None)
        meta["resourceVersion"] = str(self.store.next_rv())
        obj["apiVersion"] = (rt.storage_version and f"{rt.group}/{rt.storage_version}") or rt.api_version
        self.store.put(rt.key, obj, None)
        ctx.mutated = True
        return self.view(rt, obj)

    def _decode(self, rt: ResourceType, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise errors.bad_request("the request body must be a JSON object")
        obj = clone(body)
        kind = obj.get("kind")
        api_version = obj.get("apiVersion")
        if kind and kind != rt.kind:
            raise errors.bad_request(
                f"the API version in the data ({api_version}) does not match the expected API version"
                f" ({rt.api_version})"
                if api_version != rt.api_version
                else f"kind {kind} does not match the expected kind {rt.kind}"
            )
        if (
            api_version
            and api_version != rt.api_version
            and not (rt.group == "" and api_version == rt.version)
        ):
            raise errors.bad_request(
                f"the API version in the data ({api_version}) does not match the expected API version"
                f" ({rt.api_version})"
            )
        obj["kind"] = rt.kind
        obj["apiVersion"] = rt.api_version
        if not isinstance(obj.get("metadata", {}), dict):
            raise errors.bad_request("metadata must be an object")
        return obj

    async def _admit(self, ctx: Ctx, rt: ResourceType, obj: Obj, old: Obj | None, operation: str) -> Obj:
        """Decode-time defaults, mutating webhooks, schema and CEL, validating webhooks."""
        builtin_errors: list[FieldError] | None = None
        if rt.builtin:
            # A /status write changes only status: the rest was checked when it was written.
            checked = {"status": obj.get("status")} if ctx.subresource == "status" else obj
            builtin_errors = validation.check_builtin_decoding(
                rt, checked, ctx.field_validation, ctx.warnings
            )
            defaults.apply(rt.plural, rt.group, obj)
        else:
            validation.default_and_prune(rt, obj, ctx.field_validation, ctx.warnings)
        if self.webhooks is not None:
            mutated = await self.webhooks.mutate(ctx, rt, operation, obj, old)
            if mutated is not obj:
                obj, builtin_errors = mutated, None  # a webhook's patch is checked again
        mutator = self.mutators.get(rt.key)
        if mutator is not None and operation == "CREATE":
            mutator(obj)
        if not rt.builtin:
            validation.default_and_prune(rt, obj, "Ignore", [])
        if operation == "CREATE":
            self._prepare_for_create(rt, obj)
        validation.validate(rt, obj, old, builtin_errors)
        validator = self.validators.get(rt.key)
        if validator is not None and ctx.subresource != "status":
            field_errors = validator(obj, old)
            if field_errors:
                raise errors.invalid(rt.kind, rt.group, obj["metadata"].get("name", ""), field_errors)
        if rt.plural == "customresourcedefinitions":
            self._validate_crd(obj)
        if self.webhooks is not None:
            await self.webhooks.validate(ctx, rt, operation, obj, old)
        return obj

    @staticmethod
    def _prepare_for_create(rt: ResourceType, obj: Obj) -> None:
        """What the registry does between mutating admission and validation: the uid, then what
        a kind derives from it (a Job's generated selector), so validation and the validating
        webhooks see both, as on a real server."""
        obj["metadata"]["uid"] = str(uuid.uuid4())
        if rt.builtin:
            defaults.prepare_for_create(rt.plural, rt.group, obj)

    # -- update / patch --------------------------------------------------------------------------
    async def update(self, ctx: Ctx, body: Obj) -> Obj:
        rt = ctx.rt
        assert rt is not None
        self._check_subresource(rt, ctx.subresource)
        old = self._existing(rt, ctx.namespace, ctx.name)
        new = self._decode(rt, body)
        meta = new.setdefault("metadata", {})
        if meta.get("name") and meta["name"] != ctx.name:
            raise errors.bad_request("the name of the object does not match the name on the URL")
        rv = meta.get("resourceVersion")
        if not rv and not rt.builtin:
            # Custom resources do not allow unconditional updates (the apiextensions registry
            # says so); the value is Go's %#v of the missing uint64.
            raise errors.invalid(
                rt.kind,
                rt.group,
                ctx.name,
                [invalid("metadata.resourceVersion", GoValue("0x0"), "must be specified for an update")],
            )
        if not rv:
            raise APIError(
                422,
                "Invalid",
                f'{rt.kind}.{rt.group or "core"} "{ctx.name}" is invalid: metadata.resourceVersion: Invalid value:'
                " 0: must be specified for an update",
            )
        if rv != old["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.plural, rt.group, ctx.name)
        return await self._save(ctx, rt, old, new)

    def _check_subresource(self, rt: ResourceType, subresource: str) -> None:
        if subresource and not (subresource == "status" and rt.has_status):
            raise APIError(404, "NotFound", "the server could not find the requested resource")

    async def patch(self, ctx: Ctx, patch_type: str, body: bytes, force: bool) -> Obj:
        rt = ctx.rt
        assert rt is not None
        self._check_subresource(rt, ctx.subresource)
        ns = ctx.namespace if rt.namespaced else ""
        old = self.store.get(rt.key, ns, ctx.name)
        if patch_type in (patching.APPLY, patching.APPLY_CBOR):
            return await self._apply(ctx, rt, old, body, force)
        if old is None:
            raise errors.not_found(rt.plural, rt.group, ctx.name)
        current = self.view(rt, old)
        try:
            doc = json.loads(body or b"null")
        except ValueError as err:
            raise errors.bad_request(f"error decoding patch: {err}") from None
        if patch_type == patching.MERGE:
            new = patching.merge_patch(current, doc)
        elif patch_type == patching.JSON_PATCH:
            new = patching.json_patch(current, doc)
        elif patch_type == patching.STRATEGIC:
            if not rt.builtin:
                raise errors.unsupported_media_type(patch_type)
            new = patching.strategic_merge_patch(current, doc, rt.api_version, rt.kind)
        else:
            raise errors.unsupported_media_type(patch_type)
        if not isinstance(new, dict):
            raise errors.bad_request("the patch did not produce an object")
        new = clone(new)
        meta = new.setdefault("metadata", {})
        if (
            isinstance(doc, dict)
            and isinstance(doc.get("metadata"), dict)
            and doc["metadata"].get("resourceVersion")
        ) and doc["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.plural, rt.group, ctx.name)
        meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        if meta.get("name") != ctx.name:
            raise errors.bad_request("the name of the object does not match the name on the URL")
        new = self._decode(rt, new)
        return await self._save(ctx, rt, old, new)

    async def _apply(self, ctx: Ctx, rt: ResourceType, old: Obj | None, body: bytes, force: bool) -> Obj:
        if not ctx.field_manager:
            raise errors.bad_request("PATCH, application/apply-patch+yaml requires fieldManager")
        try:
            config = yaml.safe_load(body.decode() or "null")
        except (yaml.YAMLError, UnicodeDecodeError) as err:
            raise errors.bad_request(f"error decoding YAML: {err}") from None
        if not isinstance(config, dict):
            raise errors.bad_request("the apply configuration must be an object")
        config = json.loads(json.dumps(config, default=str))
        if config.get("kind") != rt.kind or config.get("apiVersion") not in (rt.api_version,):
            raise errors.bad_request(
                f"the API version in the data ({config.get('apiVersion')}) does not match the expected API"
                f" version ({rt.api_version})"
                if config.get("apiVersion") != rt.api_version
                else "apply patches must specify kind and apiVersion"
            )
        cmeta = config.get("metadata") or {}
        if cmeta.get("name") and cmeta["name"] != ctx.name:
            raise errors.bad_request("the name of the object does not match the name on the URL")
        rv = cmeta.get("resourceVersion")
        if rv and old is not None and rv != old["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.plural, rt.group, ctx.name)
        scope = self._scope(rt, ctx.subresource)
        if old is None:
            if ctx.subresource:
                raise errors.not_found(rt.plural, rt.group, ctx.name)
            # Apply to an absent object creates it, owned by the applier.
            obj, managed = ssa.apply(
                None, config, rt.view, ctx.field_manager, force, "", scope, rt.api_version, now()
            )
            obj.setdefault("metadata", {})["name"] = ctx.name
            return await self.create(ctx, obj, managed_fields=managed)
        live = clone(self.view(rt, old))
        merged, managed = ssa.apply(
            live, config, rt.view, ctx.field_manager, force, ctx.subresource, scope, rt.api_version, now()
        )
        merged.setdefault("metadata", {})["managedFields"] = managed
        merged["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        return await self._save(ctx, rt, old, self._decode(rt, merged), managed_fields=managed)

    async def _save(
        self,
        ctx: Ctx,
        rt: ResourceType,
        old: Obj,
        new: Obj,
        managed_fields: ManagedFields | None = None,
    ) -> Obj:
        """The common end of update and patch: keep what the endpoint may not change, admit, store."""
        ometa = old["metadata"]
        meta = new.setdefault("metadata", {})
        for k in (
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ):
            if k in ometa:
                meta[k] = ometa[k]
            else:
                meta.pop(k, None)
        meta["name"] = ometa["name"]
        if rt.namespaced:
            meta["namespace"] = ometa["namespace"]
        else:
            meta.pop("namespace", None)
        if ctx.subresource == "status":
            # /status changes only status (and managedFields).
            status = new.get("status")
            keep_managed = meta.get("managedFields")
            new = clone(self.view(rt, old))
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
            if keep_managed is not None:
                new["metadata"]["managedFields"] = keep_managed
            meta = new["metadata"]
        elif rt.has_status:
            if "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)
        if ometa.get("deletionTimestamp"):
            self._check_no_new_finalizers(rt, ctx.name, meta, ometa)
        new = await self._admit(ctx, rt, new, self.view(rt, old), "UPDATE")
        meta = new["metadata"]
        if managed_fields is not None:
            meta["managedFields"] = managed_fields
        else:
            sent = meta.get("managedFields")
            if sent and sent != ometa.get("managedFields") and sent != [{}]:
                meta["managedFields"] = sent
            else:
                base = dict(old)
                base["metadata"] = {
                    **ometa,
                    "managedFields": [] if sent == [{}] else ometa.get("managedFields"),
                }
                meta["managedFields"] = ssa.record_update(
                    base,
                    new,
                    rt.view,
                    self._manager(ctx),
                    ctx.subresource,
                    self._scope(rt, ctx.subresource),
                    rt.api_version,
                    now(),
                )
        if not meta.get("managedFields"):
            meta.pop("managedFields", None)
        if rt.has_generation and _spec_changed(old, new):
            meta["generation"] = int(ometa.get("generation", 1)) + 1
        if _same(old, new, rt):
            return self.view(rt, old)
        if ctx.dry_run:
            return self.view(rt, new)
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and not _ns_finalizers(rt, new):
            meta["resourceVersion"] = str(self.store.next_rv())
            self._remove(rt, new, old)
            ctx.mutated = True
            return self.view(rt, new)
        self._before_store(rt, new, old)
        meta["resourceVersion"] = str(self.store.next_rv())
        new["apiVersion"] = old["apiVersion"]
        self.store.put(rt.key, new, old)
        ctx.mutated = True
        return self.view(rt, new)

    @staticmethod
    def _check_no_new_finalizers(rt: ResourceType, name: str, meta: Obj, ometa: Obj) -> None:
        """Finalizers may only be removed from an object being deleted, never added: a validation
        error (422 Invalid, as ValidateObjectMetaUpdate reports it), not an authorization one."""
        added = sorted(set(meta.get("finalizers") or []) - set(ometa.get("finalizers") or []))
        if added:
            found = "[]string{" + ", ".join(json.dumps(f) for f in added) + "}"
            raise errors.invalid(
                rt.kind,
                rt.group,
                name,
                [
                    forbidden(
                        "metadata.finalizers",
                        "no new finalizers can be added if the object is being deleted, found new"
                        f" finalizers {found}",
                    )
                ],
            )

    # -- delete --------------------------------------------------------------------------------
    async def delete(self, ctx: Ctx, options: dict[str, Any]) -> Obj:
        rt = ctx.rt
        assert rt is not None
        if ctx.subresource:
            raise errors.method_not_allowed()
        if dry_run_requested(options):
            ctx.dry_run = True
        old = self._existing(rt, ctx.namespace, ctx.name)
        pre = options.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != old["metadata"]["uid"]:
            raise errors.conflict(
                rt.plural,
                rt.group,
                ctx.name,
                f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {old['metadata']['uid']}",
            )
        if pre.get("resourceVersion") and pre["resourceVersion"] != old["metadata"]["resourceVersion"]:
            raise errors.conflict(
                rt.plural,
                rt.group,
                ctx.name,
                f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, ResourceVersion"
                f" in object meta: {old['metadata']['resourceVersion']}",
            )
        if self.webhooks is not None:
            await self.webhooks.validate(ctx, rt, "DELETE", None, self.view(rt, old), options)
        policy = options.get("propagationPolicy")
        if policy is None and options.get("orphanDependents") is not None:
            policy = "Orphan" if options["orphanDependents"] else "Background"
        if policy is None:
            policy = "Orphan" if (rt.group, rt.plural) == ("batch", "jobs") else "Background"
        new = clone(old)
        meta = new["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        has_dependents = bool(self.store.dependents(meta["uid"]))
        if policy == "Orphan" and has_dependents and "orphan" not in finalizers:
            finalizers.append("orphan")
        if policy == "Foreground" and has_dependents and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
        if finalizers or _ns_finalizers(rt, new):
            if meta.get("deletionTimestamp") and finalizers == (meta.get("finalizers") or []):
                return self.view(rt, old)  # already being deleted
            meta["finalizers"] = finalizers
            meta.setdefault("deletionTimestamp", now())
            meta.setdefault("deletionGracePeriodSeconds", 0)
            if rt.plural == "namespaces" and not rt.group:
                new.setdefault("status", {})["phase"] = "Terminating"
            if ctx.dry_run:
                return self.view(rt, new)
            meta["resourceVersion"] = str(self.store.next_rv())
            self.store.put(rt.key, new, old)
            ctx.mutated = True
            return self.view(rt, new)
        if ctx.dry_run:
            return self.view(rt, old)
        meta["resourceVersion"] = str(self.store.next_rv())
        self._remove(rt, new, old)
        ctx.mutated = True
        return self.view(rt, new)

    def _remove(self, rt: ResourceType, obj: Obj, old: Obj) -> None:
        if rt.plural == "customresourcedefinitions":
            self._unregister_crd(obj)
        self.store.remove(rt.key, obj, old)

    async def delete_collection(
        self, ctx: Ctx, options: dict[str, Any], predicate: Callable[[Obj], bool] | None
    ) -> ObjList:
        rt = ctx.rt
        assert rt is not None
        if dry_run_requested(options):
            ctx.dry_run = True
        ns = ctx.namespace if rt.namespaced and ctx.namespace else None
        out = []
        for obj in list(self.store.iter(rt.key, ns)):
            if predicate is not None and not predicate(obj):
                continue
            meta = obj["metadata"]
            sub = Ctx(
                user=ctx.user,
                verb="delete",
                rt=rt,
                namespace=meta.get("namespace", ""),
                name=meta["name"],
                groups=ctx.groups,
                dry_run=ctx.dry_run,
                internal=True,
            )
            out.append(await self.delete(sub, options))
            ctx.mutated = ctx.mutated or sub.mutated
        return out

    # -- hooks around storage --------------------------------------------------------------------
    def _before_store(self, rt: ResourceType, obj: Obj, old: Obj | None) -> None:
        if rt.plural == "customresourcedefinitions" and rt.group == "apiextensions.k8s.io":
            self._register_crd(obj)

    # -- CRDs ----------------------------------------------------------------------------------
    def _validate_crd(self, crd: Obj) -> None:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        group = spec.get("group", "")
        errs = []
        if not names.get("plural"):
            errs.append(required("spec.names.plural", ""))
        if not names.get("kind"):
            errs.append(required("spec.names.kind", ""))
        expected = f"{names.get('plural')}.{group}"
        if crd["metadata"].get("name") != expected:
            errs.append(
                invalid(
                    "metadata.name", crd["metadata"].get("name"), 'must be spec.names.plural+"."+spec.group'
                )
            )
        versions = spec.get("versions") or []
        if not versions:
            errs.append(required("spec.versions", "must have exactly one version marked as storage version"))
        elif sum(1 for v in versions if v.get("storage")) != 1:
            errs.append(
                invalid("spec.versions", versions, "must have exactly one version marked as storage version")
            )
        if errs:
            raise errors.invalid(
                "CustomResourceDefinition", "apiextensions.k8s.io", crd["metadata"].get("name", ""), errs
            )

    def _register_crd(self, crd: Obj) -> None:
        spec = crd["spec"]
        names = spec["names"]
        group = spec["group"]
        name = crd["metadata"]["name"]
        storage = next(v["name"] for v in spec["versions"] if v.get("storage"))
        self.registry.remove_crd(name)
        for v in spec["versions"]:
            if not v.get("served", True):
                continue
            schema = ((v.get("schema") or {}).get("openAPIV3Schema")) or {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
            }
            self.registry.add(
                ResourceType(
                    group=group,
                    version=v["name"],
                    plural=names["plural"],
                    singular=names.get("singular") or names["kind"].lower(),
                    kind=names["kind"],
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    short_names=list(names.get("shortNames") or []),
                    categories=list(names.get("categories") or []),
                    has_status="status" in (v.get("subresources") or {}),
                    builtin=False,
                    crd_schema=schema,
                    printer_columns=list(v.get("additionalPrinterColumns") or []),
                    crd_name=name,
                    storage_version=storage,
                )
            )
        ts = (crd.get("status") or {}).get("conditions") or []
        when = {c.get("type"): c.get("lastTransitionTime") for c in ts}
        stored = list((crd.get("status") or {}).get("storedVersions") or [])
        if storage not in stored:
            stored.append(storage)
        crd["status"] = {
            "acceptedNames": {
                k: names[k]
                for k in ("plural", "singular", "kind", "listKind", "shortNames", "categories")
                if names.get(k)
            },
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                    "lastTransitionTime": when.get("NamesAccepted") or now(),
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                    "lastTransitionTime": when.get("Established") or now(),
                },
            ],
            "storedVersions": stored,
        }
        crd["status"]["acceptedNames"].setdefault("singular", names["kind"].lower())
        crd["status"]["acceptedNames"].setdefault("listKind", names["kind"] + "List")
        self.openapi_generation += 1

    def _unregister_crd(self, crd: Obj) -> None:
        """Deleting a CRD deletes its objects (each with a DELETED event), then the kind."""
        gone = self.registry.remove_crd(crd["metadata"]["name"])
        if gone:
            key = gone[0].key
            for obj in list(self.store.iter(key)):
                final = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.store.next_rv())}}
                self.store.remove(key, final, obj)
        self.openapi_generation += 1

    # -- in-process conveniences -------------------------------------------------------------------
    async def internal_patch(
        self,
        user: str,
        key: Key,
        namespace: str,
        name: str,
        patch: Any,
        subresource: str = "",
        patch_type: str = patching.MERGE,
    ) -> Obj | None:
        """A write by a simulated controller, audited under its user; ``None`` if the object is gone."""
        rt = self.registry.for_key(key)
        if rt is None:
            return None
        ctx = self.internal_ctx(user, "patch", rt, namespace, name, subresource)
        ctx.content_type = patch_type
        body = json.dumps(patch).encode()
        try:
            return await self.call(ctx, lambda: self.patch(ctx, patch_type, body, False))
        except APIError as err:
            if err.code == 404:
                return None
            raise

    async def internal_delete(
        self,
        user: str,
        key: Key,
        namespace: str,
        name: str,
        policy: str = "Background",
        uid: str | None = None,
    ) -> None:
        rt = self.registry.for_key(key)
        if rt is None:
            return
        ctx = self.internal_ctx(user, "delete", rt, namespace, name)
        options: dict[str, Any] = {"propagationPolicy": policy}
        if uid:
            options["preconditions"] = {"uid": uid}
        try:
            await self.call(ctx, lambda: self.delete(ctx, options))
        except APIError as err:
            if err.code not in (404, 409):
                raise

    async def internal_create(self, user: str, obj: Obj) -> Obj:
        rt = self.registry.for_kind(obj["apiVersion"], obj["kind"])
        if rt is None:
            raise errors.not_found("", "", obj["kind"])
        ctx = self.internal_ctx(user, "create", rt, obj["metadata"].get("namespace", ""))
        return await self.call(ctx, lambda: self.create(ctx, obj))

    def internal_ctx(
        self,
        user: str,
        verb: str,
        rt: ResourceType,
        namespace: str = "",
        name: str = "",
        subresource: str = "",
        field_manager: str = "",
    ) -> Ctx:
        method = {"create": "POST", "update": "PUT", "patch": "PATCH", "delete": "DELETE"}.get(verb, "GET")
        return Ctx(
            user=user,
            verb=verb,
            rt=rt,
            namespace=namespace if rt.namespaced else "",
            name=name,
            subresource=subresource,
            method=method,
            internal=True,
            user_agent=user,
            field_manager=field_manager or user.rsplit(":", 1)[-1],
        )


def dry_run_requested(options: dict[str, Any]) -> bool:
    """Whether DeleteOptions ask for a dry run: kubectl ``delete --dry-run=server`` sends
    ``dryRun: ["All"]`` in the body, not in the query."""
    value = options.get("dryRun")
    return isinstance(value, list) and "All" in value


def _ns_finalizers(rt: ResourceType, obj: Obj) -> bool:
    return rt.plural == "namespaces" and not rt.group and bool((obj.get("spec") or {}).get("finalizers"))


def _body(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _spec_changed(old: Obj, new: Obj) -> bool:
    return _body(old) != _body(new)


def _same(old: Obj, new: Obj, rt: ResourceType) -> bool:
    """A write that changes nothing is not stored: no new resourceVersion, no watch event."""
    if _body(old) != _body(new) or old.get("status") != new.get("status"):
        return False
    om, nm = dict(old["metadata"]), dict(new["metadata"])
    for k in ("resourceVersion",):
        om.pop(k, None)
        nm.pop(k, None)
    return om == nm
