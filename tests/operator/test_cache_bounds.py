"""A tenant cannot grow the operator's memory with objects of the kinds it watches (docs/security.md,
finding 4): ConfigMaps carrying our label, or JobSets another controller made, are kept by name and
ownership only; the whole object is kept for the children our TrainJobs control, which the render
core compares with what it builds. On both control planes, through the operator's own watches."""

from __future__ import annotations

import json

from operator_helpers import TJ, get_or_none, trainjob, wait_for
from trainer_sandbox.backends import Cluster
from trainer_sandbox.embedded_operator import EmbeddedOperator

from trainer.api.objects import Obj

LABEL = "trainer.kubeflow.org/trainjob-name"
PAYLOAD = 900 * 1024  # close to the API server's object limit, as in the review's reproduction


def cached_bytes(operator: EmbeddedOperator, kind: str, names: list[str], namespace: str) -> int:
    cache = operator.operator.cache
    found = [cache.get(kind, namespace, name) for name in names]
    assert all(o is not None for o in found), "the watch delivered them"
    return sum(len(json.dumps(o)) for o in found)


def test_foreign_objects_of_watched_kinds_cost_their_names_not_their_bytes(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    ns = cluster.namespace
    names = [f"tenant-{i}" for i in range(8)]
    for name in names:  # 7 MiB of a tenant's ConfigMaps, carrying the label our watch selects
        cluster.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "labels": {LABEL: "whatever"}},
                "data": {"blob": "x" * PAYLOAD},
            }
        )
    cluster.create(trainjob("ours", suspend=True))
    snapshot = wait_for(
        lambda: get_or_none(cluster, "v1", "ConfigMap", "ours-runtime-snapshot"), what="our snapshot"
    )

    def delivered() -> bool:
        cache = operator.operator.cache
        return all(cache.get("ConfigMap", ns, n) is not None for n in [*names, "ours-runtime-snapshot"])

    wait_for(delivered, what="the watch to deliver every ConfigMap")
    foreign = cached_bytes(operator, "ConfigMap", names, ns)
    assert foreign < 8 * 2048, f"{foreign} bytes kept of {8 * PAYLOAD} bytes of foreign ConfigMaps"
    kept: Obj | None = operator.operator.cache.get("ConfigMap", ns, "ours-runtime-snapshot")
    assert kept is not None and kept.get("data") == snapshot["data"], "our own child is kept whole"
    assert (
        cluster.get(TJ, "TrainJob", "ours")["metadata"]["uid"]
        == (kept["metadata"]["ownerReferences"][0]["uid"])
    )
