"""`trainer render` end to end, as other tools call it: a subprocess, files, stdin, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from render_helpers import ROOT, runtime, trainjob

TRAINER = [sys.executable, "-m", "trainer.cli"]
TORCH = {"numNodes": 1, "torch": {}}


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TRAINER, "render", *args], input=stdin, capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def write(tmp: Path, name: str, *objs: dict[str, Any]) -> str:
    path = tmp / name
    path.write_text(yaml.safe_dump_all(objs))
    return str(path)


def test_yaml_output_order_and_determinism(tmp_path: Path) -> None:
    f = write(tmp_path, "in.yaml", runtime(ml_policy=TORCH), trainjob("b"), trainjob("a"))
    first = run("--no-default-runtimes", "-f", f)
    assert first.returncode == 0, first.stderr
    assert first.stdout == run("--no-default-runtimes", "-f", f).stdout, "output must be byte-for-byte stable"
    docs = list(yaml.safe_load_all(first.stdout))
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("TrainJob", "b"),
        ("JobSet", "b"),
        ("ConfigMap", "b-runtime-snapshot"),
        ("TrainJob", "a"),
        ("JobSet", "a"),
        ("ConfigMap", "a-runtime-snapshot"),
    ]
    assert docs[0]["metadata"]["creationTimestamp"] == "1970-01-01T00:00:00Z"
    assert docs[0]["spec"]["runtimeRef"] == {
        "name": "rt",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    assert docs[0]["spec"]["suspend"] is False, "CRD defaults are applied"
    # docs/decisions.md §ttl: built, not started: nothing has reported its Jobs, so no status yet.
    assert "status" not in docs[0]


def test_json_list_stdin_and_now(tmp_path: Path) -> None:
    payload = json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": [runtime(ml_policy=TORCH), trainjob(suspend=True)]}
    )
    out = run(
        "--no-default-runtimes", "-f", "-", "-o", "json", "--now", "2026-05-01T10:00:00Z", stdin=payload
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["kind"] == "List" and data["apiVersion"] == "v1"
    tj = data["items"][0]
    assert tj["metadata"]["creationTimestamp"] == "2026-05-01T10:00:00Z"
    assert tj["status"]["conditions"][0]["lastTransitionTime"] == "2026-05-01T10:00:00Z"


def test_json_input_is_read_as_json(tmp_path: Path) -> None:
    """JSON as json.dumps writes it: an emoji is an escaped surrogate pair, which YAML refuses and
    kubectl's JSON decoder accepts; a lone surrogate becomes U+FFFD, as Go's decoder makes it."""
    env = [{"name": "GREETING", "value": "\U0001f600"}, {"name": "BROKEN", "value": "a\ud83d"}]
    job = trainjob(trainer={"numNodes": 1, "env": env})
    payload = json.dumps(runtime(ml_policy=TORCH)) + "\n" + json.dumps(job)  # a stream of two
    assert "\\ud83d\\ude00" in payload
    path = tmp_path / "in.json"
    path.write_text(payload)
    for output in ("yaml", "json"):
        out = run("--no-default-runtimes", "-f", str(path), "-o", output)
        assert out.returncode == 0, out.stderr
        docs = list(yaml.safe_load_all(out.stdout)) if output == "yaml" else json.loads(out.stdout)["items"]
        jobset = next(d for d in docs if d["kind"] == "JobSet")
        job_template = jobset["spec"]["replicatedJobs"][0]["template"]
        container = job_template["spec"]["template"]["spec"]["containers"][0]
        values = {e["name"]: e.get("value") for e in container["env"]}
        assert values["GREETING"] == "\U0001f600" and values["BROKEN"] == "a\ufffd", values


def test_directory_input_is_lexical_and_not_recursive(tmp_path: Path) -> None:
    write(tmp_path, "b-job.yaml", trainjob())
    write(tmp_path, "a-runtime.yml", runtime(ml_policy=TORCH))
    (tmp_path / "notes.txt").write_text("not a manifest")
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", "x.yaml", trainjob("nested"))
    out = run("--no-default-runtimes", "-f", str(tmp_path), "-o", "json")
    assert out.returncode == 0, out.stderr
    assert [i["metadata"]["name"] for i in json.loads(out.stdout)["items"] if i["kind"] == "TrainJob"] == [
        "job"
    ]


def test_default_runtimes_and_replacement(tmp_path: Path) -> None:
    out = run("-f", write(tmp_path, "j.yaml", trainjob(runtime_name="torch-distributed")), "-o", "json")
    assert out.returncode == 0, out.stderr
    own = runtime("torch-distributed", ml_policy={"numNodes": 4, "torch": {}})
    out = run("-f", write(tmp_path, "k.yaml", own, trainjob(runtime_name="torch-distributed")), "-o", "json")
    jobset = json.loads(out.stdout)["items"][1]
    assert jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] == 4


def test_refusal_exit_1_names_object_and_field(tmp_path: Path) -> None:
    bad = trainjob(trainer={"numNodes": -1})
    out = run("--no-default-runtimes", "-f", write(tmp_path, "bad.yaml", runtime(ml_policy=TORCH), bad))
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr.startswith("TrainJob default/job: spec.trainer.numNodes: ")
    assert "Traceback" not in out.stderr


def test_missing_runtime_is_a_refusal(tmp_path: Path) -> None:
    out = run("--no-default-runtimes", "-f", write(tmp_path, "j.yaml", trainjob(kind="TrainingRuntime")))
    assert out.returncode == 1
    assert "specified trainingRuntime must be created before the TrainJob is created" in out.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("kind: [unclosed", "cannot parse"),
        ("apiVersion: v1\nmetadata: {name: x}\n", "has no apiVersion or kind"),
        ("- just\n- a list\n", "is not an object"),
    ],
)
def test_usage_errors_exit_2(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    out = run("-f", str(path))
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr


def test_unreadable_file_and_bad_flag_exit_2(tmp_path: Path) -> None:
    assert run("-f", str(tmp_path / "absent.yaml")).returncode == 2
    assert run("-f", "x", "-o", "toml").returncode == 2


def test_other_version_gets_a_hint(tmp_path: Path) -> None:
    old = trainjob()
    old["apiVersion"] = "kubeflow.org/v2alpha1"
    out = run("-f", write(tmp_path, "old.yaml", old))
    assert out.returncode == 1
    assert "trainer.kubeflow.org/v1alpha1" in out.stderr


def test_seed_style_mistakes_get_hints(tmp_path: Path) -> None:
    rt = runtime(ml_policy={"numNodes": 1, "pytorch": {}})
    out = run("--no-default-runtimes", "-f", write(tmp_path, "a.yaml", rt))
    assert out.returncode == 1 and "mlPolicy.torch" in out.stderr
    tj = trainjob(runtime_name="torch-distributed", trainer={"numProcPerNode": "auto"})
    out = run("-f", write(tmp_path, "b.yaml", tj))
    assert out.returncode == 1 and "spec.trainer.numProcPerNode" in out.stderr and "integer" in out.stderr
    tj = trainjob(runtime_name="x", kind="torch-distributed")
    out = run("-f", write(tmp_path, "c.yaml", tj))
    assert out.returncode == 1 and "spec.runtimeRef.name" in out.stderr


def test_a_refusal_is_one_line_per_error_and_the_rules_not_checked_a_note(tmp_path: Path) -> None:
    """The API server's `<nil>: Invalid value: "null": some validation rules were not checked ...`
    is no field's reason: render says it once, in plain words, after the object's errors."""
    tj = trainjob(kind="torch-distributed")
    del tj["spec"]["runtimeRef"]["name"]
    tj["spec"]["trainer"] = {"numNodes": "two"}
    out = run("-f", write(tmp_path, "a.yaml", tj))
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.splitlines() == [
        "TrainJob default/job: spec.runtimeRef.name: Required value: put the runtime's name here, not "
        'in kind ("torch-distributed"), which must be TrainingRuntime or ClusterTrainingRuntime',
        'TrainJob default/job: spec.trainer.numNodes: Invalid value: "string": spec.trainer.numNodes in '
        'body must be of type integer: "string"',
        "Note: TrainJob default/job: the API server checks the CRD's validation rules only once the "
        "errors above are corrected; they may find more",
    ]


def test_a_misspelt_runtime_name_gets_the_closest_runtime(tmp_path: Path) -> None:
    runtimes = [runtime(name, ml_policy=TORCH) for name in ("torch-distributed", "jax-distributed")]
    tj = trainjob(runtime_name="torch-distributd")
    out = run("--no-default-runtimes", "-f", write(tmp_path, "a.yaml", *runtimes, tj))
    assert out.returncode == 1
    (line,) = out.stderr.splitlines()
    assert line.startswith('TrainJob default/job: spec.runtimeRef: Invalid value: "torch-distributd": ')
    assert line.endswith(
        "specified clusterTrainingRuntime must be created before the TrainJob is created; "
        'did you mean "torch-distributed"? ClusterTrainingRuntimes that exist: jax-distributed, '
        "torch-distributed"
    )


def test_unused_kinds_are_ignored_with_a_note(tmp_path: Path) -> None:
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}
    out = run("--no-default-runtimes", "-f", write(tmp_path, "s.yaml", svc))
    assert out.returncode == 0
    assert out.stdout == ""
    assert "ignoring Service 's'" in out.stderr


def test_update_is_validated_as_an_update(tmp_path: Path) -> None:
    first = trainjob(trainer={"image": "a"})
    second = trainjob(trainer={"image": "b"})
    out = run(
        "--no-default-runtimes", "-f", write(tmp_path, "u.yaml", runtime(ml_policy=TORCH), first, second)
    )
    assert out.returncode == 1
    assert "spec.trainer: Invalid value" in out.stderr and "field is immutable" in out.stderr


@pytest.mark.parametrize(
    ("metadata", "line"),
    [
        ([], "TrainJob default/: metadata: Invalid value: []: must be an object"),
        ({}, "TrainJob default/: metadata.name: Required value: name or generateName is required"),
        (
            {"name": "x", "labels": []},
            "metadata.labels: Invalid value: []: must be a map of strings to strings",
        ),
        (
            {"name": "x", "annotations": {"a": 1}},
            # Named as the API server's decoder names it (Go struct field ObjectMeta.annotations).
            'metadata.annotations: Invalid value: 1: the value of "a" must be a string',
        ),
        ({"name": "x", "namespace": 5}, "metadata.namespace: Invalid value: 5: must be a string"),
        (  # found by the fuzzer: a list cannot key the stored objects, so it must be refused first
            {"name": "x", "namespace": [None]},
            'TrainJob default/x: metadata.namespace: Invalid value: "array": must be a string',
        ),
    ],
)
def test_malformed_metadata_is_refused_not_crashed_on(tmp_path: Path, metadata: Any, line: str) -> None:
    obj = trainjob()
    obj["metadata"] = metadata
    out = run("--no-default-runtimes", "-f", write(tmp_path, "in.yaml", runtime(ml_policy=TORCH), obj))
    assert out.returncode == 1, out.stderr
    assert line in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


@pytest.mark.parametrize(
    ("obj", "line"),
    [
        (
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": [1]},
            'ConfigMap default/: metadata: Invalid value: "array": must be an object',
        ),
        (
            {"apiVersion": "v1", "kind": "Secret", "metadata": {}},
            "Secret default/: metadata.name: Required value",
        ),
        (
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"generateName": "s-"}},
            "Secret default/: metadata.name: Required value: a cluster object needs a name",
        ),
        (
            {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": 1}},
            "PriorityClass : metadata.name: Invalid value: 1: must be a string",
        ),
    ],
)
def test_malformed_cluster_objects_are_refused_not_crashed_on(tmp_path: Path, obj: Any, line: str) -> None:
    """Objects given as cluster facts (Secrets, PriorityClasses...) are keyed by name too."""
    out = run("--no-default-runtimes", "-f", write(tmp_path, "in.yaml", obj))
    assert out.returncode == 1, out.stderr
    assert line in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr


def test_generate_name_gets_a_stable_name_as_a_server_would_give(tmp_path: Path) -> None:
    obj = trainjob()
    obj["metadata"] = {"generateName": "run-", "namespace": "team"}
    f = write(tmp_path, "in.yaml", runtime(ml_policy=TORCH), obj, obj)
    out = run("--no-default-runtimes", "-f", f, "-o", "json")
    assert out.returncode == 0, out.stderr
    names = [d["metadata"]["name"] for d in json.loads(out.stdout)["items"] if d["kind"] == "TrainJob"]
    assert len(names) == 2 and names[0] != names[1], "two creates from one generateName are two TrainJobs"
    assert all(n.startswith("run-") and len(n) == len("run-") + 5 for n in names)
    assert run("--no-default-runtimes", "-f", f, "-o", "json").stdout == out.stdout


def test_integers_beyond_their_format_are_refused(tmp_path: Path) -> None:
    """An int32 field's overflow: kube-apiserver 1.36 refuses it itself, in its own words (and
    upstream's webhook, decoding into int32 fields, would refuse it after an older server)."""
    objs = (runtime(ml_policy=TORCH), trainjob(trainer={"numNodes": 2**31}))
    out = run("--no-default-runtimes", "-f", write(tmp_path, "in.yaml", *objs))
    assert out.returncode == 1
    assert (
        '<nil>: Invalid value: "": Checked value must be of type integer with format int32 in spec.trainer.numNodes'
        in out.stderr
    )
    assert (
        run(
            "--no-default-runtimes",
            "-f",
            write(tmp_path, "ok.yaml", objs[0], trainjob(trainer={"numNodes": 2**31 - 1})),
        ).returncode
        == 0
    )


