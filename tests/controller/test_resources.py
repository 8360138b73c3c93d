"""The watched resources are one table derived from the plugins: what the render core builds can
be written and is watched, what a plugin reads is cached, and a disabled plugin's kinds are none
of these."""

from __future__ import annotations

import kopf
import pytest
from kopf._cogs.structs.references import Resource as KopfResource
from render_helpers import Obj, render, replicated_job, runtime, trainjob

from trainer.api import constants as c
from trainer.controller.client import ApiClient
from trainer.controller.config import Configuration
from trainer.controller.informer import Informer
from trainer.controller.operator import Operator
from trainer.controller.resources import OWN, Resources, Role, UndeclaredKind
from trainer.runtime import framework as fw
from trainer.runtime.kinds import Builds, Declaration, DeclarationConflict, Kind, Reads

DEFAULT = Resources.of(fw.default())


def _children(policy: Obj, ml_policy: Obj) -> list[Obj]:
    jobs = [
        replicated_job("launcher", "launcher", [{"name": "node", "image": "img"}]),
        replicated_job("node", "trainer", [{"name": "node", "image": "img"}]),
    ]
    rt = runtime(ml_policy=ml_policy, jobs=jobs, podGroupPolicy=policy)
    cluster = render(rt, trainjob())
    assert not cluster.refusals, [r.lines() for r in cluster.refusals]
    return [o for o in cluster.output() if o["kind"] != "TrainJob"]


@pytest.mark.parametrize("scheduler", ["coscheduling", "volcano"])
def test_every_child_the_render_core_builds_is_written_and_watched(scheduler: str) -> None:
    children = _children({scheduler: {}}, {"numNodes": 2, "mpi": {}})
    kinds = {o["kind"] for o in children}
    assert {"JobSet", "ConfigMap", "Secret", "PodGroup"} <= kinds, kinds
    watched = {(r.api_version, r.kind) for r in DEFAULT.watched if r.role is Role.CHILD}
    for obj in children:
        resource = DEFAULT.writable[(obj["apiVersion"], obj["kind"])]
        assert DEFAULT.resource_of(obj) is resource.type
        # Key material is created once and never listed or watched (docs/security.md, finding 1).
        assert ((obj["apiVersion"], obj["kind"]) in watched) is (obj["kind"] != "Secret")
        assert resource.watched is (obj["kind"] != "Secret")


def test_the_table_is_what_the_enabled_plugins_declare() -> None:
    table = {(r.type.group, r.type.plural): r for r in DEFAULT.watched}
    assert sorted(table) == sorted(
        [
            (c.GROUP, "trainjobs"),
            (c.GROUP, "trainingruntimes"),
            (c.GROUP, "clustertrainingruntimes"),
            (c.GROUP, "optimizationjobs"),  # the searches (docs/optimization.md)
            ("", "configmaps"),  # the core's snapshot, MPI's hostfile, Flux's entrypoint
            ("jobset.x-k8s.io", "jobsets"),
            ("scheduling.x-k8s.io", "podgroups"),
            ("scheduling.volcano.sh", "podgroups"),
            ("scheduling.k8s.io", "priorityclasses"),  # read by Volcano's admission
            ("scheduling.k8s.io", "workloads"),  # kube-scheduler's own gang (docs/scheduling.md)
            ("scheduling.k8s.io", "podgroups"),
        ]
    )
    assert table[("scheduling.k8s.io", "priorityclasses")].role is Role.FACT
    assert not table[("scheduling.k8s.io", "priorityclasses")].type.namespaced
    secrets = DEFAULT.writable[("v1", "Secret")]  # MPI's and Flux's keys: written once, never watched
    assert (secrets.patch, secrets.watched) == (False, False)
    assert {v for g, r, v in DEFAULT.permissions() if r == "secrets"} == {"create", "get"}
    assert table[("jobset.x-k8s.io", "jobsets")].delete
    assert table[("scheduling.volcano.sh", "podgroups")].optional
    for plural in ("workloads", "podgroups"):  # alpha, behind gates: served where they are on
        gang = table[("scheduling.k8s.io", plural)]
        assert gang.optional and gang.delete and gang.watched and not gang.patch
        assert gang.label == c.TRAINJOB_NAME_LABEL
        granted = {v for g, r, v in DEFAULT.permissions() if (g, r) == ("scheduling.k8s.io", plural)}
        assert granted == {"create", "delete", "list", "watch"}, "immutable: made again, never patched"
    # Without Volcano, nobody reads PriorityClasses or builds Volcano's PodGroups: neither is
    # watched, written nor granted.
    without = Resources.of(fw.load(fw.PluginConfig(disabled=frozenset({"Volcano"}))))
    kept = {(r.type.group, r.type.plural) for r in without.watched}
    assert kept == set(table) - {
        ("scheduling.k8s.io", "priorityclasses"),
        ("scheduling.volcano.sh", "podgroups"),
    }
    assert not any(group == "scheduling.volcano.sh" for group, _, _ in without.permissions())


def test_an_undeclared_kind_cannot_be_written() -> None:
    pod_group = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {"name": "x"}}
    without = Resources.of(fw.load(fw.PluginConfig(disabled=frozenset({"Volcano"}))))
    with pytest.raises(
        UndeclaredKind, match=r"PodGroup \(scheduling.volcano.sh/v1beta1\) is built but no enabled"
    ):
        without.resource_of(pod_group)
    read_only = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "x"}}
    with pytest.raises(UndeclaredKind):
        DEFAULT.resource_of(read_only)


WIDGET = Kind("example.com/v1", "Widget", "widgets")


