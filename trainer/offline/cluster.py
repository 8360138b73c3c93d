"""An offline cluster: manifests applied in order, each TrainJob reconciled by the render core.

``trainer render`` and ``trainer demo`` (before the operator) use it. It plays the parts the API
server and the operator play on a cluster, without I/O: admission of each object as a create or
an update, server-set metadata, and the children each reconcile writes, which later reconciles
see (so a running JobSet stays frozen, and a runtime changed later does not touch a TrainJob
that already has its snapshot). An OptimizationJob makes its first wave of trial TrainJobs, each
then admitted and reconciled as any TrainJob is (docs/optimization.md, "trainer render").
"""

from __future__ import annotations

import copy
import hashlib
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.apimachinery.errors import AdmissionError, FieldError, refusal_lines, required
from trainer.runtime.framework import Framework
from trainer.runtime.info import Facts

NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the API server's: no vowels, no look-alikes
CHILD_ORDER = {"JobSet": 0, "ConfigMap": 1, "Secret": 2, "PodGroup": 3}


def trainjob_uid(namespace: str, name: str) -> str:
    """A stable uid, so the same input renders to the same bytes."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{name}"))


def optimizationjob_uid(namespace: str, name: str) -> str:
    """A stable uid for an OptimizationJob, not the uid a TrainJob of the same name gets."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{c.OPTIMIZATIONJOB_KIND}/{namespace}/{name}"))


def generated_name(prefix: str, ordinal: int) -> str:
    """The name an API server would give for ``generateName``: the prefix, cut to leave room,
    and five characters from its alphabet; here derived from the prefix and the object's place in
    the input, so the same input renders the same names."""
    digest = hashlib.sha256(f"{prefix}\x00{ordinal}".encode()).digest()
    suffix = "".join(NAME_ALPHABET[b % len(NAME_ALPHABET)] for b in digest[:5])
    return prefix[:58] + suffix


def render_seed(uid: str) -> bytes:
    """The seed offline renders hand to plugins that generate key material (``Info.seed``).

    Derived from the TrainJob's uid, itself derived from its namespace and name, so that
    ``trainer render --show-secrets`` prints the same bytes for the same input. Keys made this way
    are predictable from the manifest: they are for looking at, never for a real cluster (the
    operator renders without a seed and uses the operating system's randomness).
    """
    return hashlib.sha256(b"trainer render seed\x00" + uid.encode()).digest()


@dataclass
class Refusal:
    kind: str
    namespace: str | None
    name: str
    errors: list[FieldError]

    def _where(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}" if self.namespace else f"{self.kind} {self.name}"

    def lines(self) -> list[str]:
        """One ``<Kind> <namespace>/<name>: <field>: <reason>`` line per error (README, render's
        contract); the API server's "rules not checked" error is no field's reason (``note``)."""
        lines, _ = refusal_lines(self.errors)
        return [f"{self._where()}: {line}" for line in lines]

    def note(self) -> str | None:
        """``Note: <Kind> <namespace>/<name>: ...`` when the errors kept the CRD's CEL rules from
        running, said once after ``lines`` (``errors.refusal_lines``); None otherwise."""
        _, note = refusal_lines(self.errors)
        return f"Note: {self._where()}: {note}" if note else None


