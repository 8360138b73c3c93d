"""`trainer migrate` prints only what `trainer render` admits: a conversion a cluster would refuse
(a value v2 cannot take) is exit 2, naming the v1 job, the field and the reason, and is not printed;
the other jobs are still converted. No integer field is ever printed as a float."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from migrate_helpers import migrate, render, run
from test_migrate import pytorchjob
from v1_examples import pi


def kinds_and_names(out: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(o["kind"], o["metadata"]["name"]) for o in out]


def test_replicas_beyond_int32_are_refused_naming_the_job_and_field(capsys: Any, monkeypatch: Any) -> None:
    big = pytorchjob(name="big", workers=2**31)
    code, out, err = migrate([big, pytorchjob(name="fine")], capsys, monkeypatch)
    assert code == 1, err
    assert kinds_and_names(out) == [("TrainJob", "fine")], "the refused job is not printed, the other is"
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith("error: PyTorchJob team-a/big: a cluster would refuse its TrainJob team-a/big: ")
    assert "Checked value must be of type integer with format int32 in spec.trainer.numNodes" in line
    assert "Warning: PyTorchJob team-a/big" not in err, "no notes for a job that is not printed"


def test_an_mpi_hostfile_over_the_configmap_limit_is_refused(capsys: Any, monkeypatch: Any) -> None:
    job = pi()
    job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 200_000
    code, out, err = migrate([job], capsys, monkeypatch)
    assert code == 1 and out == []
    assert "error: MPIJob ml/pi: a cluster would refuse its TrainJob ml/pi: spec.trainer.numNodes: " in err
    assert "over the ConfigMap limit" in err


def test_mpi_slots_beyond_int32_name_the_runtime_first(capsys: Any, monkeypatch: Any) -> None:
    """The job's TrainingRuntime is refused; the TrainJob after it, which names it, is not tried."""
    code, out, err = migrate([pi(slotsPerWorker=2**31)], capsys, monkeypatch)
    assert code == 1 and out == []
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [
        'error: MPIJob ml/pi: a cluster would refuse its TrainingRuntime ml/pi: <nil>: Invalid value: "": '
        "Checked value must be of type integer with format int32 in spec.mlPolicy.mpi.numProcPerNode"
    ]


def test_what_migrate_prints_render_admits(capsys: Any, monkeypatch: Any) -> None:
    """The check is render's own: a job just inside the limits converts and renders."""
    job = pi()
    job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 30_000
    code, out, err = migrate([job], capsys, monkeypatch)
    assert code == 0, err
    assert kinds_and_names(out) == [("TrainingRuntime", "pi"), ("TrainJob", "pi")]
    assert any(o["kind"] == "JobSet" for o in render(out, capsys, monkeypatch))


def with_grace(seconds: object) -> dict[str, Any]:
    """A PyTorchJob with a runtime of its own (restartPolicy Never) whose pods carry ``seconds``."""
    job = pytorchjob(name="grace")
    for rspec in job["spec"]["pytorchReplicaSpecs"].values():
        rspec["restartPolicy"] = "Never"
        rspec["template"]["spec"]["terminationGracePeriodSeconds"] = copy.copy(seconds)
    return job


def test_an_integral_float_is_printed_as_an_integer(capsys: Any, monkeypatch: Any) -> None:
    """``30.0`` is an integer to the API server (it stores 30); migrate prints it as one."""
    code, out, err = migrate([with_grace(30.0)], capsys, monkeypatch)
    assert code == 0, err
    [runtime] = [o for o in out if o["kind"] == "TrainingRuntime"]
    [rjob] = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    grace = rjob["template"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == 30 and isinstance(grace, int)

    code, text, err = run(
        ["migrate", "-f", "-", "-o", "json"], json.dumps(with_grace(30.0)), capsys, monkeypatch
    )
    assert code == 0, err
    assert '"terminationGracePeriodSeconds": 30\n' in text or '"terminationGracePeriodSeconds": 30,' in text


@pytest.mark.parametrize("seconds", [1.5, 1e40])
def test_a_float_in_an_integer_field_is_refused(seconds: float, capsys: Any, monkeypatch: Any) -> None:
    code, out, err = migrate([with_grace(seconds)], capsys, monkeypatch)
    assert code == 1 and out == []
    assert "error: PyTorchJob team-a/grace: a cluster would refuse its TrainingRuntime team-a/grace: " in err
    assert "terminationGracePeriodSeconds" in err


@pytest.mark.parametrize(
    ("replicas", "code", "reason"),
    [
        ("1e40", 1, "spec.pytorchReplicaSpecs.Worker.replicas: "),  # a float in JSON; '1e40' in YAML
        ("1.0e+40", 1, "spec.pytorchReplicaSpecs.Worker.replicas: "),  # a float in both
        (str(10**40), 1, "Checked value must be of type integer with format int32 in spec.trainer.numNodes"),
    ],
)
@pytest.mark.parametrize("read_as", ["json", "yaml"])
def test_huge_replicas_never_print_a_number_v2_cannot_take(
    replicas: str, code: int, reason: str, read_as: str, capsys: Any, monkeypatch: Any
) -> None:
    """A replica count that is not an integer is migrate's own refusal; an integer beyond int32 is
    admission's. Either way it is named, exit 1, and nothing is printed."""
    text = json.dumps(pytorchjob(name="huge", workers=7)).replace('"replicas": 7', f'"replicas": {replicas}')
    if read_as == "yaml":
        text = "---\n" + text  # the same text, read by the YAML reader
    got, out, err = run(["migrate", "-f", "-"], text, capsys, monkeypatch)
    assert (got, out) == (code, ""), err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith("error: PyTorchJob team-a/huge: ") and reason in line
