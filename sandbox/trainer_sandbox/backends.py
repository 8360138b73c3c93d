"""One face for two control planes: the stand-in and the real one built from source.

The operator's integration tests were written against the stand-in's helpers (``create``, ``get``,
``patch``, ``delete``, users, the audit log). They run unchanged on a real kube-apiserver through
:class:`RealCluster`, which offers the same methods over HTTPS, with the differences a real server
brings made explicit:

- **Users** are real identities: a service account's user gets a token from the TokenRequest API,
  any other user a client certificate from the cluster's CA. A real server authorizes them, so
  :meth:`grant` binds a ClusterRole (the stand-in authorizes nothing and records the grant only).
- **The audit log** is a file the API server writes asynchronously. :meth:`audit_mark` and
  :meth:`audit_since` bracket a stretch of it with marker requests of their own and wait until the
  server has written the marker, so no earlier record is missed.
- **Isolation.** The real control plane is shared by a whole test session, so each test works in a
  namespace of its own (:meth:`RealCluster.for_test`), and what it creates outside a namespace is
  deleted after it.
"""

from __future__ import annotations

import base64
import builtins
import datetime
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import yaml

from trainer.api.objects import Obj
from trainer_sandbox.apiserver.audit import AuditRecord
from trainer_sandbox.apiserver.errors import APIError

ADMIN = "admin"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
MUTATING_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


class Cluster(Protocol):
    """What a backend-neutral test may use."""

    backend: str  # "standin" or "real"
    namespace: str  # where the test's namespaced objects go unless it names another
    start_mark: int  # the audit log's position when the test began
    serves_logs: bool  # whether pods/log answers (tests assert logs only where it does)

    def create(self, obj: Obj, user: str = ADMIN) -> Obj: ...

    def apply(self, obj: Obj, user: str = ADMIN, field_manager: str = "test", force: bool = True) -> Obj: ...

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj: ...

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[Obj]: ...

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        patch: Any,
        namespace: str | None = None,
        subresource: str = "",
    ) -> Obj: ...

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        propagation: str | None = None,
    ) -> None: ...

    def add_user(self, name: str, groups: Iterable[str] = ()) -> object: ...

    def grant(self, user: str, cluster_role: str = "cluster-admin") -> None: ...

    def write_kubeconfig(self, path: str | Path, user: str = ADMIN, namespace: str | None = None) -> Path: ...

    def audit_mark(self) -> int: ...

    def audit_since(self, mark: int) -> builtins.list[AuditRecord]: ...


class _Http:
    """JSON over HTTPS with the admin's client certificate; errors as the stand-in's APIError."""

    def __init__(self, server: str, context: ssl.SSLContext) -> None:
        self.server = server.rstrip("/")
        self.context = context

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        timeout: float = 30,
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.server + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        for key, value in (headers or {}).items():
            request.add_header(key, value)
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self.context) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                status = json.loads(raw)
            except ValueError:
                status = {"message": raw.decode(errors="replace")}
            raise APIError(
                exc.code, str(status.get("reason", "")), str(status.get("message", "")), status.get("details")
            ) from None
        return json.loads(text) if text else {}


def _tls_from_kubeconfig(kubeconfig: Path, scratch: Path) -> tuple[str, ssl.SSLContext]:
    """The server and a TLS context from a kubeconfig with embedded certificate data."""
    config = yaml.safe_load(kubeconfig.read_text())
    context_name = config.get("current-context")
    contexts = {c["name"]: c["context"] for c in config.get("contexts") or []}
    context = contexts.get(context_name) if context_name else next(iter(contexts.values()), None)
    clusters = {c["name"]: c["cluster"] for c in config["clusters"]}
    users = {u["name"]: u["user"] for u in config["users"]}
    cluster = clusters[context["cluster"]] if context else next(iter(clusters.values()))
    user = users[context["user"]] if context else next(iter(users.values()))
    scratch.mkdir(parents=True, exist_ok=True)
    ca = scratch / "ca.crt"
    ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    tls = ssl.create_default_context(cafile=str(ca))
    if "client-certificate-data" in user:
        cert, key = scratch / "admin.crt", scratch / "admin.key"
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.touch(mode=0o600)
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        tls.load_cert_chain(str(cert), str(key))
    return str(cluster["server"]), tls


