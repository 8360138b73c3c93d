"""The metrics server's guards (controller/metrics_auth.py): HTTPS, then the per-client limit, then
a TokenReview and a SubjectAccessReview, each verdict kept as controller-runtime keeps it. The API
server's answers are canned here; tests/chart/test_chart_install.py scrapes the real control
plane's operator with real ServiceAccount tokens."""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests
from pydantic import ValidationError

from trainer.controller.client import ApiError
from trainer.controller.config import Configuration
from trainer.controller.metrics import Metrics
from trainer.controller.metrics_auth import (
    ALLOW_SECONDS,
    DENY_SECONDS,
    MAX_REVIEWS,
    TOKEN_SECONDS,
    MetricsAuth,
    User,
)
from trainer.controller.reviews import Busy, RateLimits, ReviewError
from trainer.controller.tls_certificates import write_self_signed

Obj = dict[str, Any]
TOKENS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
PROMETHEUS = "system:serviceaccount:monitoring:prometheus"


class Cluster:
    """Answers TokenReviews from ``tokens`` (token -> user) and SubjectAccessReviews from ``readers``."""

    def __init__(self) -> None:
        self.tokens: dict[str, Obj] = {
            "prometheus-token": {
                "username": PROMETHEUS,
                "uid": "sa-uid",
                "groups": ["system:serviceaccounts", "system:authenticated"],
                "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]},
            },
            "someone-token": {"username": "system:serviceaccount:team:default", "groups": []},
        }
        self.readers = {PROMETHEUS}
        self.requests: list[tuple[str, Obj]] = []
        self.down = False

    async def request(self, method: str, path: str, body: Obj | None = None, **_: Any) -> Obj:
        assert method == "POST" and body is not None
        self.requests.append((path, body))
        if self.down:
            raise ApiError(503, {"reason": "ServiceUnavailable"})
        if path == TOKENS:
            user = self.tokens.get(body["spec"]["token"])
            return {"status": {"authenticated": True, "user": user} if user else {"authenticated": False}}
        assert path == ACCESS
        return {"status": {"allowed": body["spec"]["user"] in self.readers}}

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]


