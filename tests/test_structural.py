"""Structural-schema pruning, defaulting and validation, checked against the upstream CRDs.

Expected messages are kube-apiserver 1.32's for the same objects: the OpenAPI checks of
kube-openapi as apiextensions-apiserver reports them, list-type uniqueness, and the CRDs' CEL
rules with transition rules on update.
"""

from __future__ import annotations

import ast
import copy
import functools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from reference_data import needs_reference, params, reference_dir

from trainer.apimachinery import schema_validation
from trainer.apimachinery.defaulting import apply_defaults, drop_non_nullable_nulls
from trainer.apimachinery.errors import FieldError
from trainer.apimachinery.object_meta import validate_object_meta
from trainer.apimachinery.pruning import prune, unknown_fields
from trainer.apimachinery.schema_validation import validate

REFERENCE = reference_dir()
# Every test here reads upstream's CRDs (tests/reference_data.py says where they are).
pytestmark = needs_reference("crds")

NOT_CHECKED = (
    '<nil>: Invalid value: "null": some validation rules were not checked because the object was invalid; '
    "correct the existing errors to complete validation"
)

Obj = dict[str, Any]


@functools.cache
def _crd_schema(relative: str) -> Obj:
    crd = yaml.safe_load((REFERENCE / "crds" / relative).read_text())
    schema: Obj = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def trainjob_schema() -> Obj:
    return _crd_schema("trainer/trainer.kubeflow.org_trainjobs.yaml")


def runtime_schema() -> Obj:
    return _crd_schema("trainer/trainer.kubeflow.org_trainingruntimes.yaml")


def cluster_runtime_schema() -> Obj:
    return _crd_schema("trainer/trainer.kubeflow.org_clustertrainingruntimes.yaml")


def jobset_schema() -> Obj:
    return _crd_schema("jobset/jobset.x-k8s.io_jobsets.yaml")


def messages(errors: list[FieldError]) -> list[str]:
    return [str(error) for error in errors]


def check(schema: Obj, obj: Any, old: Any = None) -> list[str]:
    """Validate a copy (validation must not change the object) and return the messages."""
    before = copy.deepcopy(obj)
    result = messages(validate(schema, obj, old))
    assert obj == before
    return result


def trainjob(**spec: Any) -> Obj:
    body: Obj = {"runtimeRef": {"name": "torch-distributed"}}
    body.update(spec)
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "job", "namespace": "default"},
        "spec": body,
    }


def runtime(**spec: Any) -> Obj:
    body: Obj = {"template": {"spec": {"replicatedJobs": [{"name": "node", "template": {}}]}}}
    body.update(spec)
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime",
        "metadata": {"name": "rt", "namespace": "default"},
        "spec": body,
    }


def patched_trainjob(grace: int, node_selector: str = "a") -> Obj:
    pod_spec = {"terminationGracePeriodSeconds": grace, "nodeSelector": {"pool": node_selector}}
    rjob = {"name": "node", "template": {"spec": {"template": {"spec": pod_spec}}}}
    patch = {
        "manager": "kueue.x-k8s.io/multikueue",
        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [rjob]}}},
    }
    return trainjob(runtimePatches=[{"manager": "acme.io/other"}, patch])


# ---------------------------------------------------------------------------------------------
# OpenAPI checks
# ---------------------------------------------------------------------------------------------


class TestTypes:
    def test_wrong_type_names_the_actual_type(self) -> None:
        obj = trainjob(trainer={"numNodes": "two"})
        assert check(trainjob_schema(), obj)[0] == (
            'spec.trainer.numNodes: Invalid value: "string": '
            'spec.trainer.numNodes in body must be of type integer: "string"'
        )

    @pytest.mark.parametrize(
        ("field", "value", "actual", "expected"),
        [
            ("suspend", "yes", "string", "boolean"),
            ("activeDeadlineSeconds", 1.5, "number", "integer"),
            ("runtimeRef", ["torch"], "array", "object"),
            ("runtimePatches", {"manager": "x"}, "object", "array"),
            ("managedBy", True, "boolean", "string"),
        ],
    )
    def test_each_json_type(self, field: str, value: Any, actual: str, expected: str) -> None:
        obj = trainjob(**{field: value})
        assert check(trainjob_schema(), obj)[0] == (
            f'spec.{field}: Invalid value: "{actual}": spec.{field} in body must be of type {expected}: "{actual}"'
        )

    def test_integral_float_is_an_integer(self) -> None:
        assert check(trainjob_schema(), trainjob(trainer={"numNodes": 2.0})) == []

    def test_integer_is_a_number(self) -> None:
        schema = {"type": "object", "properties": {"ratio": {"type": "number", "minimum": 0.5}}}
        assert check(schema, {"ratio": 1}) == []
        assert check(schema, {"ratio": 0.25}) == [
            "ratio: Invalid value: 0.25: ratio in body should be greater than or equal to 0.5"
        ]

    def test_null_needs_nullable(self) -> None:
        schema = {
            "type": "object",
            "properties": {"plain": {"type": "string"}, "optional": {"type": "string", "nullable": True}},
        }
        assert check(schema, {"plain": None, "optional": None}) == [
            'plain: Invalid value: "null": plain in body must be of type string: "null"'
        ]

    def test_int_or_string(self) -> None:
        ok = trainjob(trainer={"resourcesPerNode": {"limits": {"cpu": 2, "memory": "1Gi"}}})
        assert check(trainjob_schema(), ok) == []
        bad = trainjob(trainer={"resourcesPerNode": {"limits": {"cpu": True}}})
        path = "spec.trainer.resourcesPerNode.limits.cpu"
        assert check(trainjob_schema(), bad) == [
            f'{path}: Invalid value: "boolean": {path} in body must be of type integer,string: "boolean"',
            f'<nil>: Invalid value: "": "{path}" must validate at least one schema (anyOf)',
            f'{path}: Invalid value: "boolean": {path} in body must be of type integer: "boolean"',
            NOT_CHECKED,
        ]

    def test_datetime_from_a_yaml_loader_counts_as_its_text(self) -> None:
        obj = yaml.safe_load("time: 2024-05-01T10:00:00Z")
        schema = {"type": "object", "properties": {"time": {"type": "string", "format": "date-time"}}}
        assert check(schema, obj) == []


