"""The shell blocks of README.md and docs/*.md, run as written.

Every ```sh (or bash, shell, console) block has a marker on the line just before its fence, an
HTML comment that renders as nothing:

    <!-- runnable -->
    <!-- runnable; given: namespace team-a, mnist-ddp.yaml -->
    <!-- not runnable: never ends -->

A runnable block runs here as it is written, with bash (``set -euo pipefail``), and must exit 0.
The blocks of one document run in their order, as a reader follows the page: a block may rely on
what an earlier one did (the TrainJob it applied). They run in a scratch directory that mirrors the
repository's top level (``.venv/bin/trainer``, ``examples/`` are there), with ``.venv/bin`` first
on PATH (``trainer``). A block that calls kubectl runs on the session's real control plane
(tests/backend_plugin.py), with KUBECONFIG set to its admin's and its kubectl on PATH; those blocks
are skipped, with the reason, where Go is missing outside CI, as every test of the real control
plane is. What kubectl created is deleted afterwards, and a block may change nothing it did not
create: the control plane is the whole session's.

``given:`` names what the page tells the reader to have first. ``NAME.yaml`` is the page's YAML
block whose first line is ``# NAME.yaml`` (the reader saved it), or else one of GIVEN_FILES;
``namespace NAME`` is a namespace the page says the reader has.

Every other block is not runnable for one of REASONS, and SKIPPED lists each, by its first
command: marking a block not runnable is a change to this list, made on purpose.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from backend_plugin import _go_missing, selected_backends
from trainer_sandbox.apiserver.errors import APIError
from trainer_sandbox.backends import RealCluster

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
SHELLS = frozenset({"sh", "bash", "shell", "console"})

REASONS = {
    "internet": "it fetches a chart, a manifest or a package from the internet, which is not reachable here",
    "Docker": "it builds or pushes an image with Docker",
    "never ends": "it runs until stopped: an operator, a watch, a followed log",
    "a user's cluster": "it needs a cluster with the chart installed: a Helm release, an image in the user's registry",
    "real nodes": "it runs containers on real nodes: root, and the host's network, mounts and cgroups (tests/nodes)",
    "takes minutes": "it runs the test suite or a benchmark",
    "the reader's files": "it names a file or program of the reader's own",
}

# The blocks not run, by document, in its order: each block's first command, and the reason.
SKIPPED: dict[str, list[tuple[str, str]]] = {
    "README.md": [
        ("./scripts/demo", "takes minutes"),
        ("scripts/cluster up", "never ends"),
        ("scripts/bootstrap", "real nodes"),
        ("scripts/cluster up --real-nodes 2 --no-trainer-objects", "real nodes"),
    ],
    "docs/benchmarks.md": [
        (".venv/bin/python bench/operator_load.py", "takes minutes"),
        (".venv/bin/python bench/operator_load.py --controller ours --controller upstream", "takes minutes"),
        (
            ".venv/bin/python bench/operator_load.py --controller ours --controller upstream --phases scale",
            "takes minutes",
        ),
        (
            ".venv/bin/python bench/operator_load.py --controller ours --controller upstream --phases scale "
            "--scale-counts 1000,10000",
            "takes minutes",
        ),
        (
            ".venv/bin/python bench/operator_load.py --controller ours --controller upstream --runs 3",
            "takes minutes",
        ),
        (".venv/bin/python bench/operator_load.py --controller ours", "the reader's files"),
    ],
    "docs/drop-in.md": [
        ("kubectl annotate clustertrainingruntime torch-distributed --overwrite", "a user's cluster"),
        (
            "helm upgrade trainer charts/kubeflow-trainer --namespace kubeflow-system --wait --timeout 5m",
            "a user's cluster",
        ),
    ],
    "docs/install.md": [
        ("JOBSET_VERSION=0.10.1", "internet"),
        (
            'kubectl apply --server-side -f "https://github.com/kubernetes-sigs/jobset/releases/download/v${JOBSET_VERSION}/manifests.yaml"',
            "internet",
        ),
        ("REGISTRY=registry.example.com/ml-platform", "Docker"),
        ("helm install kubeflow-trainer charts/kubeflow-trainer", "a user's cluster"),
        (
            "kubectl -n kubeflow-system rollout status deployment/kubeflow-trainer-controller-manager",
            "a user's cluster",
        ),
        (
            "helm upgrade kubeflow-trainer charts/kubeflow-trainer -n kubeflow-system --reuse-values --set manager.replicas=3",
            "a user's cluster",
        ),
        (
            'kubectl -n kubeflow-system patch secret kubeflow-trainer-webhook-cert --type=json -p \'[{"op":"remove","path":"/data"}]\'',
            "a user's cluster",
        ),
        (
            "helm install kubeflow-trainer charts/kubeflow-trainer -n kubeflow-system --create-namespace",
            "a user's cluster",
        ),
        (
            "helm install kubeflow-trainer charts/kubeflow-trainer -n kubeflow-system --create-namespace",
            "a user's cluster",
        ),
        (
            "helm upgrade kubeflow-trainer charts/kubeflow-trainer -n kubeflow-system --reuse-values",
            "a user's cluster",
        ),
        (
            "kubectl -n kubeflow-system port-forward svc/kubeflow-trainer-controller-manager 8443 &",
            "a user's cluster",
        ),
        (
            "helm upgrade kubeflow-trainer charts/kubeflow-trainer -n kubeflow-system -f my-values.yaml --wait",
            "a user's cluster",
        ),
        ("helm uninstall kubeflow-trainer -n kubeflow-system --wait", "a user's cluster"),
        (
            "kubectl delete crd trainjobs.trainer.kubeflow.org trainingruntimes.trainer.kubeflow.org",
            "a user's cluster",
        ),
        ("kubectl get crd | grep trainer.kubeflow.org", "a user's cluster"),
    ],
    "docs/platform-guide.md": [
        ("helm install jobset oci://registry.k8s.io/jobset/charts/jobset", "internet"),
        (
            "helm upgrade --install kubeflow-trainer charts/kubeflow-trainer -n kubeflow-system",
            "a user's cluster",
        ),
        ("kubectl -n kubeflow-system logs deployment/kubeflow-trainer-controller-manager -f", "never ends"),
        (
            "helm upgrade kubeflow-trainer charts/kubeflow-trainer -n kubeflow-system -f platform-values.yaml --wait",
            "a user's cluster",
        ),
        ("helm uninstall kubeflow-trainer -n kubeflow-system --wait", "a user's cluster"),
    ],
    "docs/plugins.md": [
        ("python -m build --wheel", "the reader's files"),
    ],
    "docs/user-guide.md": [
        ("kubectl -n team-a get pods -l jobset.sigs.k8s.io/jobset-name=mnist-ddp", "never ends"),
    ],
}

# --- reading the documents ---------------------------------------------------------------------

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)")
MARKER = re.compile(
    r"^<!--[ \t]*(?:runnable(?:;[ \t]*given:[ \t]*(?P<given>[^>]*?))?|not runnable:[ \t]*(?P<reason>[^>]*?))[ \t]*-->$"
)
LOOKS_LIKE_A_MARKER = re.compile(r"^<!--.*runnable")


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # of the opening fence, from 1
    lang: str
    text: str  # without the fence's indentation
    marker: str | None  # the line before the fence when it looks like a marker

    @property
    def shell(self) -> bool:
        return self.lang in SHELLS

    @property
    def first_command(self) -> str:
        """Its first line that is not a comment, without a comment or a continuation's backslash."""
        lines = [
            ln.strip() for ln in self.text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")
        ]
        return re.sub(r"\s+#\s.*$", "", lines[0] if lines else "").removesuffix("\\").strip()

    @property
    def parsed(self) -> re.Match[str] | None:
        return MARKER.match(self.marker) if self.marker else None

    @property
    def runnable(self) -> bool:
        return self.parsed is not None and self.parsed.group("reason") is None

    @property
    def reason(self) -> str | None:
        return self.parsed.group("reason") if self.parsed else None

    @property
    def given(self) -> tuple[str, ...]:
        names = (self.parsed.group("given") or "") if self.parsed else ""
        return tuple(n.strip() for n in names.split(",") if n.strip())

    @property
    def needs_cluster(self) -> bool:
        return bool(re.search(r"(^|[\s;&|(])kubectl\s", self.text)) or any(
            g.startswith("namespace ") for g in self.given
        )

    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def read_blocks(doc: str, text: str) -> tuple[list[Block], list[tuple[int, str]]]:
    """The fenced blocks of a document, and its markers that stand before no shell block (with
    their line numbers)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    orphans: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            if LOOKS_LIKE_A_MARKER.match(lines[i].strip()):
                following = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
                if not following or following.group("lang") not in SHELLS:
                    orphans.append((i + 1, f"{doc}:{i + 1}: {lines[i].strip()} stands before no shell block"))
            i += 1
            continue
        indent, fence = opening.group("indent"), opening.group("fence")
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        body = [ln[len(indent) :] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1 : end]]
        before = lines[i - 1].strip() if i > 0 else ""
        marker = before if LOOKS_LIKE_A_MARKER.match(before) else None
        blocks.append(Block(doc, i + 1, opening.group("lang"), "\n".join(body) + "\n", marker))
        i = end + 1
    return blocks, orphans


def problems_of(doc: str, text: str) -> list[str]:
    """What is wrong with the markers of a document: one line each, in the document's order."""
    blocks, found = read_blocks(doc, text)
    for block in blocks:
        if not block.shell:
            continue
        if block.marker is None:
            problem = (
                f"a {block.lang} block without a marker on the line before its fence "
                f"(<!-- runnable --> or <!-- not runnable: REASON -->): {block.first_command}"
            )
        elif block.parsed is None:
            problem = f"a marker this test cannot read: {block.marker}"
        elif block.reason is not None and block.reason not in REASONS:
            problem = f"{block.reason!r} is not one of the reasons: {', '.join(REASONS)}"
        else:
            continue
        found.append((block.line, f"{block.where()}: {problem}"))
    return [problem for _, problem in sorted(found)]


