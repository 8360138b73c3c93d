"""Tests for trainer.api.quantity: Kubernetes quantity parsing, canonical form and resource helpers.

Expected canonical strings come from k8s.io/apimachinery's own quantity tests and from the
PodGroup examples of docs/upstream-behaviour.md §coscheduling and §volcano.
"""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
from typing import Any

import pytest

from trainer.api.quantity import (
    Quantity,
    QuantityFormat,
    canonical_quantity,
    cpu_count,
    gpu_count,
    pod_requests,
    resource_list_canonical,
)

# --------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "fmt", "nanos"),
    [
        ("2", QuantityFormat.DECIMAL_SI, 2 * 10**9),
        ("2500m", QuantityFormat.DECIMAL_SI, 2_500_000_000),
        ("1.5Gi", QuantityFormat.BINARY_SI, 3 * 2**29 * 10**9),
        ("4Gi", QuantityFormat.BINARY_SI, 4 * 2**30 * 10**9),
        ("1e3", QuantityFormat.DECIMAL_EXPONENT, 1000 * 10**9),
        ("1E3", QuantityFormat.DECIMAL_EXPONENT, 1000 * 10**9),
        ("1.3E+6", QuantityFormat.DECIMAL_EXPONENT, 1_300_000 * 10**9),
        ("5e-3", QuantityFormat.DECIMAL_EXPONENT, 5_000_000),
        ("100M", QuantityFormat.DECIMAL_SI, 10**8 * 10**9),
        ("0.7", QuantityFormat.DECIMAL_SI, 700_000_000),
        ("5n", QuantityFormat.DECIMAL_SI, 5),
        ("4u", QuantityFormat.DECIMAL_SI, 4000),
        ("8k", QuantityFormat.DECIMAL_SI, 8000 * 10**9),
        ("12E", QuantityFormat.DECIMAL_SI, 12 * 10**18 * 10**9),  # "E" alone is exa, not an exponent
        (".5", QuantityFormat.DECIMAL_SI, 500_000_000),
        ("1.", QuantityFormat.DECIMAL_SI, 10**9),
        ("1.G", QuantityFormat.DECIMAL_SI, 10**18),
        ("+3", QuantityFormat.DECIMAL_SI, 3 * 10**9),
        ("-250m", QuantityFormat.DECIMAL_SI, -250_000_000),
        ("007", QuantityFormat.DECIMAL_SI, 7 * 10**9),
    ],
)
def test_parse_strings(text: str, fmt: QuantityFormat, nanos: int) -> None:
    quantity = Quantity.parse(text)
    assert quantity.format is fmt
    assert quantity.nanos == nanos


@pytest.mark.parametrize(
    ("text", "nanos", "fmt"),
    [
        # Precision finer than nano is rounded up (away from zero), as ParseQuantity does.
        ("3.001n", 4, QuantityFormat.DECIMAL_SI),
        ("1.1E-9", 2, QuantityFormat.DECIMAL_EXPONENT),
        ("0.0000000001", 1, QuantityFormat.DECIMAL_SI),
        ("0.00000012345", 124, QuantityFormat.DECIMAL_SI),
        ("-0.0000000001", -1, QuantityFormat.DECIMAL_SI),
        # Binary values below one unit become DecimalSI.
        ("0.000000000001Ki", 2, QuantityFormat.DECIMAL_SI),
        # BinarySI is capped at the largest int64.
        ("9Ei", (2**63 - 1) * 10**9, QuantityFormat.BINARY_SI),
    ],
)
def test_parse_rounds_and_adjusts_like_kubernetes(text: str, nanos: int, fmt: QuantityFormat) -> None:
    quantity = Quantity.parse(text)
    assert quantity.nanos == nanos
    assert quantity.format is fmt


