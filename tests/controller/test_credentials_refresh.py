"""Credentials kept fresh while the operator runs: token files read again, exec credentials fetched
again at expiry, new credentials and one retry on a 401, kopf's login, proxy-url.

The real control plane's version of these (a token revoked under a running operator, a rotated
service-account token file, a proxy) is tests/operator/test_credentials_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import kopf
import pytest
import yaml
from aiohttp import web
from kopf._cogs.structs.credentials import Vault, VaultKey

from trainer.controller.client import ApiClient, ApiError
from trainer.controller.credentials import (
    REREAD_SECONDS,
    RETRY_SECONDS,
    Credentials,
    CredentialsError,
    Loaded,
    login,
)

BASE = datetime(2030, 1, 1, tzinfo=UTC).timestamp()


class Clock:
    def __init__(self, now: float = BASE) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 20))


def kubeconfig(path: Path, user: dict[str, object], cluster: dict[str, object] | None = None) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "ctx",
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "clusters": [{"name": "c", "cluster": cluster or {"server": "https://10.0.0.1:6443"}}],
                "users": [{"name": "u", "user": user}],
            }
        )
    )
    return path


def counting_plugin(tmp_path: Path, body: str) -> dict[str, object]:
    """An exec plugin that knows how often it ran (``n``, from 1) and prints what ``body`` says."""
    script = tmp_path / "plugin.py"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, pathlib\n"
        f"counter = pathlib.Path({str(tmp_path / 'runs')!r})\n"
        "n = int(counter.read_text()) + 1 if counter.exists() else 1\n"
        "counter.write_text(str(n))\n"
        "def emit(status):\n"
        "    print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', 'kind': 'ExecCredential',"
        " 'status': status}))\n" + body
    )
    script.chmod(0o755)
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "interactiveMode": "Never",
            "command": str(script),
        }
    }


def runs(tmp_path: Path) -> int:
    counter = tmp_path / "runs"
    return int(counter.read_text()) if counter.exists() else 0


@pytest.fixture
def service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    mount = tmp_path / "serviceaccount"
    mount.mkdir()
    (mount / "token").write_text("token-1\n")
    (mount / "namespace").write_text("kubeflow-system")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    yield mount


def rotate(mount: Path, token: str) -> None:
    """As the kubelet does: the new file is swapped in whole."""
    (mount / "token.new").write_text(token + "\n")
    (mount / "token.new").replace(mount / "token")


# --- token files ---


def test_the_service_account_token_file_is_read_again_every_minute(service_account: Path) -> None:
    clock = Clock()
    credentials = Credentials.of(service_account=service_account)
    credentials.clock = clock

    async def main() -> None:
        first = await credentials.current()
        assert (first.server, first.token) == ("https://10.96.0.1:443", "token-1")
        rotate(service_account, "token-2")
        clock.now += REREAD_SECONDS - 1
        assert await credentials.current() is first, "not read again within the minute"
        clock.now += 1
        second = await credentials.current()
        assert second.token == "token-2"
        clock.now += REREAD_SECONDS
        assert await credentials.current() is second, "the same token read again: the same object"
        assert credentials.fetches == 3

    run(main)


def test_the_service_account_token_file_is_read_again_on_a_401(service_account: Path) -> None:
    credentials = Credentials.of(service_account=service_account)
    credentials.clock = Clock()

    async def main() -> None:
        first = await credentials.current()
        rotate(service_account, "token-2")
        assert await credentials.refresh(first) is True
        assert credentials.info.token == "token-2"
        fetches = credentials.fetches
        # Another request refused with the old token: the new one is there already, not read again.
        assert await credentials.refresh(first) is True
        assert credentials.fetches == fetches
        # Refused with a token that the file still holds: nothing else to try.
        assert await credentials.refresh(credentials.info) is False

    run(main)


def test_a_kubeconfig_token_file_is_read_again_every_minute(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("file-1")
    clock = Clock()
    credentials = Credentials.of(str(kubeconfig(tmp_path / "config", {"tokenFile": "token"})))
    credentials.clock = clock

    async def main() -> None:
        assert (await credentials.current()).token == "file-1"
        (tmp_path / "token").write_text("file-2")
        clock.now += REREAD_SECONDS
        assert (await credentials.current()).token == "file-2"

    run(main)


# --- exec plugins: expiry ---


def test_an_exec_credential_is_fetched_again_when_it_expires(tmp_path: Path) -> None:
    # Each token lasts an hour from BASE times the run number.
    user = counting_plugin(
        tmp_path,
        f"expires = {BASE} + 3600 * n\n"
        "import datetime\n"
        "stamp = datetime.datetime.fromtimestamp(expires, datetime.timezone.utc).isoformat()\n"
        "emit({'token': f'exec-{n}', 'expirationTimestamp': stamp})\n",
    )
    clock = Clock(BASE - 600)
    credentials = Credentials.of(str(kubeconfig(tmp_path / "config", user)))
    credentials.clock = clock

    async def main() -> None:
        first = await credentials.current()
        assert first.token == "exec-1" and first.expiration == datetime.fromtimestamp(BASE + 3600, UTC)
        clock.now = BASE + 3600 - 30
        assert await credentials.current() is first and runs(tmp_path) == 1, "not run again before"
        clock.now = BASE + 3600 - 5  # within the margin before the expiry
        second = await credentials.current()
        assert second.token == "exec-2" and runs(tmp_path) == 2
        clock.now = BASE + 3600 + 5
        assert await credentials.current() is second and runs(tmp_path) == 2

    run(main)


def test_an_exec_credential_that_arrives_expired_is_not_fetched_on_every_request(tmp_path: Path) -> None:
    user = counting_plugin(
        tmp_path, "emit({'token': 'stale', 'expirationTimestamp': '2020-01-01T00:00:00Z'})\n"
    )
    clock = Clock()
    credentials = Credentials.of(str(kubeconfig(tmp_path / "config", user)))
    credentials.clock = clock

    async def main() -> None:
        for _ in range(5):
            await credentials.current()
        assert runs(tmp_path) == 1
        clock.now += RETRY_SECONDS
        await credentials.current()
        assert runs(tmp_path) == 2

    run(main)


# --- the client: a 401 fetches new credentials, and the request is made once more ---


class ApiServer:
    """Answers a request with the token in ``valid`` with JSON, any other with a 401 Status."""

    def __init__(self, valid: set[str]) -> None:
        self.valid = valid
        self.seen: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.seen.append(token)
        if token not in self.valid:
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "Unauthorized"}
            return web.json_response({**status, "reason": "Unauthorized", "code": 401}, status=401)
        return web.json_response({"kind": "ConfigMap", "metadata": {"name": "ok"}})


@asynccontextmanager
async def serving(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def tokens(server: str, *issued: str) -> Callable[[], Loaded]:
    """A source that gives the tokens in turn, then the last one again."""
    queue = list(issued)

    def load() -> Loaded:
        token = queue.pop(0) if len(queue) > 1 else queue[0]
        return Loaded(kopf.ConnectionInfo(server=server, scheme="Bearer", token=token))

    return load


def test_a_401_fetches_new_credentials_once_for_all_the_requests_it_meets() -> None:
    api = ApiServer({"tok-2"})

    async def main() -> None:
        async with serving(api.handle) as url:
            credentials = Credentials(tokens(url, "tok-1", "tok-2", "tok-3"))
            await credentials.current()
            client = ApiClient.from_credentials(credentials, qps=0, burst=1)
            try:
                answers = await asyncio.gather(*(client.request("GET", "/api/v1/x") for _ in range(10)))
            finally:
                await client.close()
        assert all(a["metadata"]["name"] == "ok" for a in answers)
        assert credentials.fetches == 2, "one fetch for the ten 401s"
        assert api.seen.count("tok-1") == 10 and api.seen.count("tok-2") == 10

    run(main)


def test_a_401_that_new_credentials_do_not_cure_is_the_api_error() -> None:
    api = ApiServer(set())

    async def main() -> None:
        async with serving(api.handle) as url:
            credentials = Credentials(tokens(url, "tok-1", "tok-2"))
            await credentials.current()
            client = ApiClient.from_credentials(credentials, qps=0, burst=1)
            try:
                with pytest.raises(ApiError) as caught:
                    await client.request("GET", "/api/v1/x")
            finally:
                await client.close()
        assert caught.value.code == 401
        assert api.seen == ["tok-1", "tok-2"], "retried once, with the new token"

    run(main)


def test_a_static_client_is_not_retried_on_a_401() -> None:
    api = ApiServer(set())

    async def main() -> None:
        async with serving(api.handle) as url:
            client = ApiClient(url, headers={"Authorization": "Bearer fixed"}, qps=0)
            try:
                with pytest.raises(ApiError):
                    await client.request("GET", "/api/v1/x")
            finally:
                await client.close()
        assert api.seen == ["fixed"]

    run(main)


def test_a_failed_refresh_names_its_source_and_never_a_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first run gives a token the server refuses; the second prints a token among junk (not
    an ExecCredential): neither token reaches the error, the log or the message kopf gets."""
    api = ApiServer(set())
    user = counting_plugin(
        tmp_path,
        "if n == 1:\n    emit({'token': 's3cret-first'})\nelse:\n    print('token: s3cret-second')\n",
    )

    async def main() -> None:
        async with serving(api.handle) as url:
            credentials = Credentials.of(str(kubeconfig(tmp_path / "config", user, {"server": url})))
            await credentials.current()
            client = ApiClient.from_credentials(credentials, qps=0, burst=1)
            try:
                with pytest.raises(ApiError) as caught:
                    await client.request("GET", "/api/v1/x")
            finally:
                await client.close()
            assert caught.value.code == 401
            assert credentials.failures == 1 and credentials.info.token == "s3cret-first", "the ones held"
            texts = [str(caught.value), caplog.text]
            await credentials.for_kopf()  # kopf's first login: the ones held
            credentials.clock = Clock(credentials.clock() + RETRY_SECONDS)
            with pytest.raises(CredentialsError) as for_kopf:
                await credentials.for_kopf()  # kopf's login again, after its 401
            texts.append(str(for_kopf.value))
        assert "users['u'].user.exec: the plugin's output is not JSON" in caplog.text
        for text in texts:
            assert "s3cret" not in text, text

    with caplog.at_level(logging.INFO):
        run(main)