@dataclass
class OfflineCluster:
    framework: Framework
    now: str = "1970-01-01T00:00:00Z"
    facts: Facts = field(default_factory=Facts)
    trainjobs: dict[tuple[str, str], Obj] = field(default_factory=dict)
    optimizationjobs: dict[tuple[str, str], Obj] = field(default_factory=dict)
    # (kind, namespace, name) of each TrainJob and OptimizationJob, in first-applied order.
    roots: list[tuple[str, str, str]] = field(default_factory=list)
    children: dict[tuple[str, str], dict[tuple[str, str, str], Obj]] = field(default_factory=dict)
    applied: set[tuple[str, str, str]] = field(default_factory=set)
    refusals: list[Refusal] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # docs/decisions.md §ttl: each TrainJob's effective TTL, as of its last reconcile here.
    lifetimes: dict[tuple[str, str], str] = field(default_factory=dict)
    # False: admission alone, for `trainer migrate`, which checks what it writes as `trainer
    # render` would admit it and has no use for what a reconcile would make of it.
    reconcile: bool = True

    def load_default_runtimes(self) -> None:
        from importlib.util import find_spec

        import yaml

        from trainer.offline.manifests import _loader

        # The data package, found without importlib.resources (milliseconds of `trainer render`'s
        # start) and without importing anything.
        spec = find_spec("trainer.runtimes")
        assert spec is not None and spec.origin is not None
        for path in sorted(Path(spec.origin).parent.glob("*.yaml")):
            for doc in yaml.load_all(path.read_text(), Loader=_loader()):
                if isinstance(doc, dict):
                    self.facts.put(doc)

    def fact_kinds(self) -> dict[str, bool]:
        """The kinds the render core and the enabled plugins read or build (``kinds``), which
        are cluster facts here, each with whether it is namespaced; any other kind is ignored
        with a note, as the operator would never see it."""
        return {d.kind.kind: d.kind.namespaced for _, d in self.framework.declarations}

    def apply(self, obj: Obj) -> None:
        api_version = str(obj.get("apiVersion", ""))
        kind = str(obj.get("kind", ""))
        group = api_version.rpartition("/")[0]
        facts = self.fact_kinds()
        if group in (c.GROUP, "kubeflow.org") or kind in (c.TRAINJOB_KIND, *c.RUNTIME_KINDS):
            self._apply_trainer_object(obj)
        elif kind in facts:
            namespaced = facts[kind]
            if not self._metadata_ok(kind, obj, namespaced=namespaced):
                return
            if not (obj.get("metadata") or {}).get("name"):
                # generateName needs a server to pick the name; an offline fact has none to find
                err = required("metadata.name", "a cluster object needs a name")
                namespace = obj["metadata"].get("namespace") or "default" if namespaced else None
                self.refusals.append(Refusal(kind, namespace, "", [err]))
                return
            fact = copy.deepcopy(obj)
            meta = fact.setdefault("metadata", {})
            if namespaced:
                meta.setdefault("namespace", "default")
            self.facts.put(fact)
            owner = self._trainjob_of(fact)
            if owner is not None and self.reconcile:
                # The operator reconciles a TrainJob when one of its children changes: a JobSet
                # whose status is given after its TrainJob reaches the TrainJob's status.
                self._reconcile(owner)
        else:
            name = (obj.get("metadata") or {}).get("name", "")
            self.notes.append(f"Note: ignoring {kind} {name!r}: trainer render does not use this kind")

    def _metadata_ok(self, kind: str, obj: Obj, *, namespaced: bool = True) -> bool:
        """Refuse an object whose metadata cannot be keyed on (a name that is not a string...).

        Everything after this reads the name and namespace as strings, as the API server's
        decoding guarantees; offline there is no decoder, so the check is ours.
        """
        from trainer.admission.admit import check_metadata

        try:
            check_metadata(obj)
        except AdmissionError as exc:
            meta = obj.get("metadata")
            meta = meta if isinstance(meta, dict) else {}
            name, namespace = meta.get("name"), meta.get("namespace")
            if kind == c.CLUSTER_TRAINING_RUNTIME_KIND or not namespaced:
                namespace = None
            elif not isinstance(namespace, str) or not namespace:
                namespace = "default"
            name = name if isinstance(name, str) else ""
            self.refusals.append(Refusal(kind, namespace, name, exc.errors))
            return False
        return True

    def _apply_trainer_object(self, obj: Obj) -> None:
        from trainer.admission.admit import KINDS, admit

        obj = copy.deepcopy(obj)
        kind = str(obj.get("kind", ""))
        if not self._metadata_ok(kind, obj):
            return
        if obj.get("metadata") is None:
            obj["metadata"] = {}  # decoded into ObjectMeta, null is empty
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = generated_name(meta["generateName"], len(self.applied))
        name = str(meta.get("name", ""))
        namespaced = kind != c.CLUSTER_TRAINING_RUNTIME_KIND
        if namespaced:
            meta["namespace"] = meta.get("namespace") or "default"
        else:
            meta.pop("namespace", None)
        namespace = meta.get("namespace")
        if kind == c.OPTIMIZATIONJOB_KIND:
            self._apply_optimizationjob(obj, namespace, name)
            return
        if kind not in KINDS:
            self.refusals.append(
                Refusal(
                    kind,
                    namespace,
                    name,
                    [FieldError("kind", "Unsupported value", f"{kind} is not served by {c.GROUP}")],
                )
            )
            return
        key = (kind, namespace or "", name)
        old = self._stored(kind, namespace, name) if key in self.applied else None
        obj.pop("status", None)  # the main resource ignores status, as the API server does
        try:
            admitted, warnings = admit(obj, old, self.facts, self.framework, self.now)
        except AdmissionError as exc:
            self.refusals.append(Refusal(kind, namespace, name, exc.errors))
            self.warnings.extend(f"Warning: {w}" for w in exc.warnings)
            return
        self.warnings.extend(f"Warning: {w}" for w in warnings)
        self.applied.add(key)
        if kind == c.TRAINJOB_KIND:
            self._store_trainjob(admitted, old)
        else:
            self.facts.put(admitted)

    def _stored(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        if kind == c.TRAINJOB_KIND:
            return self.trainjobs.get((namespace or "default", name))
        if kind == c.OPTIMIZATIONJOB_KIND:
            return self.optimizationjobs.get((namespace or "default", name))
        return self.facts.get(kind, namespace, name)

    def _apply_optimizationjob(self, obj: Obj, namespace: str, name: str) -> None:
        """Admit an OptimizationJob as the API server and its webhook would (the CRD's schema and
        rules, then ``validate_optimizationjob``), then take the controller's first step: the
        first wave of trials (``plan`` with none yet), each applied as a TrainJob, so the TrainJob
        webhook judges the template and each trial renders as any TrainJob does. Its status is
        what ``plan`` gives once those trials exist."""
        from trainer.admission.admit import check_schema, check_version
        from trainer.apimachinery.formats import integer_overflows
        from trainer.apimachinery.openapi import schemas
        from trainer.optimization.plan import plan
        from trainer.optimization.validation import validate_optimizationjob

        kind = c.OPTIMIZATIONJOB_KIND
        key = (kind, namespace, name)
        old = self._stored(kind, namespace, name) if key in self.applied else None
        obj.pop("status", None)
        try:
            check_version(obj)
            admitted = check_schema(obj, old, self.now)
            errors = integer_overflows(schemas()[kind], admitted) or validate_optimizationjob(admitted)
            if errors:
                raise AdmissionError(errors)
        except AdmissionError as exc:
            self.refusals.append(Refusal(kind, namespace, name, exc.errors))
            return
        self.applied.add(key)
        self._stamp(admitted, old, optimizationjob_uid(namespace, name))
        if old is None:
            self.roots.append(key)
        self.optimizationjobs[(namespace, name)] = admitted
        if not self.reconcile:
            return

        def trials() -> list[Obj]:
            return [tj for (ns, _), tj in self.trainjobs.items() if ns == namespace]

        first = plan(admitted, trials(), self.now)
        for trial in first.create:
            self.apply(trial)
        admitted["status"] = first.status  # what the next step reads as the stored status
        # The controller's next step, once it sees those trials: the status it writes then.
        admitted["status"] = plan(admitted, trials(), self.now).status

    def _stamp(self, admitted: Obj, old: Obj | None, uid: str) -> None:
        """What the API server keeps or sets on a write: an update keeps the object's uid, its
        creation time and its status; a create gets ``uid`` and ``now``."""
        meta = admitted["metadata"]
        if old is not None:
            meta["uid"] = old["metadata"]["uid"]
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            if old.get("status"):
                admitted["status"] = old["status"]
        else:
            meta["uid"] = uid
            meta["creationTimestamp"] = self.now

    def _store_trainjob(self, admitted: Obj, old: Obj | None) -> None:
        meta = admitted["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        self._stamp(admitted, old, trainjob_uid(namespace, name))
        if (namespace, name) not in self.trainjobs:
            self.roots.append((c.TRAINJOB_KIND, namespace, name))
        self.trainjobs[(namespace, name)] = admitted
        if self.reconcile:
            self._reconcile(admitted)

    def _reconcile(self, admitted: Obj) -> None:
        from trainer.runtime.render import render

        meta = admitted["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        outcome = render(admitted, self.facts, self.framework, self.now, seed=render_seed(meta["uid"]))
        written = self.children.setdefault((namespace, name), {})
        for child in outcome.objects:
            child_meta = child["metadata"]
            known = self.facts.get(child["kind"], namespace, child_meta["name"], Facts.group_of(child))
            if known is not None and "status" in known:
                # Writing an object leaves its status alone (the status subresource), so a JobSet
                # given with its status keeps it when the TrainJob rewrites the JobSet's spec.
                self.facts.put({**child, "status": known["status"]})
            else:
                self.facts.put(child)
            written[(child["apiVersion"], child["kind"], child_meta["name"])] = child
        gone = [(kind, ns, child_name) for kind, ns, child_name in outcome.delete]
        gone += [(obj["kind"], namespace, obj["metadata"]["name"]) for obj in outcome.rebuild]
        for kind, ns, child_name in gone:
            self.facts.remove(kind, ns, child_name)
            for child_key in [k for k in written if k[1:] == (kind, child_name)]:
                del written[child_key]
        if outcome.rebuild:
            # Gone at once here (no Jobs to wait for): the next reconcile builds it afresh.
            self._reconcile(admitted)
            return
        if outcome.status:
            admitted["status"] = outcome.status
        else:
            admitted.pop("status", None)
        self._note_lifetime(admitted, outcome.expired)
        self.warnings.extend(
            f"Warning: {e.reason}: {e.message}" for e in outcome.events if e.type == "Warning"
        )

    def _note_lifetime(self, trainjob: Obj, expired: bool) -> None:
        from trainer.runtime.render import effective, finished_at, run_policy

        meta = trainjob["metadata"]
        key = (meta["namespace"], meta["name"])
        own = (trainjob.get("spec") or {}).get("ttlSecondsAfterFinished")
        ttl = effective(
            trainjob, {} if own is not None else run_policy(trainjob, self.facts), "ttlSecondsAfterFinished"
        )
        if ttl is None:
            self.lifetimes.pop(key, None)
            return
        where = "its own" if own is not None else "its runtime's runPolicy"
        line = f"Note: TrainJob {key[0]}/{key[1]}: ttlSecondsAfterFinished {ttl} ({where}): deleted {ttl} s after it finishes"
        finished = finished_at(trainjob.get("status") or {})
        if finished is not None:
            line += f"; finished at {finished}" + (", so it is due for deletion at --now" if expired else "")
        self.lifetimes[key] = line

    def _trainjob_of(self, fact: Obj) -> Obj | None:
        """The applied TrainJob a cluster object belongs to, as the operator's watches map it:
        its JobSet has the TrainJob's name; other children carry a TrainJob owner reference."""
        meta = fact["metadata"]
        namespace = meta.get("namespace") or "default"
        if fact.get("kind") == c.JOBSET_KIND:
            return self.trainjobs.get((namespace, meta["name"]))
        refs = meta.get("ownerReferences")
        for ref in refs if isinstance(refs, list) else []:
            if isinstance(ref, dict) and ref.get("kind") == c.TRAINJOB_KIND and ref.get("controller"):
                return self.trainjobs.get((namespace, str(ref.get("name"))))
        return None

    def output(self) -> list[Obj]:
        """Each TrainJob and OptimizationJob once, in first-applied order, each TrainJob followed by
        its children in a fixed order (an OptimizationJob's trials follow it: they are applied
        right after it)."""
        items: list[Obj] = []
        for kind, namespace, name in self.roots:
            if kind == c.OPTIMIZATIONJOB_KIND:
                items.append(self.optimizationjobs[(namespace, name)])
                continue
            trainjob = self.trainjobs[(namespace, name)]
            items.append(trainjob)
            children = self.children.get((namespace, name), {})
            items.extend(
                sorted(
                    children.values(),
                    key=lambda o: (
                        CHILD_ORDER.get(o["kind"], 9),
                        o["kind"],
                        o["metadata"]["name"],
                        o["apiVersion"],
                    ),
                )
            )
        return items
