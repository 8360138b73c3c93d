"""What the `trainer migrate` tests share: running the CLI, rendering its output, reading env."""

from __future__ import annotations

import io
from typing import Any

import pytest
import yaml

from trainer.cli import main

COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def run(
    argv: list[str], stdin: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def migrate(
    jobs: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    *flags: str,
) -> tuple[int, list[dict[str, Any]], str]:
    code, out, err = run(["migrate", "-f", "-", *flags], yaml.safe_dump_all(jobs), capsys, monkeypatch)
    return code, [d for d in yaml.safe_load_all(out) if d], err


def render(
    objects: list[dict[str, Any]], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> list[dict[str, Any]]:
    code, out, err = run(["render", "-f", "-"], yaml.safe_dump_all(objects), capsys, monkeypatch)
    assert code == 0, err
    return [d for d in yaml.safe_load_all(out) if d]


def jobset_of(
    objects: list[dict[str, Any]], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    [jobset] = [o for o in render(objects, capsys, monkeypatch) if o["kind"] == "JobSet"]
    return jobset


def pods(jobset: dict[str, Any]) -> dict[str, tuple[int, dict[str, Any]]]:
    """Each replicated job's pod count and pod template."""
    out = {}
    for rjob in jobset["spec"]["replicatedJobs"]:
        spec = rjob["template"]["spec"]
        out[rjob["name"]] = (rjob.get("replicas", 1) * spec.get("parallelism", 1), spec["template"])
    return out


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env") or []}


def v1_crd(kind: str, versions: tuple[str, ...] = ("v1",)) -> dict[str, Any]:
    """A Training Operator v1 CRD as a plain CRD: any object of the kind is accepted."""
    plural = kind.lower() + "s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.kubeflow.org"},
        "spec": {
            "group": "kubeflow.org",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": i == 0,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
                for i, version in enumerate(versions)
            ],
        },
    }