class TestRequired:
    def test_missing_field(self) -> None:
        obj = trainjob()
        obj["spec"]["runtimeRef"] = {}
        assert check(trainjob_schema(), obj) == ["spec.runtimeRef.name: Required value", NOT_CHECKED]

    def test_missing_object(self) -> None:
        obj = trainjob()
        del obj["spec"]["runtimeRef"]
        assert check(trainjob_schema(), obj) == ["spec.runtimeRef: Required value", NOT_CHECKED]

    def test_not_checked_only_where_the_server_has_a_cel_validator(self) -> None:
        """kube-apiserver says the rules were not checked only when it has a CEL validator, and it
        makes one only for rules on a node, its properties, items or additionalProperties: rules
        inside allOf branches alone get none, so nothing runs and nothing is said."""
        rule = {"x-kubernetes-validations": [{"rule": "self.a != 'x'", "message": "not x"}]}
        props = {"a": {"type": "string"}, "b": {"type": "string"}}
        only_all_of: dict[str, Any] = {
            "type": "object",
            "required": ["b"],
            "properties": props,
            "allOf": [rule],
        }
        assert check(only_all_of, {"a": "x"}) == ["b: Required value"]
        assert check(only_all_of, {"a": "x", "b": "y"}) == []
        b_rule = {"x-kubernetes-validations": [{"rule": "self != 'z'", "message": "not z"}]}
        with_own_rule = {**only_all_of, "properties": {**props, "b": {"type": "string", **b_rule}}}
        assert check(with_own_rule, {"a": "x"}) == ["b: Required value", NOT_CHECKED]
        assert check(with_own_rule, {"a": "x", "b": "y"}) == ['<nil>: Invalid value: "object": not x']

    def test_required_at_the_root_and_in_map_values(self) -> None:
        schema = {
            "type": "object",
            "required": ["spec"],
            "properties": {
                "spec": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {"name": {}},
                    },
                }
            },
        }
        assert check(schema, {}) == ["spec: Required value"]
        # The OpenAPI validator names a map entry with a dot, as kube-openapi does.
        assert check(schema, {"spec": {"first": {}}}) == ["spec.first.name: Required value"]


class TestEnum:
    @pytest.mark.parametrize("value", ["Intel", "MPICH", "invalid"])
    def test_unsupported_value(self, value: str) -> None:
        obj = runtime(mlPolicy={"mpi": {"mpiImplementation": value}})
        assert check(runtime_schema(), obj) == [
            f'spec.mlPolicy.mpi.mpiImplementation: Unsupported value: "{value}": supported values: "OpenMPI", ""',
            NOT_CHECKED,
        ]

    @pytest.mark.parametrize("value", ["OpenMPI", ""])
    def test_supported_values(self, value: str) -> None:
        assert check(runtime_schema(), runtime(mlPolicy={"mpi": {"mpiImplementation": value}})) == []

    def test_non_string_choices_are_shown_as_json(self) -> None:
        schema = {"type": "object", "properties": {"n": {"type": "integer", "enum": [1, 2]}}}
        assert check(schema, {"n": 2}) == []
        assert check(schema, {"n": 3}) == ['n: Unsupported value: 3: supported values: "1", "2"']

    def test_volcano_network_topology_mode(self) -> None:
        obj = runtime(podGroupPolicy={"volcano": {"networkTopology": {"mode": "medium"}}})
        assert check(runtime_schema(), obj)[0] == (
            'spec.podGroupPolicy.volcano.networkTopology.mode: Unsupported value: "medium": '
            'supported values: "hard", "soft"'
        )


class TestNumbers:
    def test_minimum(self) -> None:
        assert check(trainjob_schema(), trainjob(trainer={"numNodes": -1})) == [
            "spec.trainer.numNodes: Invalid value: -1: spec.trainer.numNodes in body should be greater than or equal to 0"
        ]

    def test_runtime_patch_grace_period(self) -> None:
        obj = patched_trainjob(-1)
        path = (
            "spec.runtimePatches[1].trainingRuntimeSpec.template.spec.replicatedJobs[0]"
            ".template.spec.template.spec.terminationGracePeriodSeconds"
        )
        assert check(trainjob_schema(), obj) == [
            f"{path}: Invalid value: -1: {path} in body should be greater than or equal to 0"
        ]

    def test_zero_nodes_is_accepted(self) -> None:
        assert check(trainjob_schema(), trainjob(trainer={"numNodes": 0})) == []

    def test_maximum(self) -> None:
        obj = trainjob()
        obj["status"] = {
            "trainerStatus": {"progressPercentage": 150, "lastUpdatedTime": "2025-01-01T00:00:00Z"}
        }
        path = "status.trainerStatus.progressPercentage"
        assert check(trainjob_schema(), obj) == [
            f"{path}: Invalid value: 150: {path} in body should be less than or equal to 100"
        ]

    def test_exclusive_bounds_and_multiple_of(self) -> None:
        schema = {
            "type": "object",
            "properties": {
                "low": {"type": "integer", "minimum": 0, "exclusiveMinimum": True},
                "high": {"type": "integer", "maximum": 10, "exclusiveMaximum": True},
                "step": {"type": "integer", "multipleOf": 5},
                "ratio": {"type": "number", "multipleOf": 0.5, "maximum": 1000000},
            },
        }
        assert check(schema, {"low": 1, "high": 9, "step": 15, "ratio": 2.5}) == []
        assert check(schema, {"low": 0, "high": 10, "step": 7, "ratio": 2000000.25}) == [
            "low: Invalid value: 0: low in body should be greater than 0",
            "high: Invalid value: 10: high in body should be less than 10",
            "step: Invalid value: 7: step in body should be a multiple of 5",
            "ratio: Invalid value: 2000000.25: ratio in body should be a multiple of 0.5",
            # Go prints float64 bounds with %v.
            "ratio: Invalid value: 2000000.25: ratio in body should be less than or equal to 1e+06",
        ]

    def test_numbers_must_fit_their_type_and_format(self) -> None:
        # kube-apiserver 1.36 (kube-openapi's range check): at the root, with an empty value, and
        # the CEL rules still run (numProcPerNode's rule refuses 0 beside the range error).
        assert check(trainjob_schema(), trainjob(trainer={"numNodes": 2**40, "numProcPerNode": 0})) == [
            '<nil>: Invalid value: "": Checked value must be of type integer with format int32 in'
            " spec.trainer.numNodes",
            'spec.trainer.numProcPerNode: Invalid value: "integer": numProcPerNode must be greater than or equal to 1',
        ]
        assert check(trainjob_schema(), trainjob(trainer={"numNodes": 2**31 - 1})) == []
        schema = {
            "type": "object",
            "properties": {"n": {"type": "integer"}, "f": {"type": "number", "format": "float"}},
        }
        assert check(schema, {"n": 2**63, "f": 1e39}) == [
            '<nil>: Invalid value: "": Checked value must be of type integer (default format) in n',
            '<nil>: Invalid value: "": Checked value must be of type number with format float in f',
        ]

    def test_an_integral_float_in_an_integer_field_is_no_int_to_cel(self) -> None:
        """JSON's 1.0 passes the type check of an integer field, but CEL sees a float64 there."""
        assert check(trainjob_schema(), trainjob(trainer={"numProcPerNode": 1.0})) == [
            'spec.trainer.numProcPerNode: Invalid value: "integer": invalid data, expected int, got float64'
            " evaluating rule: numProcPerNode must be greater than or equal to 1",
        ]


