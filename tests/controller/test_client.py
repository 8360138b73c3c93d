"""The API client and the Event recorder against a proxy that answers in HTML.

A load balancer or ingress in front of an API server answers 502, 503 and 504 with an HTML page of
its own. The client looks at the status before the body: a gateway error is retried, within the
same bounded retries as any 5xx, and an answer that is not JSON is a clear ApiError, not a
JSONDecodeError. The recorder loses at most the one Event that failed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from trainer.api.objects import Obj
from trainer.controller.client import ApiClient, ApiError, ResourceType
from trainer.controller.events import Recorder

CONFIGMAPS = ResourceType("", "v1", "configmaps")
HTML = "<html><head><title>503 Service Unavailable</title></head><body>upstream down</body></html>"
TRAINJOB = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": "tj", "namespace": "default", "uid": "u-1"},
}


class Proxy:
    """A loopback server: answers each request with the next of ``script``, then with JSON."""

    def __init__(self, script: list[tuple[int, str, str]]) -> None:
        self.script = list(script)
        self.seen: list[Obj] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.text()
        self.seen.append(json.loads(body) if body else {})
        if self.script:
            status, content_type, text = self.script.pop(0)
            return web.Response(status=status, text=text, content_type=content_type)
        return web.json_response({"kind": "ConfigMap", "metadata": {"name": "ok"}})


@asynccontextmanager
async def serving(proxy: Proxy) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 20))


@pytest.mark.parametrize("code", [502, 503, 504])
def test_a_gateway_error_page_is_retried_then_the_request_succeeds(code: int) -> None:
    proxy = Proxy([(code, "text/html", HTML)])

    async def main() -> None:
        async with serving(proxy) as url:
            client = ApiClient(url, qps=0, retries=2)
            try:
                answer = await client.request("GET", CONFIGMAPS.path("default", "ok"))
            finally:
                await client.close()
        assert answer["metadata"]["name"] == "ok"
        assert client.requests == 2

    run(main)


def test_an_error_page_that_persists_is_a_clear_api_error() -> None:
    proxy = Proxy([(503, "text/html", HTML)] * 3)

    async def main() -> None:
        async with serving(proxy) as url:
            client = ApiClient(url, qps=0, retries=1)
            try:
                with pytest.raises(ApiError) as raised:
                    await client.request("GET", CONFIGMAPS.path("default", "ok"))
            finally:
                await client.close()
        assert raised.value.code == 503
        assert client.requests == 2, "the retries stay bounded"
        assert "503 Service Unavailable" in str(raised.value)

    run(main)


def test_a_refusal_or_success_that_is_not_json_is_a_clear_api_error() -> None:
    proxy = Proxy([(403, "text/html", "<html>forbidden by the proxy</html>"), (200, "text/html", HTML)])

    async def main() -> None:
        async with serving(proxy) as url:
            client = ApiClient(url, qps=0, retries=3)
            try:
                with pytest.raises(ApiError) as refused:
                    await client.request("GET", CONFIGMAPS.path("default", "ok"))
                with pytest.raises(ApiError) as garbled:
                    await client.request("GET", CONFIGMAPS.path("default", "ok"))
            finally:
                await client.close()
        assert refused.value.code == 403 and "forbidden by the proxy" in str(refused.value)
        assert client.requests == 2, "neither a 403 nor a 200 is retried"
        assert garbled.value.code == 200 and "not JSON" in str(garbled.value)

    run(main)


def _posted_reasons(proxy: Proxy) -> list[str]:
    return [seen["reason"] for seen in proxy.seen if seen.get("kind") == "Event"]


def test_the_recorder_posts_the_next_event_after_one_failed() -> None:
    # No retries: the HTML page is the recorder's to handle.
    proxy = Proxy([(503, "text/html", HTML)])

    async def main() -> None:
        async with serving(proxy) as url:
            recorder = Recorder(ApiClient(url, qps=0, retries=0))
            recorder.start()
            recorder.record(TRAINJOB, "Normal", "First", "lost to the proxy")
            recorder.record(TRAINJOB, "Normal", "Second", "posted")
            await asyncio.wait_for(recorder.queue.join(), 10)
            recorder.record(TRAINJOB, "Normal", "Third", "posted too")
            await recorder.stop(flush=10)
        assert _posted_reasons(proxy) == ["First", "Second", "Third"]

    run(main)


class FailingOnce:
    """A client whose first create fails in a way nobody foresaw."""

    def __init__(self) -> None:
        self.posted: list[str] = []

    async def create(self, rtype: ResourceType, namespace: str | None, obj: Obj) -> Obj:
        if not self.posted:
            self.posted.append("<failed>")
            raise RuntimeError("-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----")
        self.posted.append(obj["reason"])
        return obj

    async def close(self) -> None:
        pass


def test_the_recorder_survives_any_error_of_one_event_and_logs_no_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = FailingOnce()

    async def main() -> None:
        recorder = Recorder(client)  # type: ignore[arg-type]  # create and close are all it uses
        recorder.start()
        recorder.record(TRAINJOB, "Normal", "First", "dropped")
        recorder.record(TRAINJOB, "Normal", "Second", "posted")
        await recorder.stop(flush=10)

    with caplog.at_level(logging.INFO, logger="trainer.controller"):
        run(main)
    assert client.posted == ["<failed>", "Second"]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "First" in logged and "RuntimeError" in logged
    assert "MIIE" not in logged