def test_now_must_be_an_rfc3339_time(tmp_path: Path) -> None:
    out = run("--now", "garbage", "-f", write(tmp_path, "in.yaml", trainjob()))
    assert out.returncode == 2 and "--now 'garbage'" in out.stderr


def test_warnings_go_to_stderr(tmp_path: Path) -> None:
    deprecated = runtime(ml_policy=TORCH)
    deprecated["metadata"]["labels"] = {"trainer.kubeflow.org/support": "deprecated"}
    out = run("--no-default-runtimes", "-f", write(tmp_path, "in.yaml", deprecated, trainjob()))
    assert out.returncode == 0
    warnings = [line for line in out.stderr.splitlines() if line.startswith("Warning: ")]
    assert [w.split('"')[0] for w in warnings] == [
        "Warning: ClusterTrainingRuntime ",
        "Warning: Referenced ClusterTrainingRuntime ",
    ], "one warning when the runtime is created, one when a TrainJob references it"
    assert all("is deprecated and will be removed in a future release" in w for w in warnings)
    assert "Warning" not in out.stdout


def test_show_secrets_warns_that_the_keys_are_derivable(tmp_path: Path) -> None:
    """The SSH keys render prints are derived from the input, for reproducible output: anyone with
    the manifest has them. Printing them says so, once, on stderr."""
    mpi = write(tmp_path, "mpi.yaml", trainjob("ds", "deepspeed-distributed"))
    shown = run("-f", mpi, "--show-secrets")
    assert shown.returncode == 0, shown.stderr
    assert any(d["kind"] == "Secret" for d in yaml.safe_load_all(shown.stdout))
    [warning] = [line for line in shown.stderr.splitlines() if "--show-secrets" in line]
    assert warning.startswith("Warning: ")
    assert "derived from the input" in warning and "never use it for real jobs" in warning
    assert "Warning" not in shown.stdout
    assert "--show-secrets" not in run("-f", mpi).stderr, "redacted, there is nothing to warn about"
    torch = write(tmp_path, "torch.yaml", trainjob("t", "torch-distributed"))
    assert "--show-secrets" not in run("-f", torch, "--show-secrets").stderr, "no Secret, no warning"


def test_a_status_server_ca_that_is_not_utf8_is_a_usage_error(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"\xff\xfe-----BEGIN CERTIFICATE-----\n")
    out = run(
        "-f", write(tmp_path, "in.yaml", trainjob("t", "torch-distributed")), "--status-server-ca", str(ca)
    )
    assert out.returncode == 2, out.stderr
    assert f"--status-server-ca {ca}: not UTF-8 text" in out.stderr and "Traceback" not in out.stderr
