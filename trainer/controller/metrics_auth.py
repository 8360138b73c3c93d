"""Who may read the metrics (``metrics.auth.enabled``; docs/configuration.md, "Metrics").

What controller-runtime's ``filters.WithAuthenticationAndAuthorization`` does for upstream's
``metrics.auth``, with the guards our other token-taking server has (controller/reviews.py):

1. more than one client address's share of requests: 429, before its token is looked at;
2. no bearer token, or one the API server does not authenticate (a TokenReview with no audience:
   the API server's own): 401 ``Unauthorized``;
3. a caller the API server does not authorize to ``get`` the path (a SubjectAccessReview of a
   non-resource URL: RBAC's ``nonResourceURLs: ["/metrics"]``, ``verbs: ["get"]``): 403
   ``Authorization denied for user <name>``;
4. as many reviews under way as it makes at once: 429; the API server cannot tell: 500.

Plain text answers, as Go's ``http.Error`` writes them. Where ours differs from controller-runtime's
filter (docs/decisions.md §metrics-auth): a token the API server refuses is 401 and the refusal is
kept a minute (controller-runtime reads the refusal's ``status.error`` as a failure to authenticate:
500, asked again on every scrape); an authorization is kept five minutes and a denial 30 s, as it
keeps them; a header is a bearer token only as ``Bearer <token>``, nothing after it. Requests it
makes, with an API client of its own: ``create`` TokenReviews and SubjectAccessReviews (the chart's
``<release>-metrics-auth`` ClusterRole).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from trainer.api.objects import Obj
from trainer.controller.client import ApiClient, ApiError
from trainer.controller.credentials import CredentialsError
from trainer.controller.reviews import Busy, RateLimits, ReviewError, Slots, Verdicts, bearer, digest

logger = logging.getLogger("trainer.metrics")

TOKEN_SECONDS = 60.0  # controller-runtime's CacheTTL, for both verdicts on a token
ALLOW_SECONDS = 300.0  # its AllowCacheTTL
DENY_SECONDS = 30.0  # its DenyCacheTTL
MAX_REVIEWS = 4  # a scraper or two, every 15 s or more: a handful at once is already an attack
# Each client address: this many requests at once, and this many a second after that.
PER_CLIENT_BURST = 10
PER_CLIENT_QPS = 1.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class User:
    """Who the API server says a token belongs to: what a SubjectAccessReview asks about."""

    name: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]

    @classmethod
    def of(cls, user: Obj) -> User:
        extra = user.get("extra") or {}
        return cls(
            name=str(user.get("username") or ""),
            uid=str(user.get("uid") or ""),
            groups=tuple(str(g) for g in user.get("groups") or ()),
            extra=tuple(sorted((str(k), tuple(str(v) for v in vs or ())) for k, vs in extra.items())),
        )


class MetricsAuth:
    """TokenReview, then SubjectAccessReview, each remembered for a while."""

    def __init__(
        self,
        client: ApiClient,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.users: Verdicts[User | None] = Verdicts(clock, wall)
        self.decisions: Verdicts[bool] = Verdicts(clock, wall)
        self.slots = Slots(MAX_REVIEWS)

    async def user(self, token: str) -> User | None:
        """Whom ``token`` authenticates, or None. Raises :class:`Busy`, :class:`ReviewError`."""
        key = digest(token)
        kept = self.users.get(key)
        if kept is not None:
            return kept[0]
        review = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        with self.slots.take():
            status = await self._create("/apis/authentication.k8s.io/v1/tokenreviews", review)
        user = User.of(status.get("user") or {}) if status.get("authenticated") is True else None
        # A refusal is kept its minute even for a token past its expiry: that is why it was refused.
        self.users.keep(key, user, TOKEN_SECONDS, token if user is not None else None)
        return user

    async def allowed(self, user: User, verb: str, path: str) -> bool:
        """Whether ``user`` may ``verb`` the non-resource URL ``path``."""
        key = (user, verb, path)
        kept = self.decisions.get(key)
        if kept is not None:
            return kept[0]
        spec: Obj = {
            "user": user.name,
            "groups": list(user.groups),
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        with self.slots.take():
            status = await self._create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
        allowed = status.get("allowed") is True and status.get("denied") is not True
        self.decisions.keep(key, allowed, ALLOW_SECONDS if allowed else DENY_SECONDS)
        return allowed

    async def _create(self, path: str, review: Obj) -> Obj:
        try:
            answer = await self.client.request("POST", path, review)
        except ApiError as exc:
            raise ReviewError(f"{exc.code} {exc.reason}".strip()) from None
        except (aiohttp.ClientError, TimeoutError, CredentialsError) as exc:
            raise ReviewError(type(exc).__name__) from None
        status: Obj = answer.get("status") or {}
        return status


def plain(status: int, text: str, headers: dict[str, str] | None = None) -> web.Response:
    """An answer as Go's ``http.Error`` writes one."""
    response = web.Response(status=status, text=text + "\n", content_type="text/plain", charset="utf-8")
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers.update(headers or {})
    return response


def guarded(handler: Handler, auth: MetricsAuth | None, client_limits: RateLimits | None = None) -> Handler:
    """``handler`` behind authentication and authorization, given ``auth``, and the per-client limit
    that spares the API server reviews. Without ``auth`` nothing is asked, and nothing is limited
    but what the port bounds (controller/serving.py)."""
    if auth is None:
        return handler
    limits = client_limits or RateLimits(qps=PER_CLIENT_QPS, burst=PER_CLIENT_BURST)

    async def guard(request: web.Request) -> web.StreamResponse:
        try:
            return await _checked(request)
        except Exception as exc:  # an answer, never aiohttp's page and traceback
            logger.error("metrics: a request failed: %s", type(exc).__name__)
            return plain(500, "Internal Server Error")

    async def _checked(request: web.Request) -> web.StreamResponse:
        assert auth is not None
        client = request.remote or ""
        if not limits.allow(client):
            return plain(429, "Too Many Requests", {"Retry-After": str(limits.retry_after(client))})
        token = bearer(request.headers.get("Authorization", ""))
        try:
            user = await auth.user(token) if token is not None else None
            if user is None:
                return plain(401, "Unauthorized")
            try:
                allowed = await auth.allowed(user, request.method.lower(), request.path)
            except ReviewError as exc:
                logger.warning("metrics: authorizing %s failed: %s", user.name, exc)
                return plain(500, f"Authorization for user {user.name} failed")
        except Busy:
            return plain(429, "Too Many Requests", {"Retry-After": "1"})
        except ReviewError as exc:
            logger.warning("metrics: authentication failed: %s", exc)
            return plain(500, "Authentication failed")
        if not allowed:
            logger.debug("metrics: authorization denied for user %s", user.name)
            return plain(403, f"Authorization denied for user {user.name}")
        return await handler(request)

    return guard
