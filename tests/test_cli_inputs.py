"""Hostile or broken input files for `trainer render` and `trainer migrate`: each is a usage error
(exit 2) naming the file and the reason, never a hang, a traceback or an internal error (exit 3);
ordinary anchors, and documents up to the bounds, still read.

Both commands read manifests through trainer/offline/manifests.py, so the cases run through both.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from render_helpers import trainjob

from trainer.cli import main
from trainer.offline.manifests import MAX_ALIASED_NODES, MAX_DEPTH

COMMANDS = ("render", "migrate")


def run(command: str, path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    code = main([command, "-f", str(path), *flags])
    out, err = capsys.readouterr()
    return code, out, err


def usage_error(command: str, path: Path, capsys: pytest.CaptureFixture[str], *reason: str) -> None:
    """Run ``command`` on ``path``: exit 2, nothing on stdout, the file and ``reason`` on stderr."""
    code, out, err = run(command, path, capsys)
    assert code == 2, err
    assert out == ""
    assert str(path) in err and all(r in err for r in reason), err
    assert "Traceback" not in err and "internal error" not in err


def billion_laughs(levels: int = 9, width: int = 9, uses: int = 1) -> str:
    """A TrainJob whose args hold ``uses`` times ``width ** levels`` strings, in a few hundred
    bytes of anchors, each level ``width`` aliases of the one before."""
    lines = ["apiVersion: trainer.kubeflow.org/v1alpha1", "kind: TrainJob", "metadata: {name: lol}", "x:"]
    lines.append(f"  a0: &a0 [{','.join(['lol'] * width)}]")
    for i in range(1, levels):
        lines.append(f"  a{i}: &a{i} [{','.join([f'*a{i - 1}'] * width)}]")
    args = ",".join([f"*a{levels - 1}"] * uses)
    lines.append(f"spec: {{runtimeRef: {{name: torch-distributed}}, trainer: {{args: [{args}]}}}}")
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", COMMANDS)
def test_an_alias_bomb_is_refused_before_it_is_expanded(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "lol.yaml"
    path.write_text(billion_laughs())
    assert len(path.read_bytes()) < 600
    usage_error(command, path, capsys, f"aliases expand to more than {MAX_ALIASED_NODES} nodes")


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    "spec",
    [
        "&s {runtimeRef: {name: torch-distributed}, trainer: {x: *s}}",
        "{runtimeRef: {name: torch-distributed}, trainer: {args: &l [a, *l]}}",
    ],
)
def test_a_recursive_alias_is_refused(
    command: str, spec: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text(
        f"apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {{name: j}}\nspec: {spec}\n"
    )
    usage_error(command, path, capsys, "recursive alias")


def test_ordinary_anchors_and_merge_keys_still_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A manifest sharing blocks through anchors (and a merge key) reads as its expansion."""
    path = tmp_path / "anchors.yaml"
    path.write_text(
        """
apiVersion: v1
kind: List
items:
- apiVersion: trainer.kubeflow.org/v1alpha1
  kind: TrainJob
  metadata: {name: shared, namespace: default}
  spec:
    runtimeRef: &ref {name: torch-distributed}
    trainer:
      env: &env
      - {name: A, value: "1"}
      - {name: B, value: "2"}
- apiVersion: trainer.kubeflow.org/v1alpha1
  kind: TrainJob
  metadata: {name: again, namespace: default}
  spec:
    runtimeRef: *ref
    trainer:
      env: *env
      resourcesPerNode:
        limits: &small {cpu: "1", memory: 1Gi}
        requests:
          <<: *small
          cpu: 500m
"""
    )
    code, out, err = run("render", path, capsys)
    assert code == 0, err
    jobs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(out) if d["kind"] == "TrainJob"}
    assert jobs["again"]["spec"]["trainer"]["env"] == jobs["shared"]["spec"]["trainer"]["env"]
    assert jobs["again"]["spec"]["trainer"]["resourcesPerNode"]["requests"] == {
        "cpu": "500m",
        "memory": "1Gi",
    }


