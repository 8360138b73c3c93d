"""What migrate writes is what `trainer render` admits: each converted object goes through the same
admission (the API server's schema and CEL rules, then our webhooks) before it is printed
(docs/migration.md §admission).

A v1 job can carry values v2 cannot take (more replicas than an int32 holds, an MPI hostfile over
the ConfigMap limit): the conversion itself would pass them on, and the user would learn of it
only from ``kubectl apply``. The rules are not restated here; the offline cluster ``trainer
render`` uses judges each object, without rendering it.

What migrate cannot see of the cluster is taken to be there: the PriorityClasses the pods name
(the v1 job's pods could not have been created without them), which the Volcano rules look up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.api.objects import Obj

if TYPE_CHECKING:
    from trainer.offline.cluster import OfflineCluster


class Admission:
    """One offline cluster for a whole run, with the bundled runtimes a TrainJob may name.

    Each job's objects are applied in order (its TrainingRuntime before the TrainJob that refers
    to it); names are unique per run (``cmd._check_unique``), so no job sees another's objects.
    """

    def __init__(self) -> None:
        self._cluster: OfflineCluster | None = None

    def refusals(self, objects: list[Obj]) -> list[str]:
        """Why the first object refused is, as ``<Kind> <namespace>/<name>: <field>: <why>``; [] if
        none is. The objects after it are not tried: they refer to it (a TrainJob to its runtime),
        so their refusals would only repeat that it is missing."""
        cluster = self._cluster or self._start()
        for name in _priority_classes(objects):
            cluster.facts.put(
                {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}}
            )
        before = len(cluster.refusals)
        for obj in objects:
            cluster.apply(obj)
            if len(cluster.refusals) > before:
                return [line for refusal in cluster.refusals[before:] for line in refusal.lines()]
        return []

    def _start(self) -> OfflineCluster:
        # Loaded on first use: a run that converts nothing pays nothing for it.
        from trainer.offline.cluster import OfflineCluster
        from trainer.runtime import framework

        self._cluster = OfflineCluster(framework=framework.default(), reconcile=False)
        self._cluster.load_default_runtimes()
        return self._cluster


def _priority_classes(objects: list[Obj]) -> set[str]:
    """Every ``priorityClassName`` in ``objects``, wherever a pod spec sits (walked without
    recursion: what was read is bounded, but not to Python's stack)."""
    found: set[str] = set()
    stack: list[object] = list(objects)
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            name = value.get("priorityClassName")
            if isinstance(name, str) and name:
                found.add(name)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return found


def as_stored(obj: Obj) -> Obj:
    """``obj`` with its integral floats as integers, as the API server stores it.

    YAML and JSON input can spell an integer field ``30.0``; admission accepts that (as the API
    server does), and migrate must not print a float where the field is an integer. After
    admission every float left is in an integer or int-or-string field (the CRDs have no
    ``number`` fields), so this is the round trip through Go's JSON the server makes.
    """
    from trainer.admission.admit import integral_floats_as_ints

    stored: Obj = integral_floats_as_ints(obj)
    return stored