class TestStrings:
    def test_too_long(self) -> None:
        assert check(trainjob_schema(), trainjob(trainer={"image": "x" * 501})) == [
            "spec.trainer.image: Too long: may not be more than 500 bytes",
            NOT_CHECKED,
        ]

    def test_length_counts_characters(self) -> None:
        assert check(trainjob_schema(), trainjob(trainer={"image": "é" * 500})) == []
        assert check(trainjob_schema(), trainjob(trainer={"image": "é" * 501}))[0].endswith("500 bytes")

    def test_too_short(self) -> None:
        obj = trainjob(runtimeRef={"name": ""})
        assert check(trainjob_schema(), obj) == [
            'spec.runtimeRef.name: Invalid value: "": spec.runtimeRef.name in body should be at least 1 chars long'
        ]

    def test_pattern(self) -> None:
        obj = trainjob(trainer={"resourcesPerNode": {"limits": {"cpu": "two"}}})
        pattern = yaml.safe_load(
            "p: ^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$"
        )["p"]
        path = "spec.trainer.resourcesPerNode.limits.cpu"
        assert check(trainjob_schema(), obj) == [
            f"{path}: Invalid value: \"two\": {path} in body should match '{pattern}'"
        ]

    def test_pattern_dollar_does_not_match_before_a_final_newline(self) -> None:
        schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]+$"}}}
        assert check(schema, {"name": "abc"}) == []
        assert len(check(schema, {"name": "abc\n"})) == 1

    def test_only_the_first_string_error_is_reported(self) -> None:
        schema = {
            "type": "object",
            "properties": {"s": {"type": "string", "minLength": 3, "pattern": "^[0-9]+$"}},
        }
        assert check(schema, {"s": "a"}) == [
            's: Invalid value: "a": s in body should be at least 3 chars long'
        ]

    def test_date_time_format(self) -> None:
        obj = trainjob(runtimePatches=[{"manager": "acme.io/x", "time": "yesterday"}])
        path = "spec.runtimePatches[0].time"
        assert check(trainjob_schema(), obj) == [
            f'{path}: Invalid value: "yesterday": {path} in body must be of type date-time: "yesterday"',
            NOT_CHECKED,
        ]
        for good in ("2024-05-01T10:00:00Z", "2024-05-01t10:00:00.123+02:00"):
            obj["spec"]["runtimePatches"][0]["time"] = good
            assert check(trainjob_schema(), obj) == []

    @pytest.mark.parametrize(
        ("fmt", "good", "bad"),
        [
            ("date", "2024-02-29", "2023-02-29"),
            ("byte", "aGVsbG8=", "hello!"),
            ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123"),
            ("ipv4", "10.0.0.1", "10.0.0.256"),
            ("ipv6", "fe80::1", "10.0.0.1"),
            ("cidr", "10.0.0.0/8", "10.0.0.0"),
            ("mac", "00:00:5e:00:53:01", "00:00:5e"),
        ],
    )
    def test_string_formats(self, fmt: str, good: str, bad: str) -> None:
        schema = {"type": "object", "properties": {"v": {"type": "string", "format": fmt}}}
        assert check(schema, {"v": good}) == []
        assert check(schema, {"v": bad}) == [
            f'v: Invalid value: "{bad}": v in body must be of type {fmt}: "{bad}"'
        ]

    def test_unchecked_formats_accept_anything(self) -> None:
        schema = {"type": "object", "properties": {"v": {"type": "string", "format": "email"}}}
        assert check(schema, {"v": "not an email"}) == []


