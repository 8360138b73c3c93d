"""Leader election (controller/leader.py) against an in-memory Lease API with optimistic concurrency:
who leads, when a follower takes over, when a leader stops writing, and the configuration.

Durations are tenths of a second; the real control plane's test (tests/operator/
test_leader_election.py) runs two operator processes and SIGKILLs the leader.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import pytest
from pydantic import ValidationError

from trainer.api.objects import Obj
from trainer.controller.client import ApiClient, ApiError
from trainer.controller.config import Configuration, LeaderElection
from trainer.controller.leader import LEASES, Elector, Fence, FencedClient, NotLeader, Timing

NS, NAME = "kubeflow-system", "trainer.kubeflow.org"
PATH = LEASES.path(NS, NAME)
TIMING = Timing(lease_duration=0.6, renew_deadline=0.4, retry_period=0.1)
SLACK = 0.1  # the event loop's own delays on a busy machine


class LeaseApi:
    """One Lease, stored as an API server stores it: a resourceVersion checked on every update."""

    def __init__(self) -> None:
        self.lease: Obj | None = None
        self.version = 0
        self.writes: list[tuple[str, str]] = []  # (verb, holder) of each accepted write

    def handle(self, method: str, path: str, body: Obj | None) -> Obj:
        if method == "GET":
            if self.lease is None:
                raise ApiError(404, {"reason": "NotFound"})
            return copy.deepcopy(self.lease)
        assert body is not None
        if method == "POST":
            if self.lease is not None:
                raise ApiError(409, {"reason": "AlreadyExists"})
        elif method == "PUT":
            assert self.lease is not None
            if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
                raise ApiError(409, {"reason": "Conflict"})
        else:
            raise AssertionError(method)
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        self.writes.append(("create" if method == "POST" else "update", body["spec"]["holderIdentity"]))
        return copy.deepcopy(self.lease)


class Client(ApiClient):
    """A replica's connection to the LeaseApi; ``down`` cuts it (every request fails)."""

    def __init__(self, api: LeaseApi) -> None:
        super().__init__("http://lease-api.invalid", qps=0)
        self.api = api
        self.down = False

    async def request(self, *args: Any, **kwargs: Any) -> Obj:
        method, path = args[0], args[1]
        body = args[2] if len(args) > 2 else kwargs.get("body")
        await asyncio.sleep(0.002)
        if self.down:
            raise OSError("connection refused")
        assert path.startswith(LEASES.path(NS)), path
        return self.api.handle(method, path, body)


class Replica:
    def __init__(self, api: LeaseApi, name: str, timing: Timing = TIMING) -> None:
        self.client = Client(api)
        self.started: list[float] = []
        self.stopped: list[float] = []
        self.elector = Elector(
            self.client,
            NS,
            NAME,
            timing,
            on_started_leading=self._started,
            on_stopped_leading=self._stopped,
            holder=name,
        )

    async def _started(self) -> None:
        self.started.append(time.monotonic())

    async def _stopped(self) -> None:
        self.stopped.append(time.monotonic())


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 20))


async def until(check: Callable[[], bool], timeout: float = 5) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, "timed out"
        await asyncio.sleep(0.005)
    return time.monotonic()


def renewed(api: LeaseApi) -> float:
    assert api.lease is not None
    stamp = api.lease["spec"]["renewTime"]
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


# --- configuration ----------------------------------------------------------------------------


def test_defaults_are_upstreams_and_off_unless_asked() -> None:
    election = Configuration().leader_election
    assert election.leader_elect is False
    assert election.resource_name == "trainer.kubeflow.org" and election.resource_lock == "leases"
    assert (
        election.lease_duration_seconds,
        election.renew_deadline_seconds,
        election.retry_period_seconds,
    ) == (
        15.0,
        10.0,
        2.0,
    )
    # Upstream's section as its manifests ship it is read as is.
    upstream = Configuration.model_validate(
        {
            "leaderElection": {
                "leaderElect": True,
                "resourceName": "trainer.kubeflow.org",
                "resourceNamespace": "",
                "resourceLock": "leases",
                "leaseDuration": "15s",
                "renewDeadline": "10s",
                "retryPeriod": "2s",
            }
        }
    )
    assert upstream.leader_election.leader_elect is True


@pytest.mark.parametrize(
    ("section", "complaint"),
    [
        ({"leaseDuration": "10s", "renewDeadline": "10s"}, "longer than renewDeadline"),
        ({"renewDeadline": "2s", "retryPeriod": "2s"}, "1.2 x retryPeriod"),
        ({"retryPeriod": "0s"}, "above zero"),
        ({"leaseDuration": "15"}, "not a duration"),
        ({"resourceLock": "configmaps"}, "resourceLock"),
        ({"resourceName": ""}, "resourceName"),
    ],
)
def test_durations_that_cannot_work_are_refused(section: Obj, complaint: str) -> None:
    with pytest.raises(ValidationError) as refused:
        LeaderElection.model_validate(section)
    assert complaint in str(refused.value)


