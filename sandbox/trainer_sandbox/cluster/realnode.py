"""Real nodes: containerd, kubelet and kube-proxy per node, running real containers with runc.

Each node runs in its own network namespace (see ``nodenet``) and its own mount namespace, kept
open by a bind mount under ``<cluster>/nodes/ns`` so that every process of one node shares one
view: kubelet's volume mounts are the mounts containerd gives the containers. The node mounts
fresh tmpfs on ``/run`` (containerd's shim sockets and runc's state, paths containerd does not
let us move; kubelet's directory is bound there too), ``/var/log`` (kubelet's
``/var/log/containers`` links) and ``/var/lib`` (the CNI library's result cache), so none of that
touches the host, and every mount a node makes goes when its namespace does.

Each node also has a cgroup of its own, ``/trn<id>-n<k>`` in every hierarchy: kubelet's
``cgroupRoot``, with its daemons in ``system`` below it. Shims and containers outlive a killed
containerd; ``teardown`` kills whatever is left in the node's cgroups, then removes them.

The facts this rests on, on a VM with a hybrid cgroup v1 layout and no CAP_SYS_RESOURCE: runc from
Debian (crun refuses the hybrid layout), ``restrict_oom_score_adj`` in containerd (runc cannot
lower ``oom_score_adj``), kubelet with ``cgroupfs`` and ``failCgroupV1: false``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainer_sandbox.cluster import nodenet

CGROUP_ROOT = Path("/sys/fs/cgroup")
# kubelet's root directory as the node sees it: <node>/kubelet bound there, so that the unix
# sockets kubelet makes in it stay under the 108-byte limit wherever the cluster directory is.
KUBELET_DIR = "/run/kubelet"
RUNC = "/usr/sbin/runc"
PAUSE_IMAGE = "localhost/trainer/pause:1"
CLUSTER_DNS = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
REAL_NODE_LABEL = "trainer.kubeflow.org/real-node"
REQUIRED_COMMANDS = (
    "ip",
    "nsenter",
    "unshare",
    "mount",
    "umount",
    "iptables",
    "runc",
    "mmdebstrap",
    "buildah",
)


def node_name(index: int) -> str:
    return f"real-{index}"


class NodeError(RuntimeError):
    pass


def missing_commands() -> list[str]:
    """Host commands the real nodes need that are not installed (``scripts/bootstrap`` installs
    them from Debian)."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [c for c in REQUIRED_COMMANDS if shutil.which(c, path=path) is None]


def preflight() -> None:
    """Fail early, naming the reason, where real nodes cannot run."""
    if os.geteuid() != 0:
        raise NodeError("real nodes need root (network namespaces, mounts, cgroups)")
    missing = missing_commands()
    if missing:
        raise NodeError(f"real nodes need {', '.join(missing)}: scripts/bootstrap installs them (as root)")
    if not (CGROUP_ROOT / "memory").is_dir() and not (CGROUP_ROOT / "cgroup.controllers").exists():
        raise NodeError(f"no cgroup hierarchy found under {CGROUP_ROOT}")


