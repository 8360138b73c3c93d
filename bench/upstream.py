"""Upstream's API requests for the same work, derived from its documented behaviour.

Upstream publishes no figures, so the bench derives them from what its controller does on each
reconcile (docs/upstream-behaviour.md §pipeline, §snapshot, §mpi-ssh-secret, §mpi-hostfile,
§coscheduling, §suspend and §reconcile):

- every object a reconcile builds is written with server-side apply, one PATCH each; what it
  builds depends on the state: the first reconcile builds every child (runtime snapshot, JobSet,
  MPI SSH Secret and hostfile ConfigMap, PodGroup); while suspended, the JobSet and the PodGroup
  are built again on every reconcile; the MPI hostfile ConfigMap is built on every reconcile of
  an unfinished MPI TrainJob, running or not; the SSH Secret and the snapshot only when absent;
  a running JobSet and an existing PodGroup of a running TrainJob are not rebuilt;
- one GET per reconcile for the runtime (or its snapshot ConfigMap); controller-runtime serves
  it from its informer cache, so on a real cluster it is usually no request at all (an upper
  bound here, counted as a read, never as a write);
- one status PATCH when the status changed (the same changes as ours, so we use our count);
- an Event only for a failed reconcile (none in these runs);
- a client budget of 50 requests/s with a burst of 100.

"The same work" means the same reconciles: upstream's watches (TrainJobs, and the JobSets,
ConfigMaps, Secrets and PodGroups it owns) are ours, and a no-op server-side apply changes no
resourceVersion, so it triggers no further reconcile. Figures are per TrainJob.
"""

from __future__ import annotations

from dataclasses import dataclass

QPS = 50.0
BURST = 100

DERIVATION = (
    "upstream (derived, not measured): one server-side apply PATCH per object each reconcile builds "
    "(first reconcile: every child; suspended: JobSet + PodGroup again on every reconcile; MPI: hostfile "
    "ConfigMap on every reconcile), one runtime/snapshot GET per reconcile (informer-cached upstream: an "
    "upper bound), one status PATCH per status change (our count), Events only on failure; "
    f"client budget {QPS:g} QPS / burst {BURST}; same reconciles as ours (same watch triggers)"
)


@dataclass(frozen=True)
class Shape:
    """What a TrainJob's runtime makes it build."""

    mpi: bool = False
    gang: bool = False

    @property
    def children(self) -> int:
        """Objects of a first reconcile: snapshot, JobSet, [SSH Secret, hostfile], [PodGroup]."""
        return 2 + (2 if self.mpi else 0) + (1 if self.gang else 0)

    def rebuilt(self, suspended: bool) -> int:
        """Objects applied again by every later reconcile in this state."""
        return (1 + (1 if self.gang else 0) if suspended else 0) + (1 if self.mpi else 0)


TORCH = Shape()
MPI = Shape(mpi=True)


@dataclass(frozen=True)
class Requests:
    reads: float
    writes: float

    @property
    def total(self) -> float:
        return self.reads + self.writes


def lifecycle(shape: Shape, *, suspended: bool, reconciles: float, status_writes: float) -> Requests:
    """Requests per TrainJob for ``reconciles`` reconciles (the first one included) in one state."""
    later = max(0.0, reconciles - 1)
    applies = shape.children + later * shape.rebuilt(suspended)
    return Requests(reads=reconciles, writes=applies + status_writes)


def until_jobset(shape: Shape) -> float:
    """Writes from creation until the JobSet exists: the first reconcile's applies.

    Children are applied in the builders' order and the JobSet is among them; counting all of
    them is what a reconcile that creates the JobSet writes.
    """
    return float(shape.children)


def budget_floor(writes: float, count: int) -> float:
    """Seconds the client budget alone needs for ``count`` TrainJobs of ``writes`` writes each."""
    return max(0.0, (writes * count - BURST) / QPS)