class TestCollections:
    def test_too_many_items(self) -> None:
        env = [{"name": f"E{i}", "value": "v"} for i in range(129)]
        assert check(trainjob_schema(), trainjob(trainer={"env": env})) == [
            "spec.trainer.env: Too many: 129: must have at most 128 items",
            NOT_CHECKED,
        ]

    def test_too_few_items(self) -> None:
        obj = runtime(
            mlPolicy={"torch": {"envInjection": {"targets": [{"jobName": "j", "containerNames": []}]}}}
        )
        path = "spec.mlPolicy.torch.envInjection.targets[0].containerNames"
        assert check(runtime_schema(), obj) == [
            f"{path}: Invalid value: 0: {path} in body should have at least 1 items"
        ]

    def test_singular_item(self) -> None:
        schema = {"type": "object", "properties": {"one": {"type": "array", "maxItems": 1, "items": {}}}}
        assert check(schema, {"one": [1, 2]}) == ["one: Too many: 2: must have at most 1 item"]

    def test_too_few_properties(self) -> None:
        assert check(runtime_schema(), runtime() | {"spec": {}}) == [
            "spec: Invalid value: 0: spec in body should have at least 1 properties"
        ]

    def test_too_many_properties(self) -> None:
        schema = {"type": "object", "properties": {"m": {"type": "object", "maxProperties": 2}}}
        assert check(schema, {"m": {"a": 1, "b": 2, "c": 3}}) == ["m: Too many: 3: must have at most 2 items"]

    def test_list_map_duplicate_key(self) -> None:
        obj = trainjob(
            trainer={"env": [{"name": "a", "value": "1"}, {"name": "b"}, {"name": "a", "value": "2"}]}
        )
        assert check(trainjob_schema(), obj) == [
            'spec.trainer.env[2]: Duplicate value: map[string]interface {}{"name":"a"}'
        ]

    def test_list_map_keyed_by_manager(self) -> None:
        obj = trainjob(runtimePatches=[{"manager": "acme.io/x"}, {"manager": "acme.io/x"}])
        assert check(trainjob_schema(), obj) == [
            'spec.runtimePatches[1]: Duplicate value: map[string]interface {}{"manager":"acme.io/x"}'
        ]

    def test_list_map_with_several_keys_and_a_defaulted_key(self) -> None:
        schema = {
            "type": "object",
            "properties": {
                "ports": {
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["port", "protocol"],
                    "items": {
                        "type": "object",
                        "properties": {
                            "port": {"type": "integer"},
                            "protocol": {"type": "string", "default": "TCP"},
                        },
                    },
                }
            },
        }
        obj = {"ports": [{"port": 80}, {"port": 80, "protocol": "UDP"}, {"port": 80, "protocol": "TCP"}]}
        assert check(schema, obj) == []  # keys are compared as sent
        apply_defaults(schema, obj)
        assert check(schema, obj) == [
            'ports[2]: Duplicate value: map[string]interface {}{"port":80, "protocol":"TCP"}'
        ]

    def test_list_map_reports_the_second_occurrence_and_missing_keys(self) -> None:
        obj = trainjob(
            trainer={"env": [{"name": "a"}, {"name": "a"}, {"name": "a"}, {"value": "x"}, {"value": "y"}]}
        )
        # OpenAPI errors come first, then the list-type ones.
        assert check(trainjob_schema(), obj) == [
            "spec.trainer.env[3].name: Required value",
            "spec.trainer.env[4].name: Required value",
            'spec.trainer.env[1]: Duplicate value: map[string]interface {}{"name":"a"}',
            "spec.trainer.env[4]: Duplicate value: map[string]interface {}{}",
            NOT_CHECKED,
        ]

    def test_list_map_items_must_be_objects(self) -> None:
        obj = trainjob(trainer={"env": [{"name": "a"}, "b"]})
        assert (
            'spec.trainer.env[1]: Invalid value: "b": must be an object for an array of list-type map'
            in check(trainjob_schema(), obj)
        )

    def test_set_duplicates_are_reported_once_per_value(self) -> None:
        target = {"jobName": "j", "containerNames": ["a", "b", "a", "a", "b"]}
        obj = runtime(mlPolicy={"torch": {"envInjection": {"targets": [target]}}})
        path = "spec.mlPolicy.torch.envInjection.targets[0].containerNames"
        assert check(runtime_schema(), obj) == [
            f'{path}[2]: Duplicate value: "a"',
            f'{path}[4]: Duplicate value: "b"',
        ]


# ---------------------------------------------------------------------------------------------
# CEL rules
# ---------------------------------------------------------------------------------------------


class TestTrainJobRules:
    def test_name_must_be_an_rfc1035_label(self) -> None:
        obj = trainjob()
        obj["metadata"]["name"] = "1jobname"
        assert check(trainjob_schema(), obj) == [
            '<nil>: Invalid value: "object": metadata.name must match RFC 1035 DNS label format'
        ]

    def test_name_is_at_most_63_characters(self) -> None:
        obj = trainjob()
        obj["metadata"]["name"] = "a" * 72
        assert check(trainjob_schema(), obj) == [
            '<nil>: Invalid value: "object": metadata.name must be no more than 63 characters'
        ]

    @pytest.mark.parametrize("value", [0, -5])
    def test_num_proc_per_node(self, value: int) -> None:
        assert check(trainjob_schema(), trainjob(trainer={"numProcPerNode": value})) == [
            'spec.trainer.numProcPerNode: Invalid value: "integer": numProcPerNode must be greater than or equal to 1'
        ]

    def test_managed_by_values(self) -> None:
        assert check(trainjob_schema(), trainjob(managedBy="invalid")) == [
            'spec.managedBy: Invalid value: "string": ManagedBy must be trainer.kubeflow.org/trainjob-controller '
            "or kueue.x-k8s.io/multikueue if set"
        ]
        assert check(trainjob_schema(), trainjob(managedBy="kueue.x-k8s.io/multikueue")) == []

    def test_managed_by_is_immutable_on_update_only(self) -> None:
        old = trainjob(managedBy="trainer.kubeflow.org/trainjob-controller")
        new = trainjob(managedBy="kueue.x-k8s.io/multikueue")
        assert check(trainjob_schema(), new) == []
        assert check(trainjob_schema(), new, old) == [
            'spec.managedBy: Invalid value: "string": field is immutable'
        ]
        assert check(trainjob_schema(), copy.deepcopy(old), old) == []

    def test_transition_rules_need_the_field_in_both_objects(self) -> None:
        old = trainjob()
        new = trainjob(initializer={"dataset": {"storageUri": "hf://data"}}, activeDeadlineSeconds=60)
        assert check(trainjob_schema(), new, old) == []
        assert check(trainjob_schema(), old, new) == []
        changed = trainjob(initializer={"dataset": {"storageUri": "hf://other"}}, activeDeadlineSeconds=61)
        assert check(trainjob_schema(), changed, new) == [
            'spec.activeDeadlineSeconds: Invalid value: "integer": field is immutable',
            'spec.initializer: Invalid value: "object": field is immutable',
        ]

    @pytest.mark.parametrize("uri", ["invalid-uri", "s3://", "://x"])
    def test_storage_uri_refused(self, uri: str) -> None:
        obj = trainjob(initializer={"dataset": {"storageUri": uri}, "model": {"storageUri": uri}})
        detail = 'Invalid value: "string": storageUri may be empty, or it must be a valid URI (scheme://...)'
        assert check(trainjob_schema(), obj) == [
            f"spec.initializer.dataset.storageUri: {detail}",
            f"spec.initializer.model.storageUri: {detail}",
        ]

    @pytest.mark.parametrize("uri", ["", "s3://bucket/data", "hf://org/model"])
    def test_storage_uri_accepted(self, uri: str) -> None:
        assert check(trainjob_schema(), trainjob(initializer={"dataset": {"storageUri": uri}})) == []

    def test_trainer_status_needs_last_updated_time(self) -> None:
        obj = trainjob()
        obj["status"] = {"trainerStatus": {"progressPercentage": 10}}
        assert check(trainjob_schema(), obj) == [
            'status.trainerStatus: Invalid value: "object": lastUpdatedTime is required when trainerStatus is present'
        ]


