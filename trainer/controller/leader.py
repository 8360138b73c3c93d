"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's ``leaderelection`` does.

Every replica of the operator lists and watches (its cache stays warm) and serves the admission
webhooks, health and metrics; only the holder of the Lease reconciles. The Lease records
``holderIdentity`` (hostname and a random suffix, as controller-runtime names a replica),
``leaseDurationSeconds``, ``acquireTime``, ``renewTime`` and ``leaseTransitions``, and every
change is an update with the resourceVersion read just before it, so two replicas that try at
once cannot both win (the second gets 409).

- **Acquiring.** A replica takes the Lease when nobody holds it, or when its record has not
  changed for the record's own ``leaseDurationSeconds`` by this replica's own clock (client-go's
  rule: the time a record was *observed*, not the ``renewTime`` written by another machine's
  clock; and the holder's duration, not this replica's configured one). A follower
  looks every ``retryPeriod`` and again at the moment the record it saw would expire, so it takes
  over at most ``leaseDuration`` + ``retryPeriod`` after the holder's last renewal.
- **Renewing.** The holder renews every ``retryPeriod``. Its writes are fenced (:class:`Fence`):
  allowed only until ``renewDeadline`` after the start of its last successful renewal, which is
  ``leaseDuration - renewDeadline`` before any other replica can consider the Lease expired. When
  no renewal succeeds within ``renewDeadline``, or the Lease shows another holder, the replica
  stops leading at once: the fence closes (its reconciler's client refuses every request), its
  workers are cancelled mid-request and awaited, and only then does it look for the Lease again.
- **Losing it** drops the replica back to follower; it does not exit. controller-runtime exits
  instead (its manager's runnables cannot be started again); here the workers are tasks that can
  be stopped for certain and started again, and a follower keeps serving the webhooks with a warm
  cache.
- **Stopping** (SIGTERM): the workers stop first, then the Lease is released (no holder,
  ``leaseDurationSeconds: 1``), as controller-runtime's ``LeaderElectionReleaseOnCancel``, so
  that a rolling upgrade hands over within one retry period instead of a lease duration.

The elector has a client of its own, outside the reconciler's budget: a renewal never queues
behind a burst of JobSet creations.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp

from trainer.api.objects import Obj
from trainer.controller.client import ApiClient, ApiError, ResourceType

logger = logging.getLogger("trainer.leader")

LEASES = ResourceType("coordination.k8s.io", "v1", "leases")
RELEASE_TIMEOUT = 2.0  # seconds a release may take at shutdown


async def cancel_and_wait(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait until each has ended, cancelling again any that swallowed it
    (``asyncio.wait_for`` before Python 3.12 may, when its inner future completes at that moment).
    A cancellation of the caller is not swallowed here."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.5)


def identity() -> str:
    """This replica's name in the Lease: hostname (the pod's name in a cluster) and a random suffix."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def micro_time(moment: datetime) -> str:
    """A ``metav1.MicroTime`` (RFC 3339 with microseconds), as the Lease's times are written."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Timing:
    lease_duration: float
    renew_deadline: float
    retry_period: float


class NotLeader(ApiError):
    """A request of the reconciler while this replica does not hold the Lease: never sent."""

    def __init__(self, what: str) -> None:
        super().__init__(0, {"reason": "NotLeader", "message": f"{what}: this replica is not the leader"})


class Fence:
    """Whether this replica may write now: it holds the Lease and renewed it within the deadline.

    The deadline is on the monotonic clock, so a check needs no elector task to have run: a
    replica whose event loop stalled past its deadline refuses its own writes all the same.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.deadline: float | None = None

    def open_until(self, deadline: float) -> None:
        self.deadline = deadline

    def close(self) -> None:
        self.deadline = None

    @property
    def open(self) -> bool:
        return self.deadline is not None and self.clock() < self.deadline

    def check(self, what: str) -> None:
        if not self.open:
            raise NotLeader(what)


class FencedClient(ApiClient):
    """The reconciler's client: every request passes the fence first, or is refused (NotLeader)."""

    fence: Fence

    @classmethod
    def behind(cls, fence: Fence, client: ApiClient) -> FencedClient:
        """A client with ``client``'s server, credentials and budget (the same token bucket)."""
        fenced = cls(
            client.server,
            headers=None if client.credentials is not None else dict(client.headers),
            ssl_context=None if client.credentials is not None else client.ssl,
            credentials=client.credentials,  # fetched again on expiry and 401s, for both clients
            proxy=client.proxy,
        )
        fenced.limiter = client.limiter
        fenced.retries = client.retries
        fenced.fence = fence
        return fenced

    async def request(self, *args: Any, **kwargs: Any) -> Obj:
        # Checked before each request (the one a 401 repeats too): none starts once leadership is lost.
        self.fence.check(" ".join(str(a) for a in args[:2]) or "a request")
        return await super().request(*args, **kwargs)

    def before_sending(self, method: str, path: str) -> None:
        # And again as each attempt goes out: a request may wait for the budget, or pause between
        # retries, for longer than leadership lasts (a create once went out 76 ms after it ended).
        self.fence.check(f"{method} {path}")


class Attempt(enum.Enum):
    ACQUIRED = enum.auto()  # this replica holds the Lease now (acquired or renewed)
    HELD = enum.auto()  # another replica holds it and its record has not expired
    FAILED = enum.auto()  # the API server could not be asked, or another replica won the race


class Elector:
    """Campaign for the Lease, lead while it is renewed, follow otherwise (see the module)."""

    def __init__(
        self,
        client: ApiClient,
        namespace: str,
        name: str,
        timing: Timing,
        *,
        on_started_leading: Callable[[], Awaitable[None]],
        on_stopped_leading: Callable[[], Awaitable[None]],
        holder: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.timing = timing
        self.identity = holder or identity()
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.clock = clock
        self.wall = wall
        self.fence = Fence(clock)
        self.leading = False
        self.transitions = 0  # times this replica became leader (for tests and logs)
        self._observed: Obj | None = None  # the Lease's spec as last seen
        self._observed_at = 0.0  # when it was first seen so (this replica's monotonic clock)
        self._last_holder: str | None = None
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle ---

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.create_task(self.run(), name="leader-election")
        return self._task

    async def run(self) -> None:
        while True:
            await self._acquire()
            await self._lead()
            await self._renew()
            await self._step_down()

    async def stop(self) -> None:
        """Stop campaigning; a leader stops its workers first, then releases the Lease."""
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None
        if self.leading:
            await self._step_down()
            try:
                async with asyncio.timeout(RELEASE_TIMEOUT):
                    await self._release()
            except (ApiError, TimeoutError, OSError, aiohttp.ClientError) as exc:
                # The Lease then expires by itself, a lease duration from the last renewal.
                logger.info("leader election: could not release the Lease: %s", exc)
        await self.client.close()

    # --- the two phases ---

    async def _acquire(self) -> None:
        """Until this replica holds the Lease: try every retry period, and when the record seen expires."""
        retry = self.timing.retry_period
        while True:
            started = self.clock()
            outcome = await self._attempt(timeout=self.timing.renew_deadline)
            if outcome is Attempt.ACQUIRED:
                self.fence.open_until(started + self.timing.renew_deadline)
                return
            # Jittered early rather than late (client-go: up to 1.2x later): a follower sees each
            # renewal within one retry period, and tries again the moment the record it saw
            # expires, so it takes over within leaseDuration + retryPeriod of the last renewal.
            wake = started + retry * random.uniform(0.8, 1.0)
            if outcome is Attempt.HELD:
                wake = min(wake, self._observed_at + self._record_duration() + 0.001)
            await asyncio.sleep(max(0.0, wake - self.clock()))

    async def _renew(self) -> None:
        """Renew every retry period; return when leadership is lost (the fence is closed then)."""
        next_at = self.clock() + self.timing.retry_period
        while True:
            deadline = self.fence.deadline
            if deadline is None:
                return
            await asyncio.sleep(max(0.0, min(next_at, deadline) - self.clock()))
            started = self.clock()
            if started >= deadline:
                self._lost(f"no renewal succeeded within renewDeadline ({self.timing.renew_deadline:g}s)")
                return
            outcome = await self._attempt(timeout=deadline - started)
            if outcome is Attempt.ACQUIRED:
                self.fence.open_until(started + self.timing.renew_deadline)
            elif outcome is Attempt.HELD:
                self._lost(f"the Lease is held by {self._last_holder}")
                return
            next_at = started + self.timing.retry_period

    async def _lead(self) -> None:
        self.leading = True
        self.transitions += 1
        logger.info("leader election: %s leads (Lease %s/%s)", self.identity, self.namespace, self.name)
        try:
            await self.on_started_leading()
        except BaseException:
            await self._step_down()
            raise

    def _lost(self, why: str) -> None:
        """Stop writing now (synchronously, so no request of the reconciler passes after this)."""
        self.fence.close()
        logger.warning("leader election: %s stops leading: %s", self.identity, why)

    async def _step_down(self) -> None:
        self.fence.close()
        if not self.leading:
            return
        self.leading = False
        await self.on_stopped_leading()

    # --- one try, as client-go's tryAcquireOrRenew ---

    async def _attempt(self, timeout: float) -> Attempt:
        try:
            async with asyncio.timeout(max(0.001, timeout)):
                return await self._try_acquire_or_renew()
        except ApiError as exc:
            logger.info("leader election: Lease %s/%s: %s", self.namespace, self.name, exc)
        except (TimeoutError, OSError, aiohttp.ClientError) as exc:
            logger.info("leader election: Lease %s/%s: %s", self.namespace, self.name, type(exc).__name__)
        except Exception:  # a Lease we cannot read (edited by hand?): a failed try, not a dead elector
            logger.exception("leader election: Lease %s/%s", self.namespace, self.name)
        return Attempt.FAILED

    async def _try_acquire_or_renew(self) -> Attempt:
        now = micro_time(self.wall())
        try:
            lease = await self.client.request("GET", LEASES.path(self.namespace, self.name))
        except ApiError as exc:
            if exc.code != 404:
                raise
            return await self._create(now)
        spec: Obj = lease.get("spec") or {}
        if spec != self._observed:
            self._observed, self._observed_at = spec, self.clock()
        holder = spec.get("holderIdentity") or ""
        if holder != self._last_holder:
            self._last_holder = holder
            if holder and holder != self.identity:
                logger.info("leader election: %s holds Lease %s/%s", holder, self.namespace, self.name)
        expired = self._observed_at + self._record_duration() <= self.clock()
        if holder and holder != self.identity and not expired:
            return Attempt.HELD
        ours = holder == self.identity  # a renewal: the acquisition and the count stay
        wanted: Obj = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, int(self.timing.lease_duration)),
            "acquireTime": spec.get("acquireTime") if ours else now,
            "renewTime": now,
            "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (0 if ours else 1),
        }
        return await self._update(lease, wanted)

    def _record_duration(self) -> float:
        """How long the record seen holds: its ``leaseDurationSeconds`` (a holder that released
        it wrote 1; another configuration may hold it longer); this replica's own when it has none,
        or when it is what this replica would write itself (whole seconds of the same duration)."""
        try:
            seconds = float((self._observed or {}).get("leaseDurationSeconds") or 0)
        except (TypeError, ValueError):
            seconds = 0.0
        if seconds <= 0 or seconds == max(1, int(self.timing.lease_duration)):
            return self.timing.lease_duration
        return seconds

    async def _create(self, now: str) -> Attempt:
        spec: Obj = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, int(self.timing.lease_duration)),
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": 0,
        }
        body = {
            "apiVersion": LEASES.api_version,
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
        }
        try:
            created = await self.client.create(LEASES, self.namespace, body)
        except ApiError as exc:
            if exc.code == 409:  # another replica created it first
                return Attempt.FAILED
            raise
        self._saw(created)
        return Attempt.ACQUIRED

    async def _update(self, lease: Obj, spec: Obj) -> Attempt:
        meta = lease.get("metadata") or {}
        body = {
            "apiVersion": LEASES.api_version,
            "kind": "Lease",
            "metadata": {**meta, "resourceVersion": meta.get("resourceVersion")},
            "spec": spec,
        }
        try:
            updated = await self.client.request("PUT", LEASES.path(self.namespace, self.name), body)
        except ApiError as exc:
            if exc.code == 409:  # changed since it was read: another replica was faster
                return Attempt.FAILED
            raise
        self._saw(updated)
        return Attempt.ACQUIRED

    def _saw(self, lease: Obj) -> None:
        self._observed, self._observed_at = lease.get("spec") or {}, self.clock()
        self._last_holder = self.identity

    async def _release(self) -> None:
        """Give the Lease up at shutdown, so that another replica takes it at its next try."""
        lease = await self.client.request("GET", LEASES.path(self.namespace, self.name))
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") != self.identity:
            return
        now = micro_time(self.wall())
        released = {
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": int(spec.get("leaseTransitions") or 0),
        }
        await self._update(lease, released)
        logger.info("leader election: %s released Lease %s/%s", self.identity, self.namespace, self.name)
