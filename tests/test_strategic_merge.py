"""Tests for trainer.apimachinery.strategic_merge.

What it must do: docs/upstream-behaviour.md §runtime-patches and §strategic-merge.
"""

from __future__ import annotations

import copy
import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from trainer.apimachinery.strategic_merge import (
    MergeKeys,
    jobset_merge_keys,
    merge_keys_from_openapi,
    strategic_merge,
)

POD_SPEC = ("replicatedJobs", "template", "spec", "template", "spec")


def _jobset(*jobs: dict[str, Any]) -> dict[str, Any]:
    return {"replicatedJobs": list(jobs)}


def _job(name: str, pod_spec: dict[str, Any], **job_template: Any) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": {"template": {"spec": pod_spec}}}
    template.update(job_template)
    return {"name": name, "template": template}


def _pod_spec(result: dict[str, Any], job: str = "node") -> dict[str, Any]:
    for replicated_job in result["replicatedJobs"]:
        if replicated_job["name"] == job:
            spec: dict[str, Any] = replicated_job["template"]["spec"]["template"]["spec"]
            return spec
    raise AssertionError(f"no replicated job {job}")


def _names(items: list[dict[str, Any]]) -> list[str]:
    return [item["name"] for item in items]


# -------------------------------------------------------------------------------- spec examples


def test_spec_env_order_example() -> None:
    original = _jobset(
        _job(
            "node",
            {
                "containers": [
                    {
                        "name": "node",
                        "image": "pytorch",
                        "env": [
                            {"name": "INIT_ENV", "value": "1"},
                            {"name": "DATASET_PATH", "value": "/data"},
                        ],
                    }
                ]
            },
        )
    )
    patch = _jobset(
        _job(
            "node",
            {
                "containers": [
                    {
                        "name": "node",
                        "env": [{"name": "INIT_ENV", "value": "2"}, {"name": "NEW_VALUE", "value": "x"}],
                    }
                ]
            },
        )
    )
    result = strategic_merge(original, patch, jobset_merge_keys)
    container = _pod_spec(result)["containers"][0]
    assert container["env"] == [
        {"name": "INIT_ENV", "value": "2"},
        {"name": "NEW_VALUE", "value": "x"},
        {"name": "DATASET_PATH", "value": "/data"},
    ]
    assert container["image"] == "pytorch"


def test_pod_template_merges_by_key() -> None:
    original = _jobset(
        _job(
            "node",
            {
                "serviceAccountName": "runtime-sa",
                "nodeSelector": {"zone": "a", "disk": "ssd"},
                "tolerations": [{"key": "gpu", "operator": "Exists"}, {"key": "spot", "operator": "Exists"}],
                "volumes": [{"name": "data", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}],
                "initContainers": [{"name": "setup", "image": "busybox", "command": ["sh", "-c", "true"]}],
                "containers": [
                    {
                        "name": "node",
                        "image": "trainer",
                        "command": ["torchrun", "train.py"],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        "securityContext": {"runAsUser": 1000, "capabilities": {"add": ["NET_ADMIN"]}},
                    },
                    {"name": "sidecar", "image": "logger"},
                ],
                "imagePullSecrets": [{"name": "registry-a"}],
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]},
                                {"matchExpressions": [{"key": "b", "operator": "In", "values": ["2"]}]},
                            ]
                        }
                    }
                },
            },
        )
    )
    patch = _jobset(
        _job(
            "node",
            {
                "serviceAccountName": "user-sa",
                "nodeSelector": {"disk": "nvme", "pool": "training"},
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml"}],
                "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "cache"}}],
                "initContainers": [{"name": "fetch", "image": "curl"}],
                "containers": [
                    {
                        "name": "node",
                        "volumeMounts": [{"name": "cache", "mountPath": "/data", "readOnly": True}],
                        "securityContext": {"runAsUser": 2000},
                        "command": ["python", "main.py"],
                    }
                ],
                "imagePullSecrets": [{"name": "registry-b"}],
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "c", "operator": "In", "values": ["3"]}]}
                            ]
                        }
                    }
                },
            },
        )
    )
    spec = _pod_spec(strategic_merge(original, patch, jobset_merge_keys))

    assert spec["serviceAccountName"] == "user-sa"
    assert spec["nodeSelector"] == {"zone": "a", "disk": "nvme", "pool": "training"}
    # tolerations and nodeSelectorTerms are atomic: replaced wholesale.
    assert spec["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "ml"}]
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "c", "operator": "In", "values": ["3"]}]}]
    }
    # volumes by name: the patched item merges (both sources remain: $retainKeys is what drops them).
    assert spec["volumes"] == [
        {"name": "data", "emptyDir": {}},
        {"name": "cache", "emptyDir": {}, "persistentVolumeClaim": {"claimName": "cache"}},
    ]
    # A new init container comes before the original-only one (upstream mergeSortedSlice).
    assert _names(spec["initContainers"]) == ["fetch", "setup"]
    assert spec["imagePullSecrets"] == [{"name": "registry-b"}, {"name": "registry-a"}]

    node, sidecar = spec["containers"]
    assert sidecar == {"name": "sidecar", "image": "logger"}
    assert node["image"] == "trainer"
    assert node["command"] == ["python", "main.py"]  # command is atomic
    # volumeMounts merge by mountPath.
    assert node["volumeMounts"] == [{"name": "cache", "mountPath": "/data", "readOnly": True}]
    assert node["securityContext"] == {"runAsUser": 2000, "capabilities": {"add": ["NET_ADMIN"]}}


