"""The chart's NetworkPolicy for the operator's pods (docs/security.md, finding 6; docs/install.md,
"Network policy"): one policy, on by default, that admits only training pods (JobSet's pods, from
any namespace) to the status server's port, and every other port the pod serves from anywhere unless
its own restriction is on. A NetworkPolicy that selects a pod for Ingress drops whatever none of its
rules admits, so these tests read the policy as a CNI would: who may reach each port, the union of
every rule that covers it."""

from __future__ import annotations

from typing import Any

import chart_harness as h
import helm_python as helm
import pytest
import yaml

Obj = dict[str, Any]
ANYONE = "anyone"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
TRAINING_PODS = {
    "namespaceSelector": {},
    "podSelector": {"matchExpressions": [{"key": JOBSET_NAME, "operator": "Exists"}]},
}
GATE = {"manager": {"config": {"featureGates": {"TrainJobStatus": True}}}}
MOVED = h.merge(
    GATE,
    {
        "manager": {
            "config": {
                "webhook": {"port": 9444},
                "metrics": {"bindAddress": ":9090"},
                "health": {"healthProbeBindAddress": "127.0.0.1:9091"},
                "statusServer": {"port": 8443},
            }
        }
    },
)
API_SERVERS = [{"ipBlock": {"cidr": "10.0.0.0/24"}}, {"ipBlock": {"cidr": "172.16.5.10/32"}}]
PROMETHEUS = [
    {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
]


def chart_values() -> Obj:
    values: Obj = yaml.safe_load((h.CHART / "values.yaml").read_text())
    return values


def status_port(values: Obj) -> int:
    return int(h.merge(chart_values(), values)["manager"]["config"]["statusServer"]["port"])


def container(objects: list[Obj]) -> Obj:
    (manager,) = h.one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    result: Obj = manager
    return result


def container_ports(objects: list[Obj]) -> dict[str, int]:
    return {p["name"]: int(p["containerPort"]) for p in container(objects)["ports"]}


def sources(policy: Obj, port: int, named: dict[str, int]) -> str | list[Obj]:
    """Who may open a TCP connection to ``port`` of a selected pod: ``ANYONE``, or the peers of every
    rule covering it (none: the port is closed). A rule without ports covers every port; a rule
    without peers admits every source (NetworkPolicy's semantics)."""

    def covers(entry: Obj) -> bool:
        if entry.get("protocol", "TCP") != "TCP":
            return False
        if "port" not in entry:  # every port of the protocol
            return True
        if isinstance(entry["port"], str):
            if entry["port"] not in named:  # a name no container port has
                return False
            return named[entry["port"]] == port
        first = int(entry["port"])
        return first <= port <= int(entry.get("endPort", first))

    peers: list[Obj] = []
    for rule in policy["spec"].get("ingress") or []:
        ports = rule.get("ports")
        if ports and not any(covers(p) for p in ports):
            continue
        if not rule.get("from"):
            return ANYONE
        peers += rule["from"]
    return peers


def rule_ports(policy: Obj) -> list[int]:
    out = []
    for rule in policy["spec"]["ingress"]:
        assert rule.get("ports"), f"a rule without ports admits its peers to every port: {rule}"
        out += [p["port"] for p in rule["ports"]]
    return out


@pytest.mark.parametrize("values", [{}, GATE, MOVED], ids=["defaults", "gate-on", "moved-ports"])
def test_one_policy_selects_exactly_the_manager_pods_for_ingress(values: Obj) -> None:
    objects = h.render(values)
    (policy,) = h.find(objects, "NetworkPolicy")
    deployment = h.one(objects, "Deployment")
    assert policy["metadata"]["namespace"] == h.NAMESPACE
    assert policy["metadata"]["name"] == deployment["metadata"]["name"]
    assert policy["spec"]["podSelector"] == deployment["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # the operator's egress (the API server) is untouched


@pytest.mark.parametrize("values", [{}, GATE, MOVED], ids=["defaults", "gate-on", "moved-ports"])
def test_status_port_admits_only_training_pods_from_any_namespace(values: Obj) -> None:
    objects = h.render(values)
    policy = h.one(objects, "NetworkPolicy")
    status = status_port(values)
    if "status" in container_ports(objects):  # with the gate; without it the rule waits for it
        assert container_ports(objects)["status"] == status
    assert sources(policy, status, container_ports(objects)) == [TRAINING_PODS]


@pytest.mark.parametrize("values", [{}, GATE, MOVED], ids=["defaults", "gate-on", "moved-ports"])
def test_webhook_metrics_and_health_ports_are_open(values: Obj) -> None:
    objects = h.render(values)
    policy = h.one(objects, "NetworkPolicy")
    ports = container_ports(objects)
    for name in ("webhook", "metrics", "health"):
        assert sources(policy, ports[name], ports) == ANYONE, name


@pytest.mark.parametrize(
    "values",
    [
        {},
        GATE,
        MOVED,
        {"manager": {"networkPolicy": {"webhook": {"restrict": True, "from": API_SERVERS}}}},
        h.merge(MOVED, {"manager": {"networkPolicy": {"metrics": {"from": PROMETHEUS}}}}),
    ],
    ids=["defaults", "gate-on", "moved-ports", "webhook-restricted", "metrics-restricted"],
)
def test_every_container_port_is_admitted_and_every_rule_is_a_port(values: Obj) -> None:
    """No port the pod serves is closed by the policy; no rule opens a port the pod does not serve
    (but the status port, admitted ahead of the gate)."""
    objects = h.render(values)
    policy = h.one(objects, "NetworkPolicy")
    ports = container_ports(objects)
    for name, number in ports.items():
        assert sources(policy, number, ports) != [], f"port {name} ({number}) is closed by the policy"
    status = status_port(values)
    assert set(rule_ports(policy)) == {*ports.values(), status}
    assert len(rule_ports(policy)) == len(set(rule_ports(policy))), "each port in one rule"


def test_webhook_restriction_puts_its_peers_on_the_webhook_port_only() -> None:
    values = h.merge(
        MOVED, {"manager": {"networkPolicy": {"webhook": {"restrict": True, "from": API_SERVERS}}}}
    )
    objects = h.render(values)
    policy = h.one(objects, "NetworkPolicy")
    ports = container_ports(objects)
    assert sources(policy, ports["webhook"], ports) == API_SERVERS
    assert sources(policy, ports["metrics"], ports) == ANYONE
    assert sources(policy, ports["health"], ports) == ANYONE
    assert sources(policy, ports["status"], ports) == [TRAINING_PODS]


def test_webhook_peers_without_the_restriction_change_nothing() -> None:
    values = {"manager": {"networkPolicy": {"webhook": {"from": API_SERVERS}}}}
    objects = h.render(values)
    ports = container_ports(objects)
    assert sources(h.one(objects, "NetworkPolicy"), ports["webhook"], ports) == ANYONE


def test_metrics_and_status_peers_are_values() -> None:
    team = [
        {"namespaceSelector": {"matchLabels": {"team": "ml"}}, "podSelector": TRAINING_PODS["podSelector"]}
    ]
    values = h.merge(
        GATE,
        {"manager": {"networkPolicy": {"metrics": {"from": PROMETHEUS}, "statusServer": {"from": team}}}},
    )
    objects = h.render(values)
    policy = h.one(objects, "NetworkPolicy")
    ports = container_ports(objects)
    assert sources(policy, ports["metrics"], ports) == PROMETHEUS
    assert sources(policy, ports["status"], ports) == team
    assert sources(policy, ports["webhook"], ports) == ANYONE
    assert sources(policy, ports["health"], ports) == ANYONE


@pytest.mark.parametrize(
    "network_policy",
    [
        {"webhook": {"restrict": True}},
        {"webhook": {"restrict": True, "from": []}},
        # Off, nothing would restrict the port the values say is restricted.
        {"enabled": False, "webhook": {"restrict": True, "from": API_SERVERS}},
    ],
    ids=["no-peers", "empty-peers", "policy-off"],
)
def test_webhook_restriction_that_would_not_hold_is_refused(network_policy: Obj) -> None:
    with pytest.raises(helm.HelmError) as refused:
        h.render({"manager": {"networkPolicy": network_policy}})
    key = (
        "manager.networkPolicy.enabled"
        if network_policy.get("enabled") is False
        else "manager.networkPolicy.webhook.from"
    )
    assert key in str(refused.value)


@pytest.mark.parametrize("values", [{}, GATE], ids=["defaults", "gate-on"])
def test_disabled_renders_no_policy(values: Obj) -> None:
    assert (
        h.find(h.render(h.merge(values, {"manager": {"networkPolicy": {"enabled": False}}})), "NetworkPolicy")
        == []
    )


@pytest.mark.parametrize(
    ("network_policy", "complaint"),
    [
        ({"statusServer": {"from": [{"podselector": {}}]}}, "podselector"),  # a typo is not "anyone"
        ({"webhook": {"from": [{}]}}, "from"),  # an empty peer
        ({"webhook": {"restrict": "yes", "from": API_SERVERS}}, "restrict"),
        ({"metrics": {"from": [{"ipBlock": {"except": ["10.0.0.1/32"]}}]}}, "cidr"),
        ({"health": {"from": []}}, "health"),  # the probes' port stays open: not a value
    ],
)
def test_values_schema_refuses(network_policy: Obj, complaint: str) -> None:
    with helm.Chart.load(h.CHART) as chart, pytest.raises(helm.HelmError) as refused:
        chart.render(
            values={"manager": {"networkPolicy": network_policy}}, name=h.RELEASE, namespace=h.NAMESPACE
        )
    assert complaint in str(refused.value)
