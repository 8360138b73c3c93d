"""The chart rendered offline by Helm 4 (helm-python-sdk): strict lint, schema, and every object checked.

Built-in kinds are validated against the Kubernetes OpenAPI schemas (kubernetes-validate) of the oldest
and newest supported versions; custom resources against upstream's CRDs in the reference data
(tests/reference_data.py): the trainer's, JobSet's for the runtimes' JobSet templates, cert-manager's
and Prometheus Operator's.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import chart_harness as h
import helm_python as helm
import kubernetes_validate
import pytest
import reference_data
import yaml
from trainer_sandbox import sandbox

import trainer
from trainer.apimachinery import pruning, schema_validation
from trainer.controller.config import Configuration
from trainer.controller.operator import Operator

Obj = dict[str, Any]

KUBERNETES_VERSIONS = ("1.29", "1.33")  # schemas checked offline; 1.36 runs for real (docs/install.md)
RUNTIME_KEYS = {
    "torchDistributed": "torch-distributed",
    "deepspeedDistributed": "deepspeed-distributed",
    "mlxDistributed": "mlx-distributed",
    "jaxDistributed": "jax-distributed",
    "xgboostDistributed": "xgboost-distributed",
    "torchtuneDistributed.llama3_2_1B": "torchtune-llama3.2-1b",
    "torchtuneDistributed.llama3_2_3B": "torchtune-llama3.2-3b",
    "torchtuneDistributed.qwen2_5_1_5B": "torchtune-qwen2.5-1.5b",
}


def runtime_toggle(key: str, enabled: bool) -> Obj:
    out: Obj = {"enabled": enabled}
    for part in reversed(key.split(".")):
        out = {part: out}
    return {"runtimes": out}


def all_runtimes(enabled: bool) -> Obj:
    values: Obj = {}
    for key in RUNTIME_KEYS:
        values = h.merge(values, runtime_toggle(key, enabled))
    return values


# A CA's PEM, base64, as a user gives it with webhook.existingSecret.caBundle (not parsed by the chart).
CA_BUNDLE = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()

# Each toggle the chart has, and the values a user of upstream's chart would carry over.
TOGGLES: dict[str, Obj] = {
    "defaults": {},
    "crds-off": {"crds": {"enabled": False}},
    "cert-manager": {"certManager": {"enabled": True}},
    "existing-secret": {"webhook": {"existingSecret": {"name": "corp-webhook-tls", "caBundle": CA_BUNDLE}}},
    "existing-secret-injected": {
        "webhook": {
            "existingSecret": {"name": "corp-webhook-tls"},
            "annotations": {"service.beta.openshift.io/inject-cabundle": "true"},
        }
    },
    "operator-certificate": {
        "webhook": {
            "operatorCertificate": {"caValidity": "8760h", "certValidity": "720h", "checkInterval": "30s"}
        }
    },
    "cert-manager-issuer": {
        "certManager": {"enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}
    },
    "grafana-dashboard": {"grafanaDashboard": {"enabled": True, "namespace": "monitoring"}},
    "service-monitor": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}, "interval": "30s"},
        "metricsReader": {
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}]
        },
    },
    "metrics-plain": {
        "manager": {"config": {"metrics": {"bindAddress": ":8080", "secureServing": False}}},
        "serviceMonitor": {"enabled": True},
    },
    "metrics-off": {
        "manager": {"config": {"metrics": {"bindAddress": "0"}}},
        "serviceMonitor": {"enabled": True},
    },
    "runtimes-off": all_runtimes(False),
    "runtimes-default-enabled": h.merge(all_runtimes(False), {"runtimes": {"defaultEnabled": True}}),
    "runtime-images": {
        "runtimes": {
            "deepspeedDistributed": {"image": {"registry": "mirror.example.com", "tag": "v2.3.0"}},
            "torchtuneDistributed": {"image": {"tag": "v2.3.0"}},
        }
    },
    "operator-settings": {
        "manager": {
            "replicas": 0,
            "logFormat": "plain",
            "verbosity": 2,
            "priorityClassName": "system-cluster-critical",
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
            "config": {"featureGates": {"TrainJobStatus": True}, "plugins": {"disabled": ["Volcano"]}},
        },
        "image": {
            "registry": "registry.example.com",
            "tag": "0.1.0-rc1",
            "pullSecrets": [{"name": "regcred"}],
        },
        "commonLabels": {"team": "ml-platform"},
    },
    "upstream-values": {
        "image": {
            "registry": "ghcr.io",
            "repository": "kubeflow/trainer/trainer-operator",
            "pullPolicy": "Always",
        },
        "jobset": {"install": False},
        "manager": {
            "replicas": 1,
            "resources": {
                "limits": {"cpu": "500m", "memory": "512Mi"},
                "requests": {"cpu": "100m", "memory": "300Mi"},
            },
            "config": {
                "clientConnection": {"qps": 0.5, "burst": 10},
                "controller": {"groupKindConcurrency": {"trainJob": 10}},
                "leaderElection": {
                    "leaderElect": True,
                    "resourceName": "trainer.kubeflow.org",
                    "resourceNamespace": "",
                    "leaseDuration": "15s",
                    "renewDeadline": "10s",
                    "retryPeriod": "2s",
                },
            },
        },
        "webhook": {"failurePolicy": "Ignore"},
        "runtimes": {"defaultEnabled": False, "torchDistributed": {"enabled": True}},
    },
    "replicas": {"manager": {"replicas": 3, "podDisruptionBudget": {"minAvailable": 2}}},
    "one-replica": {"manager": {"replicas": 1}},
    "own-affinity": {
        "manager": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}
                        ]
                    }
                },
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "manager"}},
                            "topologyKey": "topology.kubernetes.io/zone",
                        }
                    ]
                },
            }
        }
    },
    "lease-elsewhere": {
        "manager": {
            "replicas": 2,
            "config": {"leaderElection": {"resourceNamespace": "kube-system", "leaseDuration": "30s"}},
        }
    },
    "leader-election-off": {"manager": {"replicas": 1, "config": {"leaderElection": {"leaderElect": False}}}},
    "network-policy": {
        "manager": {
            "config": {"featureGates": {"TrainJobStatus": True}},
            "networkPolicy": {
                "webhook": {
                    "restrict": True,
                    "from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                },
                "metrics": {
                    "from": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
                            },
                            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
                        }
                    ]
                },
            },
        }
    },
    "network-policy-off": {"manager": {"networkPolicy": {"enabled": False}}},
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Obj]]:
    return {name: h.render(values) for name, values in TOGGLES.items()}


@pytest.fixture(scope="module")
def default() -> list[Obj]:
    return h.render()


@pytest.fixture(scope="module")
def reference() -> Path:
    return reference_data.require("crds")


@pytest.fixture(scope="module")
def schemas(reference: Path) -> dict[tuple[str, str], Obj]:
    """openAPIV3Schema by (apiVersion, kind), from the reference CRDs."""
    found: dict[tuple[str, str], Obj] = {}
    for path in sorted(reference.glob("crds/*/*.yaml")):
        for crd in yaml.load_all(path.read_text(), Loader=h._LOADER):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            for version in crd["spec"]["versions"]:
                key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
                found[key] = version["schema"]["openAPIV3Schema"]
    return found


def _check_custom(schema: Obj, obj: Obj) -> list[str]:
    problems = [f"unknown field {p}" for p in pruning.unknown_fields(schema, obj)]
    problems += [str(e) for e in schema_validation.validate(schema, obj)]
    return problems


# --- lint and schema ---------------------------------------------------------------------------


@pytest.mark.parametrize("toggle", sorted(TOGGLES))
def test_strict_lint_is_clean(toggle: str) -> None:
    for version in KUBERNETES_VERSIONS:
        values = TOGGLES[toggle]
        if version < "1.30":  # no ValidatingAdmissionPolicy before 1.30: turned off, as docs/install.md says
            values = h.merge(values, {"manager": {"admissionPolicy": {"enabled": False}}})
        report = helm.lint(h.CHART, values, strict=True, namespace=h.NAMESPACE, kube_version=f"v{version}.0")
        assert report["errors"] == [] and report["messages"] == [], report


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"manager": {"replica": 1}}, "replica"),  # a typo is an error, not a silent default
        # Without leader election, two replicas would both reconcile.
        ({"manager": {"replicas": 2, "config": {"leaderElection": {"leaderElect": False}}}}, "replicas"),
        ({"manager": {"config": {"leaderElection": {"leaderElect": False}}}}, "replicas"),  # 2 by default
        ({"manager": {"replicas": 2, "podDisruptionBudget": {"minAvailable": 2}}}, "minAvailable"),
        ({"manager": {"podDisruptionBudget": {"minAvailable": 2}}}, "minAvailable"),  # 2 replicas by default
        ({"manager": {"replicas": 3, "podDisruptionBudget": {"minAvailable": 3}}}, "minAvailable"),
        ({"manager": {"config": {"leaderElection": {"leaseDuration": "15"}}}}, "leaseDuration"),
        ({"jobset": {"install": True}}, "install"),  # JobSet is installed separately
        ({"webhook": {"failurePolicy": "Maybe"}}, "failurePolicy"),
        ({"manager": {"config": {"leaderElection": {"resourceLock": "leases"}}}}, "resourceLock"),
        ({"manager": {"config": {"metrics": {"bindAddress": "8080"}}}}, "bindAddress"),
        ({"runtimes": {"torchDistributed": {"enabled": "yes"}}}, "enabled"),
        ({"certManager": {"issuerRef": {"kind": "ClusterIssuer"}}}, "name"),
        ({"webhook": {"selfManagedCertValidityDays": 365}}, "selfManagedCertValidityDays"),  # gone
        ({"webhook": {"operatorCertificate": {"certValidity": "30d"}}}, "certValidity"),
        ({"webhook": {"existingSecret": {"caBundle": "not base64!"}}}, "caBundle"),
        # Two sources for one certificate.
        ({"certManager": {"enabled": True}, "webhook": {"existingSecret": {"name": "x"}}}, "existingSecret"),
        ({"dataCache": {"enabled": True}}, "dataCache"),
        # Restricting the webhook port to nobody would refuse every TrainJob write.
        (
            {"manager": {"networkPolicy": {"webhook": {"restrict": True}}}},
            "manager.networkPolicy.webhook.from",
        ),
        # Two servers on one port: a Service the API server refuses, an operator that cannot bind.
        (
            {"manager": {"config": {"metrics": {"bindAddress": ":9443"}}}},
            "manager.config.webhook.port and manager.config.metrics.bindAddress are both port 9443",
        ),
        (
            {
                "manager": {
                    "config": {"featureGates": {"TrainJobStatus": True}, "statusServer": {"port": 8443}}
                }
            },
            "manager.config.metrics.bindAddress and manager.config.statusServer.port are both port 8443",
        ),
        # That Secret holds no CA to check the operator's certificate against.
        (
            {
                "webhook": {"existingSecret": {"name": "corp", "caBundle": CA_BUNDLE}},
                "serviceMonitor": {"enabled": True},
            },
            "serviceMonitor.tlsConfig is needed with webhook.existingSecret",
        ),
        # Upstream's switch off with nothing in its place would leave the webhooks without a certificate.
        (
            {"manager": {"config": {"certManagement": {"enable": False}}}},
            "manager.config.certManagement.enable is false",
        ),
        # What the operator would refuse at start-up, refused at install instead.
        (
            {
                "manager": {
                    "config": {"health": {"readinessEndpointName": "up", "livenessEndpointName": "up"}}
                }
            },
            "readinessEndpointName and livenessEndpointName must differ",
        ),
        ({"manager": {"config": {"tls": {"nextProtos": ["h2"]}}}}, "/manager/config/tls/nextProtos"),
        ({"manager": {"config": {"tls": {"cipherSuites": ["TLS_RSA_WITH_RC4_128_SHA"]}}}}, "cipherSuites/0"),
        ({"manager": {"config": {"tls": {"minVersion": "1.0"}}}}, "minVersion"),
        # A pod whose labels overwrite its selector's would not match it.
        (
            {"manager": {"selectorLabels": {"team": "a"}, "labels": {"team": "b"}}},
            "manager.selectorLabels.team is also in manager.labels",
        ),
        # A ClusterRoleBinding to a ServiceAccount without its namespace is refused at install.
        ({"metricsReader": {"subjects": [{"kind": "ServiceAccount", "name": "prometheus"}]}}, "namespace"),
    ],
)
def test_values_schema_refuses(values: Obj, complaint: str) -> None:
    with helm.Chart.load(h.CHART) as chart, pytest.raises(helm.HelmError) as refused:
        chart.render(values=values, name=h.RELEASE, namespace=h.NAMESPACE)
    assert complaint in str(refused.value)


def test_every_value_is_documented_and_in_the_schema() -> None:
    import sync_chart

    text = (h.CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    documented = {d.key for d in sync_chart.value_docs(text)}
    schema = json.loads((h.CHART / "values.schema.json").read_text())

    def leaves(node: Any, prefix: str = "") -> list[str]:
        if isinstance(node, dict) and node:
            return [leaf for k, v in node.items() for leaf in leaves(v, f"{prefix}{k}.")]
        return [prefix[:-1]]

    def schema_node(path: list[str]) -> Any:
        node = schema
        for part in path:
            while "$ref" in node:
                node = schema["definitions"][node["$ref"].split("/")[-1]]
            if "properties" not in node:
                return node  # a free-form object (resources, affinity, ...): Kubernetes checks it
            node = node["properties"].get(part)
            if node is None:
                return None
        return node

    for leaf in leaves(values):
        parts = leaf.split(".")
        assert any(".".join(parts[:i]) in documented for i in range(1, len(parts) + 1)), (
            f"{leaf}: no `# --` comment"
        )
        assert schema_node(parts) is not None, f"{leaf} is not in values.schema.json"


# --- every object valid -------------------------------------------------------------------------


_VALIDATED: set[str] = set()  # objects the same under several toggles are checked once


@pytest.mark.parametrize("toggle", sorted(TOGGLES))
def test_every_rendered_object_is_valid(
    toggle: str, rendered: dict[str, list[Obj]], schemas: dict[tuple[str, str], Obj]
) -> None:
    jobset_spec = schemas[("jobset.x-k8s.io/v1alpha2", "JobSet")]["properties"]["spec"]
    for obj in rendered[toggle]:
        fingerprint = json.dumps(obj, sort_keys=True)
        if fingerprint in _VALIDATED:
            continue
        where = f"{obj['kind']} {obj['metadata']['name']}"
        key = (obj["apiVersion"], obj["kind"])
        if key in schemas:
            assert _check_custom(schemas[key], obj) == [], where
            if obj["kind"] == "ClusterTrainingRuntime":
                problems = _check_custom(jobset_spec, obj["spec"]["template"]["spec"])
                assert problems == [], f"{where}: its JobSet template: {problems}"
        else:
            for version in KUBERNETES_VERSIONS:
                if obj["kind"].startswith("ValidatingAdmissionPolicy") and version < "1.30":
                    continue  # the API is GA from 1.30; the chart refuses older clusters with it on
                try:
                    kubernetes_validate.validate(obj, version, strict=True)
                except kubernetes_validate.ValidationError as exc:
                    pytest.fail(
                        f"{where} is not a valid Kubernetes {version} object: {exc.message} at {list(exc.path)}"
                    )
        _VALIDATED.add(fingerprint)


def test_crds_are_the_projects_and_survive_uninstall(default: list[Obj]) -> None:
    crds = h.find(default, "CustomResourceDefinition")
    project = {}
    for path in sorted((h.ROOT / "crds").glob("trainer.kubeflow.org_*.yaml")):
        crd = yaml.load(path.read_text(), Loader=h._LOADER)
        project[crd["metadata"]["name"]] = crd
    assert sorted(c["metadata"]["name"] for c in crds) == sorted(project)
    for crd in crds:
        meta = crd["metadata"]
        assert meta["annotations"]["helm.sh/resource-policy"] == "keep"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        want = project[meta["name"]]
        # Equal as JSON: a number that became a float or a string on the way would show.
        assert json.dumps(crd["spec"], sort_keys=True) == json.dumps(want["spec"], sort_keys=True)
        # kubectl apply (client side) keeps the whole object in an annotation limited to 256 KiB.
        assert len(json.dumps(crd, separators=(",", ":"))) < 256 * 1024
    assert h.find(h.render({"crds": {"enabled": False}}), "CustomResourceDefinition") == []


# --- secure by default --------------------------------------------------------------------------


def test_operator_pod_is_secure_by_default(default: list[Obj]) -> None:
    pod = h.one(default, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    ctx = container["securityContext"]
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["privileged"] is False
    assert ctx["runAsNonRoot"] is True
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    for kind in ("requests", "limits"):
        assert set(container["resources"][kind]) == {"cpu", "memory"}, kind
    # The only writable paths are volumes: /tmp (bounded) and nothing else.
    writable = [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")]
    assert writable == ["/tmp"]
    tmp = next(v for v in pod["volumes"] if v["name"] == "tmp")
    assert tmp["emptyDir"]["sizeLimit"]
    # The token is mounted where it is used, not by every pod of the ServiceAccount.
    assert h.one(default, "ServiceAccount")["automountServiceAccountToken"] is False
    assert pod["automountServiceAccountToken"] is True
    assert not container["image"].endswith(":latest")


def test_no_rbac_rule_has_a_wildcard(rendered: dict[str, list[Obj]]) -> None:
    for objects in rendered.values():
        for role in h.find(objects, "ClusterRole") + h.find(objects, "Role"):
            for rule in role["rules"]:
                for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                    assert not any("*" in v for v in rule.get(field) or []), (role["metadata"]["name"], rule)


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"plugins": {"disabled": ["Volcano"]}},
        {"plugins": {"disabled": ["MPI", "Flux", "CoScheduling", "Volcano"]}},
        {"featureGates": {"TrainJobStatus": True}},
    ],
    ids=["default", "no-volcano", "no-gangs-no-keys", "status-gate"],
)
def test_the_cluster_role_grants_what_the_enabled_plugins_declare(config: Obj) -> None:
    """The ClusterRole is derived from the plugins: whatever the configuration turns off is not
    granted, and it is the same table the operator watches and writes (controller/resources.py)."""
    from trainer_sandbox import rbac_audit

    objects = h.render({"manager": {"config": config}})
    granted = rbac_audit.permissions_from_rules(
        h.one(objects, "ClusterRole", "kubeflow-trainer-controller-manager")["rules"]
    )
    operator = Operator(config=Configuration.model_validate(config))
    assert granted == operator.resources.permissions()
    if "Volcano" in (config.get("plugins") or {}).get("disabled", []):
        assert not any(resource == "priorityclasses" for _, resource, _ in granted)


# --- names and wiring ---------------------------------------------------------------------------


def test_names_are_upstreams(default: list[Obj]) -> None:
    manager = "kubeflow-trainer-controller-manager"
    for kind in ("Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        h.one(default, kind, manager)
    h.one(default, "ValidatingWebhookConfiguration", "validator.trainer.kubeflow.org")
    h.one(default, "MutatingWebhookConfiguration", "defaulter.trainer.kubeflow.org")
    public = h.one(default, "ConfigMap", "kubeflow-trainer-public")
    assert public["metadata"]["namespace"] == h.NAMESPACE
    h.one(default, "Secret", "kubeflow-trainer-webhook-cert")
    # Another release name still gives unique, bounded names.
    other = h.render(release="trainer-canary")
    h.one(other, "Deployment", "trainer-canary-kubeflow-trainer-controller-manager")


def test_webhooks_are_the_operators_handlers(default: list[Obj]) -> None:
    registry = Operator(config=Configuration()).registry()
    handlers = {hd.id: hd.reason.value for hd in registry._webhooks.get_all_handlers()}
    configured = {}
    service = h.one(default, "Service")
    for kind, reason in (
        ("ValidatingWebhookConfiguration", "validating"),
        ("MutatingWebhookConfiguration", "mutating"),
    ):
        for hook in h.one(default, kind)["webhooks"]:
            ref = hook["clientConfig"]["service"]
            assert (ref["name"], ref["namespace"], ref["port"]) == (
                service["metadata"]["name"],
                h.NAMESPACE,
                443,
            )
            assert hook["name"] == ref["path"][1:] + ".trainer.kubeflow.org"
            configured[ref["path"][1:]] = reason
    assert configured == handlers
    # The Service's webhook port reaches the container port the operator's configuration listens on.
    deployment = h.one(default, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    config = yaml.safe_load(h.one(default, "ConfigMap", "kubeflow-trainer-config")["data"]["config.yaml"])
    assert ports["webhook"] == config["webhook"]["port"]
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {
        "webhook": "webhook",
        "metrics": "metrics",
    }
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_operator_configuration_is_what_the_operator_reads(rendered: dict[str, list[Obj]]) -> None:
    for name, objects in rendered.items():
        text = h.one(objects, "ConfigMap", "kubeflow-trainer-config")["data"]["config.yaml"]
        config = Configuration.model_validate(yaml.safe_load(text))  # refuses unknown fields
        pod = h.one(objects, "Deployment")["spec"]["template"]["spec"]
        mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert config.webhook.enabled and not config.webhook.manage_configuration
        expected_secret = (
            "corp-webhook-tls" if name.startswith("existing-secret") else "kubeflow-trainer-webhook-cert"
        )
        if config.cert_management.enable:
            # The operator's own certificate: read from its Secret through the API, written under the
            # writable /tmp (nothing mounted), for the Service the webhooks call.
            assert "webhook-cert" not in mounts, name
            assert config.webhook.cert_dir is not None and config.webhook.cert_dir.startswith(
                mounts["tmp"] + "/"
            )
            settings = config.cert_management
            assert settings.webhook_secret_name == expected_secret
            assert settings.webhook_secret_namespace == h.NAMESPACE
            assert settings.webhook_service_name == h.one(objects, "Service")["metadata"]["name"]
            assert settings.validating_webhook_configuration_name == "validator.trainer.kubeflow.org"
            assert settings.mutating_webhook_configuration_name == "defaulter.trainer.kubeflow.org"
        else:
            assert config.webhook.cert_dir == mounts["webhook-cert"], name
            secret = next(v for v in pod["volumes"] if v["name"] == "webhook-cert")["secret"]["secretName"]
            assert secret == expected_secret
        args = pod["containers"][0]["args"]
        assert f"--config={mounts['config']}/config.yaml" in args
    upstream = yaml.safe_load(
        h.one(rendered["upstream-values"], "ConfigMap", "kubeflow-trainer-config")["data"]["config.yaml"]
    )
    parsed = Configuration.model_validate(upstream)
    assert parsed.controller.trainjob_workers == 10  # upstream's groupKindConcurrency.trainJob
    assert (parsed.client_connection.qps, parsed.client_connection.burst) == (0.5, 10)
    operator = Configuration.model_validate(
        yaml.safe_load(
            h.one(rendered["operator-settings"], "ConfigMap", "kubeflow-trainer-config")["data"][
                "config.yaml"
            ]
        )
    )
    assert operator.plugins.disabled == ["Volcano"] and operator.feature_gates == {"TrainJobStatus": True}
    args = h.one(rendered["operator-settings"], "Deployment")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert "--log-format=plain" in args and "-vv" in args


def test_replicas_elect_a_leader_and_one_stays_through_drains(rendered: dict[str, list[Obj]]) -> None:
    def election(objects: list[Obj]) -> Any:
        text = h.one(objects, "ConfigMap", "kubeflow-trainer-config")["data"]["config.yaml"]
        return Configuration.model_validate(yaml.safe_load(text)).leader_election

    # Two replicas by default, so that a restart of one (a node drain, an eviction, a crash) never
    # leaves the webhooks, whose failurePolicy is Fail, without a server: every TrainJob write would
    # be refused. They elect one to reconcile, and a disruption budget keeps one of them running.
    default = rendered["defaults"]
    deployment = h.one(default, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pdb = h.one(default, "PodDisruptionBudget")
    assert pdb["metadata"]["name"] == deployment["metadata"]["name"]
    assert pdb["metadata"]["namespace"] == h.NAMESPACE and pdb["spec"]["minAvailable"] == 1
    selector = pdb["spec"]["selector"]["matchLabels"]
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    assert selector["app.kubernetes.io/component"] == "manager"
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    assert h.one(default, "ValidatingWebhookConfiguration")["webhooks"][0]["failurePolicy"] == "Fail"
    # One replica: no disruption budget, which would block every drain of its node; it still elects
    # (an upgrade runs two pods for a while).
    single = rendered["one-replica"]
    assert h.one(single, "Deployment")["spec"]["replicas"] == 1
    assert h.find(single, "PodDisruptionBudget") == []
    assert election(single).leader_elect
    elected = election(default)
    assert elected.leader_elect and elected.resource_name == "trainer.kubeflow.org"
    assert elected.resource_namespace == h.NAMESPACE
    assert (elected.lease_duration, elected.renew_deadline, elected.retry_period) == ("15s", "10s", "2s")
    # An upgrade starts a new pod before it stops an old one: the webhooks stay served, and the
    # Lease keeps the two from reconciling at once.
    strategy = h.one(default, "Deployment")["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}

    objects = rendered["replicas"]
    deployment = h.one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    pdb = h.one(objects, "PodDisruptionBudget")
    assert pdb["metadata"]["namespace"] == h.NAMESPACE and pdb["spec"]["minAvailable"] == 2
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert h.one(rendered["lease-elsewhere"], "PodDisruptionBudget")["spec"]["minAvailable"] == 1

    # The Lease's Role: in the Lease's namespace, bound to the operator's ServiceAccount.
    for name, namespace in (("defaults", h.NAMESPACE), ("lease-elsewhere", "kube-system")):
        objects = rendered[name]
        assert election(objects).resource_namespace == namespace
        role = h.one(objects, "Role", "kubeflow-trainer-leader-election")
        binding = h.one(objects, "RoleBinding", "kubeflow-trainer-leader-election")
        assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == namespace
        assert role["rules"] == [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "verbs": ["create", "get", "update"],
            }
        ]
        account = h.one(objects, "ServiceAccount")["metadata"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
        ]
    assert election(rendered["lease-elsewhere"]).lease_duration_seconds == 30

    off = rendered["leader-election-off"]
    assert not election(off).leader_elect
    assert h.one(off, "Deployment")["spec"]["replicas"] == 1
    assert h.find(off, "Role", "kubeflow-trainer-leader-election") == []


def test_replicas_prefer_different_nodes(rendered: dict[str, list[Obj]]) -> None:
    """By default the replicas prefer nodes apart (a node's loss or drain takes one, not both), but
    only prefer: a one-node cluster still runs them all. An anti-affinity of the user's replaces it."""
    deployment = h.one(rendered["defaults"], "Deployment")
    affinity = deployment["spec"]["template"]["spec"]["affinity"]
    assert affinity == {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]},
                        "topologyKey": "kubernetes.io/hostname",
                    },
                }
            ]
        }
    }
    assert h.one(rendered["one-replica"], "Deployment")["spec"]["template"]["spec"].get("affinity") is None
    own = TOGGLES["own-affinity"]["manager"]["affinity"]
    assert h.one(rendered["own-affinity"], "Deployment")["spec"]["template"]["spec"]["affinity"] == own
    # Another kind of affinity is kept, beside the default anti-affinity.
    node_only = {"nodeAffinity": own["nodeAffinity"]}
    spec = h.one(h.render({"manager": {"affinity": node_only}}), "Deployment")["spec"]["template"]["spec"]
    assert spec["affinity"] == {**node_only, **affinity}