class TestRuntimeRules:
    def test_only_one_policy(self) -> None:
        obj = runtime(mlPolicy={"torch": {}, "mpi": {"numProcPerNode": 1}})
        assert check(runtime_schema(), obj) == [
            'spec.mlPolicy: Invalid value: "object": Only one of the policy can be configured'
        ]

    def test_mpi_num_proc_per_node(self) -> None:
        assert check(runtime_schema(), runtime(mlPolicy={"mpi": {"numProcPerNode": 0}})) == [
            'spec.mlPolicy.mpi.numProcPerNode: Invalid value: "integer": NumProcPerNode in mpiPolicy must be >= 1'
        ]

    def test_env_injection_must_not_name_node(self) -> None:
        target = {"jobName": "launcher", "containerNames": ["node"]}
        obj = runtime(mlPolicy={"torch": {"envInjection": {"targets": [target]}}})
        assert check(runtime_schema(), obj) == [
            'spec.mlPolicy.torch.envInjection.targets[0].containerNames: Invalid value: "array": containerNames '
            "must not include the main node container because PET_* envs are always injected into it"
        ]

    def test_startup_policy_and_depends_on(self) -> None:
        obj = runtime()
        obj["spec"]["template"]["spec"] = {
            "startupPolicy": {"startupPolicyOrder": "InOrder"},
            "replicatedJobs": [
                {"name": "launcher", "template": {}},
                {"name": "node", "template": {}, "dependsOn": [{"name": "launcher", "status": "Ready"}]},
            ],
        }
        assert check(runtime_schema(), obj) == [
            'spec.template.spec: Invalid value: "object": StartupPolicy and DependsOn APIs are mutually exclusive'
        ]
        jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "j"}}
        jobset["spec"] = obj["spec"]["template"]["spec"]
        assert check(jobset_schema(), jobset) == [
            'spec: Invalid value: "object": StartupPolicy and DependsOn APIs are mutually exclusive'
        ]


class TestCorrelation:
    def test_list_map_entries_are_matched_by_key(self) -> None:
        old = patched_trainjob(300)
        reordered = copy.deepcopy(old)
        reordered["spec"]["runtimePatches"].reverse()
        assert check(trainjob_schema(), reordered, old) == []
        assert check(trainjob_schema(), patched_trainjob(300, node_selector="b"), old) == []
        path = (
            "spec.runtimePatches[1].trainingRuntimeSpec.template.spec.replicatedJobs[0]"
            ".template.spec.template.spec.terminationGracePeriodSeconds"
        )
        assert check(trainjob_schema(), patched_trainjob(600), old) == [
            f'{path}: Invalid value: "integer": field is immutable'
        ]

    def test_a_new_key_has_nothing_to_compare_with(self) -> None:
        old = patched_trainjob(300)
        new = patched_trainjob(600)
        new["spec"]["runtimePatches"][1]["manager"] = "acme.io/new"
        assert check(trainjob_schema(), new, old) == []

    def test_jobset_depends_on_follows_replicated_job_names(self) -> None:
        def jobset(order: list[str], status: str) -> Obj:
            jobs = {
                "launcher": {"name": "launcher", "template": {}},
                "node": {
                    "name": "node",
                    "template": {},
                    "dependsOn": [{"name": "launcher", "status": status}],
                },
            }
            return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "j"},
                    "spec": {"replicatedJobs": [jobs[name] for name in order]}}  # fmt: skip

        old = jobset(["launcher", "node"], "Ready")
        assert check(jobset_schema(), jobset(["node", "launcher"], "Ready"), old) == []
        assert check(jobset_schema(), jobset(["node", "launcher"], "Complete"), old) == [
            'spec.replicatedJobs[0].dependsOn: Invalid value: "array": Value is immutable'
        ]

    def test_not_through_atomic_lists(self) -> None:
        schema = {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "v": {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf"}]}
                        },
                    },
                }
            },
        }
        assert check(schema, {"items": [{"v": "b"}]}, {"items": [{"v": "a"}]}) == []

    def test_through_additional_properties(self) -> None:
        schema = {
            "type": "object",
            "properties": {
                "byName": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        "properties": {"v": {"type": "string"}},
                        "x-kubernetes-validations": [
                            {"rule": "self.v == oldSelf.v", "message": "v is fixed"}
                        ],
                    },
                }
            },
        }
        old = {"byName": {"a": {"v": "1"}, "b": {"v": "1"}}}
        assert check(schema, {"byName": {"a": {"v": "1"}, "b": {"v": "2"}, "c": {"v": "3"}}}, old) == [
            'byName[b]: Invalid value: "object": v is fixed'
        ]


