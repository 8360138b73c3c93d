"""The operator's metrics keep a bounded set of series, whatever runtime authors write."""

from __future__ import annotations

from prometheus_client import generate_latest

from trainer.controller.metrics import FRAMEWORKS, Metrics, framework_of


def test_the_framework_label_takes_only_known_values() -> None:
    """A runtime's framework label takes any value; each new value was a new series of every
    TrainJob counter for as long as the operator ran (docs/security.md, finding 8)."""
    metrics = Metrics()
    for label in ("torch", None, "", *(f"made-up-{i}" for i in range(100))):
        metrics.created.labels(framework=framework_of(label)).inc()
    text = generate_latest(metrics.registry).decode()
    series = {
        line.split("{", 1)[1].split("}", 1)[0]
        for line in text.splitlines()
        if line.startswith("trainer_trainjobs_created_total{")
    }
    assert series == {f'framework="{f}"' for f in FRAMEWORKS}
    assert 'trainer_trainjobs_created_total{framework="other"} 100.0' in text
    assert 'trainer_trainjobs_created_total{framework="unknown"} 2.0' in text
    assert framework_of("deepspeed") == "deepspeed"