def test_a_watch_refused_with_a_401_is_made_again_with_new_credentials() -> None:
    """A watch is a long request of its own (controller/informer.py): its 401 fetches new
    credentials too, and the next attempt goes with them."""
    from trainer.controller.informer import Informer
    from trainer.controller.resources import TRAINJOBS

    api = ApiServer({"tok-2"})

    async def watch(request: web.Request) -> web.StreamResponse:
        refused = await api.handle(request)
        if refused.status == 401:
            return refused
        response = web.StreamResponse()
        await response.prepare(request)
        event = {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "7"}}}
        await response.write(json.dumps(event).encode() + b"\n")
        return response

    class Sink:
        def __init__(self) -> None:
            self.events: list[str] = []

        def listed(self, *_: object) -> None:
            pass

        def changed(self, _resource: object, type_: str, obj: dict[str, object]) -> None:
            self.events.append(type_)

    async def main() -> None:
        sink = Sink()
        async with serving(watch) as url:
            credentials = Credentials(tokens(url, "tok-1", "tok-2"))
            await credentials.current()
            client = ApiClient.from_credentials(credentials, qps=0, burst=1)
            informer = Informer(client, [(TRAINJOBS, "default")], sink)
            reflector = informer.reflectors[0]
            reflector.resource_version = "5"
            try:
                with pytest.raises(ApiError) as caught:
                    await reflector.watch()
                assert caught.value.code == 401
                assert await reflector.watch() == 1
            finally:
                await informer.close()
                await client.close()
        assert api.seen == ["tok-1", "tok-2"] and sink.events == ["ADDED"]
        assert reflector.resource_version == "7"

    run(main)