class RealCluster:
    """A real control plane reached through its admin kubeconfig and its audit log file."""

    backend = "real"
    serves_logs = True  # kwok's server answers pods/log from the files cluster/podlogs.py writes

    def __init__(
        self, kubeconfig: Path, audit_log: Path, *, ca_dir: Path, kubectl: str, namespace: str = "default"
    ) -> None:
        self.kubeconfig = kubeconfig
        self.kubectl = kubectl  # the kubectl built with this control plane, of the server's version
        self.start_mark = 0
        self.audit_log = audit_log
        self.ca_dir = ca_dir  # ca.crt and ca.key: client certificates for users that are not service accounts
        self.namespace = namespace
        self.server, self._tls = _tls_from_kubeconfig(kubeconfig, kubeconfig.parent / ".backend")
        self.http = _Http(self.server, self._tls)
        self._resources: dict[tuple[str, str], tuple[str, bool]] = {}
        self._users: dict[str, tuple[str, ...]] = {}
        self._cluster_scoped_created: list[tuple[str, str, str]] = []
        self._webhook_baseline = self._webhook_configurations()

    # -- per-test views ----------------------------------------------------------------------------
    def for_test(self, namespace: str) -> RealCluster:
        """A view that puts namespaced objects in ``namespace`` (created now) by default."""
        view = RealCluster.__new__(RealCluster)
        view.__dict__.update(self.__dict__)
        view.namespace = namespace
        view._cluster_scoped_created = []
        view._ensure_namespace(namespace)
        view.start_mark = view.audit_mark()
        return view

    def cleanup(self) -> None:
        """Delete the test's namespace and what it created outside one (foreground, not waited for)."""
        for api_version, kind, name in reversed(self._cluster_scoped_created):
            try:
                self.delete(api_version, kind, name, namespace="")
            except APIError as exc:
                if exc.code != 404:
                    raise
        for kind, name in self._webhook_configurations() - self._webhook_baseline:
            # An operator the test ran registered these; with it gone they would refuse every write.
            try:
                self.http.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/{name}")
            except APIError as exc:
                if exc.code != 404:
                    raise
        if self.namespace != "default":
            try:
                self.http.request("DELETE", f"/api/v1/namespaces/{self.namespace}")
            except APIError as exc:
                if exc.code != 404:
                    raise

    def _webhook_configurations(self) -> set[tuple[str, str]]:
        found = set()
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            listing = self.http.request("GET", f"/apis/admissionregistration.k8s.io/v1/{kind}")
            found |= {(kind, item["metadata"]["name"]) for item in listing.get("items") or []}
        return found

    def _ensure_namespace(self, namespace: str) -> None:
        try:
            self.http.request(
                "POST",
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
            )
        except APIError as exc:
            if exc.code != 409:
                raise
        # The service-account controller makes `default` in every namespace; pods need it.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                self.http.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
                return
            except APIError as exc:
                if exc.code != 404:
                    raise
            time.sleep(0.1)
        raise AssertionError(f"namespace {namespace}: no default ServiceAccount after 30 s")

    # -- discovery ---------------------------------------------------------------------------------
    def _resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        """The plural and whether it is namespaced, from discovery (read again on a miss: CRDs come and go)."""
        key = (api_version, kind)
        if key not in self._resources:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            try:
                listing = self.http.request("GET", base)
            except APIError as exc:
                raise APIError(
                    404, "NotFound", f"no kind {kind!r} is registered for version {api_version!r}"
                ) from exc
            for resource in listing.get("resources") or []:
                if "/" not in resource["name"]:
                    self._resources[(api_version, resource["kind"])] = (
                        resource["name"],
                        resource["namespaced"],
                    )
        if key not in self._resources:
            raise APIError(404, "NotFound", f"no kind {kind!r} is registered for version {api_version!r}")
        return self._resources[key]

    def _path(self, api_version: str, kind: str, namespace: str | None, name: str = "") -> str:
        plural, namespaced = self._resource(api_version, kind)
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        ns = self.namespace if namespace is None else namespace
        path = f"{base}/namespaces/{ns}/{plural}" if namespaced and ns else f"{base}/{plural}"
        return f"{path}/{name}" if name else path

    def _namespace_of(self, obj: Obj) -> str | None:
        return (obj.get("metadata") or {}).get("namespace")

    # -- the stand-in's helper methods -------------------------------------------------------------
    def create(self, obj: Obj, user: str = ADMIN) -> Obj:
        path = self._path(obj["apiVersion"], obj["kind"], self._namespace_of(obj))
        created: Obj = self.http.request("POST", path, obj, headers=self._as(user))
        if not created["metadata"].get("namespace"):
            self._cluster_scoped_created.append((obj["apiVersion"], obj["kind"], created["metadata"]["name"]))
        return created

    def install(self, obj: Obj) -> None:
        """Create ``obj`` as the admin to outlive the test (its cleanup leaves it); one that exists
        already is left as it is. For what the control plane's other tests rely on."""
        try:
            self.http.request(
                "POST", self._path(obj["apiVersion"], obj["kind"], self._namespace_of(obj)), obj
            )
        except APIError as exc:
            if exc.code != 409:
                raise

    def apply(self, obj: Obj, user: str = ADMIN, field_manager: str = "test", force: bool = True) -> Obj:
        path = self._path(obj["apiVersion"], obj["kind"], self._namespace_of(obj), obj["metadata"]["name"])
        query = urllib.parse.urlencode({"fieldManager": field_manager, "force": str(force).lower()})
        applied: Obj = self.http.request(
            "PATCH",
            f"{path}?{query}",
            obj,
            content_type="application/apply-patch+yaml",
            headers=self._as(user),
        )
        return applied

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None, user: str = ADMIN
    ) -> Obj:
        got: Obj = self.http.request(
            "GET", self._path(api_version, kind, namespace, name), headers=self._as(user)
        )
        return got

    def list(self, api_version: str, kind: str, namespace: str | None = None, user: str = ADMIN) -> list[Obj]:
        listing = self.http.request("GET", self._path(api_version, kind, namespace), headers=self._as(user))
        items: list[Obj] = listing.get("items") or []
        for item in items:  # a list's items carry no kind; the stand-in's do
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items

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
        path = self._path(api_version, kind, namespace, name) + (f"/{subresource}" if subresource else "")
        patched: Obj = self.http.request(
            "PATCH", path, patch, content_type="application/merge-patch+json", headers=self._as(user)
        )
        return patched

    def json_patch(
        self, api_version: str, kind: str, name: str, ops: builtins.list[Obj], namespace: str | None = None
    ) -> Obj:
        """A JSON patch (RFC 6902) as the admin: only the paths it names change."""
        patched: Obj = self.http.request(
            "PATCH",
            self._path(api_version, kind, namespace, name),
            ops,
            content_type="application/json-patch+json",
        )
        return patched

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        user: str = ADMIN,
        propagation: str | None = None,
    ) -> None:
        body = {"propagationPolicy": propagation} if propagation else None
        self.http.request(
            "DELETE", self._path(api_version, kind, namespace, name), body, headers=self._as(user)
        )

    def _as(self, user: str) -> dict[str, str]:
        """Requests on behalf of another user go as that user through impersonation by the admin."""
        return {} if user == ADMIN else {"Impersonate-User": user}

    # -- users -------------------------------------------------------------------------------------
    def add_user(self, name: str, groups: Iterable[str] = ()) -> None:
        self._users[name] = tuple(groups)

    def grant(self, user: str, cluster_role: str = "cluster-admin") -> None:
        """Bind ``cluster_role`` to ``user`` (a service account's user is bound as the account)."""
        digest = uuid.uuid5(uuid.NAMESPACE_URL, f"{user}/{cluster_role}").hex[:10]
        subject: Obj
        if user.startswith(SERVICE_ACCOUNT_PREFIX):
            ns, _, sa = user.removeprefix(SERVICE_ACCOUNT_PREFIX).partition(":")
            subject = {"kind": "ServiceAccount", "name": sa, "namespace": ns}
        else:
            subject = {"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}
        name = f"test-{cluster_role}-{digest}"
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": [subject],
        }
        try:
            self.http.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
        except APIError as exc:
            if exc.code != 409:
                raise
        # Users outlive a test on the shared server: its grants must not.
        self._cluster_scoped_created.append(("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", name))

    def write_kubeconfig(self, path: str | Path, user: str = ADMIN, namespace: str | None = None) -> Path:
        """A kubeconfig for ``user``: the admin's own, a service-account token, or a client certificate."""
        path = Path(path)
        if user == ADMIN:
            credentials = next(iter(yaml.safe_load(self.kubeconfig.read_text())["users"]))["user"]
        elif user.startswith(SERVICE_ACCOUNT_PREFIX):
            credentials = {"token": self._service_account_token(user)}
        else:
            credentials = self._client_certificate(user, self._users.get(user, ()))
        config = yaml.safe_load(self.kubeconfig.read_text())
        cluster = config["clusters"][0]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [cluster],
            "users": [{"name": user, "user": credentials}],
            "contexts": [
                {
                    "name": "test",
                    "context": {
                        "cluster": cluster["name"],
                        "user": user,
                        "namespace": namespace or self.namespace,
                    },
                }
            ],
            "current-context": "test",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def _service_account_token(self, user: str, seconds: int = 3600) -> str:
        ns, _, name = user.removeprefix(SERVICE_ACCOUNT_PREFIX).partition(":")
        self._ensure_namespace(ns)
        try:
            self.http.request(
                "POST",
                f"/api/v1/namespaces/{ns}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
            )
        except APIError as exc:
            if exc.code != 409:
                raise
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        }
        issued = self.http.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{name}/token", request)
        return str(issued["status"]["token"])

    def _client_certificate(self, user: str, groups: Iterable[str]) -> dict[str, str]:
        import datetime as dt

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        ca_cert = x509.load_pem_x509_certificate((self.ca_dir / "ca.crt").read_bytes())
        ca_key = serialization.load_pem_private_key((self.ca_dir / "ca.key").read_bytes(), None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        subject.append(x509.NameAttribute(NameOID.COMMON_NAME, user))
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        pem_key = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return {
            "client-certificate-data": base64.b64encode(
                cert.public_bytes(serialization.Encoding.PEM)
            ).decode(),
            "client-key-data": base64.b64encode(pem_key).decode(),
        }

    # -- audit -------------------------------------------------------------------------------------
    def audit_mark(self) -> int:
        """A position in the audit log after which every later request's record will be."""
        return self._marker()[1]

    def audit_since(self, mark: int) -> builtins.list[AuditRecord]:
        """Every request recorded after ``mark`` and before now (a marker request of ours ends it)."""
        start, _ = self._marker()
        with self.audit_log.open("rb") as log:
            log.seek(mark)
            chunk = log.read(max(0, start - mark))
        records = []
        started: set[str] = set()
        for line in chunk.splitlines():
            event = json.loads(line)
            if event.get("stage") == "ResponseStarted":
                started.add(str(event.get("auditID")))
            elif event.get("auditID") in started:
                continue  # a long-running request already counted when it opened
            record = audit_record(event)
            if record is not None and not record.name.startswith(_MARKER_PREFIX):
                records.append(record)
        return records

    def _marker(self, timeout: float = 30) -> tuple[int, int]:
        """Make a request only we make, and return where its record starts and ends in the log."""
        name = f"{_MARKER_PREFIX}{uuid.uuid4().hex}"
        try:
            self.http.request("GET", f"/api/v1/namespaces/default/configmaps/{name}")
        except APIError as exc:
            if exc.code != 404:
                raise
        needle = f'"name":"{name}"'.encode()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = self.audit_log.read_bytes() if self.audit_log.exists() else b""
            at = data.rfind(needle)
            if at >= 0:
                begin = data.rfind(b"\n", 0, at) + 1
                end = data.find(b"\n", at)
                return begin, (len(data) if end < 0 else end + 1)
            time.sleep(0.05)
        raise AssertionError(
            f"the audit log {self.audit_log} did not record a marker request within {timeout} s"
        )


_MARKER_PREFIX = "trainer-audit-mark-"


def audit_record(event: Obj) -> AuditRecord | None:
    """A kube-apiserver audit event (JSON, one per line) as the stand-in's record, or None for
    the stages that are not one.

    A request is one record, as on the stand-in: when it completed, or for a long-running one
    (a watch, a followed log) when its response started. A watch's ResponseComplete comes only when
    it closes, often after the test has ended; one whose start lies before the queried stretch
    began before it, and is not that stretch's.
    """
    stage = event.get("stage")
    if stage == "ResponseComplete" and event.get("verb") == "watch":
        code = int((event.get("responseStatus") or {}).get("code") or 0)
        if 200 <= code < 300:
            return None
    elif stage not in ("ResponseStarted", "ResponseComplete", "Panic"):
        return None
    ref = event.get("objectRef") or {}
    code = int((event.get("responseStatus") or {}).get("code") or 0)
    verb = str(event.get("verb", ""))
    uri = str(event.get("requestURI", ""))
    user = (event.get("impersonatedUser") or event.get("user") or {}).get("username", "")
    return AuditRecord(
        user=str(user),
        verb=verb,
        group=str(ref.get("apiGroup", "")),
        version=str(ref.get("apiVersion", "")),
        resource=str(ref.get("resource", "")),
        subresource=str(ref.get("subresource", "")),
        namespace=str(ref.get("namespace", "")),
        name=str(ref.get("name", "")),
        method="",
        path=uri,
        user_agent=str(event.get("userAgent", "")),
        status=code,
        mutated=verb in MUTATING_VERBS and 200 <= code < 300 and "dryRun=" not in uri,
        time=_received(event),
    )


def _received(event: Obj) -> float:
    """When the server received the request (the stand-in's records carry their arrival too)."""
    stamp = event.get("requestReceivedTimestamp")
    if not isinstance(stamp, str):
        return time.time()
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