def all_blocks() -> list[Block]:
    return [b for doc in DOCS for b in read_blocks(doc, (ROOT / doc).read_text())[0]]


# --- the markers --------------------------------------------------------------------------------


def test_every_shell_block_is_marked() -> None:
    found = [p for doc in DOCS for p in problems_of(doc, (ROOT / doc).read_text())]
    assert not found, "\n".join(found)


def test_the_blocks_not_run_are_the_listed_ones_with_their_reasons() -> None:
    marked = sorted(
        (b.doc, b.first_command, b.reason or "") for b in all_blocks() if b.shell and not b.runnable
    )
    listed = sorted((doc, command, reason) for doc, blocks in SKIPPED.items() for command, reason in blocks)
    unlisted = [f"{d}: {c!r}: {r}" for d, c, r in marked if (d, c, r) not in listed]
    gone = [f"{d}: {c!r}: {r}" for d, c, r in listed if (d, c, r) not in marked]
    assert marked == listed, (
        "blocks marked not runnable that SKIPPED does not list:\n  "
        + "\n  ".join(unlisted or ["(none)"])
        + "\nSKIPPED entries no block is marked with:\n  "
        + "\n  ".join(gone or ["(none)"])
    )


def test_the_marker_check_finds_each_kind_of_mistake() -> None:
    doc = "\n".join(
        [
            "<!-- runnable -->",
            "```sh",
            "echo fine",
            "```",
            "```bash",
            "echo unmarked",
            "```",
            "<!-- not runnable: too lazy -->",
            "```sh",
            "echo unknown reason",
            "```",
            "<!-- runnable, given mnist.yaml -->",
            "```console",
            "echo unreadable marker",
            "```",
            "<!-- runnable -->",
            "```yaml",
            "a: 1",
            "```",
            "  <!-- not runnable: Docker -->",
            "  ```sh",
            "  docker build .",
            "  ```",
        ]
    )
    found = problems_of("x.md", doc)
    assert [p.split(":", 2)[1] for p in found] == ["5", "9", "13", "16"], found
    assert "without a marker" in found[0] and "echo unmarked" in found[0]
    assert "'too lazy' is not one of the reasons" in found[1]
    assert "cannot read" in found[2]
    assert "stands before no shell block" in found[3]
    blocks, _ = read_blocks("x.md", doc)
    assert [(b.line, b.runnable, b.reason) for b in blocks if b.shell] == [
        (2, True, None),
        (5, False, None),
        (9, False, "too lazy"),
        (13, False, None),
        (21, False, "Docker"),
    ]
    assert blocks[-1].text == "docker build .\n"


