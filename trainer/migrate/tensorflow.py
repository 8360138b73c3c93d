"""TFJob (kubeflow.org/v1) without parameter servers: a TrainingRuntime of its own.

v2 has no TensorFlow plugin. A TFJob of Workers, with or without a Chief (MultiWorkerMirrored
training), becomes one replicated job per v1 replica type (Workers as ``node``, the others by
their lower-case type), and each pod's container named tensorflow gets TF_CONFIG as v1 wrote it
(v1 wrote none into a container named otherwise): every task's address, its own type and index
(from the Job's completion index), environment "cloud". Parameter servers have no place in v2
and are refused (docs/migration.md §tfjob).
"""

from __future__ import annotations

import json

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.migrate.common import Options, Result, finish, read_job
from trainer.migrate.errors import Refusal
from trainer.migrate.policy import restart_policy, run_policy
from trainer.migrate.single import (
    Framework,
    check_counts,
    pod_of,
    replica_specs,
    replicas,
    v1_port,
    without_v1_port,
)
from trainer.migrate.templates import (
    main_container,
    own_runtime_ref,
    pod_template,
    replicated_job,
    training_runtime,
    user_env,
    with_v1_env,
)

BASE = "spec.tfReplicaSpecs"
CONTAINER = "tensorflow"
INDEX_ENV = "TF_TASK_INDEX"  # the completion index, which TF_CONFIG's task index is made from
TYPES = ("Chief", "Master", "Worker", "Evaluator", "PS")


def _env(_: object) -> list[Obj]:
    return []


TF = Framework(
    kind="TFJob",
    specs="tfReplicaSpecs",
    container=CONTAINER,
    port_name="tfjob-port",
    default_port=2222,
    order=TYPES,
    single=("Chief", "Master"),
    runtime=None,
    policy=None,
    restart_default="Never",
    reserved_env=(),
    env=_env,
    port_by_name_only=True,  # v1 took 2222 unless the container named tensorflow had the port
)


def convert(job: Obj, options: Options) -> Result:
    source = read_job(job, options)
    notes, metadata, name, spec = source.notes, source.metadata, source.name, source.spec
    namespace = source.namespace
    if spec.get("enableDynamicWorker"):
        notes.loss(
            "spec.enableDynamicWorker",
            "dynamic workers (a sparse TF_CONFIG) are for parameter-server training, which v2 does not have",
        )
    specs = replica_specs(spec, TF)
    counts = {rtype: replicas(rspec, f"{BASE}.{rtype}") for rtype, rspec in specs.items()}
    if counts.get("PS"):
        raise Refusal(
            f"{BASE}.PS",
            "parameter servers (ParameterServerStrategy) have no place in Trainer v2; a TFJob of a "
            "Chief and Workers (MultiWorkerMirroredStrategy) converts",
        )
    check_counts(counts, TF)
    roles = [rtype for rtype in TYPES if counts.get(rtype)]
    total = sum(counts.values())
    trainer_role = "Worker" if counts.get("Worker") else roles[0]
    jobs = {rtype: c.NODE if rtype == trainer_role else rtype.lower() for rtype in roles}
    templates = {rtype: pod_of(specs[rtype], f"{BASE}.{rtype}") for rtype in roles}
    mains = {
        rtype: main_container(templates[rtype], CONTAINER, f"{BASE}.{rtype}.template", notes)
        for rtype in roles
    }
    ports = {rtype: v1_port(mains[rtype], TF) for rtype in roles}
    # v1 wrote every replica type of the spec, sorted, one with no replicas as an empty list.
    cluster = {
        rtype.lower(): [
            f"{name}-{jobs[rtype]}-0-{i}.{name}.{namespace}.svc:{ports[rtype]}" for i in range(counts[rtype])
        ]
        if rtype in jobs
        else []
        for rtype in sorted(specs, key=str.lower)
    }
    lifecycle = run_policy(spec, list(templates.values()), total, notes)
    chief = next((rtype for rtype in ("Chief", "Master") if counts.get(rtype)), None)
    all_workers = spec.get("successPolicy") == "AllWorkers"

    rjobs: list[Obj] = []
    for rtype in roles:
        base = f"{BASE}.{rtype}"
        main = mains[rtype]
        container = str(main.get("name"))
        template = without_v1_port(templates[rtype], container, TF)
        env = user_env(main, (), f"{base}.template.spec.containers[{container}]", notes)
        # v1 wrote no TF_CONFIG for a job of one pod, nor into a container not named tensorflow.
        if total > 1 and container == CONTAINER:
            env = with_v1_env(env, _tf_config(cluster, rtype.lower()))
        elif total > 1:
            notes.warn(
                f"{base}.template.spec.containers[{container}].env",
                f"v1 set TF_CONFIG only in a container named {CONTAINER!r}, so this one ran without it "
                f"(each pod on its own); it gets none here either (name it {CONTAINER!r} to get it)",
            )
        restart = restart_policy(
            specs[rtype].get("restartPolicy"), TF.restart_default, f"{base}.restartPolicy", notes
        )
        rjob = replicated_job(
            jobs[rtype],
            pod_template(
                template, container, env, restart.pod, lifecycle.priority_class, base=f"{base}.template"
            ),
            backoff_limit=lifecycle.backoff_limit,
            pod_failure_policy=restart.pod_failure_policy,
            trainer=rtype == trainer_role,
        )
        if rtype == "Worker" and chief is None and not all_workers and counts["Worker"] > 1:
            # v1: without a Chief the job succeeds when Worker 0 does.
            rjob["template"]["spec"]["successPolicy"] = {"rules": [{"succeededIndexes": "0"}]}
        rjobs.append(rjob)
    if chief is not None and not all_workers:
        success: Obj = {"operator": "All", "targetReplicatedJobs": [jobs[chief]]}
    else:
        success = {"operator": "All", "targetReplicatedJobs": [c.NODE]}
    runtime = training_runtime(
        {**metadata, "name": name},
        "tensorflow",
        {"numNodes": counts[trainer_role]},
        rjobs,
        pod_group_policy=lifecycle.pod_group_policy,
        queue=lifecycle.queue,
        jobset_spec={"successPolicy": success} if len(rjobs) > 1 else None,
    )
    out_spec: Obj = {"runtimeRef": own_runtime_ref(name), "trainer": {"numNodes": counts[trainer_role]}}
    out_spec.update(lifecycle.trainjob)
    return finish(job, metadata, name, out_spec, [runtime], notes)


def _tf_config(cluster: dict[str, list[str]], task_type: str) -> list[Obj]:
    """TF_CONFIG as v1 wrote it; the task index is the pod's completion index, which Kubernetes
    puts in the value from the variable before it ($(NAME) expansion)."""
    text = json.dumps(
        {"cluster": cluster, "task": {"type": task_type, "index": 0}, "environment": "cloud"},
        separators=(",", ":"),
    )
    text = text.replace('"index":0', f'"index":$({INDEX_ENV})')
    return [
        {"name": INDEX_ENV, "valueFrom": {"fieldRef": {"fieldPath": c.JOB_COMPLETION_INDEX_FIELD}}},
        {"name": "TF_CONFIG", "value": text},
    ]