def test_ports_merge_by_container_port() -> None:
    original = _jobset(
        _job("node", {"containers": [{"name": "node", "ports": [{"containerPort": 29500, "name": "a"}]}]})
    )
    patch = _jobset(
        _job(
            "node",
            {
                "containers": [
                    {
                        "name": "node",
                        "ports": [{"containerPort": 29500, "protocol": "TCP"}, {"containerPort": 8080}],
                    }
                ]
            },
        )
    )
    ports = _pod_spec(strategic_merge(original, patch, jobset_merge_keys))["containers"][0]["ports"]
    assert ports == [{"containerPort": 29500, "name": "a", "protocol": "TCP"}, {"containerPort": 8080}]


def test_labels_and_annotations_merge_per_key() -> None:
    original = _jobset(
        _job(
            "node",
            {"containers": [{"name": "node"}]},
            metadata={"labels": {"a": "1", "b": "2"}, "annotations": {"x": "1"}},
        )
    )
    patch = _jobset(_job("node", {}, metadata={"labels": {"b": "3", "c": "4"}, "annotations": {"x": None}}))
    job_template = strategic_merge(original, patch, jobset_merge_keys)["replicatedJobs"][0]["template"]
    assert job_template["metadata"] == {"labels": {"a": "1", "b": "3", "c": "4"}, "annotations": {}}


def test_null_deletes_keys() -> None:
    original = {"a": 1, "b": {"c": 2, "d": 3}, "e": [1, 2]}
    result = strategic_merge(
        original, {"a": None, "b": {"c": None}, "e": None, "missing": None}, jobset_merge_keys
    )
    assert result == {"b": {"d": 3}}


def test_scalars_and_type_changes_replace() -> None:
    original = {"a": 1, "b": {"c": 2}, "d": [1], "e": "x"}
    result = strategic_merge(
        original, {"a": "one", "b": [1], "d": {"k": "v"}, "e": {"f": None, "g": 1}}, jobset_merge_keys
    )
    # Values introduced by the patch are cleaned: nulls inside them are dropped.
    assert result == {"a": "one", "b": [1], "d": {"k": "v"}, "e": {"g": 1}}


# ------------------------------------------------------------------------------ replicatedJobs


