"""The v1 kinds whose replicas all become one ``node`` Job: PyTorchJob, XGBoostJob, JAXJob and a
PaddleJob or TFJob of workers only.

v1 ranked its replica types in a fixed order (Master first, then Workers), which is the order of
the Job's completion indexes, so rank ``i`` in v1 is completion index ``i`` in v2. A framework says
what its v1 controller put in the environment; that is added beside the v2 plugin's own env.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.migrate import shapes
from trainer.migrate.common import Notes, Options, Result, finish, read_job
from trainer.migrate.errors import Refusal
from trainer.migrate.policy import Restart, restart_policy, run_policy
from trainer.migrate.templates import (
    BUNDLED_RESTART,
    main_container,
    own_runtime_ref,
    pod_template,
    replicated_job,
    runtime_patches,
    split,
    training_runtime,
    user_env,
    with_v1_env,
)

MAX_ENV_INJECTION = 8  # containerNames of an envInjection target (docs/migration.md §pytorchjob)


@dataclass
class Context:
    """What a framework's v1 env is computed from."""

    name: str
    namespace: str
    counts: dict[str, int]  # replicas per v1 replica type
    nodes: int
    port: int  # the training container's v1 port (its named port, else v1's default)
    spec: Obj  # the v1 job's spec
    trainer: Obj  # the TrainJob's trainer fields the framework set (numProcPerNode)

    def host(self, index: int) -> str:
        """The v2 pod of completion index ``index``, by the JobSet's headless service."""
        return f"{self.name}-{c.NODE}-0-{index}.{self.name}"


@dataclass(frozen=True)
class Framework:
    kind: str
    specs: str  # the replica specs field, e.g. "pytorchReplicaSpecs"
    container: str  # v1's training container
    port_name: str  # v1's port of the training container, by name
    default_port: int
    order: tuple[str, ...]  # replica types in rank order
    single: tuple[str, ...]  # types that have at most one replica
    runtime: str | None  # the bundled runtime that fits, None: always a TrainingRuntime
    policy: str | None  # the mlPolicy source of the generated runtime; None: plain
    restart_default: str  # v1's default restartPolicy for the kind
    reserved_env: tuple[str, ...]  # set by the v2 plugin (docs/migration.md)
    env: Callable[[Context], list[Obj]]  # what v1's controller set, with v1's meaning
    # Extra trainer fields from the v1 spec and its training container.
    trainer: Callable[[Obj, Obj, Notes], Obj] | None = None
    check: Callable[[Obj, Notes], None] | None = None  # kind-specific refusals, before anything
    # v1 read the port only from the container named ``container`` and used ``default_port`` for
    # any other (PaddleJob, TFJob). The other kinds' v1 could not start a job whose port it did not
    # find that way, so a lone container named otherwise has its own port taken.
    port_by_name_only: bool = False

    @property
    def base(self) -> str:
        return f"spec.{self.specs}"


def convert(job: Obj, options: Options, fw: Framework) -> Result:
    source = read_job(job, options)
    notes, metadata, name, spec = source.notes, source.metadata, source.name, source.spec
    if fw.check is not None:
        fw.check(spec, notes)
    specs = replica_specs(spec, fw)
    counts = {rtype: replicas(rspec, f"{fw.base}.{rtype}") for rtype, rspec in specs.items()}
    check_counts(counts, fw)
    nodes = sum(counts.values())
    running = [rtype for rtype in fw.order if counts.get(rtype)]
    first = running[0]
    template = pod_of(specs[first], f"{fw.base}.{first}")
    for rtype in running[1:]:
        other = pod_of(specs[rtype], f"{fw.base}.{rtype}")
        if comparable(other) != comparable(template):
            notes.loss(
                f"{fw.base}.{rtype}.template",
                f"differs from the {first}'s template; v2 runs every node from one template "
                f"(the {first}'s is used)",
            )
    restart = _restart(specs, running, fw, notes)

    base = f"{fw.base}.{first}.template"
    main = main_container(template, fw.container, base, notes)
    container = str(main.get("name"))
    port = v1_port(main, fw)
    template = without_v1_port(template, container, fw)
    trainer: Obj = {"numNodes": nodes}
    if fw.trainer is not None:
        trainer.update(fw.trainer(spec, main, notes))
    context = Context(name, source.namespace, counts, nodes, port, spec, trainer)
    v1_env = fw.env(context)
    env = with_v1_env(user_env(main, fw.reserved_env, f"{base}.spec.containers[{container}]", notes), v1_env)
    lifecycle = run_policy(spec, [template], nodes, notes)

    piece = split(template, container, base, env)
    fits = (
        fw.runtime is not None
        and not piece.blockers
        and restart.pod == BUNDLED_RESTART
        and restart.pod_failure_policy is None
        and not lifecycle.needs_runtime
    )
    objects: list[Obj] = []
    if fits:
        out_spec: Obj = {"runtimeRef": {"name": fw.runtime}, "trainer": {**piece.trainer, **trainer}}
        patches = runtime_patches(piece.patch)
        if patches:
            out_spec["runtimePatches"] = patches
    else:
        # v1 set its env on every container of the pod, sidecars too; the torch plugin sets its
        # PET_* on the ones envInjection names (docs/migration.md §pytorchjob).
        others = [
            str(x.get("name"))
            for x in (template.get("spec") or {}).get("containers") or []
            if isinstance(x, dict) and x.get("name") != container
        ]
        node = replicated_job(
            c.NODE,
            pod_template(
                template, container, env, restart.pod, lifecycle.priority_class, base=base, others_env=v1_env
            ),
            backoff_limit=lifecycle.backoff_limit,
            pod_failure_policy=restart.pod_failure_policy,
            trainer=True,
        )
        ml_policy: Obj = {"numNodes": nodes}
        if fw.policy is not None:
            ml_policy[fw.policy] = {}
        if fw.policy == "torch" and others:
            if len(others) > MAX_ENV_INJECTION:
                notes.warn(
                    f"{base}.spec.containers",
                    f"the torch plugin's PET_* go to at most {MAX_ENV_INJECTION} containers beside the "
                    f"training one (envInjection); not to {', '.join(others[MAX_ENV_INJECTION:])}",
                )
            injected = others[:MAX_ENV_INJECTION]
            ml_policy["torch"] = {
                "envInjection": {"targets": [{"jobName": c.NODE, "containerNames": injected}]}
            }
        objects.append(
            training_runtime(
                {**metadata, "name": name},
                fw.policy or fw.kind.removesuffix("Job").lower(),
                ml_policy,
                [node],
                pod_group_policy=lifecycle.pod_group_policy,
                queue=lifecycle.queue,
            )
        )
        out_spec = {"runtimeRef": own_runtime_ref(name), "trainer": trainer}
    out_spec.update(lifecycle.trainjob)
    return finish(job, metadata, name, out_spec, objects, notes)


