"""`trainer run` plumbing: the liveness address and what reaches the error log."""

from __future__ import annotations

import json
import logging

import pytest

from trainer.controller.config import Configuration, Health
from trainer.controller.main import RefusalsAreNotErrors, liveness_endpoint


def test_liveness_defaults_to_the_configured_health_address_and_name() -> None:
    assert liveness_endpoint(None, Health(), in_cluster=True) == "http://0.0.0.0:8081/healthz"
    assert liveness_endpoint("http://127.0.0.1:9/x", Health(), in_cluster=True) == "http://127.0.0.1:9/x"
    assert liveness_endpoint(None, Health(healthProbeBindAddress=""), in_cluster=True) is None
    assert liveness_endpoint(None, Health(healthProbeBindAddress="0"), in_cluster=False) is None
    named = Health(healthProbeBindAddress="127.0.0.1:9000", livenessEndpointName="livez")
    assert liveness_endpoint(None, named, in_cluster=True) == "http://127.0.0.1:9000/livez"


def test_outside_a_cluster_an_unset_probe_address_is_loopback_and_a_set_one_is_kept() -> None:
    """Issue #30: `trainer run` on a laptop or a shared host does not serve on every interface
    unless the file asks it to."""
    assert liveness_endpoint(None, Health(), in_cluster=False) == "http://127.0.0.1:8081/healthz"
    every = Health(healthProbeBindAddress=":8081")
    assert liveness_endpoint(None, every, in_cluster=False) == "http://0.0.0.0:8081/healthz"


@pytest.mark.parametrize(
    "health",
    [
        {"readinessEndpointName": "a/b"},  # one path segment
        {"livenessEndpointName": ".."},
        {"livenessEndpointName": ""},
        {"readinessEndpointName": "same", "livenessEndpointName": "same"},
    ],
)
def test_health_endpoint_names_are_one_segment_each_and_differ(health: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="health"):
        Configuration.model_validate({"health": health})


def _record(message: str, exc: Exception | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord("kopf.objects", logging.ERROR, __file__, 1, message, (), exc_info)


def test_kopfs_words_for_a_refusal_are_debug_other_errors_stay_errors() -> None:
    # What kopf logs when our validating handler raises kopf.AdmissionError (a PermanentError):
    # our validator logs the refusal itself, naming the object; kopf's line is for -vv only.
    refusal = _record("Webhook 'validator.trainjob' failed permanently: spec.trainer.env: reserved")
    assert not RefusalsAreNotErrors().filter(refusal) and refusal.levelno == logging.DEBUG
    crash = _record("Webhook 'validator.trainjob' failed with an exception. Will ignore.", KeyError("boom"))
    assert RefusalsAreNotErrors().filter(crash) and crash.levelno == logging.ERROR
    other = _record("Handler 'trainjobs' failed permanently: boom")
    assert RefusalsAreNotErrors().filter(other) and other.levelno == logging.ERROR


def test_log_lines_have_rfc3339_times_and_name_their_object(capsys: pytest.CaptureFixture[str]) -> None:
    """JSON lines carry a time log pipelines parse (RFC 3339, UTC, milliseconds) and the object a
    line is about as fields; plain lines the same time."""
    from trainer.controller.events import Recorder
    from trainer.controller.main import JsonFormatter, TextFormatter, rfc3339

    assert rfc3339(0.25) == "1970-01-01T00:00:00.250Z"
    trainjob = {"metadata": {"name": "mnist", "namespace": "team-a", "uid": "u-1"}}
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep, logger = Keep(), logging.getLogger("trainer.trainjob")
    logger.addHandler(keep)
    # What `trainer run` sets (configure_logging); setLevel, so that an earlier test's cached
    # "INFO is off" for this logger is dropped (assigning .level keeps logging's cache).
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        recorder = Recorder(client=None, capacity=1)  # type: ignore[arg-type]  # never started: queued only
        recorder.record(trainjob, "Normal", "JobSetCreated", "Created JobSet mnist", post=False)
        recorder.record(trainjob, "Warning", "TrainJobFailed", "key -----BEGIN EC PRIVATE KEY-----abc")
    finally:
        logger.removeHandler(keep)
        logger.setLevel(level)
    first, second = records
    # A notice logged, not posted (docs/decisions.md §events), leaves the Event queue to the other.
    assert recorder.queue.qsize() == 1 and recorder.dropped == 0
    assert recorder.queue.get_nowait()["reason"] == "TrainJobFailed"
    line = json.loads(JsonFormatter().format(first))
    assert line["time"].endswith("Z") and len(line["time"]) == len("1970-01-01T00:00:00.250Z")
    assert line["level"] == "info" and line["logger"] == "trainer.trainjob"
    assert line["message"] == "TrainJob team-a/mnist: JobSetCreated: Created JobSet mnist"
    assert {k: line[k] for k in ("kind", "namespace", "name", "uid", "reason")} == {
        "kind": "TrainJob",
        "namespace": "team-a",
        "name": "mnist",
        "uid": "u-1",
        "reason": "JobSetCreated",
    }
    assert second.levelno == logging.WARNING and "PRIVATE KEY" not in second.getMessage()
    text = TextFormatter().format(first)
    assert text.startswith(rfc3339(first.created) + " INFO    trainer.trainjob: TrainJob team-a/mnist")