def test_replicated_jobs_merge_by_name_and_keep_other_jobs() -> None:
    original = _jobset(
        _job("dataset-initializer", {"containers": [{"name": "dataset-initializer", "image": "init"}]}),
        _job("node", {"containers": [{"name": "node", "image": "trainer"}]}, metadata={"labels": {"a": "b"}}),
    )
    patch = _jobset(_job("node", {"nodeSelector": {"gpu": "a100"}}))
    result = strategic_merge(original, patch, jobset_merge_keys)
    assert _names(result["replicatedJobs"]) == ["dataset-initializer", "node"]
    assert result["replicatedJobs"][0] == original["replicatedJobs"][0]
    node = result["replicatedJobs"][1]
    assert node["template"]["metadata"] == {"labels": {"a": "b"}}
    assert node["template"]["spec"]["template"]["spec"] == {
        "containers": [{"name": "node", "image": "trainer"}],
        "nodeSelector": {"gpu": "a100"},
    }


def test_patch_naming_a_new_replicated_job_adds_it() -> None:
    original = _jobset(
        _job("launcher", {"containers": [{"name": "l"}]}), _job("node", {"containers": [{"name": "n"}]})
    )
    new_job = _job("extra", {"containers": [{"name": "e", "image": "x"}]})

    result = strategic_merge(original, _jobset(new_job), jobset_merge_keys)
    # Upstream order rule: a patch item that the original does not have is not preceded by any
    # original-only item, so it comes first (callers re-sort replicatedJobs afterwards,
    # docs/upstream-behaviour.md §runtime-patches).
    assert _names(result["replicatedJobs"]) == ["extra", "launcher", "node"]
    assert result["replicatedJobs"][0] == new_job

    # When the patch also names the last original job, the new one lands after it.
    result = strategic_merge(original, _jobset(_job("node", {}), new_job), jobset_merge_keys)
    assert _names(result["replicatedJobs"]) == ["launcher", "node", "extra"]


def test_patch_item_without_merge_key_is_an_error() -> None:
    with pytest.raises(ValueError, match="merge key 'name'"):
        strategic_merge(_jobset(), {"replicatedJobs": [{"template": {}}]}, jobset_merge_keys)
    with pytest.raises(ValueError, match="must be objects"):
        strategic_merge(_jobset(), {"replicatedJobs": ["node"]}, jobset_merge_keys)


# ---------------------------------------------------------------------------------------- order


@pytest.mark.parametrize(
    ("original", "patch", "expected"),
    [
        (["A", "B"], ["A", "N"], ["A", "N", "B"]),
        (["A", "B"], ["C", "B"], ["C", "A", "B"]),
        (["A", "B", "C"], ["C", "D", "B"], ["A", "C", "D", "B"]),
        (["B", "A"], ["B", "D"], ["B", "D", "A"]),
        (["A", "B", "C", "D"], ["D", "B"], ["A", "C", "D", "B"]),
        (["A", "B"], ["B", "A"], ["B", "A"]),
        (["A", "B"], [], ["A", "B"]),
        ([], ["A", "B"], ["A", "B"]),
    ],
)
def test_keyed_list_order(original: list[str], patch: list[str], expected: list[str]) -> None:
    spec = {"containers": [{"name": name, "from": "original"} for name in original]}
    patch_spec = {"containers": [{"name": name} for name in patch]}
    result = strategic_merge(
        _jobset(_job("node", spec)), _jobset(_job("node", patch_spec)), jobset_merge_keys
    )
    assert _names(_pod_spec(result)["containers"]) == expected


# ----------------------------------------------------------------------------------- directives