# --- kopf's login ---


def test_kopf_logs_in_again_with_new_credentials_after_a_401() -> None:
    """kopf keeps the credentials it saw refused and will not take them again; its login after a
    401 must give new ones, or fail (kopf then tries the login again) rather than repeat them."""

    async def main() -> None:
        credentials = Credentials(tokens("https://k:6443", "tok-1", "tok-2"))
        vault = Vault()
        first = await credentials.for_kopf()
        await vault.populate({"login": first})

        async def authenticator() -> None:  # kopf's: wait until the vault is empty, log in again
            await vault.wait_for_emptiness()
            await vault.populate({"login": await credentials.for_kopf()})

        relogin = asyncio.create_task(authenticator())
        await vault.invalidate(VaultKey("login"), first, exc=RuntimeError("401"))
        await relogin
        async for _, info in vault:
            assert info.token == "tok-2"  # type: ignore[attr-defined]
            break
        # Now the source gives the same token again: the login fails instead of repeating it.
        credentials.clock = Clock(credentials.clock() + RETRY_SECONDS)
        with pytest.raises(CredentialsError, match="no others could be fetched"):
            await credentials.for_kopf()

    run(main)


def test_kopf_gets_the_credentials_the_clients_fetched_already() -> None:
    async def main() -> None:
        credentials = Credentials(tokens("https://k:6443", "tok-1", "tok-2", "tok-3"))
        first = await credentials.for_kopf()
        assert await credentials.refresh(first)  # a client met the 401 first
        assert (await credentials.for_kopf()).token == "tok-2"
        assert credentials.fetches == 2

    run(main)


