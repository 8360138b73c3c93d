"""The plugin framework: phase order, plugin order within a phase, enable/disable, failures."""

from __future__ import annotations

from typing import Any

import pytest
from render_helpers import container, only, render, runtime, trainjob

from trainer.api.views import TrainingRuntimeSpec
from trainer.runtime import framework as fw
from trainer.runtime.hookspecs import hookimpl
from trainer.runtime.info import Info, PluginError
from trainer.runtime.kinds import Builds, Kind, Reads
from trainer.runtime.podspec import upsert_env

TORCH = {"numNodes": 1, "torch": {}}


class Recorder:
    """A plugin from "another package" that records the phases it sees and adds an env var."""

    name = "Recorder"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        return False

    @hookimpl
    def trainer_enforce_ml_policy(self, info: Info) -> None:
        self.calls.append("ml")
        node = info.trainer_pod_set().container("node")  # type: ignore[union-attr]
        upsert_env(node, [{"name": "RECORDER", "value": "1"}])

    @hookimpl
    def trainer_enforce_pod_group_policy(self, info: Info) -> None:
        self.calls.append("podgroup")

    @hookimpl
    def trainer_enforce_pod_spec(self, info: Info) -> None:
        self.calls.append("podspec")

    @hookimpl
    def trainer_pre_build_sync(self, info: Info) -> None:
        self.calls.append("sync")

    @hookimpl
    def trainer_build(self, info: Info) -> list[dict[str, Any]] | None:
        self.calls.append("build")
        return None


def test_phases_run_in_order_and_external_plugins_after_builtins() -> None:
    recorder = Recorder()
    framework = fw.load(extra=[recorder])
    cluster = render(runtime(ml_policy=TORCH), trainjob(trainer={"image": "x"}), fw=framework)
    assert recorder.calls == ["ml", "podgroup", "podspec", "sync", "build"]
    names = [e["name"] for e in container(only(cluster, "JobSet"), "node")["env"]]
    # Torch ran before the external plugin within the ML phase (docs/decisions.md §1).
    assert names.index("PET_MASTER_PORT") < names.index("RECORDER")


def test_builtin_order_is_fixed() -> None:
    framework = fw.default()
    assert framework.enabled == [
        "PlainML",
        "Torch",
        "MPI",
        "JAX",
        "XGBoost",
        "Flux",
        "CoScheduling",
        "Volcano",
        "Workload",
        "JobSet",
    ]
    # A gated built-in takes its place in the order when its gate is on.
    gated = fw.load(fw.PluginConfig(feature_gates={"TrainJobStatus": True}))
    assert gated.enabled[-2:] == ["TrainJobStatus", "JobSet"]
    impls = [impl.plugin_name for impl in reversed(framework.hook.trainer_enforce_ml_policy.get_hookimpls())]
    assert impls[:2] == ["PlainML", "Torch"]


def test_disabled_plugin_refuses_runtimes_that_need_it() -> None:
    framework = fw.load(fw.PluginConfig(disabled=frozenset({"Torch"})))
    assert "Torch" not in framework.enabled
    cluster = render(runtime(ml_policy=TORCH), fw=framework)
    (refusal,) = cluster.refusals
    assert "needs plugins that are disabled in this operator: Torch" in refusal.lines()[0]
    # A runtime that does not need it is still fine.
    assert not render(runtime(ml_policy={"numNodes": 1, "jax": {}}), fw=framework).refusals


def test_disabling_an_unknown_plugin_is_a_configuration_error() -> None:
    with pytest.raises(fw.PluginConfigError, match="cannot disable unknown plugins: Nope"):
        fw.load(fw.PluginConfig(disabled=frozenset({"Nope"})))


def test_allow_listing_a_missing_external_plugin_is_an_error() -> None:
    with pytest.raises(fw.PluginConfigError, match="not installed"):
        fw.load(fw.PluginConfig(allowed_external=frozenset({"ghost"})))


class Failing:
    name = "Failing"

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        return False

    @hookimpl
    def trainer_enforce_pod_spec(self, info: Info) -> None:
        raise PluginError("the pod spec cannot be enforced: no GPUs left")


def test_a_failing_plugin_stops_the_build_and_shows_on_status() -> None:
    cluster = render(runtime(ml_policy=TORCH), trainjob(), fw=fw.load(extra=[Failing()]))
    # Only the snapshot is written: it pins the runtime before any phase runs, as upstream's does.
    assert [(o["kind"], o["metadata"]["name"]) for o in cluster.output()] == [
        ("TrainJob", "job"),
        ("ConfigMap", "job-runtime-snapshot"),
    ]
    (cond,) = only(cluster, "TrainJob")["status"]["conditions"]
    assert cond["type"] == "ReconcileFailed" and cond["status"] == "True"
    assert cond["message"] == (
        "TrainJob resources reconciliation failed: the pod spec cannot be enforced: no GPUs left"
    ), "the condition carries the Event's message (docs/decisions.md §3)"
    assert any("TrainJobResourcesCreationFailed" in w for w in cluster.warnings)