def test_patch_delete_removes_keyed_items() -> None:
    original = _jobset(
        _job(
            "node",
            {
                "containers": [
                    {"name": "node", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
                    {"name": "sidecar"},
                ]
            },
        )
    )
    patch = _jobset(
        _job(
            "node",
            {
                "containers": [
                    {"name": "node", "env": [{"name": "A", "$patch": "delete"}, {"name": "C", "value": "3"}]},
                    {"name": "sidecar", "$patch": "delete"},
                ]
            },
        )
    )
    spec = _pod_spec(strategic_merge(original, patch, jobset_merge_keys))
    assert spec["containers"] == [
        {"name": "node", "env": [{"name": "C", "value": "3"}, {"name": "B", "value": "2"}]}
    ]


def test_patch_delete_removes_a_map() -> None:
    original = {"spec": {"affinity": {"nodeAffinity": {}}, "keep": 1}}
    result = strategic_merge(original, {"spec": {"affinity": {"$patch": "delete"}}}, jobset_merge_keys)
    assert result == {"spec": {"keep": 1}}
    assert strategic_merge(original, {"$patch": "delete"}, jobset_merge_keys) == {}
    # Deleting something the original does not have is a no-op.
    assert strategic_merge(original, {"other": {"$patch": "delete"}}, jobset_merge_keys) == original


def test_patch_replace_map_and_list() -> None:
    original = _jobset(
        _job(
            "node",
            {
                "nodeSelector": {"a": "1", "b": "2"},
                "containers": [{"name": "node", "image": "x"}, {"name": "sidecar"}],
            },
        )
    )
    patch = _jobset(
        _job(
            "node",
            {
                "nodeSelector": {"$patch": "replace", "c": "3"},
                "containers": [{"$patch": "replace"}, {"name": "only", "image": "y"}],
            },
        )
    )
    spec = _pod_spec(strategic_merge(original, patch, jobset_merge_keys))
    assert spec["nodeSelector"] == {"c": "3"}
    assert spec["containers"] == [{"name": "only", "image": "y"}]
    assert strategic_merge({"a": 1, "b": 2}, {"$patch": "replace", "c": 3}, jobset_merge_keys) == {"c": 3}


def test_unknown_patch_directive_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown \\$patch directive 'bogus'"):
        strategic_merge({"a": {}}, {"a": {"$patch": "bogus"}}, jobset_merge_keys)
    with pytest.raises(ValueError, match="merging lists cannot yet be specified"):
        strategic_merge(_jobset(), {"replicatedJobs": [{"$patch": "merge"}]}, jobset_merge_keys)
    with pytest.raises(ValueError, match="no merge key"):
        strategic_merge(_jobset(), {"replicatedJobs": [{"$patch": "delete"}]}, jobset_merge_keys)


def test_directives_never_reach_the_output() -> None:
    patch = _jobset(
        _job(
            "new",
            {
                "containers": [
                    {"name": "a", "env": [{"name": "X", "value": None}]},
                    {"name": "b", "$patch": "delete"},
                ],
                "affinity": {"$patch": "replace", "podAffinity": {}},
                "tolerations": [{"$patch": "replace"}, {"key": "k"}],
            },
        )
    )
    result = strategic_merge(_jobset(), patch, jobset_merge_keys)
    assert "$patch" not in json.dumps(result)
    assert _pod_spec(result, "new") == {
        "containers": [{"name": "a", "env": [{"name": "X"}]}],
        "affinity": {"podAffinity": {}},
        "tolerations": [{"key": "k"}],
    }


def test_retain_keys() -> None:
    original = {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}
    patch = {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}
    assert strategic_merge(original, patch, jobset_merge_keys) == {"strategy": {"type": "Recreate"}}


def test_set_element_order() -> None:
    original = _jobset(
        _job("node", {"containers": [{"name": "a", "image": "1"}, {"name": "b"}, {"name": "server-added"}]})
    )
    patch = _jobset(
        _job(
            "node",
            {
                "$setElementOrder/containers": [{"name": "c"}, {"name": "b"}, {"name": "a"}],
                "containers": [{"name": "a", "image": "2"}, {"name": "c"}],
            },
        )
    )
    spec = _pod_spec(strategic_merge(original, patch, jobset_merge_keys))
    # The directive's order wins; the server-only item keeps its place relative to the original.
    assert spec["containers"] == [
        {"name": "c"},
        {"name": "b"},
        {"name": "a", "image": "2"},
        {"name": "server-added"},
    ]
    assert not any(key.startswith("$") for key in spec)


def test_set_element_order_with_delete_and_without_list() -> None:
    original = _jobset(_job("node", {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}))
    patch = _jobset(
        _job(
            "node",
            {
                "$setElementOrder/containers": [{"name": "c"}, {"name": "a"}],
                "containers": [{"name": "b", "$patch": "delete"}],
            },
        )
    )
    assert _names(_pod_spec(strategic_merge(original, patch, jobset_merge_keys))["containers"]) == ["c", "a"]
    # An order-only patch (no list) reorders.
    patch = _jobset(
        _job("node", {"$setElementOrder/containers": [{"name": "c"}, {"name": "b"}, {"name": "a"}]})
    )
    assert _names(_pod_spec(strategic_merge(original, patch, jobset_merge_keys))["containers"]) == [
        "c",
        "b",
        "a",
    ]


def test_scalar_set_merge_and_delete_from_primitive_list() -> None:
    meta_path = ("replicatedJobs", "template", "spec", "template", "metadata", "finalizers")
    assert jobset_merge_keys(meta_path) == ("merge", None)
    original = _jobset(
        {"name": "node", "template": {"spec": {"template": {"metadata": {"finalizers": ["a", "b"]}}}}}
    )
    patch = _jobset(
        {
            "name": "node",
            "template": {
                "spec": {
                    "template": {
                        "metadata": {"finalizers": ["c", "a"], "$deleteFromPrimitiveList/finalizers": ["b"]}
                    }
                }
            },
        }
    )
    result = strategic_merge(original, patch, jobset_merge_keys)
    assert result["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"] == {
        "finalizers": ["c", "a"]
    }


# --------------------------------------------------------------------------------------- purity


def test_inputs_are_not_mutated_and_outputs_are_fresh() -> None:
    original = _jobset(
        _job(
            "node",
            {"containers": [{"name": "node", "env": [{"name": "A", "value": "1"}]}], "tolerations": []},
        ),
        _job("other", {"containers": [{"name": "other"}]}),
    )
    patch = _jobset(
        _job(
            "node",
            {
                "containers": [{"name": "node", "env": [{"name": "B", "value": "2"}]}],
                "tolerations": [{"key": "k"}],
                "volumes": [{"name": "v", "emptyDir": {}}],
            },
        )
    )
    original_snapshot = copy.deepcopy(original)
    patch_snapshot = copy.deepcopy(patch)
    result = strategic_merge(original, patch, jobset_merge_keys)
    assert original == original_snapshot
    assert patch == patch_snapshot

    # Mutating the result touches neither input, including parts the patch did not change.
    _pod_spec(result, "other")["containers"][0]["image"] = "changed"
    _pod_spec(result)["volumes"][0]["emptyDir"]["medium"] = "Memory"
    _pod_spec(result)["tolerations"].append({"key": "x"})
    assert original == original_snapshot
    assert patch == patch_snapshot


def test_path_argument_roots_the_patch() -> None:
    # Patching a JobSet object (path ("spec", ...)) uses the same table.
    original = {"spec": _jobset(_job("node", {"containers": [{"name": "a"}, {"name": "b"}]}))}
    patch = {"spec": _jobset(_job("node", {"containers": [{"name": "b", "image": "x"}]}))}
    result = strategic_merge(original, patch, jobset_merge_keys)
    assert _pod_spec(result["spec"])["containers"] == [{"name": "a"}, {"name": "b", "image": "x"}]
    # A sub-document patched on its own, with its path given.
    sub = strategic_merge(
        {"containers": [{"name": "a"}, {"name": "b"}]},
        {"containers": [{"name": "b", "image": "x"}]},
        jobset_merge_keys,
        path=POD_SPEC,
    )
    assert sub == {"containers": [{"name": "a"}, {"name": "b", "image": "x"}]}


# ------------------------------------------------------------------------------------ the table


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (("replicatedJobs",), ("merge", "name")),
        (("spec", "replicatedJobs"), ("merge", "name")),
        (("spec", "template", "spec", "replicatedJobs"), ("merge", "name")),
        ((*POD_SPEC, "containers"), ("merge", "name")),
        (("spec", *POD_SPEC, "containers"), ("merge", "name")),
        ((*POD_SPEC, "initContainers"), ("merge", "name")),
        ((*POD_SPEC, "volumes"), ("merge", "name")),
        ((*POD_SPEC, "imagePullSecrets"), ("merge", "name")),
        ((*POD_SPEC, "schedulingGates"), ("merge", "name")),
        ((*POD_SPEC, "hostAliases"), ("merge", "ip")),
        ((*POD_SPEC, "topologySpreadConstraints"), ("merge", "topologyKey")),
        ((*POD_SPEC, "containers", "env"), ("merge", "name")),
        ((*POD_SPEC, "initContainers", "env"), ("merge", "name")),
        ((*POD_SPEC, "containers", "ports"), ("merge", "containerPort")),
        ((*POD_SPEC, "containers", "volumeMounts"), ("merge", "mountPath")),
        ((*POD_SPEC, "containers", "volumeDevices"), ("merge", "devicePath")),
        ((*POD_SPEC, "containers", "resources", "claims"), ("merge", "name")),
        ((*POD_SPEC, "tolerations"), None),
        ((*POD_SPEC, "containers", "command"), None),
        ((*POD_SPEC, "containers", "args"), None),
        ((*POD_SPEC, "containers", "envFrom"), None),
        (
            (
                *POD_SPEC,
                "affinity",
                "nodeAffinity",
                "requiredDuringSchedulingIgnoredDuringExecution",
                "nodeSelectorTerms",
            ),
            None,
        ),
        (("volumeClaimPolicies",), None),
        (("replicatedJobs", "dependsOn"), None),
        (("successPolicy", "targetReplicatedJobs"), None),
        (("containers",), None),
    ],
)
def test_jobset_merge_keys(path: tuple[str, ...], expected: tuple[str, str | None] | None) -> None:
    assert jobset_merge_keys(path) == expected