# --- the fence --------------------------------------------------------------------------------


def test_the_fence_closes_at_its_deadline_and_a_fenced_request_is_never_sent() -> None:
    now = [100.0]
    fence = Fence(clock=lambda: now[0])
    assert not fence.open
    fence.open_until(101.0)
    assert fence.open
    now[0] = 101.0
    assert not fence.open  # by the clock alone: no task had to run

    async def main() -> None:
        inner = Client(LeaseApi())
        client = FencedClient.behind(fence, inner)
        assert client.limiter is inner.limiter, "the reconciler keeps the budget it shares"
        with pytest.raises(NotLeader) as refused:
            await client.request("GET", PATH)
        assert "not the leader" in str(refused.value) and refused.value.code == 0
        assert client.requests == 0
        await client.close()

    run(main)


@pytest.mark.parametrize("wait", ["for the budget", "between retries"])
def test_a_request_that_passed_the_fence_and_waited_is_not_sent_once_it_closed(wait: str) -> None:
    """The fence was checked once per call, before the wait for the client budget and the pauses
    between retries: on the real control plane a ConfigMap create went out 76 ms after its replica
    stopped leading. It is checked again as each attempt goes on the wire."""
    from aiohttp import web
    from trainer_sandbox.ports import free_port

    received: list[str] = []

    async def main() -> None:
        async def answer(request: web.Request) -> web.Response:
            received.append(request.method)
            if wait == "between retries":
                return web.json_response({"kind": "Status", "code": 503}, status=503)
            return web.json_response({"kind": "ConfigMap"})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        fence = Fence()
        fence.open_until(time.monotonic() + 60)
        client = FencedClient.behind(fence, ApiClient(f"http://127.0.0.1:{port}", qps=2, burst=1))
        try:
            if wait == "for the budget":
                await client.request("POST", "/api/v1/namespaces/ns/configmaps", {})  # spends the burst
            pending = asyncio.create_task(client.request("POST", "/api/v1/namespaces/ns/configmaps", {}))
            await asyncio.sleep(0.1)  # waiting for a token (0.5 s away), or pausing after a 503
            sent = len(received)
            fence.close()
            with pytest.raises(NotLeader):
                await pending
            assert len(received) == sent, f"an attempt went out after leadership ended ({wait})"
        finally:
            await client.close()
            await runner.cleanup()

    run(main)


# --- electing -----------------------------------------------------------------------------------


def test_one_replica_leads_and_a_release_hands_over_within_a_retry_period() -> None:
    api = LeaseApi()

    async def main() -> None:
        a, b = Replica(api, "a"), Replica(api, "b")
        a.elector.start()
        await until(lambda: a.elector.leading)
        b.elector.start()
        await asyncio.sleep(TIMING.lease_duration * 2)  # b sees a renewing: it never takes over
        assert not b.elector.leading and b.started == []
        assert {holder for _, holder in api.writes} == {"a"}
        assert api.lease is not None and api.lease["spec"]["leaseTransitions"] == 0
        acquired = api.lease["spec"]["acquireTime"]
        assert api.lease["spec"]["renewTime"] > acquired, "renewals keep the acquireTime"
        assert a.elector.fence.open and not b.elector.fence.open

        stopped = time.monotonic()
        await a.elector.stop()  # SIGTERM: the workers stop, then the Lease is released
        assert a.stopped and a.stopped[0] <= time.monotonic()
        assert api.writes[-1] == ("update", "")
        took = await until(lambda: b.elector.leading) - stopped
        assert took <= TIMING.retry_period + SLACK, f"{took:.3f}s after the release"
        assert api.lease["spec"]["holderIdentity"] == "b"
        assert api.lease["spec"]["leaseTransitions"] == 1
        await b.elector.stop()

    run(main)