# --- what the pages tell the reader to have ----------------------------------------------------


def _yaml_block(doc: str, name: str) -> str | None:
    """The document's YAML block that starts with ``# NAME``, as the reader saved it."""
    for block in read_blocks(doc, (ROOT / doc).read_text())[0]:
        if block.lang == "yaml" and re.match(rf"#\s*{re.escape(name)}\b", block.text):
            return block.text
    return None


def _copy(source: str) -> Callable[[Path], None]:
    def make(target: Path) -> None:
        shutil.copyfile(ROOT / source, target)

    return make


def _my_runtimes(target: Path) -> None:
    target.mkdir()
    shutil.copyfile(ROOT / "runtimes/torch_distributed.yaml", target / "torch-distributed.yaml")


def _my_trainjob(target: Path) -> None:
    """The platform guide: the user guide's first TrainJob fits its runtime "once its
    runtimeRef.name is changed"."""
    text = _yaml_block("docs/user-guide.md", "mnist-ddp.yaml")
    assert text, "docs/user-guide.md has no '# mnist-ddp.yaml' block any more"
    job = yaml.safe_load(text)
    job["spec"]["runtimeRef"]["name"] = "torch-cuda-shared-data"
    target.write_text(yaml.safe_dump(job))


# Files of the reader's that the README's and the guides' blocks name, made from the repository.
GIVEN_FILES: dict[str, Callable[[Path], None]] = {
    "job.yaml": _copy("examples/torch-distributed.yaml"),  # a TrainJob (torch-distributed)
    "more.yaml": _copy("examples/deepspeed.yaml"),  # another (deepspeed-distributed)
    "my-runtimes/": _my_runtimes,  # the runtime job.yaml names
    "my-trainjob.yaml": _my_trainjob,
}