# ------------------------------------------------------------------------------------- OpenAPI


def _definitions() -> dict[str, Any]:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    base = pathlib.Path(kubernetes_validate.__file__).parent
    path = base / "kubernetes-json-schema" / "v1.32.0-local-strict" / "_definitions.json"
    if not path.exists():
        pytest.skip(f"{path} not shipped by this kubernetes_validate")
    document: dict[str, Any] = json.loads(path.read_text())
    return document


@pytest.fixture(scope="module")
def definitions() -> dict[str, Any]:
    return _definitions()


@pytest.fixture(scope="module")
def pod_keys(definitions: dict[str, Any]) -> MergeKeys:
    return merge_keys_from_openapi(definitions, "#/$defs/io.k8s.api.core.v1.Pod")


@pytest.fixture(scope="module")
def deployment_keys(definitions: dict[str, Any]) -> MergeKeys:
    return merge_keys_from_openapi(definitions["$defs"], "#/definitions/io.k8s.api.apps.v1.Deployment")


def test_openapi_resolver_reads_patch_extensions(pod_keys: MergeKeys, deployment_keys: MergeKeys) -> None:
    assert pod_keys(("spec", "containers")) == ("merge", "name")
    assert pod_keys(("spec", "containers", "ports")) == ("merge", "containerPort")
    assert pod_keys(("spec", "containers", "volumeMounts")) == ("merge", "mountPath")
    assert pod_keys(("spec", "containers", "env")) == ("merge", "name")
    assert pod_keys(("spec", "volumes")) == ("merge", "name")  # "merge,retainKeys"
    assert pod_keys(("spec", "hostAliases")) == ("merge", "ip")
    assert pod_keys(("metadata", "finalizers")) == ("merge", None)
    assert pod_keys(("metadata", "ownerReferences")) == ("merge", "uid")
    assert pod_keys(("spec", "tolerations")) is None
    assert pod_keys(("spec", "containers", "command")) is None
    assert pod_keys(("spec", "containers", "resources", "claims")) is None  # listType=map, no patch tags
    assert pod_keys(("spec", "nosuchfield")) is None
    assert pod_keys(()) is None
    assert deployment_keys(("spec", "template", "spec", "containers")) == ("merge", "name")
    assert deployment_keys(("spec", "template", "spec", "containers", "volumeMounts")) == (
        "merge",
        "mountPath",
    )
    assert deployment_keys(("spec", "template", "spec", "tolerations")) is None
    # Maps reached through additionalProperties do not break the walk.
    assert deployment_keys(("metadata", "labels", "app")) is None


