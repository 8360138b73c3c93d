"""The real nodes' network: each node in a network namespace of its own, joined by a bridge in
one more (the fabric), and reached from the host through a single veth.

    host  trn<id> 10.246.0.1 ──veth── [fabric netns: bridge] ──veth── [node k netns: eth0 10.246.0.1x]
                                                                        └─ cni0 bridge: pods 10.245.k.0/24

This is how kind lays out nodes (one network namespace each, on one bridge), without a container
engine. Forwarding is switched on inside the node namespaces only, where pod traffic is routed and
kube-proxy's rules apply; the host keeps ``ip_forward`` as it was, and nothing routes off the
machine: a node's default route is the host, which forwards nothing. The host itself routes each
pod range to its node, so the API server, on the host, reaches webhooks served by pods, and
listens on 10.246.0.1, where pods reach it through the ``kubernetes`` Service.

Every name carries the cluster's id, and ``teardown`` removes exactly what ``setup`` recorded, so
``down`` leaves no namespace, interface or route behind even after a crash.
"""

from __future__ import annotations

import contextlib
import ipaddress
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

FABRIC_CIDR = ipaddress.IPv4Network("10.246.0.0/24")
HOST_IP = "10.246.0.1"
POD_CIDRS = ipaddress.IPv4Network("10.245.0.0/16")  # kwok's fake pods use 10.244.0.0/16
MAX_NODES = 8


class NetworkError(RuntimeError):
    pass


def node_ip(index: int) -> str:
    return str(FABRIC_CIDR.network_address + 10 + index)


def pod_cidr(index: int) -> str:
    return f"10.245.{index}.0/24"


@dataclass(frozen=True)
class Network:
    """The names ``setup`` made; recorded in the cluster's state file for ``teardown``."""

    cluster_id: str
    nodes: int

    @property
    def host_link(self) -> str:
        return f"trn{self.cluster_id}"

    @property
    def fabric(self) -> str:
        return f"trn{self.cluster_id}-fabric"

    def netns(self, index: int) -> str:
        return f"trn{self.cluster_id}-n{index}"

    @property
    def netns_names(self) -> list[str]:
        return [self.fabric] + [self.netns(k) for k in range(self.nodes)]


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise NetworkError(f"`ip {' '.join(args)}` failed: {out.stderr.strip()}")


def _sysctl(netns: str, key: str, value: str) -> None:
    # `ip netns exec` remounts /sys for the namespace, so this writes the namespace's own value.
    out = subprocess.run(
        ["ip", "netns", "exec", netns, "sysctl", "-qw", f"{key}={value}"], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise NetworkError(f"sysctl {key}={value} in {netns} failed: {out.stderr.strip()}")


def existing_netns() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def host_ip_in_use() -> str | None:
    """The interface holding HOST_IP already (another cluster's real nodes), if any."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3].split("/")[0] == HOST_IP:
            return fields[1]
    return None


def setup(net: Network) -> None:
    """Make the namespaces, bridge, veths, addresses and routes of ``net``; on failure, remove
    what was made and raise."""
    if not 1 <= net.nodes <= MAX_NODES:
        raise NetworkError(f"--real-nodes must be between 1 and {MAX_NODES}, not {net.nodes}")
    holder = host_ip_in_use()
    if holder is not None:
        raise NetworkError(
            f"{HOST_IP} is already on interface {holder}: another cluster with real nodes is running "
            "on this machine (stop it with `scripts/cluster down --dir ITS_DIR`)"
        )
    try:
        _ip("netns", "add", net.fabric)
        _ip("-n", net.fabric, "link", "set", "lo", "up")
        _ip("-n", net.fabric, "link", "add", "br0", "type", "bridge")
        _ip("-n", net.fabric, "link", "set", "br0", "up")
        _ip("link", "add", net.host_link, "type", "veth", "peer", "name", "host", "netns", net.fabric)
        _ip("-n", net.fabric, "link", "set", "host", "master", "br0", "up")
        _ip("addr", "add", f"{HOST_IP}/{FABRIC_CIDR.prefixlen}", "dev", net.host_link)
        _ip("link", "set", net.host_link, "up")
        for k in range(net.nodes):
            ns = net.netns(k)
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"n{k}", "netns", net.fabric)
            _ip("-n", net.fabric, "link", "set", f"n{k}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{node_ip(k)}/{FABRIC_CIDR.prefixlen}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "route", "add", "default", "via", HOST_IP)
            for j in range(net.nodes):
                if j != k:
                    _ip("-n", ns, "route", "add", pod_cidr(j), "via", node_ip(j))
            _sysctl(ns, "net.ipv4.ip_forward", "1")
            _ip("route", "add", pod_cidr(k), "via", node_ip(k), "dev", net.host_link)
    except BaseException:
        teardown(net)
        raise


def teardown(net: Network) -> list[str]:
    """Remove what ``setup`` makes; returns what it found and removed. Deleting a namespace
    deletes its interfaces, and a veth's peer with it; the host's routes go with its link."""
    removed = []
    present = set(existing_netns())
    links = subprocess.run(["ip", "-o", "link", "show", net.host_link], capture_output=True, text=True)
    if links.returncode == 0:
        with contextlib.suppress(NetworkError):
            _ip("link", "del", net.host_link)
            removed.append(f"link {net.host_link}")
    for ns in net.netns_names:
        if ns in present:
            with contextlib.suppress(NetworkError):
                _ip("netns", "del", ns)
                removed.append(f"netns {ns}")
    return removed


def run_in(netns: str) -> Sequence[str]:
    """The prefix that runs a command in ``netns`` but in the host's mount namespace (unlike
    ``ip netns exec``), so kubelet's volume mounts and containerd's container mounts are one view."""
    return ("nsenter", f"--net=/run/netns/{netns}", "--")