# --- running them -------------------------------------------------------------------------------


def _runs() -> list[Any]:
    """One test per document and kind: the blocks that need no cluster, and those on the real
    control plane."""
    params = []
    for doc in DOCS:
        runnable = [b for b in read_blocks(doc, (ROOT / doc).read_text())[0] if b.shell and b.runnable]
        for on_cluster, kind in ((False, "offline"), (True, "real")):
            blocks = [b for b in runnable if b.needs_cluster == on_cluster]
            if blocks:
                params.append(pytest.param(doc, on_cluster, blocks, id=f"{doc}-{kind}"))
    return params


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A scratch directory with the repository's top level linked into it."""
    work = tmp_path / "work"
    work.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in (".git", ".cluster"):
            (work / entry.name).symlink_to(entry)
    return work


def _provide(given: str, doc: str, work: Path, env: dict[str, str]) -> None:
    if given.startswith("namespace "):
        _kubectl(env, work, "create", "namespace", given.removeprefix("namespace "))
        return
    target = work / given.rstrip("/")
    if target.exists() or target.is_symlink():
        return  # made for an earlier block of the page (or the repository's own)
    text = _yaml_block(doc, given)
    if text is not None:
        target.write_text(text)
    elif given in GIVEN_FILES:
        GIVEN_FILES[given](target)
    else:
        pytest.fail(f"{doc}: given {given!r}: no '# {given}' YAML block in it, and GIVEN_FILES has none")


def _kubectl(env: dict[str, str], work: Path, *args: str) -> None:
    subprocess.run(["kubectl", *args], env=env, cwd=work, check=True, capture_output=True, timeout=60)


def _run(blocks: list[Block], doc: str, work: Path, env: dict[str, str]) -> None:
    for block in blocks:
        for given in block.given:
            _provide(given, doc, work, env)
        try:
            result = subprocess.run(
                ["bash", "--noprofile", "--norc", "-c", "set -euo pipefail\n" + block.text],
                cwd=work,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=120,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"{block.where()}: the block did not end within 120 s:\n{block.text}")
        assert result.returncode == 0, (
            f"{block.where()}: the block exited {result.returncode}:\n{block.text}\n"
            f"stdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-2000:]}"
        )