@pytest.mark.parametrize(
    ("value", "canonical", "fmt"),
    [
        (2, "2", QuantityFormat.DECIMAL_SI),
        (0, "0", QuantityFormat.DECIMAL_SI),
        (2.0, "2", QuantityFormat.DECIMAL_SI),  # the Kubeflow SDK sends cpu: 2.0
        (0.5, "500m", QuantityFormat.DECIMAL_SI),
        (0.1, "100m", QuantityFormat.DECIMAL_SI),  # via repr "0.1", never the binary float
        (2.5, "2500m", QuantityFormat.DECIMAL_SI),
        (1e16, "10e15", QuantityFormat.DECIMAL_EXPONENT),  # a JSON encoder writes 1e+16
        (1e-05, "10e-6", QuantityFormat.DECIMAL_EXPONENT),
    ],
)
def test_parse_numbers(value: float, canonical: str, fmt: QuantityFormat) -> None:
    quantity = Quantity.parse(value)
    assert quantity.canonical() == canonical
    assert quantity.format is fmt


def test_parse_returns_existing_quantity_and_constructor_matches_parse() -> None:
    quantity = Quantity.parse("1Gi")
    assert Quantity.parse(quantity) is quantity
    assert Quantity("1Gi") == quantity
    assert Quantity(quantity).format is QuantityFormat.BINARY_SI


@pytest.mark.parametrize(
    "bad",
    [
        "",
        " 1",
        "1 ",
        "1K",
        "1ki",
        "1e",
        "1E3.5",
        ".",
        "-",
        "+",
        "1m3",
        "abc",
        "1.2.3",
        "Gi",
        "1Gi5",
        "\u0661",
    ],
)
def test_parse_rejects_malformed_strings(bad: str) -> None:
    with pytest.raises(ValueError, match="quantities must match the regular expression"):
        Quantity.parse(bad)


@pytest.mark.parametrize("bad", [True, False, None, float("nan"), float("inf"), [1], {"cpu": 1}])
def test_parse_rejects_non_quantities(bad: Any) -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        Quantity.parse(bad)


def test_parse_rejects_absurd_exponents() -> None:
    with pytest.raises(ValueError, match="exponent out of the supported range"):
        Quantity.parse("1e999999999")
    assert Quantity.parse("1e1000").canonical() == "10e999"


def test_parse_error_names_the_input() -> None:
    with pytest.raises(ValueError, match="'12 cores'"):
        Quantity.parse("12 cores")


# ------------------------------------------------------------------------------------ canonical


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        # Examples from the brief and the PodGroup sections of the spec.
        ("0.5Gi", "512Mi"),
        ("2.5Gi", "2560Mi"),
        ("1.5", "1500m"),
        ("1250m", "1250m"),
        ("102", "102"),
        ("408Gi", "408Gi"),
        ("2048Mi", "2Gi"),
        ("1000m", "1"),
        ("1e3", "1e3"),
        ("2300m", "2300m"),
        ("3Gi", "3Gi"),
        # From k8s.io/apimachinery resource quantity tests.
        ("1.5Gi", "1536Mi"),
        ("1.5Ki", "1536"),  # whole bytes but not a whole Ki: no suffix
        ("0.5Ki", "512"),  # below 1024 bytes: decimal
        ("1025Mi", "1025Mi"),
        ("1024Mi", "1Gi"),
        ("300Mi", "300Mi"),
        ("6Ki", "6Ki"),
        ("1001Gi", "1001Gi"),
        ("1024Gi", "1Ti"),
        ("100.035Ki", "102435840m"),  # fractional bytes fall back to DecimalSI
        ("1000", "1k"),
        ("1000000", "1M"),
        ("1000000000", "1G"),
        ("1000M", "1G"),
        ("1024", "1024"),
        ("0.001", "1m"),
        ("0.08", "80m"),
        ("1.08", "1080m"),
        ("10.035M", "10035k"),
        ("7.123456M", "7123456"),
        ("0.0000001", "100n"),
        ("0.000108", "108u"),
        ("3.001n", "4n"),
        ("0", "0"),
        ("0.0", "0"),
        ("0Gi", "0"),
        ("0e3", "0"),
        ("-1Ki", "-1Ki"),
        ("-1.5", "-1500m"),
        ("9Ei", "9223372036854775807"),
        ("1E", "1E"),
        ("1000E", "1000E"),  # beyond E: keep E (upstream would drop the suffix)
        # DecimalExponent keeps its family.
        ("1e9", "1e9"),
        ("1e-3", "1e-3"),
        ("1e-9", "1e-9"),
        ("80e-3", "80e-3"),
        ("300e6", "300e6"),
        ("3e3", "3e3"),
        ("12e2", "1200"),
        ("1.3E+6", "1300e3"),
        ("0.5e0", "500e-3"),
    ],
)
def test_canonical(text: str, canonical: str) -> None:
    assert Quantity.parse(text).canonical() == canonical
    assert str(Quantity.parse(text)) == canonical
    assert canonical_quantity(text) == canonical