class TestRuleMechanics:
    @staticmethod
    def schema(rule: dict[str, Any], field: dict[str, Any] | None = None) -> Obj:
        return {
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "x": field or {"type": "integer"},
                        "m": {"type": "object", "additionalProperties": {}},
                    },
                    "x-kubernetes-validations": [rule],
                }
            },
        }

    def test_default_message_names_the_rule(self) -> None:
        schema = self.schema({"rule": "self.x > 1"})
        assert check(schema, {"spec": {"x": 1}}) == ['spec: Invalid value: "object": failed rule: self.x > 1']

    def test_message_expression(self) -> None:
        schema = self.schema({"rule": "self.x > 1", "messageExpression": "'x is ' + string(self.x)"})
        assert check(schema, {"spec": {"x": 1}}) == ['spec: Invalid value: "object": x is 1']

    def test_failing_message_expression_falls_back_to_the_message(self) -> None:
        rule = {"rule": "self.x > 1", "message": "x too small", "messageExpression": "self.nope"}
        assert check(self.schema(rule), {"spec": {"x": 1}}) == ['spec: Invalid value: "object": x too small']

    def test_field_path_and_reason(self) -> None:
        rule = {
            "rule": "self.x > 1",
            "message": "x too small",
            "fieldPath": ".x",
            "reason": "FieldValueForbidden",
        }
        assert check(self.schema(rule), {"spec": {"x": 1}}) == ["spec.x: Forbidden: x too small"]
        rule = {
            "rule": "has(self.m.key)",
            "message": "need key",
            "fieldPath": ".m['key']",
            "reason": "FieldValueRequired",
        }
        assert check(self.schema(rule), {"spec": {"m": {}}}) == ["spec.m[key]: Required value: need key"]
        rule = {"rule": "false", "reason": "FieldValueDuplicate"}
        assert check(self.schema(rule), {"spec": {}}) == ['spec: Duplicate value: "object"']

    def test_evaluation_error(self) -> None:
        schema = self.schema({"rule": "self.missing == 1"})
        assert check(schema, {"spec": {}}) == [
            'spec: Invalid value: "object": no such key: missing evaluating rule: self.missing == 1'
        ]
        schema = self.schema({"rule": "self.missing == 1", "message": "need missing"})
        assert check(schema, {"spec": {}}) == [
            'spec: Invalid value: "object": no such key: missing evaluating rule: need missing'
        ]

    def test_no_such_overload(self) -> None:
        field = {"x-kubernetes-int-or-string": True, "x-kubernetes-validations": [{"rule": "self > 1"}]}
        schema = self.schema({"rule": "true"}, field)
        assert check(schema, {"spec": {"x": "two"}}) == [
            "spec.x: Invalid value: \"\": 'no such overload: _>_(string, int)': call arguments did not match a "
            "supported operator, function or macro signature for rule: self > 1"
        ]

    def test_compile_error(self) -> None:
        errors = check(self.schema({"rule": "self.x >"}), {"spec": {"x": 1}})
        assert len(errors) == 1
        assert errors[0].startswith('spec: Invalid value: "object": rule compile error: ')

    def test_rules_skip_absent_and_null_values(self) -> None:
        field = {"type": "integer", "nullable": True, "x-kubernetes-validations": [{"rule": "self > 1"}]}
        schema = self.schema({"rule": "true"}, field)
        assert check(schema, {"spec": {}}) == []
        assert check(schema, {"spec": {"x": None}}) == []
        assert check(schema, {}) == []

    def test_blocking_errors_stop_the_rules(self) -> None:
        obj = trainjob(trainer={"numNodes": "x", "numProcPerNode": 0})
        obj["metadata"]["name"] = "1job"
        errors = check(trainjob_schema(), obj)
        assert errors == [
            'spec.trainer.numNodes: Invalid value: "string": spec.trainer.numNodes in body must be of type '
            'integer: "string"',
            NOT_CHECKED,
        ]

    def test_other_errors_do_not(self) -> None:
        obj = trainjob(trainer={"numNodes": -1, "numProcPerNode": 0})
        obj["metadata"]["name"] = "1job"
        assert check(trainjob_schema(), obj) == [
            "spec.trainer.numNodes: Invalid value: -1: spec.trainer.numNodes in body should be greater than or equal to 0",
            '<nil>: Invalid value: "object": metadata.name must match RFC 1035 DNS label format',
            'spec.trainer.numProcPerNode: Invalid value: "integer": numProcPerNode must be greater than or equal to 1',
        ]

    def test_no_rules_no_notice(self) -> None:
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
        assert check(schema, {"n": "x"}) == [
            'n: Invalid value: "string": n in body must be of type integer: "string"'
        ]

    def test_path_prefix(self) -> None:
        spec = {"runtimeRef": {"name": ""}, "trainer": {"numProcPerNode": 0}}
        errors = messages(validate(trainjob_schema()["properties"]["spec"], spec, path="spec"))
        assert errors == [
            'spec.runtimeRef.name: Invalid value: "": spec.runtimeRef.name in body should be at least 1 chars long',
            'spec.trainer.numProcPerNode: Invalid value: "integer": numProcPerNode must be greater than or equal to 1',
        ]


class TestOrderAndRatcheting:
    def test_errors_follow_schema_order_not_object_order(self) -> None:
        spec = {
            "trainer": {"numNodes": -1, "image": "x" * 501},
            "runtimeRef": {"name": ""},
            "activeDeadlineSeconds": 0,
        }
        obj = trainjob()
        obj["spec"] = spec
        assert check(trainjob_schema(), obj) == [
            "spec.activeDeadlineSeconds: Invalid value: 0: spec.activeDeadlineSeconds in body should be greater "
            "than or equal to 1",
            'spec.runtimeRef.name: Invalid value: "": spec.runtimeRef.name in body should be at least 1 chars long',
            "spec.trainer.image: Too long: may not be more than 500 bytes",
            "spec.trainer.numNodes: Invalid value: -1: spec.trainer.numNodes in body should be greater than or equal to 0",
            NOT_CHECKED,
        ]

    def test_unchanged_invalid_parts_are_ratcheted(self) -> None:
        old = trainjob(trainer={"numNodes": -1})
        old["metadata"]["name"] = "1job"
        new = copy.deepcopy(old)
        new["spec"]["suspend"] = True
        # The root changed, so its rule still counts; the unchanged trainer does not.
        root_rule = '<nil>: Invalid value: "object": metadata.name must match RFC 1035 DNS label format'
        assert check(trainjob_schema(), new, old) == [root_rule]
        old["metadata"]["name"] = new["metadata"]["name"] = "job"
        assert check(trainjob_schema(), new, old) == []
        new["spec"]["trainer"]["numNodes"] = -2
        assert check(trainjob_schema(), new, old) == [
            "spec.trainer.numNodes: Invalid value: -2: spec.trainer.numNodes in body should be greater than or equal to 0",
            'spec.trainer: Invalid value: "object": field is immutable',
        ]

    def test_list_types_are_checked_only_if_the_old_object_passed(self) -> None:
        old = trainjob(trainer={"env": [{"name": "a"}, {"name": "a"}]})
        new = trainjob(trainer={"env": [{"name": "b"}, {"name": "b"}]})
        assert check(trainjob_schema(), new, old) == [
            'spec.trainer: Invalid value: "object": field is immutable'
        ]


# ---------------------------------------------------------------------------------------------
# Pruning, embedded resources, nulls and defaults
# ---------------------------------------------------------------------------------------------