class Served:
    """The operator's metrics server on a free port, over TLS, in a thread of its own."""

    def __init__(self, tmp: Path, cluster: Cluster | None, limits: RateLimits | None = None) -> None:
        cert, key = write_self_signed(tmp, ["localhost", "127.0.0.1"])
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        self.ca = str(cert)
        self.metrics = Metrics()
        self.metrics.reconciles.labels(result="created").inc()
        auth = MetricsAuth(cluster) if cluster is not None else None  # type: ignore[arg-type]
        self.server = self.metrics.server(
            "127.0.0.1", 0, ssl_context=context, auth=auth, client_limits=limits
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)

    def get(self, token: str | None = None, path: str = "/metrics") -> requests.Response:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        url = f"https://127.0.0.1:{self.server.port}{path}"
        return requests.get(url, headers=headers, verify=self.ca, timeout=10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


@pytest.fixture
def served(tmp_path: Path, cluster: Cluster) -> Iterator[Served]:
    served = Served(tmp_path, cluster)
    try:
        yield served
    finally:
        served.stop()


def test_a_reader_gets_the_metrics_after_one_review_of_each_kind(served: Served, cluster: Cluster) -> None:
    response = served.get("prometheus-token")
    assert response.status_code == 200, response.text
    assert "trainer_reconcile_total" in response.text
    assert cluster.paths() == [TOKENS, ACCESS]
    (_, token_review), (_, access_review) = cluster.requests
    assert token_review["spec"] == {"token": "prometheus-token"}, "the API server's own audience"
    assert access_review["spec"] == {
        "user": PROMETHEUS,
        "uid": "sa-uid",
        "groups": ["system:serviceaccounts", "system:authenticated"],
        "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]},
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
    }
    for _ in range(3):
        assert served.get("prometheus-token").status_code == 200
    assert len(cluster.requests) == 2, "both verdicts are kept: a scrape costs the API server nothing more"


@pytest.mark.parametrize("header", [None, "", "Basic cHJvbTpwcm9t", "Bearer", "Bearer a b"])
def test_no_bearer_token_is_unauthorized_without_asking(
    served: Served, cluster: Cluster, header: str | None
) -> None:
    headers = {"Authorization": header} if header is not None else {}
    url = f"https://127.0.0.1:{served.server.port}/metrics"
    response = requests.get(url, headers=headers, verify=served.ca, timeout=10)
    assert (response.status_code, response.text) == (401, "Unauthorized\n")
    assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert cluster.requests == []


def test_a_token_the_api_server_does_not_know_is_unauthorized(served: Served, cluster: Cluster) -> None:
    response = served.get("forged")
    assert (response.status_code, response.text) == (401, "Unauthorized\n")
    assert cluster.paths() == [TOKENS]
    assert served.get("forged").status_code == 401
    assert cluster.paths() == [TOKENS], "the refusal is kept too"


def test_a_caller_not_allowed_to_get_metrics_is_forbidden(served: Served, cluster: Cluster) -> None:
    response = served.get("someone-token")
    assert (response.status_code, response.text) == (
        403,
        "Authorization denied for user system:serviceaccount:team:default\n",
    )
    assert "trainer_" not in response.text
    assert cluster.paths() == [TOKENS, ACCESS]


def test_the_api_server_unable_to_tell_is_an_internal_error(served: Served, cluster: Cluster) -> None:
    cluster.down = True
    response = served.get("prometheus-token")
    assert (response.status_code, response.text) == (500, "Authentication failed\n")
    cluster.down = False
    assert served.get("prometheus-token").status_code == 200, "an error is not kept as a verdict"


def test_plain_http_is_refused_by_the_tls_port(served: Served) -> None:
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://127.0.0.1:{served.server.port}/metrics", timeout=5)


def test_only_the_metrics_path_is_served(served: Served, cluster: Cluster) -> None:
    assert served.get("prometheus-token", path="/debug/pprof").status_code == 404
    assert cluster.requests == []


def test_one_client_address_is_limited_before_its_token_is_looked_at(
    tmp_path: Path, cluster: Cluster
) -> None:
    served = Served(tmp_path, cluster, RateLimits(qps=0.001, burst=3))
    try:
        codes = [served.get(f"junk-{i}").status_code for i in range(5)]
        limited = served.get("prometheus-token")
    finally:
        served.stop()
    assert codes == [401, 401, 401, 429, 429]
    assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1
    assert cluster.paths() == [TOKENS] * 3, "the limited requests reached no TokenReview"


def test_one_review_more_than_the_bound_is_answered_429_at_once_not_queued(tmp_path: Path) -> None:
    class Slow(Cluster):
        async def request(self, method: str, path: str, body: Obj | None = None, **kwargs: Any) -> Obj:
            await asyncio.sleep(1.5)
            return await super().request(method, path, body, **kwargs)

    served = Served(tmp_path, Slow())
    try:
        with ThreadPoolExecutor(MAX_REVIEWS + 1) as pool:
            slow = [pool.submit(served.get, f"junk-{i}") for i in range(MAX_REVIEWS)]
            time.sleep(0.5)  # the bound's reviews are under way
            started = time.monotonic()
            one_more = served.get("one-more")
            waited = time.monotonic() - started
            codes = [f.result().status_code for f in slow]
    finally:
        served.stop()
    assert (one_more.status_code, one_more.headers["Retry-After"]) == (429, "1")
    assert waited < 1.0, f"answered at once, not queued behind the reviews ({waited:.2f} s)"
    assert codes == [401] * MAX_REVIEWS


def test_a_failed_authorization_review_is_an_internal_error_naming_the_user(
    served: Served, cluster: Cluster
) -> None:
    original = cluster.request

    async def failing_access(method: str, path: str, body: Obj | None = None, **kw: Any) -> Obj:
        if path == ACCESS:
            raise ApiError(500, {"reason": "InternalError", "message": "etcd is away"})
        return await original(method, path, body, **kw)

    cluster.request = failing_access  # type: ignore[method-assign]
    response = served.get("prometheus-token")
    assert (response.status_code, response.text) == (500, f"Authorization for user {PROMETHEUS} failed\n")


@pytest.mark.parametrize(
    "failure,text",
    [
        (aiohttp.ClientConnectionError("refused"), "Authentication failed\n"),  # the client gave up
        (TimeoutError(), "Authentication failed\n"),
        (RuntimeError("a bug"), "Internal Server Error\n"),  # never aiohttp's page and traceback
    ],
)
def test_any_failure_is_a_plain_500(served: Served, cluster: Cluster, failure: Exception, text: str) -> None:
    async def failing(method: str, path: str, body: Obj | None = None, **kw: Any) -> Obj:
        raise failure

    cluster.request = failing  # type: ignore[method-assign]
    response = served.get("prometheus-token")
    assert (response.status_code, response.text) == (500, text)
    assert "prometheus-token" not in response.text


def test_a_refusal_of_an_expired_token_is_kept_too(cluster: Cluster) -> None:
    now = [1000.0]
    expired = "a.eyJleHAiOiA5MDB9.c"  # exp = 900: refused by the API server, and kept a minute
    auth = MetricsAuth(cluster, clock=lambda: now[0], wall=lambda: now[0])  # type: ignore[arg-type]
    for _ in range(3):
        assert asyncio.run(auth.user(expired)) is None
    assert len(cluster.requests) == 1


def test_without_auth_nothing_is_asked_or_limited(tmp_path: Path) -> None:
    served = Served(tmp_path, None, RateLimits(qps=0.001, burst=3))
    try:
        codes = [served.get().status_code for _ in range(5)]
    finally:
        served.stop()
    assert codes == [200] * 5, "no review to spare: the port's own bounds are the limit"


def test_reviews_under_way_are_bounded_and_one_more_is_busy(cluster: Cluster) -> None:
    release = asyncio.Event()

    class Slow(Cluster):
        async def request(self, method: str, path: str, body: Obj | None = None, **kwargs: Any) -> Obj:
            await release.wait()
            return await super().request(method, path, body, **kwargs)

    async def main() -> None:
        auth = MetricsAuth(Slow())  # type: ignore[arg-type]
        waiting = [asyncio.create_task(auth.user(f"token-{i}")) for i in range(MAX_REVIEWS)]
        await asyncio.sleep(0.01)
        with pytest.raises(Busy):
            await auth.user("one-more")
        release.set()
        await asyncio.gather(*waiting)
        assert await auth.user("prometheus-token") is not None, "room again"

    asyncio.run(main())


def test_verdicts_are_kept_as_controller_runtime_keeps_them(cluster: Cluster) -> None:
    now = [1000.0]
    auth = MetricsAuth(cluster, clock=lambda: now[0], wall=lambda: now[0])  # type: ignore[arg-type]

    def user(token: str) -> User | None:
        return asyncio.run(auth.user(token))

    def allowed(who: User) -> bool:
        return asyncio.run(auth.allowed(who, "get", "/metrics"))

    prometheus = user("prometheus-token")
    assert prometheus is not None and prometheus.name == PROMETHEUS
    assert allowed(prometheus)
    someone = user("someone-token")
    assert someone is not None and not allowed(someone)
    assert len(cluster.requests) == 4
    # A minute for tokens, 30 s for a refusal, five minutes for a permission.
    now[0] += DENY_SECONDS + 1
    cluster.readers.add(someone.name)
    assert allowed(someone), "a refusal is asked again after 30 s"
    cluster.readers.clear()
    assert allowed(prometheus), "a permission is kept five minutes"
    now[0] = 1000.0 + TOKEN_SECONDS + 1
    del cluster.tokens["prometheus-token"]
    assert user("prometheus-token") is None, "a token is asked about again after a minute"
    now[0] = 1000.0 + ALLOW_SECONDS + 1
    assert not allowed(prometheus), "and a permission after five"


def test_a_token_is_never_kept_past_its_expiry(cluster: Cluster) -> None:
    now = [1000.0]
    token = "a.eyJleHAiOiAxMDEwfQ.c"  # exp = 1010
    cluster.tokens[token] = {"username": PROMETHEUS}
    auth = MetricsAuth(cluster, clock=lambda: now[0], wall=lambda: now[0])  # type: ignore[arg-type]
    assert asyncio.run(auth.user(token)) is not None
    now[0] = 1011.0
    del cluster.tokens[token]
    assert asyncio.run(auth.user(token)) is None
    assert len(cluster.requests) == 2


def test_an_api_server_error_is_a_review_error(cluster: Cluster) -> None:
    cluster.down = True
    auth = MetricsAuth(cluster)  # type: ignore[arg-type]
    with pytest.raises(ReviewError):
        asyncio.run(auth.user("prometheus-token"))


def test_without_auth_anyone_reaching_the_port_reads_them(tmp_path: Path) -> None:
    served = Served(tmp_path, None)
    try:
        assert served.get().status_code == 200
    finally:
        served.stop()


# --- configuration --------------------------------------------------------------------------------


def test_metrics_default_to_https_with_auth_as_upstream_serves_them_on_8443() -> None:
    metrics = Configuration().metrics
    assert (metrics.bind_address, metrics.secure_serving, metrics.authenticated) == (":8443", True, True)
    # upstream's v2.3.0 file (no auth field): ours authorizes; turning it off is said in the file.
    carried = Configuration.model_validate({"metrics": {"bindAddress": ":8443", "secureServing": True}})
    assert carried.metrics.authenticated
    off = Configuration.model_validate({"metrics": {"auth": {"enabled": False}}})
    assert (off.metrics.secure_serving, off.metrics.authenticated) == (True, False)


def test_plain_metrics_carry_no_auth_and_auth_over_plain_http_is_refused() -> None:
    plain = Configuration.model_validate({"metrics": {"secureServing": False}}).metrics
    assert not plain.authenticated
    with pytest.raises(ValidationError, match=r"metrics\.auth\.enabled needs metrics\.secureServing"):
        Configuration.model_validate({"metrics": {"secureServing": False, "auth": {"enabled": True}}})


@pytest.mark.parametrize("address", ["8443", "localhost", ":http", ":99999", ""])
def test_a_bind_address_that_is_not_one_is_refused_by_name(address: str) -> None:
    with pytest.raises(ValidationError, match=r"metrics\.bindAddress"):
        Configuration.model_validate({"metrics": {"bindAddress": address}})


def test_bind_address_zero_serves_no_metrics() -> None:
    assert not Configuration.model_validate({"metrics": {"bindAddress": "0"}}).metrics.enabled


@pytest.mark.parametrize(
    "config,fields",
    [
        ({"metrics": {"bindAddress": ":9443"}}, "webhook.port and metrics.bindAddress"),
        ({"health": {"healthProbeBindAddress": "127.0.0.1:8443"}}, "metrics.bindAddress and health"),
        (
            {"featureGates": {"TrainJobStatus": True}, "statusServer": {"port": 8443}},
            "metrics.bindAddress and statusServer.port",
        ),
    ],
)
def test_two_servers_on_one_port_are_refused_naming_both(config: Obj, fields: str) -> None:
    with pytest.raises(ValidationError, match=fields):
        Configuration.model_validate(config)


def test_servers_off_or_on_other_hosts_do_not_collide() -> None:
    Configuration.model_validate({"metrics": {"bindAddress": "0"}, "health": {"healthProbeBindAddress": "0"}})
    Configuration.model_validate({"webhook": {"enabled": False}, "metrics": {"bindAddress": ":9443"}})
    Configuration.model_validate(
        {"metrics": {"bindAddress": "127.0.0.1:9000"}, "health": {"healthProbeBindAddress": "127.0.0.2:9000"}}
    )
    # The status server's port is free while its gate is off.
    Configuration.model_validate({"statusServer": {"port": 8443}})


def test_without_webhooks_the_operator_serves_https_with_a_certificate_of_its_own() -> None:
    """controller-runtime makes a self-signed certificate for localhost when it has none; so does
    the operator, in a directory of its own that goes when the server does."""
    from types import SimpleNamespace

    from trainer_sandbox.ports import free_port

    from trainer.controller.operator import Operator

    port = free_port()
    config = Configuration.model_validate(
        {
            "webhook": {"enabled": False},
            "metrics": {"bindAddress": f"127.0.0.1:{port}", "auth": {"enabled": False}},
        }
    )
    running = SimpleNamespace(metrics_server=None, metrics_client=None, metrics_tls=None)

    async def main() -> tuple[int, str]:
        await Operator(config=config)._start_metrics_server(running)  # type: ignore[arg-type]
        try:
            context = ssl.create_default_context(cafile=f"{running.metrics_tls.name}/tls.crt")
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"https://localhost:{port}/metrics", ssl=context) as response,
            ):
                return response.status, await response.text()
        finally:
            await running.metrics_server.stop()

    status, text = asyncio.run(main())
    assert status == 200 and "controller_runtime_reconcile_total" in text
    assert running.metrics_client is None, "no auth, no client"
    directory = Path(running.metrics_tls.name)
    assert directory.is_dir()
    running.metrics_tls.cleanup()
    assert not directory.exists()