def _hierarchies() -> list[Path]:
    """The cgroup hierarchies a node's cgroup is made in: every v1 one mounted under
    /sys/fs/cgroup (and the v2 one of a hybrid layout), or the single v2 one."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return [CGROUP_ROOT]
    out = []
    for entry in sorted(CGROUP_ROOT.iterdir()):
        if entry.is_dir() and not entry.is_symlink() and (entry / "cgroup.procs").exists():
            out.append(entry)
    return out


@dataclass(frozen=True)
class Node:
    """One real node's names and paths."""

    index: int
    cluster_id: str
    dir: Path  # <cluster>/nodes/real-<k>
    ns_dir: Path  # <cluster>/nodes/ns: a private bind mount holding the mount namespaces

    @property
    def name(self) -> str:
        return node_name(self.index)

    @property
    def netns(self) -> str:
        return f"trn{self.cluster_id}-n{self.index}"

    @property
    def mountns(self) -> Path:
        return self.ns_dir / self.name

    @property
    def cgroup(self) -> str:
        return f"trn{self.cluster_id}-n{self.index}"

    @property
    def ip(self) -> str:
        return nodenet.node_ip(self.index)

    @property
    def socket(self) -> str:
        """containerd's socket, inside the node's own /run."""
        return "/run/containerd/containerd.sock"

    def enter(self) -> list[str]:
        """The prefix that runs a command in this node's namespaces and its daemons' cgroup."""
        joins = " ".join(f"{h}/{self.cgroup}/system/cgroup.procs" for h in _hierarchies())
        return [
            "nsenter",
            f"--net=/run/netns/{self.netns}",
            f"--mount={self.mountns}",
            "--",
            "sh",
            "-c",
            f'for f in {joins}; do echo $$ > "$f" || exit 1; done; exec "$@"',
            "sh",
        ]

    def run(self, *argv: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Run a short command on the node (``ctr`` to import an image, say)."""
        out = subprocess.run([*self.enter(), *argv], capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise NodeError(f"{self.name}: `{' '.join(argv)}` failed: {out.stderr.strip()[-2000:]}")
        return out


# -- setting a node up -------------------------------------------------------------------------
def make_namespaces(ns_dir: Path, nodes: Sequence[Node]) -> None:
    """Bind ``ns_dir`` on itself, private (a persistent mount namespace can only be pinned on a
    private mount), and make each node's mount namespace there with its tmpfs mounts."""
    ns_dir.mkdir(parents=True, exist_ok=True)
    _must(["mount", "--bind", str(ns_dir), str(ns_dir)])
    _must(["mount", "--make-private", str(ns_dir)])
    for node in nodes:
        node.mountns.touch()
        _must(["unshare", f"--mount={node.mountns}", "--propagation", "private", "true"])
        (node.dir / "kubelet").mkdir(parents=True, exist_ok=True)
        script = (
            "mount -t tmpfs -o mode=755 tmpfs /run && mount -t tmpfs -o mode=755 tmpfs /var/log"
            " && mount -t tmpfs -o mode=755 tmpfs /var/lib"
            f" && mkdir {KUBELET_DIR} && mount --bind {shlex.quote(str(node.dir / 'kubelet'))} {KUBELET_DIR}"
        )
        _must(["nsenter", f"--mount={node.mountns}", "--", "sh", "-c", script])


def make_cgroups(node: Node) -> None:
    for hierarchy in _hierarchies():
        for path in (hierarchy / node.cgroup, hierarchy / node.cgroup / "system"):
            path.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset" or (hierarchy / "cpuset.cpus").exists():
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    if (path / knob).exists() and not (path / knob).read_text().strip():
                        (path / knob).write_text((path.parent / knob).read_text())


def write_configs(
    node: Node, *, bin_dir: Path, kubeconfig: Path, proxy_kubeconfig: Path, ca: Path
) -> dict[str, Path]:
    """containerd's, kubelet's, kube-proxy's and CNI's configuration files for ``node``."""
    d = node.dir
    for sub in ("containerd", "kubelet", "pod-logs", "cni/net.d", "cni/ipam", "certs.d"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    cni = {
        "cniVersion": "1.0.0",
        "name": "trainer",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": nodenet.pod_cidr(node.index)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(d / "cni" / "ipam"),
                },
            }
        ],
    }
    (d / "cni" / "net.d" / "10-trainer.conflist").write_text(json.dumps(cni, indent=2))
    cri = "plugins.'io.containerd.cri.v1.runtime'"
    containerd = f"""version = 3
root = "{d / "containerd" / "root"}"
state = "/run/containerd/state"

[grpc]
  address = "{node.socket}"

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"

[{cri}]
  enable_selinux = false
  restrict_oom_score_adj = true
  [{cri}.containerd]
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false
  [{cri}.cni]
    bin_dirs = ["{bin_dir}"]
    conf_dir = "{d / "cni" / "net.d"}"
    max_conf_num = 1

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "{d / "certs.d"}"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"
"""
    (d / "containerd" / "config.toml").write_text(containerd)
    kubelet: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{node.cgroup}",
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{node.socket}",
        "address": node.ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "podLogsDir": str(d / "pod-logs"),
        "resolvConf": "",  # the host's resolvers are unreachable from pods: cluster DNS only
        "clusterDNS": [CLUSTER_DNS],
        "clusterDomain": CLUSTER_DOMAIN,
        # Callers are checked as a real cluster checks them: certificates of our CA or bearer
        # tokens (TokenReview), then RBAC through SubjectAccessReview, which the Node authorizer
        # lets a kubelet ask. A test user's certificate gets no more from a kubelet than RBAC gives.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "serializeImagePulls": False,
        # A small machine's disk and memory are the same for every node here: eviction would
        # take pods of one test for the load of another; image GC would delete imported images.
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # kubelet sets vm.overcommit_memory, kernel.panic and the like (host-wide, not per
        # namespace); `up` records them first and `down` puts them back (read_sysctls).
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": False,
        "registerWithTaints": [],
        "nodeStatusReportFrequency": "10s",
        "shutdownGracePeriod": "0s",
        "localStorageCapacityIsolation": False,
    }
    (d / "kubelet" / "config.yaml").write_text(yaml.safe_dump(kubelet, sort_keys=False))
    proxy: dict[str, Any] = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(proxy_kubeconfig)},
        "hostnameOverride": node.name,
        "bindAddress": node.ip,
        "clusterCIDR": str(nodenet.POD_CIDRS),
        "mode": "iptables",
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "conntrack": {"maxPerCore": 0, "min": 0},  # leave the (host-wide) conntrack table alone
    }
    (d / "kube-proxy.yaml").write_text(yaml.safe_dump(proxy, sort_keys=False))
    return {
        "containerd": d / "containerd" / "config.toml",
        "kubelet": d / "kubelet" / "config.yaml",
        "kube-proxy": d / "kube-proxy.yaml",
        "kubeconfig": kubeconfig,
    }


