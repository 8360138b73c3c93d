"""`trainer run` plumbing: the liveness address and what reaches the error log."""

from __future__ import annotations

import logging

from trainer.controller.main import RefusalsAreNotErrors, liveness_endpoint


def test_liveness_defaults_to_the_configured_health_address() -> None:
    assert liveness_endpoint(None, ":8081") == "http://0.0.0.0:8081/healthz"
    assert liveness_endpoint("http://127.0.0.1:9/x", ":8081") == "http://127.0.0.1:9/x"
    assert liveness_endpoint(None, "") is None


def _record(message: str, exc: Exception | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord("kopf.objects", logging.ERROR, __file__, 1, message, (), exc_info)


def test_webhook_refusals_are_info_other_errors_stay_errors() -> None:
    # What kopf logs when our validating handler raises kopf.AdmissionError (a PermanentError).
    refusal = _record("Webhook 'validator.trainjob' failed permanently: spec.trainer.env: reserved")
    assert RefusalsAreNotErrors().filter(refusal) and refusal.levelno == logging.INFO
    crash = _record("Webhook 'validator.trainjob' failed with an exception. Will ignore.", KeyError("boom"))
    assert RefusalsAreNotErrors().filter(crash) and crash.levelno == logging.ERROR
    other = _record("Handler 'trainjobs' failed permanently: boom")
    assert RefusalsAreNotErrors().filter(other) and other.levelno == logging.ERROR