def _restart(specs: dict[str, Obj], running: list[str], fw: Framework, notes: Notes) -> Restart:
    """One restart policy for every node. Never and ExitCode mixed (both never restart a pod in
    place) become ExitCode's, with a Warning; other mixes are a loss."""
    policies = {
        rtype: restart_policy(
            specs[rtype].get("restartPolicy"), fw.restart_default, f"{fw.base}.{rtype}.restartPolicy", notes
        )
        for rtype in running
    }
    first = policies[running[0]]
    if all(p == first for p in policies.values()):
        return first
    named = {rtype: specs[rtype].get("restartPolicy") or fw.restart_default for rtype in running}
    said = ", ".join(f"{rtype} {value!r}" for rtype, value in named.items())
    if all(p.pod == "Never" for p in policies.values()):
        chosen = next(p for p in policies.values() if p.pod_failure_policy is not None)
        notes.warn(
            f"{fw.base}.{running[-1]}.restartPolicy",
            f"{said} differ; v2 restarts every node alike: 'ExitCode' for all (exit codes 128-255 of "
            "every node are retried)",
        )
        return chosen
    notes.loss(
        f"{fw.base}.{running[-1]}.restartPolicy",
        f"{said} differ; v2 restarts every node alike (the {running[0]}'s is used)",
    )
    return first


def replica_specs(spec: Obj, fw: Framework) -> dict[str, Obj]:
    specs = spec.get(fw.specs)
    if not isinstance(specs, dict) or not specs:
        raise Refusal(fw.base, "no replica specs")
    out: dict[str, Obj] = {}
    for rtype, rspec in specs.items():
        if rtype not in fw.order:
            allowed = " and ".join(fw.order)
            raise Refusal(f"{fw.base}.{rtype}", f"only {allowed} replicas exist for a {fw.kind}")
        if rspec is None:
            continue
        if not isinstance(rspec, dict):
            raise Refusal(f"{fw.base}.{rtype}", "not an object")
        out[rtype] = rspec
    return out


def check_counts(counts: dict[str, int], fw: Framework) -> None:
    """At most one of each ``single`` type, and at least one pod."""
    for rtype in fw.single:
        if counts.get(rtype, 0) > 1:
            raise Refusal(
                f"{fw.base}.{rtype}.replicas", f"{counts[rtype]}: a {fw.kind} has at most one {rtype}"
            )
    if sum(counts.values()) < 1:
        raise Refusal(fw.base, "no replicas: the job runs no pod")


def replicas(rspec: Obj, path: str) -> int:
    value = rspec.get("replicas", 1)  # v1 defaults replicas to 1
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise Refusal(f"{path}.replicas", f"{value!r} is not a replica count")
    return value


def pod_of(rspec: Obj, path: str) -> Obj:
    shapes.check_replica(rspec, path)
    template = rspec.get("template")
    if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
        raise Refusal(f"{path}.template", "no pod template")
    return template


def comparable(template: Obj) -> Obj:
    return {k: v for k, v in template.items() if k != "metadata" or v}


def v1_port(main: Obj, fw: Framework) -> int:
    """The port v1 put in its env: the training container's port named as v1 names it."""
    if fw.port_by_name_only and main.get("name") != fw.container:
        return fw.default_port
    for port in main.get("ports") or []:
        if isinstance(port, dict) and port.get("name") == fw.port_name and port.get("containerPort"):
            return int(port["containerPort"])
    return fw.default_port


def without_v1_port(template: Obj, name: str, fw: Framework) -> Obj:
    """The template without v1's own named port (v1 declared it itself when a template had none)."""
    out = copy.deepcopy(template)
    for container in out["spec"].get("containers") or []:
        if isinstance(container, dict) and container.get("name") == name and container.get("ports"):
            kept = [
                p for p in container["ports"] if not (isinstance(p, dict) and p.get("name") == fw.port_name)
            ]
            if kept:
                container["ports"] = kept
            else:
                del container["ports"]
    return out
