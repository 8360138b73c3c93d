"""What must hold after a chaos run, on either backend, read from the server's own change stream.

A run records every change to TrainJobs and their children as the server made it, each with its
resourceVersion: the stand-in's store hands its events to a listener; on the real control plane
the test watches each resource (one etcd, so one sequence of revisions orders them all). The
checks then read that history, so no timing can hide a violation:

- no status is lost: a TrainJob's conditions never lose a type (ReconcileFailed excepted: it is
  removed by design), and a terminal condition, once True, stays True;
- no child is created after its TrainJob finished (docs/decisions.md §4);
- no MPI SSH Secret is created twice or changed (a re-key would break a running job);
- every child is owned by its TrainJob when created.

Imported by module name, as the operator tests import their helpers.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Protocol

Obj = dict[str, Any]
Key = tuple[str, str]  # (API group, resource)
TRAINJOBS: Key = ("trainer.kubeflow.org", "trainjobs")
JOBSETS: Key = ("jobset.x-k8s.io", "jobsets")
CHILD_KEYS: set[Key] = {JOBSETS, ("", "configmaps"), ("", "secrets"), ("scheduling.x-k8s.io", "podgroups")}
TERMINAL = ("Complete", "Failed")


class Change(Protocol):
    """One change as the server made it: the stand-in's storage Event has this shape."""

    @property
    def rv(self) -> int: ...
    @property
    def type(self) -> str: ...  # ADDED, MODIFIED, DELETED
    @property
    def key(self) -> Key: ...
    @property
    def obj(self) -> Obj: ...
    @property
    def old(self) -> Obj | None: ...


@dataclass
class History:
    """TrainJobs' and their children's changes, in the order the server made them."""

    trainjobs: dict[str, list[Change]] = field(default_factory=lambda: defaultdict(list))
    children: list[Change] = field(default_factory=list)

    def listen(self, event: Change) -> None:
        if event.key == TRAINJOBS:
            self.trainjobs[event.obj["metadata"]["name"]].append(event)
        elif event.key in CHILD_KEYS and owner_uid(event.obj) is not None:
            self.children.append(event)
        elif event.key in CHILD_KEYS and event.type == "ADDED" and looks_like_child(event.obj):
            self.children.append(event)  # a child without an owner: reported by the checks


def owner_uid(obj: Obj) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "TrainJob" and ref.get("controller"):
            return str(ref["uid"])
    return None


def looks_like_child(obj: Obj) -> bool:
    return "trainer.kubeflow.org/trainjob-name" in (obj["metadata"].get("labels") or {})


def condition_statuses(obj: Obj) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}


def check_history(history: History, mpi_trainjobs: list[str]) -> None:
    """Fail, listing (at most 40 of) them, on every violation of the module's rules."""
    problems: list[str] = []
    uid_of: dict[str, str] = {}
    finished_at: dict[str, int] = {}  # TrainJob uid -> rv of its first terminal status
    for name, events in history.trainjobs.items():
        seen: set[str] = set()
        terminal: set[str] = set()
        for event in sorted(events, key=lambda e: e.rv):
            if event.type == "DELETED":
                break
            uid_of[name] = event.obj["metadata"]["uid"]
            conditions = condition_statuses(event.obj)
            lost = seen - set(conditions) - {"ReconcileFailed"}
            if lost:
                problems.append(f"TrainJob {name}: conditions {sorted(lost)} lost at rv {event.rv}")
            gone = {t for t in terminal if conditions.get(t) != "True"}
            if gone:
                problems.append(f"TrainJob {name}: terminal {sorted(gone)} no longer True at rv {event.rv}")
            seen |= set(conditions)
            now_terminal = {t for t in TERMINAL if conditions.get(t) == "True"}
            if now_terminal and not terminal:
                finished_at[uid_of[name]] = event.rv
            terminal |= now_terminal
    name_of = {uid: name for name, uid in uid_of.items()}

    ssh_secrets: Counter[str] = Counter()
    for event in sorted(history.children, key=lambda e: e.rv):
        meta = event.obj["metadata"]
        what = f"{event.key[1]} {meta['name']}"
        owner = owner_uid(event.obj)
        if owner is None:
            problems.append(f"{what} created without a controlling TrainJob ownerReference")
            continue
        if event.type == "ADDED" and owner in finished_at and event.rv > finished_at[owner]:
            problems.append(
                f"{what} created at rv {event.rv}, after TrainJob {name_of.get(owner)} finished at rv {finished_at[owner]}"
            )
        if event.key == ("", "secrets") and meta["name"].endswith("-mpi-ssh-auth"):
            if event.type == "ADDED":
                ssh_secrets[meta["name"]] += 1
            elif (
                event.type == "MODIFIED"
                and event.old is not None
                and event.old.get("data") != event.obj.get("data")
            ):
                problems.append(f"{what}: key material changed at rv {event.rv}")
    problems += [f"secrets {name}: created {n} times (re-keyed)" for name, n in ssh_secrets.items() if n > 1]
    problems += [
        f"TrainJob {n}: no SSH Secret was ever created"
        for n in mpi_trainjobs
        if not ssh_secrets[f"{n}-mpi-ssh-auth"]
    ]
    assert not problems, "\n".join(problems[:40])


def in_expected_state(trainjob: Obj | None, jobset: Obj | None, scenario: str) -> bool:
    """Whether a TrainJob (None: gone) and its JobSet are where the scenario must end."""
    if scenario == "deleted":
        return trainjob is None
    if trainjob is None:
        return False
    conditions = condition_statuses(trainjob)
    if scenario == "suspended":
        return (
            conditions == {"Suspended": "True"} and jobset is not None and jobset["spec"]["suspend"] is True
        )
    want = "Failed" if scenario == "fail" else "Complete"
    other = "Complete" if want == "Failed" else "Failed"
    return (
        conditions.get(want) == "True"
        and conditions.get(other) != "True"
        and "ReconcileFailed" not in conditions
    )
