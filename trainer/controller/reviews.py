"""What the servers that take bearer tokens share: the status server (training pods report
progress) and the metrics server (Prometheus scrapes). Each asks the API server about a caller's
token, so each needs the same three guards, or any client can make it ask without end
(docs/security.md, findings 7 and 8):

- a token bucket per client address, spent before any token is looked at;
- a bound on reviews under way at once: one more is refused at once (429), never queued behind
  the server's API client budget;
- verdicts kept for a while, the good ones never past the token's own expiry, so a scraper or a
  reporting pod costs the API server one review a minute, and junk costs it one per refusal period.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

V = TypeVar("V")

# How many keys a bucket table or verdict cache holds before it forgets expired ones: enough for
# every client of a busy cluster, bounded against one that makes up new keys.
MAX_KEYS = 4096


class Busy(Exception):
    """As many reviews as the server makes at once are under way (a 429)."""


class ReviewError(Exception):
    """The API server could not say (not a refusal: a 500). Its message is the answer's code and
    reason only: an answer's body is not ours to log."""


def bearer(header: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    fields = header.split()
    if len(fields) != 2 or fields[0].lower() != "bearer":
        return None
    return fields[1]


def digest(token: str) -> str:
    """What a token is remembered by: never the token itself."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT, read without verifying (only to bound how long a verdict is kept)."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"])
    except (IndexError, ValueError, KeyError, TypeError):
        return None


class RateLimits:
    """A token bucket per key: per client address, so one caller cannot make a server ask about
    junk tokens; per TrainJob (the status server), so one TrainJob's pods cannot take its client."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.qps, self.burst, self.clock = qps, burst, clock
        self._buckets: dict[Hashable, tuple[float, float]] = {}  # key -> (tokens, when)

    def allow(self, key: Hashable) -> bool:
        now = self.clock()
        tokens, when = self._buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - when) * self.qps)
        if len(self._buckets) > MAX_KEYS:  # forget the buckets that have filled up again
            full = self.burst / self.qps
            self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < full}
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return False
        self._buckets[key] = (tokens - 1.0, now)
        return True

    def retry_after(self, key: Hashable) -> int:
        tokens, _ = self._buckets.get(key, (0.0, 0.0))
        return max(1, int((1.0 - tokens) / self.qps + 0.999))


class Verdicts(Generic[V]):
    """Answers kept until a time of their own; bounded (expired ones go first, then all).

    Deadlines are on ``clock`` (monotonic: a wall clock stepped back by NTP would keep every
    verdict longer); a token's expiry claim is wall time, read with ``wall`` and turned into a
    duration when the verdict is kept."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time
    ) -> None:
        self.clock, self.wall = clock, wall
        self._kept: dict[Hashable, tuple[V, float]] = {}

    def get(self, key: Hashable) -> tuple[V] | None:
        """``(answer,)`` while one is kept for ``key``, else None (an answer may itself be None)."""
        found = self._kept.get(key)
        if found is None:
            return None
        if self.clock() >= found[1]:
            del self._kept[key]
            return None
        return (found[0],)

    def keep(self, key: Hashable, answer: V, seconds: float, token: str | None = None) -> None:
        """Keep ``answer`` for ``seconds``, and, given the token it is about, no longer than it lives."""
        expiry = token_expiry(token) if token is not None else None
        if expiry is not None:
            seconds = min(seconds, expiry - self.wall())
        if seconds <= 0:
            return
        now = self.clock()
        until = now + seconds
        if len(self._kept) >= MAX_KEYS:
            self._kept = {k: v for k, v in self._kept.items() if v[1] > now}
            if len(self._kept) >= MAX_KEYS:
                self._kept.clear()
        self._kept[key] = (answer, until)


class Slots:
    """At most ``size`` reviews under way; one more raises :class:`Busy`."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.used = 0

    @contextlib.contextmanager
    def take(self) -> Iterator[None]:
        if self.used >= self.size:
            raise Busy()
        self.used += 1
        try:
            yield
        finally:
            self.used -= 1
