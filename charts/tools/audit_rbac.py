#!/usr/bin/env python3
"""Check the operator's ClusterRole against what it does: install the chart into the local API
server, run the operator as its Deployment does, run the chart tests' workload
(tests/chart/chart_harness.py), and compare the permissions its audit log shows (plus what its
ownerReferences need) with what charts/kubeflow-trainer/templates/rbac/clusterrole.yaml grants.

That ClusterRole is not written from the audit: charts/tools/sync_chart.py derives it from what the
operator and its plugins declare they read and build. This tool, and tests/chart/test_chart_install.py,
which runs the same workload, show the declarations are true: no call the rules do not grant, no rule
no call uses. Its calls on its leader election Lease are not the ClusterRole's: they are granted in
the release namespace alone, by the Role of templates/rbac/leader-election.yaml.

With --real the workload runs on the real control plane built from cluster/ (Go needed), whose
kube-apiserver writes the audit log and authorizes each call by RBAC: a call the chart does not grant
is refused there (403) but still recorded, so it shows all the same.

Usage: python charts/tools/audit_rbac.py [--real]   (exit 1 when the two differ)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "chart"))

import chart_harness as h  # noqa: E402
from trainer_sandbox import rbac_audit  # noqa: E402

LEASE_ROLE = h.CHART / "templates" / "rbac" / "leader-election.yaml"
LEASES = "coordination.k8s.io"
# The operator's own webhook certificate: one Secret and the two webhook configurations, granted by
# name in templates/webhook/certificate-rbac.yaml (resourceNames), never by the ClusterRole.
CERTIFICATE_ROLE = h.CHART / "templates" / "webhook" / "certificate-rbac.yaml"
CERTIFICATE: set[rbac_audit.Permission] = {
    ("", "secrets", "get"),
    ("", "secrets", "update"),
    *(
        ("admissionregistration.k8s.io", kind, verb)
        for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations")
        for verb in ("get", "patch")
    ),
}


def split(
    permissions: set[rbac_audit.Permission],
) -> tuple[set[rbac_audit.Permission], set[rbac_audit.Permission]]:
    """(the ClusterRole's, the leader election Role's): Leases are written in the release namespace
    only. The certificate's calls are not in ``permissions`` (``chart_harness.operator_permissions``)."""
    lease = {p for p in permissions if p[0] == LEASES}
    return permissions - lease, lease


def _real_permissions(directory: Path) -> set[rbac_audit.Permission]:
    """The workload on a real control plane of its own (started and stopped here)."""
    from trainer_sandbox.backends import RealCluster
    from trainer_sandbox.cluster import ControlPlane

    plane = ControlPlane.start(directory / "control-plane")
    try:
        cluster = RealCluster(
            plane.kubeconfig, plane.audit_log, ca_dir=plane.pki_dir, kubectl=str(plane.kubectl)
        )
        view = cluster.for_test(h.SCENARIO_NAMESPACE)
        (directory / "release").mkdir()
        try:
            with h.installed(directory / "release", server=view) as release:
                result = h.run_scenario(release.server, release.operator_user, release.mark)
                return h.operator_permissions(result, release.operator_user)
        finally:
            view.cleanup()
    finally:
        plane.stop()


def main(argv: list[str]) -> int:
    options = set(argv[1:])
    if options - {"--real"}:
        print(__doc__, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        if "--real" in options:
            permissions = _real_permissions(Path(tmp))
        else:
            with h.installed(Path(tmp)) as release:
                result = h.run_scenario(release.server, release.operator_user, release.mark)
                permissions = h.operator_permissions(result, release.operator_user)
    used, lease = split(permissions)
    # The ClusterRole as the chart renders it with its default values (every plugin on).
    role = h.one(h.render(), "ClusterRole", "kubeflow-trainer-controller-manager")
    granted = rbac_audit.permissions_from_rules(role["rules"])
    print("used and granted:")
    print("\n".join(rbac_audit.describe(used & granted)))
    print(f"in the release namespace ({LEASE_ROLE.relative_to(h.ROOT)}):")
    print("\n".join(rbac_audit.describe(lease)))
    for title, found in (("used, not granted", used - granted), ("granted, never used", granted - used)):
        if found:
            print(f"{title}:")
            print("\n".join(rbac_audit.describe(found)))
    return 0 if used == granted else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