def test_openapi_resolver_unknown_root(definitions: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="unknown OpenAPI definition"):
        merge_keys_from_openapi(definitions, "#/definitions/io.k8s.api.core.v1.Nope")


def test_strategic_merge_on_a_deployment(deployment_keys: MergeKeys) -> None:
    original = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web"}, "finalizers": ["a"]},
        "spec": {
            "replicas": 1,
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "web",
                            "image": "nginx:1",
                            "ports": [{"containerPort": 80, "name": "http"}],
                            "volumeMounts": [{"name": "conf", "mountPath": "/etc/nginx"}],
                        },
                        {"name": "sidecar", "image": "envoy"},
                    ],
                    "tolerations": [{"key": "a", "operator": "Exists"}],
                }
            },
        },
    }
    patch = {
        "metadata": {"labels": {"tier": "front"}, "finalizers": ["b"]},
        "spec": {
            "replicas": 3,
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "web",
                            "image": "nginx:2",
                            "ports": [{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 443}],
                            "volumeMounts": [{"name": "conf2", "mountPath": "/etc/nginx", "readOnly": True}],
                        }
                    ],
                    "tolerations": [{"key": "b", "operator": "Exists"}],
                }
            },
        },
    }
    result = strategic_merge(original, patch, deployment_keys)
    # A scalar set merges as a union; the new item comes first, by the same order rule as keyed lists.
    assert result["metadata"] == {
        "name": "web",
        "labels": {"app": "web", "tier": "front"},
        "finalizers": ["b", "a"],
    }
    assert result["spec"]["replicas"] == 3
    pod = result["spec"]["template"]["spec"]
    assert pod["tolerations"] == [{"key": "b", "operator": "Exists"}]
    web, sidecar = pod["containers"]
    assert sidecar == {"name": "sidecar", "image": "envoy"}
    assert web["image"] == "nginx:2"
    assert web["ports"] == [{"containerPort": 80, "name": "http", "protocol": "TCP"}, {"containerPort": 443}]
    assert web["volumeMounts"] == [{"name": "conf2", "mountPath": "/etc/nginx", "readOnly": True}]


