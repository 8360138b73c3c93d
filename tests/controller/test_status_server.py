"""The progress status server's HTTP contract (controller/status_server.py), with a fake
authenticator and a fake write: the order of its checks, each refusal's code and Status, and that
a refused request writes nothing. Authentication itself is proven on the real control plane
(tests/operator/test_status_server_e2e.py); here its verdicts are given, and the TokenReview
checks run against canned API answers."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from trainer.controller.client import ApiError
from trainer.controller.status_server import (
    MAX_REVIEWS,
    REJECT_CACHE_SECONDS,
    AuthenticationError,
    Busy,
    RateLimits,
    Server,
    TokenReviewAuthenticator,
    decode_request,
)
from trainer.controller.tls_certificates import write_self_signed
from trainer.runtime.info import Facts

Obj = dict[str, Any]
PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}/status"
GOOD = "token-of-a-pod-of-team-job"
SDK_TIME = "2026-11-25T12:00:00.123456+00:00"


class FakeAuthenticator:
    """Tokens and the one TrainJob each may report for; "boom" cannot be checked (500)."""

    def __init__(self) -> None:
        self.tokens = {GOOD: ("team", "job"), "token-of-a-pod-of-other": ("team", "other")}
        self.calls: list[tuple[str, str, str]] = []

    async def authenticate(self, token: str, namespace: str, name: str) -> bool:
        self.calls.append((token, namespace, name))
        if token == "boom":
            raise AuthenticationError("the API server is away")
        return self.tokens.get(token) == (namespace, name)


class Harness:
    def __init__(self, tmp: Path) -> None:
        import ssl

        cert, key = write_self_signed(tmp, ["127.0.0.1"])
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        self.ca = str(cert)
        self.auth = FakeAuthenticator()
        self.writes: list[tuple[str, str, Obj]] = []
        self.fail_with: ApiError | None = None
        self.server = Server(
            self.auth,
            self.write,
            ssl_context=context,
            host="127.0.0.1",
            port=0,
            limits=RateLimits(qps=0.001, burst=5),
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)

    async def write(self, namespace: str, name: str, trainer_status: Obj) -> Obj:
        if self.fail_with is not None:
            raise self.fail_with
        self.writes.append((namespace, name, trainer_status))
        return {}

    def url(self, ns: str = "team", name: str = "job") -> str:
        return f"https://127.0.0.1:{self.server.port}" + PATH.format(ns=ns, name=name)

    def post(
        self, body: Any = None, *, token: str | None = GOOD, url: str | None = None, **kw: Any
    ) -> requests.Response:
        headers = kw.pop("headers", {})
        if token is not None:
            headers.setdefault("Authorization", f"Bearer {token}")
        if body is not None and "data" not in kw:
            kw["data"] = json.dumps(body)
        return requests.post(url or self.url(), headers=headers, verify=self.ca, timeout=10, **kw)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    try:
        yield h
    finally:
        h.stop()


def status(response: requests.Response, code: int, reason: str, message: str) -> None:
    assert response.status_code == code, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["status"] == "Failure" and body["code"] == code, body
    assert body["reason"] == reason and body["message"] == message, body


def progress(percent: int = 42, **extra: Any) -> Obj:
    return {"trainerStatus": {"progressPercentage": percent, "lastUpdatedTime": SDK_TIME, **extra}}


def test_a_pod_of_the_trainjob_writes_only_trainer_status_as_given(harness: Harness) -> None:
    sent = progress(estimatedRemainingSeconds=120, metrics=[{"name": "loss", "value": "0.5"}], unknown=1)
    response = harness.post(sent)
    assert response.status_code == 200, response.text
    expected = {
        "progressPercentage": 42,
        "estimatedRemainingSeconds": 120,
        "metrics": [{"name": "loss", "value": "0.5"}],
        "lastUpdatedTime": "2026-11-25T12:00:00Z",  # metav1.Time: UTC, to the second
    }
    assert harness.writes == [("team", "job", expected)]
    assert response.json() == {"trainerStatus": expected}
    # Bearer is matched without regard to case, as upstream's server matches it.
    assert (
        harness.post(progress(), headers={"Authorization": f"bEaReR {GOOD}"}, token=None).status_code == 200
    )


def test_no_trainer_status_is_echoed_and_nothing_is_written(harness: Harness) -> None:
    for body in ({}, {"trainerStatus": None}, None):
        response = harness.post(body, data="null" if body is None else json.dumps(body))
        assert response.status_code == 200 and response.json() == {}, response.text
    assert harness.writes == []


@pytest.mark.parametrize(
    "token,url_of",
    [
        ("token-of-a-pod-of-other", ("team", "job")),  # a pod of another TrainJob
        (GOOD, ("team", "other")),  # a pod of this TrainJob, for another's path (another audience)
        (GOOD, ("elsewhere", "job")),  # another namespace
        ("expired-or-forged", ("team", "job")),
    ],
)
def test_a_token_not_of_this_trainjob_is_forbidden_and_nothing_is_written(
    harness: Harness, token: str, url_of: tuple[str, str]
) -> None:
    status(harness.post(progress(), token=token, url=harness.url(*url_of)), 403, "Forbidden", "Forbidden")
    assert harness.writes == []


@pytest.mark.parametrize("header", ["", "Bearer", f"Basic {GOOD}", f"Bearer {GOOD} extra", f"Token {GOOD}"])
def test_a_malformed_authorization_header_is_forbidden_never_401(harness: Harness, header: str) -> None:
    headers = {"Authorization": header} if header else {}
    status(harness.post(progress(), token=None, headers=headers), 403, "Forbidden", "Forbidden")
    assert harness.writes == []
    assert all(call[0] == GOOD for call in harness.auth.calls) or not harness.auth.calls


def test_an_authenticator_that_cannot_tell_is_an_internal_error(harness: Harness) -> None:
    status(harness.post(progress(), token="boom"), 500, "InternalError", "Internal error")
    assert harness.writes == []


@pytest.mark.parametrize(
    "data",
    [
        "{not json",
        "[1, 2]",
        '"text"',
        '{"trainerStatus": "half"}',
        '{"trainerStatus": {"progressPercentage": "ten", "lastUpdatedTime": "2026-11-25T12:00:00Z"}}',
        '{"trainerStatus": {"progressPercentage": 5.5, "lastUpdatedTime": "2026-11-25T12:00:00Z"}}',
        '{"trainerStatus": {"metrics": {"loss": 1}, "lastUpdatedTime": "2026-11-25T12:00:00Z"}}',
        '{"trainerStatus": {"metrics": [{"name": "loss", "value": 1}]}}',
        '{"trainerStatus": {"lastUpdatedTime": "yesterday"}}',
        b"\xff\xfe",
    ],
)
def test_a_malformed_body_is_invalid_and_nothing_is_written(harness: Harness, data: str | bytes) -> None:
    status(harness.post(data=data), 422, "Invalid", "Invalid payload")
    assert harness.writes == []


def test_a_body_over_64_kib_is_refused_before_anything_else(harness: Harness) -> None:
    big = json.dumps(progress(metrics=[{"name": f"m{i}", "value": "x" * 60} for i in range(1200)]))
    assert len(big) > 65536
    status(harness.post(data=big), 413, "RequestEntityTooLarge", "Payload too large")
    # Before routing and before authentication: any path, no token.
    status(
        harness.post(data=big, token=None, url=f"https://127.0.0.1:{harness.server.port}/nowhere"),
        413,
        "RequestEntityTooLarge",
        "Payload too large",
    )
    assert harness.auth.calls == [] and harness.writes == []
    # Streamed without a declared length: refused as it is read, as upstream's server does.
    chunks = (big[i : i + 8192].encode() for i in range(0, len(big), 8192))
    status(harness.post(data=chunks), 422, "Invalid", "Invalid payload")
    assert harness.writes == []
    # Exactly 64 KiB is allowed through to decoding.
    exact = json.dumps(progress()).ljust(65536)
    assert harness.post(data=exact).status_code == 200


@pytest.mark.parametrize("method", ["GET", "PUT", "PATCH", "DELETE"])
def test_any_other_method_is_not_found(harness: Harness, method: str) -> None:
    response = requests.request(
        method,
        harness.url(),
        headers={"Authorization": f"Bearer {GOOD}"},
        data=json.dumps(progress()),
        verify=harness.ca,
        timeout=10,
    )
    status(response, 404, "NotFound", "Not found")
    assert harness.writes == [] and harness.auth.calls == []


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/job",
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/job/status/extra",
        "/apis/trainer.kubeflow.org/v1/namespaces/team/trainjobs/job/status",
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/jobsets/job/status",
    ],
)
def test_any_other_path_is_not_found(harness: Harness, path: str) -> None:
    status(
        harness.post(progress(), url=f"https://127.0.0.1:{harness.server.port}{path}"),
        404,
        "NotFound",
        "Not found",
    )
    assert harness.writes == [] and harness.auth.calls == []


def test_the_api_servers_refusals(harness: Harness) -> None:
    harness.fail_with = ApiError(
        422,
        {
            "reason": "Invalid",
            "message": 'TrainJob.trainer.kubeflow.org "job" is invalid: lastUpdatedTime is required',
        },
    )
    status(
        harness.post({"trainerStatus": {"progressPercentage": 1}}),
        422,
        "Invalid",
        'TrainJob.trainer.kubeflow.org "job" is invalid: lastUpdatedTime is required',
    )
    harness.fail_with = ApiError(
        404, {"reason": "NotFound", "message": 'trainjobs.trainer.kubeflow.org "job" not found'}
    )
    status(harness.post(progress()), 404, "NotFound", "Train job not found")
    harness.fail_with = ApiError(500, {"reason": "InternalError", "message": "etcd is away"})
    status(harness.post(progress()), 500, "InternalError", "Internal error")


def test_each_trainjob_has_its_own_rate_limit(harness: Harness) -> None:
    harness.auth.tokens["token-of-a-pod-of-other"] = ("team", "other")
    for _ in range(5):
        assert harness.post(progress()).status_code == 200
    refused = harness.post(progress())
    status(refused, 429, "TooManyRequests", "Too many requests")
    assert int(refused.headers["Retry-After"]) >= 1
    assert len(harness.writes) == 5
    # Another TrainJob is not held back by this one's pods.
    other = harness.post(progress(), token="token-of-a-pod-of-other", url=harness.url("team", "other"))
    assert other.status_code == 200
    # Refusals before authentication do not use up its share.
    for _ in range(3):
        assert harness.post(progress(), token="nope", url=harness.url("team", "other")).status_code == 403


def test_decoding_keeps_fields_in_order_and_sends_a_missing_time_as_null() -> None:
    decoded = decode_request(
        b'{"trainerStatus": {"metrics": [{"name": "b", "value": "2"}, {"name": "a", "value": "1"}]}}'
    )
    assert decoded == {
        "trainerStatus": {
            "metrics": [{"name": "b", "value": "2"}, {"name": "a", "value": "1"}],
            "lastUpdatedTime": None,
        }
    }


# --- the TokenReview checks, against canned answers ---------------------------------------------


TRAINJOB_UID = "tj-uid"


def reviewed(
    *,
    authenticated: bool = True,
    audiences: list[str] | None = None,
    user: str = "system:serviceaccount:team:default",
    pod: tuple[str, str] | None = ("job-node-0-0-abcde", "pod-uid"),
) -> Obj:
    extra = {}
    if pod is not None:
        extra = {
            "authentication.kubernetes.io/pod-name": [pod[0]],
            "authentication.kubernetes.io/pod-uid": [pod[1]],
        }
    aud = "trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/job/status"
    return {
        "status": {
            "authenticated": authenticated,
            "audiences": [aud] if audiences is None else audiences,
            "user": {"username": user, "extra": extra},
        }
    }


class CannedClient:
    def __init__(self, objects: dict[str, Obj], review: Obj) -> None:
        self.objects, self.review = objects, review
        self.requests: list[tuple[str, str, Obj | None]] = []

    async def request(
        self,
        method: str,
        path: str,
        body: Obj | None = None,
        *,
        params: dict[str, str] | None = None,
        **_: Any,
    ) -> Obj:
        self.requests.append((method, path, body))
        if method == "POST":
            return self.review
        if params is not None:  # a LIST by name
            name = params["fieldSelector"].removeprefix("metadata.name=")
            found = self.objects.get(f"{path}/{name}")
            return {"items": [found] if found is not None else []}
        if path in self.objects:
            return self.objects[path]
        raise ApiError(404, {"reason": "NotFound"})


def _controller(api_version: str, kind: str, name: str, uid: str) -> list[Obj]:
    return [{"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True}]


def world(
    *,
    jobset_owner_uid: str = TRAINJOB_UID,
    pod_uid: str = "pod-uid",
    pod_owner: str | None = "Job",
    job_jobset_uid: str = "js-uid",
) -> dict[str, Obj]:
    # The owner chain, as the Job and JobSet controllers write it; the pod's labels say the same
    # (anyone who creates a pod can write them): not read.
    labels = {"jobset.sigs.k8s.io/jobset-name": "job", "jobset.sigs.k8s.io/jobset-uid": "js-uid"}
    owners = _controller("batch/v1", pod_owner, "job-node-0", "job-uid") if pod_owner else []
    return {
        "/api/v1/namespaces/team/pods/job-node-0-0-abcde": {
            "metadata": {"uid": pod_uid, "labels": labels, "ownerReferences": owners}
        },
        "/apis/batch/v1/namespaces/team/jobs/job-node-0": {
            "metadata": {
                "uid": "job-uid",
                "ownerReferences": _controller("jobset.x-k8s.io/v1alpha2", "JobSet", "job", job_jobset_uid),
            }
        },
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/job": {
            "metadata": {"uid": TRAINJOB_UID}
        },
        "/apis/jobset.x-k8s.io/v1alpha2/namespaces/team/jobsets/job": {
            "metadata": {
                "uid": "js-uid",
                "ownerReferences": [
                    {
                        "apiVersion": "trainer.kubeflow.org/v1alpha1",
                        "kind": "TrainJob",
                        "name": "job",
                        "uid": jobset_owner_uid,
                        "controller": True,
                    }
                ],
            }
        },
    }


@pytest.mark.parametrize(
    "objects,review,verdict",
    [
        (world(), reviewed(), True),
        (world(), reviewed(authenticated=False), False),  # expired, forged, the wrong audience
        (world(), reviewed(audiences=["another"]), False),
        (
            world(),
            reviewed(user="system:serviceaccount:elsewhere:default"),
            False,
        ),  # upstream's namespace rule
        (world(), reviewed(user="alice"), False),
        (world(), reviewed(pod=None), False),  # a token bound to no pod
        (world(pod_uid="another-pod"), reviewed(), False),  # the pod was replaced by one of that name
        (world(pod_owner=None), reviewed(), False),  # a pod of no Job, whatever its labels say
        (world(pod_owner="ReplicaSet"), reviewed(), False),  # a pod of something else, labelled as ours
        (world(job_jobset_uid="an-earlier-jobset"), reviewed(), False),  # a Job of another JobSet
        (world(jobset_owner_uid="an-earlier-trainjob"), reviewed(), False),  # a JobSet of another TrainJob
        ({}, reviewed(), False),  # the pod is gone
    ],
)
def test_token_review_checks(objects: dict[str, Obj], review: Obj, verdict: bool) -> None:
    client = CannedClient(objects, review)
    authenticator = TokenReviewAuthenticator(client, Facts())  # type: ignore[arg-type]
    assert asyncio.run(authenticator.authenticate("a.eyJleHAiOiA5OTk5OTk5OTk5fQ.c", "team", "job")) is verdict
    method, path, body = client.requests[0]
    assert method == "POST" and path == "/apis/authentication.k8s.io/v1/tokenreviews"
    assert body is not None and body["spec"]["audiences"] == [
        "trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/job/status"
    ]


def test_an_accepted_token_is_kept_a_minute_at_most_and_never_past_its_expiry() -> None:
    now = [1000.0]
    client = CannedClient(world(), reviewed())
    authenticator = TokenReviewAuthenticator(client, Facts(), clock=lambda: now[0], wall=lambda: now[0])  # type: ignore[arg-type]
    # exp = 1030: kept 30 s, not 60.
    token = "a.eyJleHAiOiAxMDMwfQ.c"

    def check() -> bool:
        return asyncio.run(authenticator.authenticate(token, "team", "job"))

    assert check() and len(client.requests) == 5  # review, pod, Job, TrainJob, JobSet
    now[0] = 1029.0
    assert check() and len(client.requests) == 5
    now[0] = 1031.0
    client.review = reviewed(authenticated=False)  # the API server now says expired
    assert not check()


def test_an_api_server_that_cannot_review_is_an_authentication_error() -> None:
    class Failing(CannedClient):
        async def request(self, method: str, path: str, body: Obj | None = None, **_: Any) -> Obj:
            raise ApiError(503, {"reason": "ServiceUnavailable"})

    authenticator = TokenReviewAuthenticator(Failing({}, {}), Facts())  # type: ignore[arg-type]
    with pytest.raises(AuthenticationError):
        asyncio.run(authenticator.authenticate("t", "team", "job"))


# --- the CA the pods are given ---------------------------------------------------------------------


def test_the_ca_comes_from_the_certificate_secret_or_the_certificate_directory(tmp_path: Path) -> None:
    import base64

    from trainer.controller.status_server import CertificateAuthority, refresh_facts

    secret_path = "/api/v1/namespaces/kubeflow-system/secrets/kubeflow-trainer-webhook-cert"
    pem = "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n"
    secret = {"data": {"ca.crt": base64.b64encode(pem.encode()).decode(), "tls.crt": "eA=="}}
    from_secret = CertificateAuthority(CannedClient({secret_path: secret}, {}), secret_path)  # type: ignore[arg-type]
    assert asyncio.run(from_secret.read()) == (pem, None)
    no_ca = CertificateAuthority(CannedClient({secret_path: {"data": {}}}, {}), secret_path)  # type: ignore[arg-type]
    assert asyncio.run(no_ca.read()) == ("", None)  # upstream: failed to find status server ca.crt
    missing = CertificateAuthority(CannedClient({}, {}), secret_path)  # type: ignore[arg-type]
    ca, error = asyncio.run(missing.read())
    assert ca == "" and error is not None and "404" in error  # upstream: failed to look up ...

    # A certificate directory: its ca.crt (cert-manager's), else its tls.crt (a self-signed one).
    (tmp_path / "tls.crt").write_text("self-signed")
    assert asyncio.run(CertificateAuthority(cert_dir=tmp_path).read()) == ("self-signed", None)
    (tmp_path / "ca.crt").write_text(pem)
    assert asyncio.run(CertificateAuthority(cert_dir=tmp_path).read()) == (pem, None)
    assert asyncio.run(CertificateAuthority(cert_dir=tmp_path / "gone").read())[1] is not None

    # The facts follow the CA; a failed read keeps the CA last read.
    facts = Facts()
    url = "https://svc.ns.svc:10443"
    assert asyncio.run(refresh_facts(facts, url, CertificateAuthority(cert_dir=tmp_path)))
    assert facts.status_server is not None and facts.status_server.ca_cert == pem
    assert not asyncio.run(refresh_facts(facts, url, CertificateAuthority(cert_dir=tmp_path)))
    assert not asyncio.run(refresh_facts(facts, url, missing))
    assert facts.status_server.ca_cert == pem
    (tmp_path / "ca.crt").write_text(pem + pem)
    assert asyncio.run(refresh_facts(facts, url, CertificateAuthority(cert_dir=tmp_path)))
    assert facts.status_server.ca_cert == pem + pem


def test_a_refused_token_is_refused_again_without_asking_for_a_while() -> None:
    now = [1000.0]
    client = CannedClient(world(), reviewed(authenticated=False))
    authenticator = TokenReviewAuthenticator(client, Facts(), clock=lambda: now[0], wall=lambda: now[0])  # type: ignore[arg-type]

    def check() -> bool:
        return asyncio.run(authenticator.authenticate("junk", "team", "job"))

    assert not check() and len(client.requests) == 1
    now[0] = 1000.0 + REJECT_CACHE_SECONDS - 1
    assert not check() and len(client.requests) == 1, "junk costs the API server nothing more"
    now[0] = 1000.0 + REJECT_CACHE_SECONDS + 1
    client.review = reviewed()
    assert check(), "a token refused once may be good later (its pod had not started yet)"


def test_token_reviews_under_way_are_bounded_and_one_more_is_busy() -> None:
    release = asyncio.Event()

    class Slow(CannedClient):
        async def request(self, method: str, path: str, body: Obj | None = None, **kwargs: Any) -> Obj:
            if method == "POST":
                await release.wait()
            return await super().request(method, path, body, **kwargs)

    async def main() -> None:
        authenticator = TokenReviewAuthenticator(Slow(world(), reviewed()), Facts())  # type: ignore[arg-type]
        waiting = [
            asyncio.create_task(authenticator.authenticate(f"token-{i}", "team", "job"))
            for i in range(MAX_REVIEWS)
        ]
        await asyncio.sleep(0.01)
        with pytest.raises(Busy):
            await authenticator.authenticate("one-more", "team", "job")
        release.set()
        assert all(await asyncio.gather(*waiting))
        assert await authenticator.authenticate("one-more", "team", "job"), "room again"

    asyncio.run(main())


def test_one_client_address_is_limited_before_its_token_is_looked_at(harness: Harness) -> None:
    harness.server.client_limits = RateLimits(qps=0.001, burst=3)
    codes = [harness.post(progress(), token="junk").status_code for _ in range(5)]
    assert codes == [403, 403, 403, 429, 429]
    assert len(harness.auth.calls) == 3, "the limited requests reached no TokenReview"