class SecondStatus:
    name = "SecondStatus"

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        return False

    @hookimpl
    def trainer_compute_status(self, trainjob: dict[str, Any], facts: Any) -> dict[str, Any] | None:
        return None


def test_only_one_status_provider() -> None:
    with pytest.raises(fw.PluginConfigError, match="too many TrainJobStatus plugins"):
        fw.load(extra=[SecondStatus()])


def test_every_hookspec_is_documented_and_called() -> None:
    """A hook nobody calls, or one without a docstring, is a hole in the spine."""
    import inspect
    from pathlib import Path

    from trainer.runtime import hookspecs

    specs = [name for name, obj in vars(hookspecs).items() if name.startswith("trainer_") and callable(obj)]
    core = "\n".join(p.read_text() for p in Path(hookspecs.__file__).parent.parent.rglob("*.py"))
    for name in specs:
        assert inspect.getdoc(getattr(hookspecs, name)), f"{name} has no docstring"
        assert f"hook.{name}(" in core, f"{name} is never called by the core"


class Misspelt:
    """A plugin under development whose hook name has a typo: it would never run."""

    name = "Misspelt"

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        return False

    @hookimpl
    def trainer_enforce_mlpolicy(self, info: Info) -> None:
        raise AssertionError("never called")


def test_plugins_handed_to_load_get_the_checks_installed_plugins_get() -> None:
    with pytest.raises(fw.PluginConfigError, match="'trainer_enforce_mlpolicy', which is not a hook"):
        fw.load(extra=[Misspelt()])

    class Pushy(Recorder):
        name = "Pushy"

        @hookimpl(tryfirst=True)
        def trainer_build(self, info: Info) -> list[dict[str, Any]] | None:
            return None

    with pytest.raises(fw.PluginConfigError, match="marked tryfirst"):
        fw.load(extra=[Pushy()])


def test_a_framework_refuses_an_implementation_of_no_hook() -> None:
    """The last line of defence, for a Framework built from plugin objects directly: pluggy's
    check_pending, as pytest runs it, names the plugin and the hook that does not exist."""
    with pytest.raises(fw.PluginConfigError, match=r"'Misspelt'.*trainer_enforce_mlpolicy"):
        fw.Framework([Misspelt()])
    assert fw.Framework([Recorder()]).enabled == ["Recorder"]


class BuildsUndeclared:
    """Builds a kind it does not declare: the operator could neither write nor watch it."""

    name = "BuildsUndeclared"
    kinds: tuple[Any, ...] = ()

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        return False

    @hookimpl
    def trainer_build(self, info: Info) -> list[dict[str, Any]]:
        return [
            {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": info.child_metadata(info.name)}
        ]


def test_a_kind_built_but_not_declared_fails_the_reconcile_on_status() -> None:
    cluster = render(runtime(ml_policy=TORCH), trainjob(), fw=fw.load(extra=[BuildsUndeclared()]))
    assert [o["kind"] for o in cluster.output()] == ["TrainJob", "ConfigMap"], "nothing built is written"
    (cond,) = only(cluster, "TrainJob")["status"]["conditions"]
    assert cond["type"] == "ReconcileFailed"
    assert "a plugin built a Widget (example.com/v1), which no enabled plugin declares" in cond["message"]

    class Declared(BuildsUndeclared):
        name = "Declared"
        kinds = (Builds(Kind("example.com/v1", "Widget", "widgets")),)

    declared = render(runtime(ml_policy=TORCH), trainjob(), fw=fw.load(extra=[Declared()]))
    assert "Widget" in [o["kind"] for o in declared.output()]


def test_malformed_kinds_are_refused_at_load() -> None:
    class NotATuple(Recorder):
        name = "NotATuple"
        kinds = Reads(Kind("v1", "Secret", "secrets"))  # type: ignore[assignment]

    with pytest.raises(fw.PluginConfigError, match="'NotATuple': kinds must be a tuple"):
        fw.load(extra=[NotATuple()])

    class Selector(Recorder):
        name = "Selector"
        kinds = (Reads(Kind("v1", "Secret", "secrets"), label="team=a"),)

    with pytest.raises(fw.PluginConfigError, match=r"the label of Secret must be a label key .*'team=a'"):
        fw.load(extra=[Selector()])