def test_canonical_round_trips() -> None:
    for text in ["2560Mi", "1250m", "1536", "1e3", "100n", "408Gi", "80e-3"]:
        quantity = Quantity.parse(text)
        assert Quantity.parse(quantity.canonical()) == quantity
        assert Quantity.parse(quantity.canonical()).canonical() == quantity.canonical()


def test_repr() -> None:
    assert repr(Quantity.parse("2048Mi")) == "Quantity('2Gi')"


def test_resource_list_canonical() -> None:
    assert resource_list_canonical({"memory": "2048Mi", "cpu": 2.0, "nvidia.com/gpu": 1}) == {
        "cpu": "2",
        "memory": "2Gi",
        "nvidia.com/gpu": "1",
    }
    assert list(resource_list_canonical({"memory": "1", "cpu": "1"})) == ["cpu", "memory"]
    assert resource_list_canonical(None) == {}
    assert resource_list_canonical({}) == {}
    with pytest.raises(ValueError, match="resource 'cpu'"):
        resource_list_canonical({"cpu": "two"})


# ----------------------------------------------------------------------------------- arithmetic


def test_addition_is_exact() -> None:
    assert (Quantity.parse("0.1") + Quantity.parse("0.2")).canonical() == "300m"
    assert Quantity.parse("0.1") + Quantity.parse("0.2") == Quantity.parse("300m")


def test_addition_keeps_left_format_unless_left_is_zero() -> None:
    # Mixed families: the result takes the left operand's family, like Quantity.Add.
    mixed = Quantity.parse("1Gi") + Quantity.parse("1000")
    assert mixed.format is QuantityFormat.BINARY_SI
    assert mixed.canonical() == "1073742824"
    assert (Quantity.parse("1k") + Quantity.parse("1Ki")).canonical() == "2024"
    assert (Quantity.parse("1k") + Quantity.parse("1Ki")).format is QuantityFormat.DECIMAL_SI
    # A zero left operand adopts the right operand's family, so sums started from 0 print nicely.
    assert (Quantity.parse(0) + Quantity.parse("1Gi")).canonical() == "1Gi"
    assert (Quantity.parse("0") + Quantity.parse("1e3")).canonical() == "1e3"


def test_multiplication_by_int_keeps_format() -> None:
    assert (Quantity.parse("4Gi") * 102).canonical() == "408Gi"
    assert (102 * Quantity.parse("4Gi")).canonical() == "408Gi"
    assert (Quantity.parse("500m") * 2).canonical() == "1"
    assert (Quantity.parse("1Gi") * 0).is_zero


