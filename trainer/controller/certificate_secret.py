"""The operator's own webhook certificate (``certManagement.enable``): one Secret, every replica.

What the chart renders must not hold key material or a CA (``helm template`` and GitOps tools
render it again on every sync), so the operator keeps the certificate itself:

- **One Secret** (``certManagement.webhookSecretName``, type ``Opaque`` as the chart renders it
  empty) holds the CA (``ca.crt``, ``ca.key``) and the serving certificate (``tls.crt``,
  ``tls.key``). A replica that finds none creates it, and one that finds it empty fills it; when
  two try at once, one write wins (the other gets 409) and both serve the winner's. The CA and
  the serving certificate are renewed a third of their lifetime before they expire
  (``controller/tls_certificates.py``: ``renewed``), by the leader only; every change is an
  update carrying the resourceVersion just read, so a write by another replica is never lost.
- **The caBundle.** Before the leader writes a new CA into the Secret, it adds it to the webhook
  configurations' ``caBundle`` (the old CA stays there until it expires), so no replica serves a
  certificate the API server does not trust yet. The leader compares the caBundle with the Secret
  every ``checkInterval`` and writes it back when it differs: a GitOps sync that applied the
  chart's configurations without one is undone within that interval.
- **Every replica** reads the Secret every ``checkInterval`` (and at once when it starts leading),
  writes ``tls.crt`` and ``tls.key`` into its certificate directory when they changed, and loads
  them into the webhook server's TLS context in place: no restart, no dropped connection.

Requests: ``get`` and ``update`` of the one Secret (``create`` only when it does not exist), ``get`` and ``patch`` of the two
webhook configurations (the chart's Role and ClusterRole, by ``resourceNames`` where they can be).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import logging
import os
from collections.abc import Callable
from pathlib import Path

from trainer.api.objects import Obj
from trainer.controller import tls_certificates
from trainer.controller.client import ApiClient, ApiError
from trainer.controller.config import CertManagement

logger = logging.getLogger("trainer.certificate")

ADMISSION = "/apis/admissionregistration.k8s.io/v1"
JSON_PATCH = "application/json-patch+json"
# After a new CA is written into the caBundle, before a certificate it signed is served: the API
# server's webhook clients follow the configurations through a watch, within well under a second.
CA_SETTLE_SECONDS = 1.0


def _decode(secret: Obj | None) -> dict[str, bytes] | None:
    if secret is None:
        return None
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def _usable(secret: Obj) -> bool:
    data = secret.get("data") or {}
    return all(
        data.get(key)
        for key in (tls_certificates.CA_CERT, tls_certificates.TLS_CERT, tls_certificates.TLS_KEY)
    )


def _encode(data: dict[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode("ascii") for k, v in sorted(data.items())}


class SelfManagedCertificate:
    """Keep the Secret, the files the webhook server serves, and the caBundle in step (see the module)."""

    def __init__(
        self,
        client: ApiClient,
        settings: CertManagement,
        namespace: str,
        cert_dir: str | Path,
        *,
        advertise_host: str | None = None,
        leading: Callable[[], bool] = lambda: True,
        on_files_changed: Callable[[], object] = lambda: None,
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self.client = client
        self.settings = settings
        self.namespace = namespace
        self.cert_dir = Path(cert_dir)
        self.hosts = tls_certificates.service_hosts(settings.webhook_service_name, namespace, advertise_host)
        self.leading = leading
        self.on_files_changed = on_files_changed
        self.now = now
        self._wake = asyncio.Event()
        self.rotations = 0  # Secret writes of new material by this replica (for tests and logs)
        self.injections = 0  # caBundle patches by this replica

    @property
    def secret_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/secrets/{self.settings.webhook_secret_name}"

    @property
    def configurations(self) -> list[str]:
        s = self.settings
        return [
            f"{ADMISSION}/validatingwebhookconfigurations/{s.validating_webhook_configuration_name}",
            f"{ADMISSION}/mutatingwebhookconfigurations/{s.mutating_webhook_configuration_name}",
        ]

    def wake(self) -> None:
        """Look now rather than at the next interval (this replica has just started leading)."""
        self._wake.set()

    # --- one pass ---

    async def sync(self) -> None:
        """Make the certificate if there is none; renew it and write the caBundle if leading; serve it."""
        secret = await self._get()
        lead = self.leading()
        if secret is None:
            secret = await self._create()
        elif lead or not _usable(secret):
            # An empty Secret (the chart renders one for Helm to own) is filled by whoever sees it
            # first, leader or not: a replica cannot serve before it is.
            secret = await self._renew(secret)
        if lead:
            await self.inject(secret)
        self.write_files(secret)

    async def _get(self) -> Obj | None:
        try:
            return await self.client.request("GET", self.secret_path)
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise

    def _renewed(self, secret: Obj | None) -> dict[str, bytes] | None:
        s = self.settings
        return tls_certificates.renewed(
            _decode(secret),
            hosts=self.hosts,
            ca_name=f"{s.webhook_service_name}-webhook-ca",
            ca_validity=datetime.timedelta(seconds=s.ca_validity_seconds),
            cert_validity=datetime.timedelta(seconds=s.cert_validity_seconds),
            now=self.now(),
        )

    async def _create(self) -> Obj:
        data = self._renewed(None)
        assert data is not None
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": self.settings.webhook_secret_name,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/component": "webhook", "app.kubernetes.io/part-of": "kubeflow"},
            },
            # Opaque, as the chart renders it: a Secret's type cannot change once it exists.
            "type": "Opaque",
            "data": _encode(data),
        }
        return await self._write("POST", f"/api/v1/namespaces/{self.namespace}/secrets", body, "created")

    async def _renew(self, secret: Obj) -> Obj:
        data = self._renewed(secret)
        if data is None:
            return secret
        return await self._write("PUT", self.secret_path, {**secret, "data": _encode(data)}, "renewed in")

    async def _write(self, method: str, path: str, body: Obj, done: str) -> Obj:
        """Write the Secret ``body``; its CA (the earlier ones with it) is trusted first, before any
        replica can serve a certificate it signed. A 409: another replica wrote first."""
        if await self.inject(body):
            await asyncio.sleep(CA_SETTLE_SECONDS)
        try:
            written = await self.client.request(method, path, body)
        except ApiError as exc:
            if exc.code != 409:
                raise
            return await self._lost_race()
        logger.info(
            "webhook certificate: %s Secret %s/%s", done, self.namespace, self.settings.webhook_secret_name
        )
        self.rotations += 1
        return written

    async def _lost_race(self) -> Obj:
        """Another replica wrote the Secret first: serve what it wrote, and trust it (this replica
        may have written its own CA into the caBundle a moment ago)."""
        found = await self._get()
        if found is None or not _usable(found):
            raise ApiError(409, {"reason": "Conflict", "message": "the certificate Secret changed meanwhile"})
        await self.inject(found)
        return found

    async def inject(self, secret: Obj) -> bool:
        """Write the Secret's ``ca.crt`` into every webhook's caBundle where it differs; True if it did."""
        bundle = (secret.get("data") or {}).get(tls_certificates.CA_CERT)
        if not bundle:
            return False
        wrote = False
        for path in self.configurations:
            try:
                config = await self.client.request("GET", path)
            except ApiError as exc:
                if exc.code == 404:
                    logger.warning("webhook certificate: %s does not exist; no caBundle written", path)
                    continue
                raise
            patch: list[Obj] = []
            for i, hook in enumerate(config.get("webhooks") or []):
                if (hook.get("clientConfig") or {}).get("caBundle") != bundle:
                    # The name is tested, so a list reordered meanwhile is refused, not mispatched.
                    patch.append({"op": "test", "path": f"/webhooks/{i}/name", "value": hook["name"]})
                    patch.append(
                        {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
                    )
            if patch:
                await self.client.request("PATCH", path, patch, content_type=JSON_PATCH)  # type: ignore[arg-type]
                self.injections += 1
                wrote = True
                logger.info("webhook certificate: wrote the caBundle of %s", path.rsplit("/", 2)[-2:])
        return wrote

    def write_files(self, secret: Obj) -> bool:
        """``tls.crt`` and ``tls.key`` where the webhook server reads them, if they changed."""
        data = _decode(secret) or {}
        cert, key = data.get(tls_certificates.TLS_CERT), data.get(tls_certificates.TLS_KEY)
        if not cert or not key:
            return False
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        cert_path, key_path = (
            self.cert_dir / tls_certificates.TLS_CERT,
            self.cert_dir / tls_certificates.TLS_KEY,
        )
        try:
            if cert_path.read_bytes() == cert and key_path.read_bytes() == key:
                return False
        except OSError:
            pass
        for path, content, mode in ((key_path, key, 0o600), (cert_path, cert, 0o644)):
            scratch = path.with_name(f".{path.name}.new")
            scratch.write_bytes(content)
            scratch.chmod(mode)
            os.replace(scratch, path)  # a reader sees the old file or the new one, never half of one
        self.on_files_changed()
        return True

    # --- the loop ---

    async def run(self) -> None:
        interval = self.settings.check_interval_seconds
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=interval)
            self._wake.clear()
            try:
                await self.sync()
            except Exception as exc:  # the API server unreachable, a refusal: the next pass tries again
                logger.warning("webhook certificate: %s (tried again in %gs)", exc, interval)