def test_strategic_merge_on_a_pod_with_directives(pod_keys: MergeKeys) -> None:
    original = {
        "metadata": {"name": "p", "finalizers": ["x", "y"]},
        "spec": {
            "containers": [
                {"name": "a", "env": [{"name": "E1", "value": "1"}, {"name": "E2", "value": "2"}]},
                {"name": "b"},
            ],
            "volumes": [{"name": "v", "emptyDir": {}}],
        },
    }
    patch = {
        "metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]},
        "spec": {
            "$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
            "containers": [{"name": "a", "env": [{"name": "E1", "$patch": "delete"}]}],
            "volumes": [{"name": "v", "$retainKeys": ["name", "configMap"], "configMap": {"name": "cm"}}],
        },
    }
    result = strategic_merge(original, patch, pod_keys)
    assert result["metadata"] == {"name": "p", "finalizers": ["y"]}
    assert result["spec"]["containers"] == [
        {"name": "b"},
        {"name": "a", "env": [{"name": "E2", "value": "2"}]},
    ]
    assert result["spec"]["volumes"] == [{"name": "v", "configMap": {"name": "cm"}}]


# -------------------------------------------------------------------------------- import weight


def test_module_is_light() -> None:
    # The `trainer render` CLI imports this module on its cold-start path.
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import trainer.apimachinery.strategic_merge\n"
        "names = ('pydantic', 'kubernetes', 'yaml', 'kubernetes_validate')\n"
        "print(','.join(m for m in names if m in set(sys.modules) - before))"
    )
    output = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert output.strip() == ""