def test_config_change_restarts_the_operator() -> None:
    def checksum(values: Obj) -> str:
        deployment = h.one(h.render(values), "Deployment")
        return str(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum({}) == checksum({})
    assert checksum({}) != checksum({"manager": {"config": {"clientConnection": {"qps": 20}}}})


def test_image_and_settings_from_values(rendered: dict[str, list[Obj]]) -> None:
    image = h.one(h.render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    chart = yaml.safe_load((h.CHART / "Chart.yaml").read_text())
    assert image == f"trainer-operator:{chart['appVersion']}"
    pod = h.one(rendered["operator-settings"], "Deployment")["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.example.com/trainer-operator:0.1.0-rc1"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert h.one(rendered["operator-settings"], "Deployment")["spec"]["replicas"] == 0
    for obj in rendered["operator-settings"]:
        assert obj["metadata"]["labels"]["team"] == "ml-platform", obj["kind"]
    webhook = h.one(rendered["upstream-values"], "ValidatingWebhookConfiguration")["webhooks"][0]
    assert webhook["failurePolicy"] == "Ignore"


def test_appversion_is_the_projects_version() -> None:
    import tomllib

    project = tomllib.loads((h.ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((h.CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == project == trainer.__version__  # the image tag
    # The upstream release the chart implements is the operator's (tests/test_version.py).
    assert chart["annotations"]["trainer.kubeflow.org/upstream-version"] == trainer.UPSTREAM_VERSION
    notes = h.render_files()[f"{chart['name']}/templates/NOTES.txt"]
    assert (
        f"{chart['appVersion']}, implementing the Kubeflow Trainer\n{trainer.UPSTREAM_VERSION} API" in notes
    )


def test_public_configmap_is_what_the_sandbox_installs(default: list[Obj]) -> None:
    public = h.one(default, "ConfigMap", sandbox.PUBLIC_CONFIGMAP)
    assert public["metadata"]["namespace"] == sandbox.SYSTEM_NAMESPACE
    # What the Kubeflow SDK reads: the upstream release the operator implements.
    assert public["data"] == {
        "kubeflow_trainer_version": trainer.UPSTREAM_VERSION,
        "kubeflow_trainer_api_version": trainer.UPSTREAM_VERSION,
    }
    assert public["data"] == {
        "kubeflow_trainer_version": sandbox.TRAINER_VERSION,
        "kubeflow_trainer_api_version": sandbox.TRAINER_VERSION,
    }
    binding = h.one(default, "RoleBinding", sandbox.PUBLIC_CONFIGMAP)
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}
    ]
    role = h.one(default, "Role", sandbox.PUBLIC_CONFIGMAP)
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [sandbox.PUBLIC_CONFIGMAP],
            "verbs": ["get"],
        }
    ]


# --- metrics ------------------------------------------------------------------------------------


def test_service_monitor_scrapes_over_https_with_a_token_and_a_checked_certificate(
    rendered: dict[str, list[Obj]],
) -> None:
    assert h.find(rendered["defaults"], "ServiceMonitor") == []
    objects = rendered["service-monitor"]
    monitor = h.one(objects, "ServiceMonitor")
    service = h.one(objects, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == "metrics"]
    assert port["port"] == 8443
    endpoint = monitor["spec"]["endpoints"][0]
    # The operator's certificate is checked against the CA of the Secret it keeps it in, by the
    # Service's name, which that certificate carries.
    config = operator_config(objects)
    assert endpoint == {
        "port": "metrics",
        "path": "/metrics",
        "scheme": "https",
        "tlsConfig": {
            "serverName": f"{service['metadata']['name']}.{h.NAMESPACE}.svc",
            "ca": {"secret": {"name": config.cert_management.webhook_secret_name, "key": "ca.crt"}},
        },
        "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
        "interval": "30s",
    }
    assert (config.metrics.secure_serving, config.metrics.authenticated) == (True, True)


def test_plain_metrics_are_scraped_over_http_and_none_can_be_turned_off(
    rendered: dict[str, list[Obj]],
) -> None:
    plain = rendered["metrics-plain"]
    assert h.one(plain, "ServiceMonitor")["spec"]["endpoints"][0] == {
        "port": "metrics",
        "path": "/metrics",
        "scheme": "http",
    }
    config = operator_config(plain)
    assert (config.metrics.bind_address, config.metrics.secure_serving, config.metrics.authenticated) == (
        ":8080",
        False,
        False,
    )
    assert not [o for o in plain if o["metadata"]["name"].startswith("kubeflow-trainer-metrics-")]
    off = rendered["metrics-off"]
    assert h.find(off, "ServiceMonitor") == []
    assert "metrics" not in {p["name"] for p in h.one(off, "Service")["spec"]["ports"]}
    container = h.one(off, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "metrics" not in {p["name"] for p in container["ports"]}
    assert not operator_config(off).metrics.enabled


def test_upstreams_chart_values_render_with_ours_but_for_installing_jobset() -> None:
    """A platform team's values for upstream's chart carry over (docs/install.md, "From upstream's
    chart"): upstream's own values.yaml of the release we implement is refused for one key only,
    JobSet's install (a prerequisite here), and with that one key changed it renders, its
    settings reaching the operator's Configuration."""
    upstream = reference_data.upstream_module(trainer.UPSTREAM_VERSION) / "charts" / "kubeflow-trainer"
    values = yaml.safe_load((upstream / "values.yaml").read_text())
    with helm.Chart.load(h.CHART) as chart, pytest.raises(helm.HelmError) as refused:
        chart.render(values=values, name=h.RELEASE, namespace=h.NAMESPACE)
    complaints = [line for line in str(refused.value).splitlines() if line.strip().startswith("- at")]
    assert complaints == ["- at '/jobset/install': value must be false"], str(refused.value)
    # Their settings, changed from the defaults both charts share, so each is seen to arrive.
    theirs = values["manager"]["config"]
    theirs["health"]["readinessEndpointName"] = "ready-or-not"
    theirs["controller"]["groupKindConcurrency"].update(trainJob=7, clusterTrainingRuntime=2)
    theirs["metrics"]["bindAddress"] = ":9444"
    theirs["leaderElection"]["leaseDuration"] = "30s"
    theirs["statusServer"].update(port=10444, qps=9)
    objects = h.render(h.merge(values, {"jobset": {"install": False}}))
    # Their image.* names upstream's image, which carries over as any value does: docs/install.md
    # says to drop it, or the Deployment runs upstream's controller binary with our arguments.
    image = h.one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.startswith(f"{values['image']['registry']}/{values['image']['repository']}:"), image
    config = operator_config(objects)
    assert config.health.readiness_endpoint_name == "ready-or-not"
    assert (config.controller.trainjob_workers, config.controller.runtime_workers) == (7, 2)
    assert config.metrics.bind_address == ":9444"
    assert (config.leader_election.leader_elect, config.leader_election.lease_duration) == (True, "30s")
    assert (config.status_server.port, config.status_server.qps) == (10444, 9)
    expected = [
        name
        for name, toggle in values["runtimes"].items()
        if isinstance(toggle, dict) and toggle.get("enabled")
    ]
    assert len(h.installed_runtimes(objects)) == len(expected), "their runtime toggles hold"


def test_upstreams_settings_reach_the_pods_and_the_operator() -> None:
    objects = h.render(
        {
            "manager": {
                "selectorLabels": {"team": "ml-platform"},
                "config": {
                    "health": {"readinessEndpointName": "ready", "livenessEndpointName": "alive"},
                    "webhook": {"host": "10.0.0.7"},
                    "controller": {"groupKindConcurrency": {"clusterTrainingRuntime": 3}},
                    "certManagement": {
                        "webhookServiceName": "trainer-hooks",
                        "webhookSecretName": "trainer-cert",
                    },
                    "tls": {"minVersion": "1.3"},
                },
            }
        }
    )
    deployment = h.one(objects, "Deployment")
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"]["team"] == "ml-platform"
    assert pod["metadata"]["labels"]["team"] == "ml-platform", "the pods match their selector"
    assert h.one(objects, "Service")["spec"]["selector"]["team"] == "ml-platform"
    container = pod["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "health"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/alive", "port": "health"}
    assert any(a.endswith(":8081/alive") for a in container["args"] if a.startswith("--liveness="))
    service = h.one(objects, "Service")
    assert service["metadata"]["name"] == "trainer-hooks"
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        for webhook in h.one(objects, kind)["webhooks"]:
            assert webhook["clientConfig"]["service"]["name"] == "trainer-hooks"
    config = operator_config(objects)
    assert (config.cert_management.webhook_service_name, config.cert_management.webhook_secret_name) == (
        "trainer-hooks",
        "trainer-cert",
    )
    assert config.webhook.host == "10.0.0.7"
    assert (config.controller.runtime_workers, config.tls.min_version) == (3, "1.3")
    assert (config.health.readiness_endpoint_name, config.health.liveness_endpoint_name) == ("ready", "alive")


def test_values_of_an_earlier_chart_still_get_authorized_https_metrics() -> None:
    """`helm upgrade --reuse-values` from a release of a chart without these keys: they are absent
    (null removes a default, as a values file without them leaves them out)."""
    objects = h.render(
        {"manager": {"config": {"metrics": {"secureServing": None, "auth": None}}}, "metricsReader": None}
    )
    config = operator_config(objects)
    assert (config.metrics.secure_serving, config.metrics.authenticated) == (True, True)
    assert h.one(objects, "ClusterRole", "kubeflow-trainer-metrics-auth")


def test_metrics_rbac_lets_the_operator_ask_and_the_readers_read(rendered: dict[str, list[Obj]]) -> None:
    defaults = rendered["defaults"]
    reader = h.one(defaults, "ClusterRole", "kubeflow-trainer-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert h.find(defaults, "ClusterRoleBinding", "kubeflow-trainer-metrics-reader") == []
    auth = h.one(defaults, "ClusterRole", "kubeflow-trainer-metrics-auth")
    assert auth["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    ]
    service_account = h.one(defaults, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    binding = h.one(defaults, "ClusterRoleBinding", "kubeflow-trainer-metrics-auth")
    assert binding["roleRef"]["name"] == auth["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": service_account, "namespace": h.NAMESPACE}
    ]
    readers = h.one(rendered["service-monitor"], "ClusterRoleBinding", "kubeflow-trainer-metrics-reader")
    assert readers["roleRef"]["name"] == "kubeflow-trainer-metrics-reader"
    assert readers["subjects"] == [
        {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}
    ]


# --- runtimes -----------------------------------------------------------------------------------


def test_default_runtimes_are_the_projects(default: list[Obj]) -> None:
    project = {}
    for path in sorted((h.ROOT / "runtimes").glob("*.yaml")):
        runtime = yaml.safe_load(path.read_text())
        project[runtime["metadata"]["name"]] = runtime
    assert h.installed_runtimes(default) == sorted(project)
    for runtime in h.find(default, "ClusterTrainingRuntime"):
        name = runtime["metadata"]["name"]
        assert runtime["spec"] == project[name]["spec"], name
        labels = runtime["metadata"]["labels"]
        assert labels["trainer.kubeflow.org/webhook-validation"] == "disabled"
        assert project[name]["metadata"]["labels"].items() <= labels.items()


@pytest.mark.parametrize("key", sorted(RUNTIME_KEYS))
def test_each_runtime_can_be_turned_off(key: str) -> None:
    objects = h.render(runtime_toggle(key, False))
    name = RUNTIME_KEYS[key]
    assert h.installed_runtimes(objects) == sorted(set(RUNTIME_KEYS.values()) - {name})
    # Off, it is a post-upgrade hook deleted once applied: it removes the copy an earlier revision installed.
    (cleanup,) = [o for o in h.find(objects, "ClusterTrainingRuntime", name)]
    annotations = cleanup["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "post-upgrade"
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"


def test_runtime_hooks_apply_in_place_and_clean_up_on_uninstall(default: list[Obj]) -> None:
    for name in RUNTIME_KEYS.values():
        phases = {
            o["metadata"]["annotations"]["helm.sh/hook"]: o["metadata"]["annotations"][
                "helm.sh/hook-delete-policy"
            ]
            for o in h.find(default, "ClusterTrainingRuntime", name)
        }
        assert phases == {
            "post-install,post-upgrade": "hook-failed",  # applied in place: no moment without the runtime
            "pre-delete": "before-hook-creation,hook-succeeded",  # takes its place on uninstall, then goes
        }, name


def test_runtimes_default_enabled_and_off(rendered: dict[str, list[Obj]]) -> None:
    assert h.installed_runtimes(rendered["runtimes-off"]) == []
    assert h.installed_runtimes(rendered["runtimes-default-enabled"]) == sorted(RUNTIME_KEYS.values())
    # Unlike upstream's chart, every runtime is on by default: turning one on turns no other off.
    assert h.installed_runtimes(rendered["upstream-values"]) == sorted(RUNTIME_KEYS.values())


def test_runtime_images_can_be_replaced(rendered: dict[str, list[Obj]], default: list[Obj]) -> None:
    def images(objects: list[Obj], name: str) -> set[str]:
        runtime = next(
            o for o in h.find(objects, "ClusterTrainingRuntime", name) if "post-install" in h.hook_phase(o)
        )
        found = set()
        for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
            pod = rjob["template"]["spec"]["template"]["spec"]
            found |= {c["image"] for c in pod.get("containers", []) + pod.get("initContainers", [])}
        return found

    changed = rendered["runtime-images"]
    assert images(changed, "deepspeed-distributed") == {
        "mirror.example.com/kubeflow/trainer/deepspeed-runtime:v2.3.0"
    }
    tuned = images(changed, "torchtune-llama3.2-1b")
    assert "ghcr.io/kubeflow/trainer/torchtune-trainer:v2.3.0" in tuned
    assert tuned - {"ghcr.io/kubeflow/trainer/torchtune-trainer:v2.3.0"} == images(
        default, "torchtune-llama3.2-1b"
    ) - {"ghcr.io/kubeflow/trainer/torchtune-trainer"}  # the initializers' images are not the trainer's
    assert images(changed, "mlx-distributed") == images(default, "mlx-distributed")


# --- certificates -------------------------------------------------------------------------------


WEBHOOK_KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
CERTIFICATE_RBAC = "kubeflow-trainer-webhook-certificate"


def _config(objects: list[Obj]) -> Configuration:
    text = h.one(objects, "ConfigMap", "kubeflow-trainer-config")["data"]["config.yaml"]
    return Configuration.model_validate(yaml.safe_load(text))


def test_operator_certificate_is_the_default_and_renders_the_same_twice(
    default: list[Obj], rendered: dict[str, list[Obj]]
) -> None:
    # What `helm template` (and a GitOps tool) renders on every sync: nothing generated, nothing
    # looked up, so a second render is the first, byte for byte.
    assert h.render_files() == h.render_files()
    secret = h.one(default, "Secret", "kubeflow-trainer-webhook-cert")
    assert "data" not in secret and secret["type"] == "Opaque"  # filled and renewed by the operator
    for kind in WEBHOOK_KINDS:
        config = h.one(default, kind)
        assert all("caBundle" not in hook["clientConfig"] for hook in config["webhooks"])
        assert "annotations" not in config["metadata"]
    assert h.find(default, "Certificate") == [] and h.find(default, "Issuer") == []
    settings = _config(default).cert_management
    assert settings.enable
    assert (settings.ca_validity, settings.cert_validity, settings.check_interval) == (
        "87600h",
        "8760h",
        "10s",
    )
    tuned = _config(rendered["operator-certificate"]).cert_management
    assert (tuned.ca_validity, tuned.cert_validity, tuned.check_interval) == ("8760h", "720h", "30s")
    # RBAC for exactly that, by name: the Secret in the release namespace, the two configurations.
    role = h.one(default, "Role", CERTIFICATE_RBAC)
    assert role["metadata"]["namespace"] == h.NAMESPACE
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["kubeflow-trainer-webhook-cert"],
            "verbs": ["get", "update"],
        }
    ]
    cluster_role = h.one(default, "ClusterRole", CERTIFICATE_RBAC)
    assert cluster_role["rules"] == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": [plural],
            "resourceNames": [name],
            "verbs": ["get", "patch"],
        }
        for plural, name in (
            ("validatingwebhookconfigurations", "validator.trainer.kubeflow.org"),
            ("mutatingwebhookconfigurations", "defaulter.trainer.kubeflow.org"),
        )
    ]
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        binding = h.one(default, kind, CERTIFICATE_RBAC)
        assert binding["roleRef"]["name"] == CERTIFICATE_RBAC
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": "kubeflow-trainer-controller-manager",
                "namespace": h.NAMESPACE,
            }
        ]


def test_existing_secret_is_mounted_with_its_ca_bundle(rendered: dict[str, list[Obj]]) -> None:
    for toggle in ("existing-secret", "existing-secret-injected"):
        objects = rendered[toggle]
        assert h.find(objects, "Secret") == [], "the user's Secret is not the chart's"
        assert (
            h.find(objects, "Role", CERTIFICATE_RBAC)
            == []
            == h.find(objects, "ClusterRole", CERTIFICATE_RBAC)
        )
        assert not _config(objects).cert_management.enable
        pod = h.one(objects, "Deployment")["spec"]["template"]["spec"]
        volume = next(v for v in pod["volumes"] if v["name"] == "webhook-cert")
        assert volume["secret"]["secretName"] == "corp-webhook-tls"
    for kind in WEBHOOK_KINDS:
        given = h.one(rendered["existing-secret"], kind)
        assert {hook["clientConfig"]["caBundle"] for hook in given["webhooks"]} == {CA_BUNDLE}
        injected = h.one(rendered["existing-secret-injected"], kind)
        assert all("caBundle" not in hook["clientConfig"] for hook in injected["webhooks"])
        assert injected["metadata"]["annotations"] == {"service.beta.openshift.io/inject-cabundle": "true"}


def test_cert_manager_issues_the_certificate(rendered: dict[str, list[Obj]]) -> None:
    objects = rendered["cert-manager"]
    assert h.find(objects, "Secret") == []
    assert h.find(objects, "Role", CERTIFICATE_RBAC) == [] == h.find(objects, "ClusterRole", CERTIFICATE_RBAC)
    assert not _config(objects).cert_management.enable
    serving = h.one(objects, "Certificate", "kubeflow-trainer-webhook")
    assert serving["spec"]["secretName"] == "kubeflow-trainer-webhook-cert"
    assert f"kubeflow-trainer-controller-manager.{h.NAMESPACE}.svc" in serving["spec"]["dnsNames"]
    # Its own CA: self-signed Issuer -> CA Certificate -> CA Issuer -> serving Certificate.
    ca_issuer = h.one(objects, "Issuer", serving["spec"]["issuerRef"]["name"])
    ca_cert = h.one(objects, "Certificate", "kubeflow-trainer-webhook-ca")
    assert ca_issuer["spec"]["ca"]["secretName"] == ca_cert["spec"]["secretName"] and ca_cert["spec"]["isCA"]
    assert h.one(objects, "Issuer", ca_cert["spec"]["issuerRef"]["name"])["spec"] == {"selfSigned": {}}
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        config = h.one(objects, kind)
        assert (
            config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
            == f"{h.NAMESPACE}/kubeflow-trainer-webhook"
        )
        assert all("caBundle" not in hook["clientConfig"] for hook in config["webhooks"])
    issued = rendered["cert-manager-issuer"]
    assert h.find(issued, "Issuer") == []
    assert h.one(issued, "Certificate")["spec"]["issuerRef"] == {
        "group": "cert-manager.io",
        "kind": "ClusterIssuer",
        "name": "corp-ca",
    }


# --- the admission policy on the operator's own writes (docs/security.md, finding 1) ------------


def test_the_admission_policy_holds_the_operators_account_to_trainjob_children(default: list[Obj]) -> None:
    (policy,) = h.find(default, "ValidatingAdmissionPolicy")
    (binding,) = h.find(default, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert sorted(rule["resources"]) == ["configmaps", "secrets"]
    assert sorted(rule["operations"]) == ["CREATE", "UPDATE"]
    account = h.one(default, "ServiceAccount")["metadata"]
    user = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    assert [c["expression"] for c in spec["matchConditions"]] == [f"request.userInfo.username == '{user}'"]
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert f"object.metadata.name == '{h.RELEASE}-webhook-cert'" in variables["ownCertificate"]
    for name in ("controllers", "oldControllers"):
        assert "r.kind == 'TrainJob'" in variables[name]
        assert "r.controller" in variables[name], "a controller reference, not any owner"
    assert "oldObject" in variables["oldControllers"], "an update keeps the controller it had"
    assert "variables.oldControllers == variables.controllers" in variables["trainJobControlled"]
    assert "trainjob-name" not in str(spec), "not our label: upstream's children lack it"
    assert any(
        "object.type in ['kubernetes.io/ssh-auth', 'Opaque']" in v["expression"] for v in spec["validations"]
    )


def test_the_admission_policy_can_be_turned_off() -> None:
    off = h.render({"manager": {"admissionPolicy": {"enabled": False}}})
    assert not h.find(off, "ValidatingAdmissionPolicy") and not h.find(
        off, "ValidatingAdmissionPolicyBinding"
    )


# --- the Grafana dashboard (docs/security.md, finding 12) ---------------------------------------


def test_the_grafana_dashboard_reads_only_metrics_the_operator_exports() -> None:
    """Every series the dashboard queries is one the operator's registry holds (a renamed metric
    would leave an empty panel nobody notices), and the ConfigMap is what Grafana's sidecar loads."""
    from prometheus_client import generate_latest

    from trainer.controller.metrics import Metrics

    assert not h.find(h.render(), "ConfigMap", "kubeflow-trainer-grafana-dashboard"), "off by default"
    objects = h.render({"grafanaDashboard": {"enabled": True}})
    configmap = h.one(objects, "ConfigMap", "kubeflow-trainer-grafana-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(configmap["data"]["kubeflow-trainer.json"])
    assert dashboard == json.loads((h.CHART / "dashboards" / "kubeflow-trainer.json").read_text())

    metrics = Metrics()
    metrics.api_request("GET", "api", 200, 0.01)
    metrics.wq_depth.labels(controller="trainjob", name="trainjob").set(0)
    metrics.wq_queue_seconds.labels(controller="trainjob", name="trainjob").observe(0)
    metrics.wq_work_seconds.labels(controller="trainjob", name="trainjob").observe(0)
    metrics.wq_adds.labels(controller="trainjob", name="trainjob").inc()
    metrics.wq_retries.labels(controller="trainjob", name="trainjob").inc()
    metrics.cr_reconciles.labels(controller="trainjob", result="success").inc()
    metrics.cr_time.labels(controller="trainjob").observe(0.1)
    metrics.leader.labels(name="trainer.kubeflow.org").set(1)
    exported = {
        line.split("{")[0].split(" ")[0]
        for line in generate_latest(metrics.registry).decode().splitlines()
        if line and not line.startswith("#")
    }
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(
            r"\b([a-z_]+(?:_total|_bucket|_bytes|_fds|_status|_depth|_seconds))\b", target["expr"]
        )
    }
    assert len(dashboard["panels"]) >= 10 and queried
    assert queried <= exported, f"queried but never exported: {sorted(queried - exported)}"


def operator_config(objects: list[Obj]) -> Configuration:
    """The Configuration the operator reads from this render (refusing unknown fields)."""
    text = h.one(objects, "ConfigMap", "kubeflow-trainer-config")["data"]["config.yaml"]
    return Configuration.model_validate(yaml.safe_load(text))