def test_a_vanished_leader_is_replaced_within_lease_duration_plus_retry_after_its_last_renewal() -> None:
    api = LeaseApi()

    async def main() -> None:
        a, b = Replica(api, "a"), Replica(api, "b")
        a.elector.start()
        await until(lambda: a.elector.leading)
        b.elector.start()
        await asyncio.sleep(0.35)
        # As SIGKILL would: the task is gone, nothing released, no more renewals.
        assert a.elector._task is not None
        a.elector._task.cancel()
        last = renewed(api)
        await until(lambda: b.elector.leading, timeout=3)
        assert api.lease is not None
        acquired = datetime.strptime(api.lease["spec"]["acquireTime"], "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
        gap = acquired - last
        assert TIMING.lease_duration <= gap <= TIMING.lease_duration + TIMING.retry_period + SLACK, gap
        await b.elector.stop()

    run(main)


def test_a_leader_that_cannot_renew_stops_within_the_renew_deadline_before_anyone_takes_over() -> None:
    api = LeaseApi()

    async def main() -> None:
        a, b = Replica(api, "a"), Replica(api, "b")
        a.elector.start()
        await until(lambda: a.elector.leading)
        b.elector.start()
        await asyncio.sleep(0.25)
        a.client.down = True  # a partition: a's renewals fail, b still reaches the server
        last = renewed(api)
        cut = time.monotonic()
        assert a.elector.fence.deadline is not None
        assert a.elector.fence.deadline <= cut + TIMING.renew_deadline
        stopped = await until(lambda: bool(a.stopped))
        assert not a.elector.fence.open and not a.elector.leading
        assert stopped - cut <= TIMING.renew_deadline + SLACK
        took_over = await until(lambda: b.elector.leading, timeout=3)
        assert took_over > stopped, "the old leader stopped before the new one started"
        assert api.lease is not None
        acquired = datetime.strptime(api.lease["spec"]["acquireTime"], "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
        assert acquired - last >= TIMING.lease_duration, "b waited for the Lease to expire"
        # Back in reach, a follows: it never takes the Lease while b renews it.
        a.client.down = False
        await asyncio.sleep(TIMING.lease_duration)
        assert not a.elector.leading and len(a.started) == 1
        await b.elector.stop()
        await until(lambda: a.elector.leading, timeout=2)  # and leads again once b is gone
        assert len(a.started) == 2
        await a.elector.stop()

    run(main)


def test_a_leader_that_finds_another_holder_stops_at_once() -> None:
    api = LeaseApi()

    async def main() -> None:
        a = Replica(api, "a")
        a.elector.start()
        await until(lambda: a.elector.leading)
        # Someone else took the Lease (an operator with another clock, a hand edit).
        assert api.lease is not None
        spec = dict(api.lease["spec"], holderIdentity="intruder")
        api.handle("PUT", PATH, {**copy.deepcopy(api.lease), "spec": spec})
        taken = time.monotonic()
        stopped = await until(lambda: bool(a.stopped))
        assert stopped - taken <= TIMING.retry_period + SLACK
        assert not a.elector.fence.open
        await a.elector.stop()
        assert api.lease["spec"]["holderIdentity"] == "intruder", "a follower releases nothing"

    run(main)


def test_replicas_racing_for_a_free_lease_elect_exactly_one() -> None:
    api = LeaseApi()

    async def main() -> None:
        replicas = [Replica(api, f"r{i}") for i in range(5)]
        for replica in replicas:
            replica.elector.start()
        await until(lambda: any(r.elector.leading for r in replicas))
        await asyncio.sleep(TIMING.lease_duration)
        assert sum(r.elector.leading for r in replicas) == 1
        assert sum(len(r.started) for r in replicas) == 1
        assert api.writes[0][0] == "create" and all(verb == "update" for verb, _ in api.writes[1:])
        for replica in replicas:
            await replica.elector.stop()

    run(main)


def test_the_campaign_has_the_budget_it_needs_whatever_the_reconcilers(tmp_path: Any) -> None:
    """A clientConnection of one request a second (sized for the reconciler) once had the leader
    miss renewals (a read and a write each retry period) and step down every few seconds. The
    elector's own client never has less than four requests a retry period."""
    from trainer_sandbox.apiserver import LocalAPIServer

    from trainer.controller.credentials import Credentials
    from trainer.controller.operator import ELECTION_REQUESTS, Operator

    config = Configuration.model_validate(
        {
            "clientConnection": {"qps": 1, "burst": 1},
            "leaderElection": {
                "leaderElect": True,
                "renewDeadline": "3s",
                "leaseDuration": "4s",
                "retryPeriod": "1s",
            },
        }
    )
    with LocalAPIServer() as server:

        async def main() -> tuple[float, int]:
            credentials = Credentials.of(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
            await credentials.current()
            elector = Operator(config=config)._elector(credentials, "default")
            limiter = elector.client.limiter
            await elector.client.close()
            return limiter.qps, limiter.burst

        qps, burst = asyncio.run(main())
    assert (qps, burst) == (ELECTION_REQUESTS / 1.0, ELECTION_REQUESTS)


def test_the_holders_own_lease_duration_counts_not_this_replicas() -> None:
    """client-go's rule: a record holds for the leaseDurationSeconds written in it. A holder with a
    longer lease (another configuration, an administrator handing the Lease over) is not deposed
    after this replica's shorter duration; that replica took it back 4 s after being usurped for
    an hour, and wrote as leader again."""
    api = LeaseApi()
    now = "2026-11-27T00:00:00.000000Z"
    api.lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "trainer.kubeflow.org", "namespace": "default", "resourceVersion": "1"},
        "spec": {
            "holderIdentity": "usurper",
            "leaseDurationSeconds": 3600,
            "renewTime": now,
            "acquireTime": now,
        },
    }

    async def main() -> None:
        a = Replica(api, "a")
        a.elector.start()
        await asyncio.sleep(3 * TIMING.lease_duration)  # well past a's own duration (0.6 s)
        assert not a.elector.leading and api.writes == []
        # Released (as a stopping leader writes it: one second): taken within that second.
        assert api.lease is not None
        api.lease["spec"] = {**api.lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1}
        await until(lambda: a.elector.leading, timeout=2)
        await a.elector.stop()

    run(main)
