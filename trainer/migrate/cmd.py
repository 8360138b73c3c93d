"""The `trainer migrate` command: read v1 jobs (manifests or the cluster), print TrainJobs.

Exit codes (trainer/exit_codes.py): 0 every job converted; 1 a job could not be converted
faithfully, or its conversion would be refused by a cluster (a value v2 cannot take), its reasons
on stderr, nothing on stdout for it, the others converted; 2 usage or unreadable input; 3 an
internal error (trainer/cli.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from trainer.api.objects import Obj
from trainer.exit_codes import EXIT_OK, EXIT_REFUSED, EXIT_USAGE
from trainer.migrate import jax, mpi, paddle, pytorch, tensorflow, xgboost
from trainer.migrate.admission import Admission, as_stored
from trainer.migrate.common import V1_GROUP, V1_KINDS, Options, Result
from trainer.migrate.errors import Refusal

Converter = Callable[[Obj, Options], Result]
# Each kind by API version: kubeflow.org/v1 is the Training Operator's, MPIJob v2beta1 the MPI
# Operator's.
CONVERTERS: dict[tuple[str, str], Converter] = {
    ("v1", "PyTorchJob"): pytorch.convert,
    ("v1", "XGBoostJob"): xgboost.convert,
    ("v1", "JAXJob"): jax.convert,
    ("v1", "PaddleJob"): paddle.convert,
    ("v1", "TFJob"): tensorflow.convert,
    ("v1", "MPIJob"): mpi.convert_v1,
    ("v2beta1", "MPIJob"): mpi.convert_v2beta1,
}
# The plural the cluster serves each kind under, and its versions in the order they are read: a
# CRD serving both MPIJob versions stores one object, so only the first served one is listed.
PLURALS = {
    "PyTorchJob": ("pytorchjobs", ("v1",)),
    "XGBoostJob": ("xgboostjobs", ("v1",)),
    "JAXJob": ("jaxjobs", ("v1",)),
    "PaddleJob": ("paddlejobs", ("v1",)),
    "TFJob": ("tfjobs", ("v1",)),
    "MPIJob": ("mpijobs", ("v2beta1", "v1")),
}


def run_migrate(args: argparse.Namespace) -> int:
    if not args.from_cluster and (args.namespace or args.all_namespaces):
        print("error: -n and -A go with --from-cluster", file=sys.stderr)
        return EXIT_USAGE
    if args.from_cluster:
        try:
            jobs = read_cluster(args.namespace, args.all_namespaces)
        except ClusterReadError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    else:
        from trainer.offline.manifests import ManifestError, read_manifests

        try:
            jobs = read_manifests(args.filename)
        except ManifestError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    options = Options(
        lossy=args.lossy,
        suspend_running=not args.no_suspend_running,
        fix_names=args.fix_names,
        gang_scheduler=args.gang_scheduler,
    )
    items: list[Obj] = []
    refused = False
    made: dict[tuple[str, str], str] = {}  # (namespace, TrainJob name) -> the v1 job it came from
    admission = Admission()
    for job in jobs:
        what = describe(job)
        try:
            result = convert(job, options)
            _check_unique(result, what, made)
        except Refusal as exc:
            refused = True
            print(f"error: {what}: {exc.field}: {exc.reason}", file=sys.stderr)
            continue
        reasons = admission.refusals(result.objects)
        if reasons:
            refused = True
            for reason in reasons:
                print(f"error: {what}: a cluster would refuse its {reason}", file=sys.stderr)
            continue
        for warning in result.warnings:
            print(f"Warning: {what}: {warning}", file=sys.stderr)
        items.extend(as_stored(obj) for obj in result.objects)
    if args.output == "json":
        sys.stdout.write(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2) + "\n")
    elif items:
        import yaml

        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        sys.stdout.write(yaml.dump_all(items, Dumper=dumper, sort_keys=False, default_flow_style=False))
    return EXIT_REFUSED if refused else EXIT_OK


def _check_unique(result: Result, what: str, made: dict[tuple[str, str], str]) -> None:
    """Two v1 kinds may share a name in a namespace; their TrainJobs may not (one would replace
    the other when applied)."""
    for obj in result.objects:
        if obj.get("kind") != "TrainJob":
            continue
        meta = obj["metadata"]
        key = (str(meta.get("namespace") or ""), str(meta["name"]))
        if key in made:
            raise Refusal(
                "metadata.name",
                f"{made[key]} becomes the TrainJob {meta['name']!r} in this namespace too; rename one of them",
            )
        made[key] = what


def describe(job: Obj) -> str:
    metadata = job.get("metadata") or {}
    namespace = metadata.get("namespace")
    name = metadata.get("name", "?")
    return f"{job.get('kind')} {namespace}/{name}" if namespace else f"{job.get('kind')} {name}"


def convert(job: Obj, options: Options) -> Result:
    kind = job.get("kind")
    group, _, version = str(job.get("apiVersion", "")).partition("/")
    if group != V1_GROUP or kind not in V1_KINDS:
        raise Refusal("kind", f"{job.get('apiVersion')} {kind} is not a Training Operator v1 job")
    converter = CONVERTERS.get((version, str(kind)))
    if converter is None:
        versions = " and ".join(f"{V1_GROUP}/{v}" for v, k in CONVERTERS if k == kind)
        raise Refusal("apiVersion", f"{job.get('apiVersion')} is not a version of {kind} (read: {versions})")
    return converter(job, options)


class ClusterReadError(Exception):
    """The cluster could not be read (no credentials, no v1 CRD, a refused request)."""


def read_cluster(namespace: str | None, all_namespaces: bool) -> list[Obj]:
    """The v1 jobs of every kind the cluster serves, by LIST requests only: nothing changes there.
    A kind whose CRD is not installed is skipped."""
    import asyncio

    return asyncio.run(_read_cluster(namespace, all_namespaces))


async def _read_cluster(namespace: str | None, all_namespaces: bool) -> list[Obj]:
    from trainer.controller.client import ApiClient, ApiError, ResourceType
    from trainer.controller.credentials import Credentials, CredentialsError

    try:
        credentials = Credentials.of()
        info = await credentials.current()
    except CredentialsError as exc:
        raise ClusterReadError(str(exc)) from None
    if not all_namespaces and not namespace:
        namespace = info.default_namespace or "default"
    client = ApiClient.from_credentials(credentials, qps=20.0, burst=40)
    jobs: list[Obj] = []
    served = 0
    try:
        for kind, (plural, versions) in PLURALS.items():
            for version in versions:
                rtype = ResourceType(V1_GROUP, version, plural)
                try:
                    listed = await client.list(rtype, None if all_namespaces else namespace)
                except ApiError as exc:
                    if exc.code == 404:
                        continue  # this kind, or this version of it, is not served
                    raise ClusterReadError(f"cannot list {rtype.name}: {exc}") from None
                for item in listed.get("items") or []:
                    if isinstance(item, dict):
                        jobs.append({**item, "apiVersion": f"{V1_GROUP}/{version}", "kind": kind})
                served += 1
                break
    finally:
        await client.close()
    if not served:
        print(
            f"note: the cluster serves none of the v1 kinds ({', '.join(PLURALS)} in {V1_GROUP})",
            file=sys.stderr,
        )
    return jobs