# --- proxy-url ---


def test_an_http_proxy_url_is_used_by_the_client(tmp_path: Path) -> None:
    """An http:// proxy is asked for each request (here the API server is a name only the proxy
    knows); the TLS case, a CONNECT tunnel, is in the real control plane's test."""
    asked: list[str] = []

    async def proxy(request: web.Request) -> web.Response:
        asked.append(str(request.url))
        return web.json_response({"kind": "ConfigMap", "metadata": {"name": "via-proxy"}})

    async def main() -> None:
        async with serving(proxy) as url:
            path = kubeconfig(
                tmp_path / "config",
                {"token": "t"},
                {"server": "http://api.cluster.invalid:6443", "proxy-url": url},
            )
            credentials = Credentials.of(str(path))
            await credentials.current()
            client = ApiClient.from_credentials(credentials, qps=0, burst=1)
            try:
                answer = await client.request("GET", "/api/v1/namespaces/default/configmaps/x")
            finally:
                await client.close()
        assert answer["metadata"]["name"] == "via-proxy"
        assert asked == ["http://api.cluster.invalid:6443/api/v1/namespaces/default/configmaps/x"]

    run(main)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("socks5://user:s3cret@proxy.example:1080", "socks5 proxies are not supported; use an http:// proxy"),
        ("https://user:s3cret@proxy.example:3128", "https proxies are not supported; use an http:// proxy"),
        ("proxy.example:3128", "not an http:// URL"),
    ],
)
def test_a_proxy_url_the_operator_cannot_use_is_refused_at_start_up(
    tmp_path: Path, url: str, message: str
) -> None:
    path = kubeconfig(tmp_path / "config", {"token": "t"}, {"server": "https://k:6443", "proxy-url": url})
    with pytest.raises(CredentialsError) as caught:
        login(str(path))
    assert f"clusters['c'].cluster.proxy-url: {message}" in str(caught.value)
    assert "s3cret" not in str(caught.value)


def test_the_operator_refuses_to_start_with_such_a_proxy_url(tmp_path: Path) -> None:
    from trainer.controller.operator import StartupError
    from trainer.controller.operator import login as operator_login

    path = kubeconfig(
        tmp_path / "config", {"token": "t"}, {"server": "https://k:6443", "proxy-url": "socks5://p:1080"}
    )
    with pytest.raises(StartupError, match=r"no Kubernetes credentials: .*proxy-url: socks5 proxies"):
        asyncio.run(operator_login(str(path)))


def test_the_exec_plugin_is_not_run_on_the_event_loop(tmp_path: Path) -> None:
    """A plugin may take seconds (a cloud's token service): the loop goes on meanwhile."""
    user = counting_plugin(tmp_path, "import time; time.sleep(0.5)\nemit({'token': 'slow'})\n")
    credentials = Credentials.of(str(kubeconfig(tmp_path / "config", user)))

    async def main() -> None:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        ticker = asyncio.create_task(tick())
        assert (await credentials.current()).token == "slow"
        ticker.cancel()
        assert ticks >= 5

    run(main)


def test_each_run_of_the_plugin_gets_the_same_exec_info(tmp_path: Path) -> None:
    """Each run gets the same KUBERNETES_EXEC_INFO, as client-go gives it."""
    user = counting_plugin(
        tmp_path,
        f"open({str(tmp_path / 'info')!r} + str(n), 'w').write(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "emit({'token': f't{n}'})\n",
    )

    async def main() -> None:
        credentials = Credentials.of(str(kubeconfig(tmp_path / "config", user)))
        first = await credentials.current()
        assert await credentials.refresh(first)

    run(main)
    assert json.loads((tmp_path / "info1").read_text()) == json.loads((tmp_path / "info2").read_text())