def test_arithmetic_rejects_other_types() -> None:
    with pytest.raises(TypeError):
        _ = Quantity.parse("1") + 1  # type: ignore[operator]
    with pytest.raises(TypeError):
        _ = Quantity.parse("1") * 1.5  # type: ignore[operator]
    with pytest.raises(TypeError):
        _ = Quantity.parse("1") * True


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        # docs/upstream-behaviour.md §coscheduling: node x100 + 2 initializers at (1 cpu, 4Gi).
        ([(100, "1", "4Gi"), (1, "1", "4Gi"), (1, "1", "4Gi")], {"cpu": "102", "memory": "408Gi"}),
        ([(100, "2", "8Gi"), (1, "1", "4Gi"), (1, "1", "4Gi")], {"cpu": "202", "memory": "808Gi"}),
        ([(2, "500m", "1Gi"), (1, "250m", "512Mi")], {"cpu": "1250m", "memory": "2560Mi"}),
        # Volcano: launcher (300m, 1Gi) + 4 workers (500m, 512Mi).
        ([(1, "300m", "1Gi"), (4, "500m", "512Mi")], {"cpu": "2300m", "memory": "3Gi"}),
    ],
)
def test_pod_group_min_resources_examples(pods: list[tuple[int, str, str]], expected: dict[str, str]) -> None:
    # Upstream starts from an empty (zero) Quantity and adds count * request for each PodSet.
    totals: dict[str, Quantity] = {}
    for count, cpu, memory in pods:
        for name, value in (("cpu", cpu), ("memory", memory)):
            totals[name] = totals.get(name, Quantity.parse(0)) + Quantity.parse(value) * count
    assert {name: quantity.canonical() for name, quantity in totals.items()} == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2500m", 3),
        ("0.7", 1),
        ("3.7", 4),
        ("2.5", 3),
        ("4", 4),
        ("0", 0),
        ("1n", 1),
        ("1Gi", 2**30),
        ("1e3", 1000),
        ("-1.5", -2),  # away from zero, like Quantity.Value()
        ("-2", -2),
    ],
)
def test_ceil(text: str, expected: int) -> None:
    assert Quantity.parse(text).ceil() == expected


def test_is_zero() -> None:
    assert Quantity.parse("0").is_zero
    assert Quantity.parse("0Gi").is_zero
    assert Quantity.parse("0e3").is_zero
    assert not Quantity.parse("1n").is_zero


# ------------------------------------------------------------------------- identity and ordering


def test_equality_and_hash_ignore_format() -> None:
    assert Quantity.parse("1Gi") == Quantity.parse("1073741824")
    assert Quantity.parse("1k") == Quantity.parse("1e3")
    assert hash(Quantity.parse("1k")) == hash(Quantity.parse("1000"))
    assert len({Quantity.parse("1"), Quantity.parse("1000m"), Quantity.parse("1e0")}) == 1
    assert Quantity.parse("1") != Quantity.parse("2")
    assert Quantity.parse("1") != "1"


def test_ordering() -> None:
    assert Quantity.parse("999m") < Quantity.parse("1")
    assert Quantity.parse("1Ki") > Quantity.parse("1k")
    assert Quantity.parse("1Ki") >= Quantity.parse("1024")
    assert Quantity.parse("1") <= Quantity.parse("1000m")
    assert sorted(Quantity.parse(text) for text in ["1Gi", "1", "500m", "1M"]) == [
        Quantity.parse("500m"),
        Quantity.parse("1"),
        Quantity.parse("1M"),
        Quantity.parse("1Gi"),
    ]
    assert max(Quantity.parse("1Gi"), Quantity.parse("1G")).canonical() == "1Gi"
    with pytest.raises(TypeError):
        _ = Quantity.parse("1") < 2  # type: ignore[operator]


def test_immutable_copyable_picklable() -> None:
    quantity = Quantity.parse("1.5Gi")
    with pytest.raises(AttributeError):
        setattr(quantity, "_nanos", 1)  # noqa: B010
    with pytest.raises(AttributeError):
        delattr(quantity, "_format")
    for clone in (copy.copy(quantity), copy.deepcopy(quantity), pickle.loads(pickle.dumps(quantity))):
        assert clone == quantity
        assert clone.format is QuantityFormat.BINARY_SI
        assert clone.canonical() == "1536Mi"


# ---------------------------------------------------------------------------------- gpu and cpu


def _nproc(num_proc_per_node: int | None, resources: dict[str, Any] | None) -> str:
    """PET_NPROC_PER_NODE per docs/upstream-behaviour.md §torch-nproc, built from the helpers under test."""
    if num_proc_per_node is not None:
        return str(num_proc_per_node)
    if gpu_count(resources) > 0:
        return "auto"
    return str(max(1, cpu_count(resources)))


