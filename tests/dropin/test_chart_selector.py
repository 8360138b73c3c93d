"""The chart keeps the selector of the Deployment it upgrades, or says why it cannot (docs/drop-in.md).

A Deployment's selector cannot change. Upstream's chart selects the controller's pods with one
label more than ours; an upgrade from its release must keep that selector. The chart looks the
Deployment up (Helm's ``lookup``), which only a server-side render does: here ``helm install
--dry-run=server`` against the real control plane, with a Deployment of the release's name in
place as an earlier release left it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from trainer_sandbox.cluster import ControlPlane

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kubeflow-trainer"
RELEASE = "trainer"
DEPLOYMENT = "trainer-kubeflow-trainer-controller-manager"
OURS = {
    "app.kubernetes.io/name": "kubeflow-trainer",
    "app.kubernetes.io/instance": RELEASE,
    "app.kubernetes.io/component": "manager",
}


@pytest.fixture(scope="module")
def plane(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane.start(tmp_path_factory.mktemp("selector"), bin_dir=bin_dir, trainer_objects=False)
    try:
        yield plane
    finally:
        plane.stop()


def existing(plane: ControlPlane, namespace: str, selector: dict[str, str]) -> None:
    """A Deployment as an earlier release of ``RELEASE`` left it (Helm's ownership marks on it)."""
    plane.run_kubectl("create", "namespace", namespace)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": DEPLOYMENT,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {
                "meta.helm.sh/release-name": RELEASE,
                "meta.helm.sh/release-namespace": namespace,
            },
        },
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": selector},
                "spec": {"containers": [{"name": "manager", "image": "upstream"}]},
            },
        },
    }
    plane.run_kubectl("apply", "-f", "-", input=yaml.safe_dump(deployment))


def render(plane: ControlPlane, namespace: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(plane.bin_dir / "helm"), "--kubeconfig", str(plane.kubeconfig), "install", RELEASE, str(CHART),
            "--namespace", namespace, "--dry-run=server",
        ],
        capture_output=True, text=True, timeout=300, env={"HOME": str(plane.dir), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def rendered_deployment(out: str) -> dict[str, Any]:
    manifest = out[out.index("MANIFEST:") + len("MANIFEST:") :]
    for doc in yaml.safe_load_all(manifest.split("\nNOTES:")[0]):
        if doc and doc.get("kind") == "Deployment":
            return doc  # type: ignore[no-any-return]
    raise AssertionError(f"no Deployment in:\n{out[:3000]}")


def test_an_upgrade_keeps_upstreams_extra_selector_label(plane: ControlPlane) -> None:
    existing(plane, "from-upstream", {**OURS, "app.kubernetes.io/part-of": "kubeflow"})
    done = render(plane, "from-upstream")
    assert done.returncode == 0, done.stderr
    deployment = rendered_deployment(done.stdout)
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector == {**OURS, "app.kubernetes.io/part-of": "kubeflow"}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in selector.items()), "the pods match their selector"


@pytest.mark.parametrize(
    "selector, message",
    [
        (
            {**OURS, "team": "ml"},
            "selects its pods with team=ml, a label this chart's pods do not carry: set manager.selectorLabels.team=ml",
        ),
        (
            {k: v for k, v in OURS.items() if k != "app.kubernetes.io/component"},
            "does not select its pods on app.kubernetes.io/component, which this release would add",
        ),
        (
            {**OURS, "app.kubernetes.io/name": "other"},
            "selects its pods with app.kubernetes.io/name=other, this release with app.kubernetes.io/name=kubeflow-trainer",
        ),
    ],
    ids=["extra-label", "missing-label", "other-value"],
)
def test_a_selector_the_release_cannot_keep_is_named(
    plane: ControlPlane, selector: dict[str, str], message: str, request: pytest.FixtureRequest
) -> None:
    namespace = "selector-" + str(request.node.callspec.id)
    existing(plane, namespace, selector)
    done = render(plane, namespace)
    assert done.returncode != 0
    assert f"the Deployment {DEPLOYMENT} {message}" in done.stderr, done.stderr
