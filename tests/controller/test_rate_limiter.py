"""The client budget: a token bucket that serves children's writes before status writes.

Times are asserted on the limiter's own clock, which runs on a virtual-time event loop: the loop
jumps to its next timer instead of sleeping, so a loaded machine cannot make a bound fail.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from trainer.controller.client import CHILDREN, STATUS, RateLimiter

T = TypeVar("T")


class _Jumping(selectors.DefaultSelector):
    """Waits for nothing: the time a select would have slept is added to the loop's clock."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self.loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout > 0:
            self.loop.now += timeout
        return super().select(0)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_Jumping(self))

    def time(self) -> float:
        return self.now


def run_virtual(main: Callable[[VirtualTimeLoop], Awaitable[T]]) -> T:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main(loop))
    finally:
        loop.close()


def test_burst_then_qps() -> None:
    async def main(loop: VirtualTimeLoop) -> list[float]:
        limiter = RateLimiter(qps=50, burst=5, clock=loop.time)
        served = []
        for _ in range(15):  # 5 at once, then 10 at 50 a second
            await limiter.acquire()
            served.append(limiter.clock())
        return served

    served = run_virtual(main)
    assert served[:5] == [0.0] * 5
    assert served[5:] == pytest.approx([0.02 * n for n in range(1, 11)])


def test_children_are_served_before_status_and_in_arrival_order() -> None:
    async def main() -> list[str]:
        limiter = RateLimiter(qps=100, burst=1)
        await limiter.acquire()  # the bucket is empty now
        served: list[str] = []

        async def take(name: str, priority: int) -> None:
            await limiter.acquire(priority)
            served.append(name)

        tasks = [asyncio.create_task(take("status-1", STATUS))]
        await asyncio.sleep(0)
        tasks += [asyncio.create_task(take(f"child-{i}", CHILDREN)) for i in range(3)]
        await asyncio.gather(*tasks)
        return served

    assert asyncio.run(main()) == ["child-0", "child-1", "child-2", "status-1"]


def test_try_acquire_never_jumps_the_queue() -> None:
    async def main() -> None:
        limiter = RateLimiter(qps=10, burst=1)
        assert limiter.try_acquire(STATUS)
        assert not limiter.try_acquire(STATUS)  # empty
        waiter = asyncio.create_task(limiter.acquire(CHILDREN))
        await asyncio.sleep(0)
        limiter.tokens, limiter.updated = 1.0, time.monotonic()  # a token is free, and a child waits for it
        assert not limiter.try_acquire(STATUS)
        assert not limiter.try_acquire(CHILDREN)  # as urgent, but later
        waiter.cancel()
        await asyncio.sleep(0)
        assert limiter.try_acquire(STATUS)  # nobody waits any more

    asyncio.run(main())


def test_a_cancelled_waiter_takes_no_token() -> None:
    async def main(loop: VirtualTimeLoop) -> float:
        limiter = RateLimiter(qps=20, burst=1, clock=loop.time)
        await limiter.acquire()
        doomed = asyncio.create_task(limiter.acquire())
        await asyncio.sleep(0)
        doomed.cancel()
        await limiter.acquire()  # gets the next token (at 50 ms), not the one after it (100 ms)
        return limiter.clock()

    assert run_virtual(main) == pytest.approx(0.05)


def test_status_writes_leave_a_reserve_for_children() -> None:
    limiter = RateLimiter(qps=0.001, burst=10)  # as good as no refill during the test
    taken = 0
    while limiter.try_acquire(STATUS):
        taken += 1
    assert taken == 8, "two tokens (a fifth of the burst) stay for children"
    assert limiter.try_acquire(CHILDREN) and limiter.try_acquire(CHILDREN)
    assert not limiter.try_acquire(CHILDREN)