def _env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "BASH_ENV", "ENV")}
    env["PATH"] = os.pathsep.join([str(ROOT / ".venv" / "bin"), str(work / ".bin"), env.get("PATH", "")])
    return env


@pytest.mark.parametrize(("doc", "on_cluster", "blocks"), _runs())
def test_runnable_blocks_run_as_written(
    doc: str, on_cluster: bool, blocks: list[Block], work: Path, request: pytest.FixtureRequest
) -> None:
    env = _env(work)
    if not on_cluster:
        _run(blocks, doc, work, env)
        return
    if "real" not in selected_backends(request.config):
        why = _go_missing() if request.config.getoption("--backend") is None else "--backend=standin"
        pytest.skip(f"these blocks run kubectl on the real control plane ({why})")
    plane: RealCluster = request.getfixturevalue("control_plane")
    (work / ".bin").mkdir()
    (work / ".bin" / "kubectl").symlink_to(plane.kubectl)
    env["KUBECONFIG"] = str(plane.kubeconfig)
    # The namespaces the page makes must not exist yet: one of another test's, or of an earlier
    # page's, may still be being deleted (deleting takes the namespace controller seconds).
    for namespace in _namespaces_made(blocks):
        _delete_namespace(plane, namespace)
    mark = plane.audit_mark()
    try:
        _run(blocks, doc, work, env)
    finally:
        requests, changed = _undo(plane, mark)
    assert requests, f"{doc}: the audit log shows no request of kubectl's: what it made would stay"
    assert not changed, f"{doc}: blocks changed what they did not create: {changed}"


def _namespaces_made(blocks: list[Block]) -> list[str]:
    names = [g.removeprefix("namespace ") for b in blocks for g in b.given if g.startswith("namespace ")]
    names += [n for b in blocks for n in re.findall(r"kubectl create namespace ([a-z0-9-]+)", b.text)]
    return sorted(set(names))


def _undo(plane: RealCluster, mark: int) -> tuple[int, list[str]]:
    """Delete what kubectl created since ``mark`` (not waiting for a namespace to go); return how
    many requests kubectl made, and what else it changed."""
    requests = [r for r in plane.audit_since(mark) if r.user_agent.startswith("kubectl/")]
    records = [r for r in requests if r.mutated]
    created = [r for r in records if r.verb == "create" and not r.subresource]
    mine = {(r.group, r.resource, r.namespace, r.name) for r in created}
    changed = [
        f"{r.verb} {r.resource}/{r.name}" + (f" in {r.namespace}" if r.namespace else "")
        for r in records
        if r.verb != "create" and (r.group, r.resource, r.namespace, r.name) not in mine
    ]
    for r in reversed(created):
        base = "/api/v1" if not r.group else f"/apis/{r.group}/{r.version}"
        if r.resource == "namespaces":
            path = f"{base}/namespaces/{r.name}"
        elif r.namespace:
            path = f"{base}/namespaces/{r.namespace}/{r.resource}/{r.name}"
        else:
            path = f"{base}/{r.resource}/{r.name}"
        _delete(plane, path)
    return len(requests), changed


def _delete(plane: RealCluster, path: str) -> None:
    try:
        plane.http.request("DELETE", path)
    except APIError as exc:
        if exc.code != 404:
            raise


def _delete_namespace(plane: RealCluster, name: str, timeout: float = 90) -> None:
    """Delete the namespace if it exists, and wait until it is gone."""
    _delete(plane, f"/api/v1/namespaces/{name}")
    deadline = time.monotonic() + timeout
    while True:
        try:
            plane.http.request("GET", f"/api/v1/namespaces/{name}")
        except APIError as exc:
            if exc.code == 404:
                return
            raise
        if time.monotonic() > deadline:
            raise AssertionError(f"namespace {name} still exists {timeout:.0f} s after its deletion")
        time.sleep(0.2)