def test_aliases_up_to_the_bound_are_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Just under the bound: 10 ** 4 strings, shared, used 7 times (about 90 000 nodes in all)."""
    path = tmp_path / "many.yaml"
    path.write_text(billion_laughs(levels=4, width=10, uses=7))
    code, _, err = run("render", path, capsys)
    assert code == 1 and 'unknown field "x"' in err, err  # read, then judged: x is no TrainJob field
    path.write_text(billion_laughs(levels=4, width=10, uses=9))
    usage_error("render", path, capsys, "aliases expand to more than")


def test_the_alias_bound_is_for_all_documents_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Small bombs do not add up to a large one: not in one stream, not over several files."""
    half = billion_laughs(levels=4, width=10, uses=4)  # about 57 000 nodes
    one, two = tmp_path / "one.yaml", tmp_path / "two.yaml"
    one.write_text(half)
    assert run("render", one, capsys)[0] == 1  # read, then judged
    one.write_text(half + "---\n" + half)
    usage_error("render", one, capsys, "document 2: aliases expand to more than")
    one.write_text(half)
    two.write_text(half)
    code = main(["render", "-f", str(one), "-f", str(two)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and f"{two}: document 1: aliases expand to more than" in err, err


@pytest.mark.parametrize("command", COMMANDS)
def test_a_file_that_is_not_utf8_is_a_usage_error(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: café}\n".encode("latin-1"))
    usage_error(command, path, capsys, "not UTF-8 text", "0xe9")


@pytest.mark.parametrize("command", COMMANDS)
def test_stdin_that_is_not_utf8_is_a_usage_error(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stdin = io.TextIOWrapper(io.BytesIO(b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: caf\xe9}\n"))
    monkeypatch.setattr("sys.stdin", stdin)
    code = main([command, "-f", "-"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert "<stdin>: not UTF-8 text" in err and "Traceback" not in err


def nested(levels: int) -> Any:
    """``levels`` mappings, one in the other, around a string of brackets (which are no levels)."""
    value: Any = "{[{["
    for _ in range(levels):
        value = {"a": value}
    return value


def written(obj: Any, suffix: str) -> str:
    """JSON, or the same as YAML: a document marker first, so it is read by the YAML reader."""
    return json.dumps(obj) if suffix == "json" else "---\n" + json.dumps(obj)


@pytest.mark.parametrize("command", COMMANDS)
def test_json_nested_100000_deep_is_refused(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    usage_error(command, path, capsys, f"nested more than {MAX_DEPTH} levels deep")


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("suffix", ["json", "yaml"])
def test_nesting_past_the_bound_is_refused(
    command: str, suffix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """At the bound a document is read; one level past it, in JSON or in YAML, it is refused."""
    job = trainjob("job", "torch-distributed")
    job["status"] = nested(MAX_DEPTH - 1)  # the TrainJob itself is the first level
    path = tmp_path / f"deep.{suffix}"
    path.write_text(written(job, suffix))
    code, _, err = run(command, path, capsys)
    assert code in (0, 1) and "levels deep" not in err, err  # migrate refuses a TrainJob: no v1 job
    job["status"] = nested(MAX_DEPTH)
    path.write_text(written(job, suffix))
    usage_error(command, path, capsys, f"nested more than {MAX_DEPTH} levels deep")


def test_what_reads_a_document_at_the_bound_does_not_run_out_of_stack(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bound is low enough for what comes after reading, much of it recursive: a JobSet whose
    status is as deep as allowed is a cluster fact render copies and reads; a v1 job with a field
    as deep as allowed goes through the conversion, the admission of what it makes, and out."""
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "job", "namespace": "default"},
        "status": nested(MAX_DEPTH - 1),
    }
    path = tmp_path / "facts.json"
    job = trainjob("job", "torch-distributed")
    path.write_text(json.dumps(job) + "\n" + json.dumps(jobset))  # a stream: no List around them
    code, _, err = run("render", path, capsys)
    assert code == 0, err
    container = {"name": "pytorch", "image": "img", "x": nested(MAX_DEPTH - 8)}
    v1 = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "deep"},
        "spec": {"pytorchReplicaSpecs": {"Master": {"template": {"spec": {"containers": [container]}}}}},
    }
    path.write_text(json.dumps(v1))
    code, out, err = run("migrate", path, capsys)
    assert code == 1 and 'unknown field "spec.template.spec.replicatedJobs[0]' in err, err
    assert out == ""
