"""``up --real-nodes N``: the network, the nodes, their images and cluster DNS, and ``down``'s
inverse of all of it.

The control plane starts as without real nodes, but serves on the fabric's host address
(``nodenet.HOST_IP``) so that nodes and pods reach it; then each node's containerd, kubelet and
kube-proxy start as components of the cluster (recorded and stopped like the others), the images
every node needs are imported, and CoreDNS is deployed. kwok's nodes stay, tainted, for tests of
scale: a pod lands on one only if it tolerates ``realnode.KWOK_TAINT``.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trainer.api.objects import Obj
from trainer_sandbox.cluster import (
    clusterdns,
    debs,
    images,
    install,
    nodenet,
    oci,
    operator_image,
    realnode,
    registry,
)
from trainer_sandbox.cluster.kube import Kube, KubeError
from trainer_sandbox.cluster.pki import Pki, write_kubeconfig
from trainer_sandbox.cluster.realnode import Node


class Launch(Protocol):
    def __call__(self, name: str, argv: Sequence[str], *, binary: str) -> None: ...


Await = Callable[[str, Callable[[], bool]], None]
Echo = Callable[[str], None]

# The controllers real pods need beside the control plane's: Services get endpoints, Deployments
# (CoreDNS, the chart's operator) get pods.
CONTROLLERS = ("endpointslice-controller", "deployment-controller", "replicaset-controller")


BUSYBOX_IMAGE = "localhost/trainer/busybox:1"
BUSYBOX_TOOLS = ("sh", "cat", "echo", "env", "hostname", "httpd", "ls", "nc", "nslookup", "sleep", "wget")


def cluster_id(directory: Path) -> str:
    """Eight hex digits naming this cluster's namespaces, links and cgroups: derived from its
    directory, so that ``down`` finds them even without the state file."""
    return hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:8]


@dataclass
class NodePool:
    directory: Path
    count: int
    bin_dir: Path
    registry_port: int = 0
    push_port: int = 0
    host_settings: dict[str, str] = field(default_factory=dict)
    training_rootfs: dict[str, Path] = field(default_factory=dict)
    operator_archive: Path | None = None

    @property
    def id(self) -> str:
        return cluster_id(self.directory)

    @property
    def network(self) -> nodenet.Network:
        return nodenet.Network(self.id, self.count)

    @property
    def ns_dir(self) -> Path:
        return self.directory / "nodes" / "ns"

    @property
    def nodes(self) -> list[Node]:
        return [
            Node(k, self.id, self.directory / "nodes" / realnode.node_name(k), self.ns_dir)
            for k in range(self.count)
        ]

    @property
    def names(self) -> list[str]:
        return [realnode.node_name(k) for k in range(self.count)]

    def state(self) -> dict[str, Any]:
        return {"real_nodes": {"id": self.id, "count": self.count, "sysctls": self.host_settings}}

    # -- up --------------------------------------------------------------------------------
    @property
    def registry_address(self) -> str:
        return f"{nodenet.HOST_IP}:{self.registry_port}"

    def prepare(self, echo: Echo) -> None:
        """Before the API server starts: check the host, build (or find) the training image, make
        the network."""
        realnode.preflight()
        self.host_settings = realnode.read_sysctls()
        self.training_rootfs = {r.key: images.rootfs(r, echo) for r in images.RECIPES}
        self.operator_archive = operator_image.build(echo)
        nodenet.setup(self.network)

    def start(self, pki: Pki, server: str, launch: Launch, wait: Await, admin: Kube, echo: Echo) -> None:
        t0 = time.monotonic()
        archives = self._write_images()
        self._start_registry(launch, wait, echo)
        realnode.make_namespaces(self.ns_dir, self.nodes)
        assert pki.kube_proxy is not None
        proxy_kubeconfig = write_kubeconfig(
            self.directory / "pki" / "kube-proxy.kubeconfig",
            server,
            pki.ca.cert,
            pki.kube_proxy,
            "kube-proxy",
        )
        configs = {}
        for node, pair in zip(self.nodes, pki.kubelets, strict=True):
            realnode.make_cgroups(node)
            registry.write_hosts(node.dir / "certs.d", self.registry_address)
            kubeconfig = write_kubeconfig(
                self.directory / "pki" / f"kubelet-{node.name}.kubeconfig",
                server,
                pki.ca.cert,
                pair,
                f"system:node:{node.name}",
            )
            configs[node.name] = realnode.write_configs(
                node,
                bin_dir=self.bin_dir,
                kubeconfig=kubeconfig,
                proxy_kubeconfig=proxy_kubeconfig,
                ca=pki.ca.cert,
            )
            self._launch(
                launch,
                f"containerd-{node.name}",
                realnode.containerd_argv(node, self.bin_dir, configs[node.name]),
            )
        for node in self.nodes:
            wait(f"containerd-{node.name}", lambda node=node: realnode.containerd_ready(node, self.bin_dir))  # type: ignore[misc]
            for archive in archives:
                realnode.import_image(node, self.bin_dir, archive)
            self._launch(
                launch, f"kubelet-{node.name}", realnode.kubelet_argv(node, self.bin_dir, configs[node.name])
            )
            self._launch(
                launch,
                f"kube-proxy-{node.name}",
                realnode.kube_proxy_argv(node, self.bin_dir, configs[node.name]),
            )
        for node in self.nodes:
            wait(f"kubelet-{node.name}", lambda node=node: _node_ready(admin, node.name))  # type: ignore[misc]
        for obj in clusterdns.objects():
            admin.create(obj, exist_ok=True)
        wait(
            f"kubelet-{self.nodes[0].name}",
            lambda: _deployment_available(admin, clusterdns.NAMESPACE, clusterdns.NAME),
        )
        echo(f"{f'{self.count} real node(s), DNS':<28} {time.monotonic() - t0:5.1f}s")

    def _start_registry(self, launch: Launch, wait: Await, echo: Echo) -> None:
        """The registry, with the images in it under the bundled runtimes' names: written to on
        loopback only, served read-only on the host's end of the nodes' network (a pod cannot
        replace an image that later clusters will pull from the shared storage)."""
        storage = debs.cache_root() / "registry"
        storage.mkdir(parents=True, exist_ok=True)
        binary = str(self.bin_dir / "registry")
        push_address = f"127.0.0.1:{self.push_port}"
        writer = registry.write_config(self.directory / "registry-push.yaml", storage, push_address)
        reader = registry.write_config(
            self.directory / "registry.yaml", storage, self.registry_address, read_only=True
        )
        registry.collect_garbage(Path(binary), writer, storage)
        launch("registry-push", [binary, "serve", str(writer)], binary=binary)
        launch("registry", [binary, "serve", str(reader)], binary=binary)
        client = registry.Client(push_address)
        wait("registry-push", client.ping)
        wait("registry", registry.Client(self.registry_address).ping)
        for recipe in images.RECIPES:
            if recipe.key not in self.training_rootfs:
                continue
            t0 = time.monotonic()
            blobs = recipe.blobs(self.training_rootfs[recipe.key])
            uploaded = sum(client.push(name, blobs) for name in recipe.names)
            echo(f"{f'{recipe.key} image pushed ({uploaded} blobs)':<28} {time.monotonic() - t0:5.1f}s")
        if self.operator_archive is not None:  # the chart's image, from our Dockerfile
            client.push(operator_image.chart_image_name(), oci.read_archive(self.operator_archive))

    @staticmethod
    def _launch(launch: Launch, name: str, argv: list[str]) -> None:
        # The node's prefix (nsenter, then sh) execs the component: argv[-n] is what runs.
        binary = next(a for a in argv if a.endswith(("/containerd", "/kubelet", "/kube-proxy")))
        launch(name, argv, binary=binary)

    def _write_images(self) -> list[Path]:
        """The images every node needs, from binaries of ``cluster/build``."""
        out = self.directory / "images"
        out.mkdir(exist_ok=True)
        pause = out / "pause.tar"
        oci.write_archive(
            pause,
            oci.Image(realnode.PAUSE_IMAGE, entrypoint=["/pause"]),
            [oci.file_layer([oci.File("pause", source=self.bin_dir / "pause")])],
        )
        dns = out / "coredns.tar"
        oci.write_archive(
            dns,
            oci.Image(clusterdns.IMAGE, entrypoint=["/coredns"], user="65532"),
            [oci.file_layer([oci.File("coredns", source=self.bin_dir / "coredns")])],
        )
        archives = [pause, dns]
        busybox = debs.package_file("busybox-static", "bin/busybox")
        if busybox is not None:  # a shell and tools for smoke tests
            box = out / "busybox.tar"
            links = [oci.File(f"bin/{tool}", link="busybox") for tool in BUSYBOX_TOOLS]
            oci.write_archive(
                box,
                oci.Image(BUSYBOX_IMAGE, cmd=["sh"], env={"PATH": "/bin"}),
                [oci.file_layer([oci.File("bin/busybox", source=busybox), *links])],
            )
            archives.append(box)
        return archives

    # -- down ------------------------------------------------------------------------------
    @staticmethod
    def had_nodes(directory: Path, extra: dict[str, Any]) -> bool:
        """Whether the cluster in ``directory`` had real nodes: its state says so, or (the state
        file lost) their directory is there."""
        return isinstance(extra.get("real_nodes"), dict) or (directory / "nodes").exists()

    @staticmethod
    def kill_containers(directory: Path, extra: dict[str, Any]) -> None:
        """SIGKILL everything left in the nodes' cgroups: containers, shims, and any daemon that
        did not stop."""
        if NodePool.had_nodes(directory, extra):
            realnode.kill_cgroups(cluster_id(directory), nodenet.MAX_NODES)

    @staticmethod
    def teardown(directory: Path, extra: dict[str, Any]) -> list[str]:
        """Remove the nodes' leftovers (processes in their cgroups, cgroups, mounts, network) by
        the names derived from ``directory``, for as many nodes as there may be, and put back the
        host settings kubelet changed (recorded in ``extra``); safe to call twice, after a crash,
        and without the state file."""
        if not NodePool.had_nodes(directory, extra):
            return []
        ident = cluster_id(directory)
        removed = realnode.teardown(ident, nodenet.MAX_NODES, directory / "nodes" / "ns")
        removed += nodenet.teardown(nodenet.Network(ident, nodenet.MAX_NODES))
        info = extra.get("real_nodes")
        if isinstance(info, dict) and info.get("sysctls"):
            removed += realnode.restore_sysctls(info["sysctls"])
        if not realnode.mounts_under(directory / "nodes"):
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(directory / "nodes")
        return removed


def kwok_taint(nodes: list[Obj]) -> list[Obj]:
    """kwok's nodes, tainted so that pods land on real nodes unless they tolerate the taint."""
    for node in nodes:
        node.setdefault("spec", {})["taints"] = [dict(realnode.KWOK_TAINT)]
    return nodes


def _node_ready(admin: Kube, name: str) -> bool:
    try:
        node = admin.get(f"/api/v1/nodes/{name}")
    except KubeError as e:
        if e.status == 404:
            return False
        raise
    return install.schedulable(admin, node)


def _deployment_available(admin: Kube, namespace: str, name: str) -> bool:
    dep = admin.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
    status = dep.get("status") or {}
    return int(status.get("availableReplicas") or 0) >= int((dep.get("spec") or {}).get("replicas") or 1)
