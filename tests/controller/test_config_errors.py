"""A configuration file with a mistake (`trainer run --config FILE`): the operator stops at once
(exit 2) with one paragraph naming the file and, per problem, the key's path and the reason in
plain words; a misspelt key gets the closest allowed key and every key allowed where it stands.
Never pydantic's report (its types, its website), never a traceback. What was accepted before is
accepted still."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.controller.config import ConfigError, Configuration, closest_key, key_path, load

ROOT = Path(__file__).parents[2]
WEBHOOK_KEYS = "port, host, certDir, manageConfiguration, advertiseHost, enabled"


def problem(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load(str(path))
    message = str(refused.value)
    assert message.startswith(f"{path}: ")
    assert "pydantic" not in message and "https://" not in message and "[type=" not in message
    return message.removeprefix(f"{path}: ")


def test_a_misspelt_key_names_its_path_the_closest_key_and_the_keys_allowed(tmp_path: Path) -> None:
    assert problem(tmp_path, "webhook:\n  prot: 9443\n") == (
        f"webhook.prot: unknown key; did you mean port? (the keys of webhook: {WEBHOOK_KEYS})"
    )
    assert problem(tmp_path, "metrics:\n  auth:\n    enable: true\n") == (
        "metrics.auth.enable: unknown key; did you mean enabled? (the keys of metrics.auth: enabled)"
    )


def test_a_misspelt_top_level_key_lists_the_top_level_keys(tmp_path: Path) -> None:
    message = problem(tmp_path, "leaderElecton:\n  leaderElect: true\n")
    assert message == (
        "leaderElecton: unknown key; did you mean leaderElection? (the keys at the top level: "
        "apiVersion, kind, clientConnection, controller, webhook, certManagement, metrics, health, "
        "leaderElection, featureGates, statusServer, plugins, tls)"
    )


def test_no_suggestion_when_nothing_is_close(tmp_path: Path) -> None:
    assert problem(tmp_path, "webhook:\n  zzzzzz: 1\n") == (
        f"webhook.zzzzzz: unknown key (the keys of webhook: {WEBHOOK_KEYS})"
    )


def test_case_and_separators_do_not_hide_the_key_meant() -> None:
    keys = ["bindAddress", "secureServing", "auth"]
    assert closest_key("BindAddress", keys) == "bindAddress"
    assert closest_key("bind-adress", keys) == "bindAddress"
    assert closest_key("secure_serving", keys) == "secureServing"
    assert closest_key("port", keys) is None


def test_an_unknown_group_kind_is_told_like_an_unknown_key(tmp_path: Path) -> None:
    message = problem(tmp_path, "controller:\n  groupKindConcurrency:\n    TrainJob.trainer.kubeflow.io: 2\n")
    assert message == (
        "controller.groupKindConcurrency[TrainJob.trainer.kubeflow.io]: unknown key; did you mean "
        "TrainJob.trainer.kubeflow.org? (the keys of controller.groupKindConcurrency: "
        "TrainJob.trainer.kubeflow.org, TrainingRuntime.trainer.kubeflow.org, "
        "ClusterTrainingRuntime.trainer.kubeflow.org)"
    )


def test_several_problems_one_line_each_in_the_files_order(tmp_path: Path) -> None:
    message = problem(
        tmp_path,
        "webhook:\n  port: abc\nleaderElection:\n  leaseDuration: 1s\n"
        "tls:\n  cipherSuites: [TLS_X, 5]\nstatusServer: 5\n",
    )
    assert message.splitlines() == [
        "4 problems:",
        "  webhook.port: should be a valid integer, unable to parse string as an integer (got 'abc')",
        "  leaderElection.leaseDuration must be longer than renewDeadline",
        "  statusServer: should be a mapping of keys, not 5",
        "  tls.cipherSuites[1]: should be a valid string (got 5)",
    ]


def test_a_file_that_is_not_a_mapping_or_not_yaml(tmp_path: Path) -> None:
    assert problem(tmp_path, "- a\n- b\n") == "the file should be a mapping of keys, not a list"
    assert problem(tmp_path, "webhook:\n") == "webhook: should be a mapping of keys, not empty (null)"
    assert problem(tmp_path, "webhook: [\n") == (
        "not YAML: expected the node content, but found '<stream end>' (line 2, column 1)"
    )
    assert problem(tmp_path, "a: 1\n---\nb: 2\n").startswith("not YAML: ")
    (tmp_path / "config.yaml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match=r"config\.yaml: not UTF-8 text$"):
        load(str(tmp_path / "config.yaml"))
    with pytest.raises(ConfigError, match=r"absent\.yaml: No such file or directory$"):
        load(str(tmp_path / "absent.yaml"))


def test_key_paths_are_the_files() -> None:
    assert key_path(("metrics", "auth", "enabled")) == "metrics.auth.enabled"
    assert key_path(("tls", "cipherSuites", 0)) == "tls.cipherSuites[0]"
    assert key_path(("featureGates", "Some.Gate")) == "featureGates[Some.Gate]"


def test_what_was_accepted_is_accepted_still(tmp_path: Path) -> None:
    """The documented example (docs/configuration.md), the fields' Python names (the model takes
    them too), an empty file and no file."""
    doc = (ROOT / "docs" / "configuration.md").read_text()
    example = re.search(r"```yaml\n(apiVersion: config\.trainer.*?)```", doc, re.S)
    assert example is not None
    path = tmp_path / "config.yaml"
    path.write_text(example.group(1))
    documented = load(str(path))
    assert documented.controller.trainjob_workers == 4 and documented.webhook.port == 9443
    path.write_text("metrics:\n  bind_address: ':9000'\nleader_election:\n  leader_elect: true\n")
    loaded = load(str(path))
    assert loaded.metrics.bind_address == ":9000" and loaded.leader_election.leader_elect
    path.write_text("")
    assert load(str(path)) == Configuration()
    assert load(None) == Configuration()


def test_trainer_run_prints_one_paragraph_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("webhook:\n  prot: 9443\nclientConection:\n  qps: 10\n")
    done = subprocess.run(
        [sys.executable, "-m", "trainer.cli", "run", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"trainer run: {path}: 2 problems:",
        f"  webhook.prot: unknown key; did you mean port? (the keys of webhook: {WEBHOOK_KEYS})",
        "  clientConection: unknown key; did you mean clientConnection? (the keys at the top level: "
        "apiVersion, kind, clientConnection, controller, webhook, certManagement, metrics, health, "
        "leaderElection, featureGates, statusServer, plugins, tls)",
    ]