def test_declarations_of_one_kind_merge() -> None:
    merged = Resources(
        [
            ("A", Reads(WIDGET, label="x")),
            ("B", Builds(WIDGET, label="x", optional=True)),
            ("C", Builds(WIDGET, label="x", delete=True, optional=True)),
        ]
    )
    (widget,) = [r for r in merged.watched if r.kind == "Widget"]
    assert (widget.role, widget.label, widget.optional, widget.patch, widget.delete) == (
        Role.CHILD,
        "x",
        False,  # A needs it: a missing API is an error
        True,
        True,
    )


@pytest.mark.parametrize(
    ("first", "second", "what"),
    [
        # One unlabelled declaration would bring every object of the kind into the cache.
        (
            Builds(Kind("v1", "Secret", "secrets"), label="mine"),
            Reads(Kind("v1", "Secret", "secrets")),
            "label",
        ),
        # One plugin's Builds must not make another's keys rewritable.
        (Builds(WIDGET, patch=False), Builds(WIDGET), "patch"),
        (Reads(WIDGET), Reads(Kind("example.com/v1", "Widget", "gadgets")), "API"),
    ],
)
def test_declarations_of_one_kind_that_disagree_are_refused(
    first: Declaration, second: Declaration, what: str
) -> None:
    with pytest.raises(DeclarationConflict, match=rf"differ in their {what}.*A: .*B: "):
        Resources([("A", first), ("B", second)])
    # The framework refuses them at load, naming the kind, before an operator or a render starts.
    with pytest.raises(fw.PluginConfigError, match=rf"{first.kind.kind} .* differ in their {what}"):
        fw.Framework([_Declaring("A", first), _Declaring("B", second)])


class _Declaring:
    def __init__(self, name: str, declaration: Declaration) -> None:
        self.name, self.kinds = name, (declaration,)

    def needed_by(self, spec: object) -> bool:
        return False


def test_rights_follow_the_declarations() -> None:
    gadget, gizmo = Kind("example.com/v1", "Gadget", "gadgets"), Kind("example.com/v1", "Gizmo", "gizmos")
    table = Resources(
        [
            ("P", Reads(WIDGET)),
            ("Q", Builds(gadget, patch=False)),
            ("R", Builds(gizmo, label="x", patch=False)),
        ]
    )
    declared = table.permissions() - Resources([]).permissions()
    assert declared == {
        ("example.com", "widgets", "list"),
        ("example.com", "widgets", "watch"),
        # Only ever created: a plain create, and a read by name when it meets one; never listed.
        *(("example.com", "gadgets", verb) for verb in ("create", "get")),
        *(("example.com", "gizmos", verb) for verb in ("create", "get")),
    }
    watched = Resources([("P", Reads(WIDGET)), ("Q", Builds(gadget, patch=True))]).permissions()
    assert {v for g, r, v in watched if r == "gadgets"} == {"list", "watch", "create", "patch"}


def test_watch_ids_are_unique_and_only_labelled_kinds_are_filtered_by_the_server() -> None:
    assert len({r.type.name for r in DEFAULT.watched}) == len(DEFAULT.watched)
    operator = Operator(config=Configuration())
    informer = Informer(ApiClient("https://127.0.0.1:1"), operator.router.scopes(), operator.router)
    for reflector in informer.reflectors:
        r = reflector.resource
        assert reflector._params() == ({"labelSelector": r.label} if r.labelled else {}), r
    assert {(r.type.group, r.type.plural) for r in DEFAULT.watched if r.labelled} == {
        ("", "configmaps"),
        ("scheduling.k8s.io", "workloads"),  # only ours: nobody else's gang reaches the cache
        ("scheduling.k8s.io", "podgroups"),
    }


def test_each_watched_resource_is_listed_and_watched_once_per_namespace() -> None:
    scopes = Operator(config=Configuration(), namespaces=("a", "b")).router.scopes()
    assert sorted((r.type.name, ns or "") for r, ns in scopes) == sorted(
        (r.type.name, ns) for r in DEFAULT.watched for ns in (("a", "b") if r.type.namespaced else ("",))
    )
    everywhere = Operator(config=Configuration()).router.scopes()
    assert [(r, ns) for r, ns in everywhere] == [(r, None) for r in DEFAULT.watched]
    disabled = Operator(
        config=Configuration.model_validate(
            {"plugins": {"disabled": ["Volcano", "CoScheduling", "Workload"]}}
        )
    )
    assert "PodGroup" not in {r.kind for r, _ in disabled.router.scopes()}


def test_kopf_watches_nothing_and_our_kinds_have_webhooks() -> None:
    """The watches are the operator's own (controller/informer.py); kopf serves the webhooks."""
    registry = Operator(config=Configuration()).registry()
    assert list(registry._watching.get_all_handlers()) == []
    settings = kopf.OperatorSettings()
    Operator(config=Configuration.model_validate({"webhook": {"enabled": False}})).configure(settings)
    for r in DEFAULT.watched:
        kopf_resource = KopfResource(group=r.type.group, version=r.type.version, plural=r.type.plural)
        assert list(settings.watching.label_selectors.collect(kopf_resource)) == []
    webhooks = {h.id for h in registry._webhooks.get_all_handlers()}
    assert webhooks == {
        f"{prefix}.{r.kind.lower()}" for r in OWN for prefix in ("validator", "defaulter")
    } | {
        "validator.optimizationjob"  # validated only: its trials are defaulted as TrainJobs
    }
    assert {r.kind for r in OWN} == {"TrainJob", "TrainingRuntime", "ClusterTrainingRuntime"}