@pytest.mark.parametrize(
    ("num_proc_per_node", "resources", "expected"),
    [
        (3, {"limits": {"cpu": "8"}}, "3"),
        (None, None, "1"),
        (None, {}, "1"),
        (None, {"limits": {"cpu": "4"}}, "4"),
        (None, {"requests": {"cpu": "4"}}, "4"),
        (None, {"limits": {"cpu": "2500m"}}, "3"),
        (None, {"limits": {"cpu": "0.7"}}, "1"),
        (None, {"limits": {"nvidia.com/gpu": "2"}}, "auto"),
        (None, {"limits": {"nvidia.com/gpu": 2, "cpu": "8"}}, "auto"),
        (None, {"requests": {"example.com/GPU": "2", "cpu": 4}}, "auto"),
    ],
)
def test_nproc_table(num_proc_per_node: int | None, resources: dict[str, Any] | None, expected: str) -> None:
    assert _nproc(num_proc_per_node, resources) == expected


def test_gpu_count() -> None:
    assert gpu_count(None) == 0
    assert gpu_count({}) == 0
    assert gpu_count({"requests": None, "limits": None}) == 0
    assert gpu_count({"limits": {"cpu": "8", "memory": "1Gi"}}) == 0
    assert gpu_count({"limits": {"nvidia.com/gpu": "4"}}) == 4
    assert gpu_count({"requests": {"amd.com/GPU": 2}}) == 2  # case-insensitive
    assert gpu_count({"limits": {"example.com/gpu": "1500m"}}) == 2  # rounded up
    # requests win; limits are used only when the requests value is zero or absent.
    assert gpu_count({"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "4"}}) == 1
    assert gpu_count({"requests": {"nvidia.com/gpu": "0"}, "limits": {"nvidia.com/gpu": "4"}}) == 4
    assert gpu_count({"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "4"}}) == 4


def test_gpu_count_is_deterministic_with_several_gpu_names() -> None:
    # The first name in sorted order wins, whatever the mapping's insertion order.
    resources = {"limits": {"nvidia.com/gpu": "8", "amd.com/gpu": "2"}}
    assert gpu_count(resources) == 2
    assert gpu_count({"limits": dict(reversed(list(resources["limits"].items())))}) == 2


def test_cpu_count() -> None:
    assert cpu_count(None) == 0
    assert cpu_count({}) == 0
    assert cpu_count({"limits": {"memory": "1Gi"}}) == 0
    assert cpu_count({"requests": {"cpu": "2"}, "limits": {"cpu": "8"}}) == 2  # requests first
    assert cpu_count({"requests": {"cpu": "0"}, "limits": {"cpu": "8"}}) == 8  # zero request: limits
    assert cpu_count({"requests": {"memory": "1Gi"}, "limits": {"cpu": "3.7"}}) == 4
    assert cpu_count({"requests": {"cpu": 2.5}}) == 3
    assert cpu_count({"requests": {"cpu": "0"}}) == 0
    with pytest.raises(ValueError):
        cpu_count({"requests": {"cpu": "lots"}})


# -------------------------------------------------------------------------------- pod requests


def _container(name: str, restart_policy: str | None = None, **requests: str) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": "busybox"}
    if requests:
        container["resources"] = {"requests": dict(requests), "limits": {"cpu": "100"}}
    if restart_policy is not None:
        container["restartPolicy"] = restart_policy
    return container


def _canonical(requests: dict[str, Quantity]) -> dict[str, str]:
    return {name: quantity.canonical() for name, quantity in requests.items()}


def test_pod_requests_sum_of_containers_and_no_limits_fallback() -> None:
    spec = {
        "containers": [
            _container("a", cpu="500m", memory="1Gi"),
            _container("b", cpu="250m"),
            {"name": "limits-only", "resources": {"limits": {"cpu": "4", "nvidia.com/gpu": "1"}}},
            {"name": "no-resources"},
        ]
    }
    assert _canonical(pod_requests(spec)) == {"cpu": "750m", "memory": "1Gi"}


def test_pod_requests_empty() -> None:
    assert pod_requests({}) == {}
    assert pod_requests({"containers": [{"name": "main"}]}) == {}
    assert pod_requests({"containers": [{"name": "main", "resources": {"requests": None}}]}) == {}


def test_pod_requests_init_containers_take_the_max() -> None:
    spec = {
        "initContainers": [
            _container("init1", cpu="2", memory="100Mi"),
            _container("init2", cpu="1", memory="2Gi"),
        ],
        "containers": [_container("main", cpu="1", memory="1Gi")],
    }
    assert _canonical(pod_requests(spec)) == {"cpu": "2", "memory": "2Gi"}
    # A resource only init containers request still appears.
    spec = {
        "initContainers": [_container("init", **{"ephemeral-storage": "1Gi"})],
        "containers": [_container("m")],
    }
    assert _canonical(pod_requests(spec)) == {"ephemeral-storage": "1Gi"}


def test_pod_requests_sidecars_add_and_accumulate() -> None:
    spec = {
        "initContainers": [
            _container("before-sidecar", cpu="1500m"),
            _container("sidecar", "Always", cpu="1", memory="1Gi"),
            _container("after-sidecar", cpu="1500m", memory="512Mi"),
            _container("never", "Never", cpu="100m"),
        ],
        "containers": [_container("main", cpu="1", memory="1Gi")],
    }
    # containers + sidecar = cpu 2, memory 2Gi; init peak: max(1.5, 1 [sidecar alone], 1.5 + 1, 0.1 + 1)
    # = cpu 2.5, memory max(1Gi, 1.5Gi, 1Gi) = 1.5Gi.
    assert _canonical(pod_requests(spec)) == {"cpu": "2500m", "memory": "2Gi"}


def test_pod_requests_two_sidecars_accumulate_for_later_init_containers() -> None:
    spec = {
        "initContainers": [
            _container("s1", "Always", cpu="1"),
            _container("s2", "Always", cpu="1"),
            _container("init", cpu="3"),
        ],
        "containers": [_container("main", cpu="500m")],
    }
    # Regular sum 0.5 + 1 + 1 = 2.5; the init container needs 3 + 2 sidecars = 5.
    assert _canonical(pod_requests(spec)) == {"cpu": "5"}


def test_pod_requests_overhead_and_pod_level_resources() -> None:
    spec = {
        "containers": [_container("main", cpu="1", memory="1Gi", **{"nvidia.com/gpu": "2"})],
        "overhead": {"cpu": "250m", "memory": "64Mi"},
    }
    assert _canonical(pod_requests(spec)) == {"cpu": "1250m", "memory": "1088Mi", "nvidia.com/gpu": "2"}
    # Pod-level requests replace the aggregate for cpu / memory / hugepages-* only; overhead still adds.
    spec["resources"] = {"requests": {"cpu": "4", "nvidia.com/gpu": "8", "hugepages-2Mi": "4Mi"}}
    assert _canonical(pod_requests(spec)) == {
        "cpu": "4250m",
        "memory": "1088Mi",
        "nvidia.com/gpu": "2",
        "hugepages-2Mi": "4Mi",
    }


def test_pod_requests_numbers_and_bad_values() -> None:
    spec = {"containers": [{"name": "m", "resources": {"requests": {"cpu": 2.0, "memory": 1024}}}]}
    assert _canonical(pod_requests(spec)) == {"cpu": "2", "memory": "1024"}
    with pytest.raises(ValueError):
        pod_requests({"containers": [{"name": "m", "resources": {"requests": {"cpu": "x"}}}]})


def test_pod_requests_does_not_mutate_input() -> None:
    spec = {
        "initContainers": [_container("s", "Always", cpu="1")],
        "containers": [_container("m", cpu="1")],
        "overhead": {"cpu": "1"},
    }
    snapshot = copy.deepcopy(spec)
    pod_requests(spec)
    assert spec == snapshot


# -------------------------------------------------------------------------------- import weight


def test_module_is_light() -> None:
    # The `trainer render` CLI imports this module on its cold-start path.
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import trainer.api.quantity\n"
        "names = ('pydantic', 'kubernetes', 'yaml', 'decimal', 'fractions')\n"
        "print(','.join(m for m in names if m in set(sys.modules) - before))"
    )
    output = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert output.strip() == ""
