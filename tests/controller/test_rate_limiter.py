"""The client budget: a token bucket that serves children's writes before status writes."""

from __future__ import annotations

import asyncio
import time

from trainer.controller.client import CHILDREN, STATUS, RateLimiter


def test_burst_then_qps() -> None:
    async def main() -> float:
        limiter = RateLimiter(qps=50, burst=5)
        start = time.monotonic()
        for _ in range(15):  # 5 at once, then 10 at 50 a second
            await limiter.acquire()
        return time.monotonic() - start

    elapsed = asyncio.run(main())
    assert 0.17 <= elapsed < 0.6, elapsed


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
    async def main() -> float:
        limiter = RateLimiter(qps=20, burst=1)
        await limiter.acquire()
        doomed = asyncio.create_task(limiter.acquire())
        await asyncio.sleep(0)
        doomed.cancel()
        start = time.monotonic()
        await limiter.acquire()  # gets the next token (about 50 ms), not the one after it
        return time.monotonic() - start

    assert asyncio.run(main()) < 0.09


def test_status_writes_leave_a_reserve_for_children() -> None:
    limiter = RateLimiter(qps=0.001, burst=10)  # as good as no refill during the test
    taken = 0
    while limiter.try_acquire(STATUS):
        taken += 1
    assert taken == 8, "two tokens (a fifth of the burst) stay for children"
    assert limiter.try_acquire(CHILDREN) and limiter.try_acquire(CHILDREN)
    assert not limiter.try_acquire(CHILDREN)