def containerd_argv(node: Node, bin_dir: Path, configs: dict[str, Path]) -> list[str]:
    return [*node.enter(), str(bin_dir / "containerd"), "--config", str(configs["containerd"])]


def kubelet_argv(node: Node, bin_dir: Path, configs: dict[str, Path]) -> list[str]:
    return [
        *node.enter(),
        str(bin_dir / "kubelet"),
        f"--config={configs['kubelet']}",
        f"--kubeconfig={configs['kubeconfig']}",
        f"--root-dir={KUBELET_DIR}",
        f"--cert-dir={KUBELET_DIR}/pki",
        f"--hostname-override={node.name}",
        f"--node-ip={node.ip}",
        f"--node-labels={REAL_NODE_LABEL}=true",
        "--v=1",
    ]


def kube_proxy_argv(node: Node, bin_dir: Path, configs: dict[str, Path]) -> list[str]:
    return [*node.enter(), str(bin_dir / "kube-proxy"), f"--config={configs['kube-proxy']}", "--v=1"]


def import_image(node: Node, bin_dir: Path, archive: Path) -> None:
    """``ctr images import`` of an OCI archive into the node's CRI namespace."""
    node.run(
        str(bin_dir / "ctr"), "--address", node.socket, "-n", "k8s.io", "images", "import",
        "--no-unpack", str(archive),
    )  # fmt: skip


def containerd_ready(node: Node, bin_dir: Path) -> bool:
    out = node.run(str(bin_dir / "ctr"), "--address", node.socket, "version", check=False, timeout=10)
    return out.returncode == 0


# -- tearing down ------------------------------------------------------------------------------
def _cgroup_pids(path: Path) -> list[int]:
    pids: list[int] = []
    for procs in path.rglob("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            pids += [int(p) for p in procs.read_text().split()]
    return pids


def kill_cgroups(cluster_id: str, nodes: int) -> int:
    """SIGKILL every process in the nodes' cgroups until none is left (a shim may fork while we
    kill); returns how many were killed."""
    names = [f"trn{cluster_id}-n{k}" for k in range(nodes)]
    hierarchies = _hierarchies()
    killed: set[int] = set()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pids = {p for h in hierarchies for n in names if (h / n).is_dir() for p in _cgroup_pids(h / n)}
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed |= pids
        time.sleep(0.1)
    return len(killed)


def teardown(cluster_id: str, nodes: int, ns_dir: Path) -> list[str]:
    """Kill what is left in the nodes' cgroups, remove the cgroups, then drop the mount
    namespaces (their mounts go with them). Returns what was found and removed."""
    removed: list[str] = []
    names = [f"trn{cluster_id}-n{k}" for k in range(nodes)]
    hierarchies = _hierarchies()
    if count := kill_cgroups(cluster_id, nodes):
        removed.append(f"{count} processes")
    found = [h / n for h in hierarchies for n in names if (h / n).is_dir()]
    for top in found:
        # Deepest first: a cgroup goes only once it has no children (and no processes).
        for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                path.rmdir()
        try:
            top.rmdir()
        except OSError as e:
            removed.append(f"cgroup {top} NOT removed: {e}")
    if found:
        removed.append(f"cgroups of {', '.join(names)}")
    for k in range(nodes):
        path = ns_dir / node_name(k)
        if _is_mountpoint(path):
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
            removed.append(f"mount namespace {path.name}")
    if _is_mountpoint(ns_dir):
        subprocess.run(["umount", "-l", str(ns_dir)], capture_output=True)
    return removed


def _mount_points() -> list[str]:
    """Mount points of our mount namespace, with mountinfo's octal escapes (a space is \\040)
    decoded."""
    with open("/proc/self/mountinfo") as f:
        fields = [line.split()[4] for line in f]
    return [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), p) for p in fields]


def _is_mountpoint(path: Path) -> bool:
    return str(path) in _mount_points()


def mounts_under(path: Path) -> list[str]:
    """Mount points of the host's namespace at or below ``path`` (what ``down`` must leave none of)."""
    prefix = str(path)
    return [p for p in _mount_points() if p == prefix or p.startswith(prefix + "/")]


# What kubelet sets host-wide at start (its setupKernelTunables), to be put back by `down`.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


def read_sysctls() -> dict[str, str]:
    out = {}
    for key in KUBELET_SYSCTLS:
        with contextlib.suppress(OSError):
            out[key] = (Path("/proc/sys") / key).read_text().strip()
    return out


def restore_sysctls(saved: dict[str, str]) -> list[str]:
    """Write back the values ``read_sysctls`` saved where they differ now; returns what changed."""
    changed = []
    for key, value in saved.items():
        if key not in KUBELET_SYSCTLS:
            continue
        path = Path("/proc/sys") / key
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                path.write_text(value)
                changed.append(f"sysctl {key.replace('/', '.')}={value}")
    return changed


def _must(argv: Sequence[str]) -> None:
    out = subprocess.run(list(argv), capture_output=True, text=True)
    if out.returncode != 0:
        raise NodeError(f"`{' '.join(argv)}` failed: {out.stderr.strip()}")