class TestPruning:
    def test_unknown_fields_are_reported_sorted_and_removed(self) -> None:
        obj = trainjob(foo=1, trainer={"env": [{"name": "a", "bar": 2}], "numNodes": 1})
        obj["extra"] = True
        obj["metadata"]["whatever"] = "kept"
        expected = [".extra", ".spec.foo", ".spec.trainer.env[0].bar"]
        before = copy.deepcopy(obj)
        assert unknown_fields(trainjob_schema(), obj) == expected
        assert obj == before
        assert prune(trainjob_schema(), obj) == expected
        assert obj == trainjob(trainer={"env": [{"name": "a"}], "numNodes": 1}) | {
            "metadata": before["metadata"]
        }
        assert prune(trainjob_schema(), obj) == []

    def test_object_without_properties_keeps_nothing(self) -> None:
        obj = runtime(mlPolicy={"jax": {"anything": 1}})
        assert prune(runtime_schema(), obj) == [".spec.mlPolicy.jax.anything"]
        assert obj["spec"]["mlPolicy"] == {"jax": {}}

    def test_preserve_unknown_fields(self) -> None:
        schema = _crd_schema("cert-manager/cert-manager.io_issuers.yaml")
        webhook = {"groupName": "acme.io", "solverName": "s", "config": {"any": {"thing": [1]}}, "extra": 1}
        obj: Obj = {
            "apiVersion": "cert-manager.io/v1",
            "kind": "Issuer",
            "metadata": {"name": "i"},
            "spec": {
                "acme": {
                    "server": "https://x",
                    "privateKeySecretRef": {"name": "k"},
                    "solvers": [{"dns01": {"webhook": webhook}}],
                }
            },
        }
        assert prune(schema, obj) == [".spec.acme.solvers[0].dns01.webhook.extra"]
        assert obj["spec"]["acme"]["solvers"][0]["dns01"]["webhook"]["config"] == {"any": {"thing": [1]}}

    def test_known_fields_inside_preserved_objects_are_still_pruned(self) -> None:
        schema = {
            "type": "object",
            "properties": {
                "free": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": True,
                    "properties": {"known": {"type": "object", "properties": {"a": {"type": "string"}}}},
                }
            },
        }
        obj = {"free": {"other": {"x": 1}, "known": {"a": "1", "b": "2"}}}
        assert prune(schema, obj) == [".free.known.b"]
        assert obj == {"free": {"other": {"x": 1}, "known": {"a": "1"}}}


class TestEmbeddedResources:
    schema: Obj = {
        "type": "object",
        "properties": {
            "template": {
                "type": "object",
                "x-kubernetes-embedded-resource": True,
                "properties": {"spec": {"type": "object", "properties": {"replicas": {"type": "integer"}}}},
            }
        },
    }

    def test_type_meta_and_metadata_survive_pruning(self) -> None:
        template = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "labels": {"a": "b"}},
            "spec": {"x": 1},
        }
        obj = {"template": template}
        assert prune(self.schema, obj) == [".template.spec.x"]
        assert obj["template"] == {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "labels": {"a": "b"}},
            "spec": {},
        }

    def test_api_version_and_kind_are_required(self) -> None:
        assert check(self.schema, {"template": {"spec": {}}}) == [
            "template.apiVersion: Required value: must not be empty",
            "template.kind: Required value: must not be empty",
        ]
        assert check(self.schema, {"template": {"apiVersion": "a/b/c", "kind": "1Pod"}}) == [
            'template.apiVersion: Invalid value: "a/b/c": unexpected GroupVersion string: a/b/c',
            'template.kind: Invalid value: "1Pod": may have mixed case, but should otherwise match: a DNS-1035 label '
            "must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end "
            "with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is "
            "'[a-z]([-a-z0-9]*[a-z0-9])?')",
        ]
        assert check(self.schema, {"template": {"apiVersion": "apps/v1", "kind": "Deployment"}}) == []


class TestNullsAndDefaults:
    def test_trainjob_defaults(self) -> None:
        obj = apply_defaults(trainjob_schema(), trainjob())
        assert obj["spec"]["runtimeRef"] == {
            "name": "torch-distributed",
            "apiGroup": "trainer.kubeflow.org",
            "kind": "ClusterTrainingRuntime",
        }
        assert obj["spec"]["suspend"] is False
        assert obj["spec"]["managedBy"] == "trainer.kubeflow.org/trainjob-controller"

    def test_defaults_reach_list_items(self) -> None:
        env = [{"name": "A", "valueFrom": {"configMapKeyRef": {"key": "k"}}}]
        obj = apply_defaults(trainjob_schema(), trainjob(trainer={"env": env}))
        assert obj["spec"]["trainer"]["env"][0]["valueFrom"]["configMapKeyRef"] == {"key": "k", "name": ""}

    def test_runtime_policy_defaults(self) -> None:
        obj = runtime(mlPolicy={"mpi": {}}, podGroupPolicy={"coscheduling": {}})
        apply_defaults(runtime_schema(), obj)
        assert obj["spec"]["mlPolicy"]["mpi"] == {
            "numProcPerNode": 1,
            "mpiImplementation": "OpenMPI",
            "runLauncherAsNode": False,
            "sshAuthMountPath": "/root/.ssh",
        }
        assert obj["spec"]["podGroupPolicy"]["coscheduling"] == {"scheduleTimeoutSeconds": 60}
        assert validate(runtime_schema(), obj) == []

    def test_explicit_values_win_and_defaulting_is_idempotent(self) -> None:
        obj = runtime(mlPolicy={"mpi": {"numProcPerNode": 4, "mpiImplementation": ""}})
        once = apply_defaults(runtime_schema(), obj)
        assert once["spec"]["mlPolicy"]["mpi"]["numProcPerNode"] == 4
        assert once["spec"]["mlPolicy"]["mpi"]["mpiImplementation"] == ""
        assert apply_defaults(runtime_schema(), copy.deepcopy(once)) == once

    def test_defaulted_objects_get_their_own_defaults_and_copies(self) -> None:
        schema: Obj = {
            "type": "object",
            "properties": {
                "outer": {
                    "type": "object",
                    "default": {},
                    "properties": {"inner": {"type": "array", "default": [1], "items": {"type": "integer"}}},
                },
                "map": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        "properties": {"n": {"type": "integer", "default": 3}},
                    },
                },
            },
        }
        first = apply_defaults(schema, {"map": {"a": {}, "b": {"n": 1}}})
        assert first == {"outer": {"inner": [1]}, "map": {"a": {"n": 3}, "b": {"n": 1}}}
        first["outer"]["inner"].append(2)
        assert apply_defaults(schema, {})["outer"] == {"inner": [1]}
        assert schema["properties"]["outer"]["default"] == {}

    def test_null_is_defaulted_unless_nullable(self) -> None:
        schema = {
            "type": "object",
            "properties": {
                "plain": {"type": "string", "default": "d"},
                "nullable": {"type": "string", "nullable": True, "default": "d"},
            },
        }
        assert apply_defaults(schema, {"plain": None, "nullable": None}) == {"plain": "d", "nullable": None}

    def test_drop_non_nullable_nulls(self) -> None:
        obj = trainjob(managedBy=None, trainer={"image": None, "numNodes": 1})
        assert drop_non_nullable_nulls(trainjob_schema(), obj) == [".spec.trainer.image"]
        # managedBy has a default: the null stays for defaulting to replace.
        assert obj["spec"]["managedBy"] is None
        apply_defaults(trainjob_schema(), obj)
        assert obj["spec"]["managedBy"] == "trainer.kubeflow.org/trainjob-controller"
        assert check(trainjob_schema(), obj) == []


# ---------------------------------------------------------------------------------------------
# ObjectMeta
# ---------------------------------------------------------------------------------------------


class TestObjectMeta:
    def test_valid(self) -> None:
        meta = {"name": "my.job-1", "namespace": "team-a", "labels": {"app.kubernetes.io/name": "x"}}
        assert validate_object_meta(meta) == []

    def test_name_must_be_a_dns_subdomain(self) -> None:
        assert messages(validate_object_meta({"name": "My_Job"})) == [
            'metadata.name: Invalid value: "My_Job": a lowercase RFC 1123 subdomain must consist of lower case '
            "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. "
            "'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*"
            "[a-z0-9])?)*')"
        ]

    def test_name_length(self) -> None:
        assert messages(validate_object_meta({"name": "a" * 254})) == [
            f'metadata.name: Invalid value: "{"a" * 254}": must be no more than 253 characters'
        ]

    def test_name_type_and_presence(self) -> None:
        assert messages(validate_object_meta({"name": 5})) == [
            'metadata.name: Invalid value: "integer": metadata.name in body must be of type string: "integer"'
        ]
        assert validate_object_meta({}) == []
        assert messages(validate_object_meta({}, require_name=True)) == [
            "metadata.name: Required value: name or generateName is required"
        ]
        assert validate_object_meta({"generateName": "job-"}, require_name=True) == []

    def test_namespace_scope(self) -> None:
        assert messages(validate_object_meta({"name": "a"}, namespaced=True)) == [
            "metadata.namespace: Required value"
        ]
        assert messages(validate_object_meta({"name": "a", "namespace": "n"}, namespaced=False)) == [
            "metadata.namespace: Forbidden: not allowed on this type"
        ]

    def test_labels_and_annotations(self) -> None:
        meta = {"name": "a", "labels": {"bad key!": "v", "k": "-v"}, "annotations": {"a": "x" * (256 * 1024)}}
        errors = messages(validate_object_meta(meta))
        assert errors[0].startswith('metadata.labels: Invalid value: "bad key!": name part must consist of')
        assert errors[0].endswith(
            "(e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
            "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
        )
        assert errors[1].startswith(
            'metadata.labels: Invalid value: "-v": a valid label must be an empty string'
        )
        assert errors[2] == "metadata.annotations: Too long: may not be more than 262144 bytes"
        assert len(errors) == 3


# ---------------------------------------------------------------------------------------------
# Upstream objects
# ---------------------------------------------------------------------------------------------


def _upstream_runtimes() -> list[tuple[str, Obj]]:
    found = []
    for path in sorted((REFERENCE / "runtimes").rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                found.append((str(path.relative_to(REFERENCE / "runtimes")), doc))
    return found


@needs_reference("runtimes")
@pytest.mark.parametrize(
    ("name", "doc"),
    params(_upstream_runtimes(), 2, within="runtimes"),
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_upstream_runtimes_are_valid(name: str, doc: Obj) -> None:
    schema = cluster_runtime_schema()
    obj = copy.deepcopy(doc)
    assert prune(schema, obj) == [], name
    assert drop_non_nullable_nulls(schema, obj) == []
    apply_defaults(schema, obj)
    assert validate(schema, obj) == [], name
    # Round trip: defaulted output is stable, declared, and survives JSON.
    assert apply_defaults(schema, copy.deepcopy(obj)) == obj
    assert unknown_fields(schema, obj) == []
    assert validate(schema, json.loads(json.dumps(obj)), obj) == []


def _defaults(schema: Any, path: str = "") -> list[tuple[str, Obj]]:
    """Every (path, property schema) whose schema carries a default."""
    found: list[tuple[str, Obj]] = []
    if not isinstance(schema, dict):
        return found
    if "default" in schema:
        found.append((path, schema))
    for name, prop in (schema.get("properties") or {}).items():
        found.extend(_defaults(prop, f"{path}.{name}"))
    found.extend(_defaults(schema.get("items"), f"{path}[]"))
    found.extend(_defaults(schema.get("additionalProperties"), f"{path}[*]"))
    return found


UPSTREAM_CRDS = sorted(str(p.relative_to(REFERENCE / "crds")) for p in (REFERENCE / "crds").rglob("*.yaml"))


@pytest.mark.parametrize("crd", params(UPSTREAM_CRDS, within="crds"))
def test_upstream_defaults_round_trip(crd: str) -> None:
    """Every default in the CRD validates against its own schema and prunes to itself.

    The API server refuses a CRD whose defaults would not; a default-free object defaulted twice
    is the same as defaulted once.
    """
    schema = _crd_schema(crd)
    for path, prop in _defaults(schema):
        value = apply_defaults(prop, copy.deepcopy(prop["default"]))
        assert unknown_fields(prop, value) == [], path
        assert validate(prop, value, path=path.lstrip(".")) == [], path
    skeleton = {"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "n"}}
    once = apply_defaults(schema, copy.deepcopy(skeleton))
    assert apply_defaults(schema, copy.deepcopy(once)) == once
    assert unknown_fields(schema, once) == []


STRUCTURAL_MODULES = (
    "schema_nodes",
    "json_values",
    "go_syntax",
    "formats",
    "object_meta",
    "pruning",
    "defaulting",
    "schema_validation",
)


@pytest.mark.parametrize("module", STRUCTURAL_MODULES)
def test_module_needs_nothing_beyond_the_standard_library(module: str) -> None:
    source = (Path(schema_validation.__file__).parent / f"{module}.py").read_text()
    imports = {
        name
        for node in ast.walk(ast.parse(source))
        for name in (
            [alias.name for alias in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
    }
    # Imports under TYPE_CHECKING count too; only the standard library and this package's own.
    own = {
        name for name in imports if name == "trainer.apimachinery" or name.startswith("trainer.apimachinery.")
    }
    stdlib = {"__future__", "json", "math", "re", "collections.abc", "typing", "datetime", "ipaddress"}
    assert imports - own <= stdlib
    assert own <= {"trainer.apimachinery", "trainer.apimachinery.errors"} | {
        f"trainer.apimachinery.{m}" for m in STRUCTURAL_MODULES
    }
