"""Differential admission: our offline admission against the real API server (issue 14, part 3).

A fixed, seeded set of nearly valid TrainJobs, TrainingRuntimes and ClusterTrainingRuntimes is
made from every bundled runtime, every example (``examples/`` and the YAML in ``docs/``) and the
fuzz tests' hypothesis strategy: one field broken at a time (a value of another type, a number out
of bounds, a name that is no DNS-1123 name, a null, a removed field, an unknown field, a value a
CEL rule refuses, a combination a CEL rule on the parent refuses), and updates of a valid stored
object (the fields CEL transition rules keep immutable, and the same one-field breakages).

Each object is judged twice: by ``admit`` in ``Mode.FULL`` (what ``trainer render`` runs) and by
the real API server in a server-side dry run (``dryRun=All``, ``fieldValidation=Strict`` as
kubectl sends it) with the operator's webhooks registered by URL on loopback. The verdicts must
agree for every object, and where both refuse, so must the field paths the first refusing stage
names (the server calls no validating webhook after its own refusal). The API server is the
reference for the schema and CEL; our webhook rules are the reference for the rest, and the
server reports them as the webhook's message, which the same paths must be in.

Real backend only (``pytest --backend real``): the stand-in shares our schema code, so agreeing
with it proves nothing.
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from test_fuzz import BASE_TRAINJOB, mutated
from trainer_sandbox.backends import RealCluster
from trainer_sandbox.embedded_operator import EmbeddedOperator
from trainer_sandbox.operator_process import OPERATOR_USER

from trainer.admission.admit import Mode, admit
from trainer.api import constants as c
from trainer.apimachinery.errors import AdmissionError
from trainer.apimachinery.openapi import schemas
from trainer.controller.config import Configuration
from trainer.runtime import framework as fw
from trainer.runtime.info import Facts

Obj = dict[str, Any]
Path_ = tuple[Any, ...]
# The issue's number. TRAINER_DIFFERENTIAL_SEED explores other sets; the suite keeps this one.
SEED = int(os.environ.get("TRAINER_DIFFERENTIAL_SEED", "14"))
MINIMUM = 2_000
REPO = Path(__file__).resolve().parents[2]
NOW = "2026-01-01T00:00:00Z"
PLURALS = {
    c.TRAINJOB_KIND: "trainjobs",
    c.TRAINING_RUNTIME_KIND: "trainingruntimes",
    c.CLUSTER_TRAINING_RUNTIME_KIND: "clustertrainingruntimes",
}
NAME_KEYS = {"name", "manager", "subdomain", "containerName", "groupName", "schedulerName"}
BAD_NAMES = ["UPPER", "under_score", "-leading", "trailing-", "dot.ted", "a" * 64, "a" * 254, "", "sp ace"]
# Keys we never break: what routes the request (a changed kind or namespace is a different
# request, not a different object).
PROTECTED = {("apiVersion",), ("kind",), ("metadata",), ("metadata", "namespace")}


# --- the bases ----------------------------------------------------------------------------------


def _yaml_docs(text: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]


def bundled_runtimes() -> list[Obj]:
    folder = resources.files("trainer.runtimes")
    return [
        doc
        for name in sorted(p.name for p in folder.iterdir() if p.name.endswith(".yaml"))
        for doc in _yaml_docs(folder.joinpath(name).read_text())
        if doc.get("kind") == c.CLUSTER_TRAINING_RUNTIME_KIND
    ]


def examples() -> list[Obj]:
    """The TrainJobs and runtimes of ``examples/`` and of the YAML blocks in ``docs/``."""
    found: list[Obj] = []
    for path in sorted((REPO / "examples").glob("*.yaml")):
        found += _yaml_docs(path.read_text())
    for path in sorted((REPO / "docs").glob("*.md")):
        for block in re.findall(r"```ya?ml\n(.*?)```", path.read_text(), re.S):
            try:
                found += _yaml_docs(block)
            except yaml.YAMLError:
                continue
    return [d for d in found if d.get("apiVersion") == c.API_VERSION and d.get("kind") in PLURALS]


# --- one field broken at a time -----------------------------------------------------------------


def leaf_paths(obj: Any, prefix: Path_ = ()) -> list[Path_]:
    found: list[Path_] = []
    items: list[tuple[Any, Any]] = []
    if isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, list):
        items = list(enumerate(obj))
    for key, value in items:
        path = (*prefix, key)
        if path not in PROTECTED:
            found.append(path)
        found += leaf_paths(value, path)
    return found


def get_at(obj: Any, path: Path_) -> Any:
    for step in path:
        obj = obj[step]
    return obj


def set_at(obj: Any, path: Path_, value: Any) -> None:
    get_at(obj, path[:-1])[path[-1]] = value


def other_types(value: Any) -> list[Any]:
    if isinstance(value, bool):
        return ["true", 1]
    if isinstance(value, int):
        return [str(value), 1.5, True]
    if isinstance(value, float):
        return [str(value), True]
    if isinstance(value, str):
        return [7, True, [value], {"a": value}]
    if isinstance(value, list):
        return [{"a": 1}, "x"]
    if isinstance(value, dict):
        return [["x"], "x", 1]
    return ["x", 1, {}]


def out_of_bounds(value: Any) -> list[Any]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [-1, 0, 2**31, -(2**31) - 1, 2**53]
    if isinstance(value, str):
        return ["", "x" * 3000]
    if isinstance(value, list):
        return [[], value * 3]
    return []


@dataclass
class Case:
    label: str
    obj: Obj
    base: str | None = None  # an update of the stored base of this key


@dataclass
class Verdict:
    accepted: bool
    paths: frozenset[str] = frozenset()
    detail: str = ""


def break_one(rng: random.Random, obj: Obj) -> tuple[str, Obj]:
    """``obj`` with one field broken, and what was done."""
    out = copy.deepcopy(obj)
    path = rng.choice(leaf_paths(out))
    value = get_at(out, path)
    where = ".".join(str(p) for p in path)
    options: list[tuple[str, Callable[[], None]]] = [
        ("type", lambda: set_at(out, path, rng.choice(other_types(value)))),
        ("null", lambda: set_at(out, path, None)),
        ("delete", lambda: get_at(out, path[:-1]).pop(path[-1])),
    ]
    bounds = out_of_bounds(value)
    if bounds:
        options += [("bound", lambda: set_at(out, path, rng.choice(bounds)))] * 2
    if isinstance(path[-1], str) and path[-1] in NAME_KEYS and isinstance(value, str):
        options += [("name", lambda: set_at(out, path, rng.choice(BAD_NAMES)))] * 3
    if isinstance(value, dict):
        options.append(("unknown", lambda: value.__setitem__("unknownField", rng.choice([1, "x", {}]))))
    if isinstance(value, list) and value and isinstance(value[0], dict):
        options.append(("duplicate", lambda: value.append(copy.deepcopy(value[0]))))
    what, action = rng.choice(options)
    action()
    return f"{what} {where}", out


# --- CEL-guarded fields, from the CRD schemas ---------------------------------------------------


def cel_paths(schema: Obj, prefix: Path_ = ()) -> list[tuple[Path_, list[str]]]:
    """Each schema position with CEL rules ("*" for any list item or map value) and its rules."""
    found: list[tuple[Path_, list[str]]] = []
    rules = [r["rule"] for r in schema.get("x-kubernetes-validations") or []]
    if rules:
        found.append((prefix, rules))
    for key, sub in (schema.get("properties") or {}).items():
        found += cel_paths(sub, (*prefix, key))
    if isinstance(schema.get("items"), dict):
        found += cel_paths(schema["items"], (*prefix, "*"))
    if isinstance(schema.get("additionalProperties"), dict):
        found += cel_paths(schema["additionalProperties"], (*prefix, "*"))
    return found


def concrete(obj: Any, pattern: Path_, prefix: Path_ = ()) -> Iterator[Path_]:
    """The paths in ``obj`` that match ``pattern``."""
    if not pattern:
        yield prefix
        return
    head, rest = pattern[0], pattern[1:]
    if head == "*":
        keys = list(obj.keys()) if isinstance(obj, dict) else range(len(obj)) if isinstance(obj, list) else []
        for key in keys:
            yield from concrete(obj[key], rest, (*prefix, key))
    elif isinstance(obj, dict) and head in obj:
        yield from concrete(obj[head], rest, (*prefix, head))


def changed(value: Any) -> Any:
    """A different value of the same type (what a transition rule sees as a change)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "-changed"
    if isinstance(value, list):
        return value[:-1] if value else ["changed"]
    if isinstance(value, dict):
        out = copy.deepcopy(value)
        for key, sub in out.items():
            if isinstance(sub, (str, int, bool, list)):
                out[key] = changed(sub)
                return out
        out["changedField"] = "x"
        return out
    return "changed"


def cel_breakers(value: Any) -> list[Any]:
    """Values of the same type that rules on a field often refuse."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [0, -1]
    if isinstance(value, str):
        return ["", "not a uri", "node", "example.com/elsewhere"]
    if isinstance(value, list):
        return [[], [*value, "node"], value + value]
    return []


# --- the set of cases ---------------------------------------------------------------------------


@dataclass
class Plan:
    namespace: str
    bases: dict[str, Obj] = field(default_factory=dict)  # stored before the updates
    runtimes: list[Obj] = field(default_factory=list)  # stored before anything else
    cases: list[Case] = field(default_factory=list)


def as_training_runtime(runtime: Obj, namespace: str) -> Obj:
    out = copy.deepcopy(runtime)
    out["kind"] = c.TRAINING_RUNTIME_KIND
    out["metadata"] = {**out["metadata"], "namespace": namespace}
    return out


def trainjob_for(runtime: Obj, namespace: str, name: str) -> Obj:
    """The fuzz tests' TrainJob that uses many fields, on ``runtime``."""
    tj = copy.deepcopy(BASE_TRAINJOB)
    tj["metadata"] = {"name": name, "namespace": namespace, "labels": {"team": "a"}}
    tj["spec"]["runtimeRef"] = {"name": runtime["metadata"]["name"], "kind": runtime["kind"]}
    jobs = {rj["name"] for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    for key, job in (("dataset", "dataset-initializer"), ("model", "model-initializer")):
        if job not in jobs:
            del tj["spec"]["initializer"][key]
    if not tj["spec"]["initializer"]:
        del tj["spec"]["initializer"]
    tj["spec"]["suspend"] = True
    out: Obj = tj
    return out


def hypothesis_cases(bases: list[Obj], count: int, protect: int) -> list[Obj]:
    """The fuzz tests' strategy (up to four fields changed), drawn with a fixed seed."""
    drawn: list[Obj] = []

    @seed(SEED)
    @settings(
        database=None,
        max_examples=count,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data(), index=st.integers(0, len(bases) - 1))
    def draw(data: st.DataObject, index: int) -> None:
        drawn.append(data.draw(mutated(bases[index], protect=protect)))

    draw()
    return drawn


def plan(namespace: str) -> Plan:
    rng = random.Random(SEED)
    p = Plan(namespace)
    bundled = bundled_runtimes()
    # TrainingRuntimes of the bundled runtimes' specs, in the test's namespace, for TrainJobs to use.
    p.runtimes = [as_training_runtime(r, namespace) for r in bundled]
    runtimes: list[Obj] = bundled + p.runtimes

    bases: list[Obj] = []
    for r in bundled:
        ctr = copy.deepcopy(r)
        ctr["metadata"] = {**ctr["metadata"], "name": f"d-{ctr['metadata']['name']}"}
        bases.append(ctr)
        bases.append(as_training_runtime(ctr, namespace))
    for i, r in enumerate(runtimes):
        bases.append(trainjob_for(r, namespace, f"d-tj-{i}"))
    for i, ex in enumerate(examples()):
        ex = copy.deepcopy(ex)
        meta = ex.setdefault("metadata", {})
        meta["name"] = f"d-ex-{i}"
        if ex["kind"] == c.CLUSTER_TRAINING_RUNTIME_KIND:
            meta.pop("namespace", None)
        else:
            meta["namespace"] = namespace
        bases.append(ex)

    for base in bases:
        kind = base["kind"]
        # One field broken at a time, at random places.
        for _ in range(28 if kind == c.TRAINJOB_KIND else 50):
            what, broken = break_one(rng, base)
            p.cases.append(Case(f"{kind} {base['metadata']['name']}: {what}", broken))
        # Every CEL-guarded field the base has, with values its rules may refuse.
        for pattern, rules in cel_paths(schemas()[kind]):
            for path in concrete(base, pattern):
                if not path or path in PROTECTED:
                    continue
                value = get_at(base, path)
                if any("oldSelf" in r for r in rules):
                    continue  # transition rules: the updates below
                for bad in cel_breakers(value):
                    broken = copy.deepcopy(base)
                    set_at(broken, path, bad)
                    p.cases.append(Case(f"{kind} {base['metadata']['name']}: cel {path}={bad!r:.30}", broken))
        p.cases += combinations(base)

    # Updates: a valid object stored first, then an update of it (dry run).
    for base in bases:
        kind = base["kind"]
        if kind == c.CLUSTER_TRAINING_RUNTIME_KIND and not base["metadata"]["name"].startswith("d-"):
            continue
        base = copy.deepcopy(base)
        base["metadata"]["name"] = "u" + base["metadata"]["name"][1:]  # stored: not the creates' names
        key = f"{kind}/{base['metadata']['name']}"
        p.bases[key] = base
        for pattern, rules in cel_paths(schemas()[kind]):
            if not any("oldSelf" in r for r in rules):
                continue
            for path in concrete(base, pattern):
                if not path or path in PROTECTED:
                    continue
                update = copy.deepcopy(base)
                set_at(update, path, changed(get_at(base, path)))
                p.cases.append(Case(f"update {key}: immutable {path}", update, key))
            if len(pattern) >= 1 and pattern[-1] != "*":
                parent = pattern[:-1]
                for path in concrete(base, parent):
                    if isinstance(get_at(base, path), dict) and pattern[-1] not in get_at(base, path):
                        update = copy.deepcopy(base)
                        get_at(update, path)[pattern[-1]] = _value_for(pattern[-1])
                        p.cases.append(
                            Case(f"update {key}: set immutable {(*path, pattern[-1])}", update, key)
                        )
        for _ in range(8):
            what, broken = break_one(rng, base)
            broken["metadata"]["name"] = base["metadata"]["name"]
            p.cases.append(Case(f"update {key}: {what}", broken, key))
        if kind == c.TRAINJOB_KIND:
            p.cases += trainjob_updates(base, key)

    trainjobs = [trainjob_for(r, namespace, "hyp") for r in runtimes]
    renamed = [{**r, "metadata": {**r["metadata"], "name": "hyp"}} for r in runtimes]
    drawn = hypothesis_cases(trainjobs, 300, protect=2) + hypothesis_cases(renamed, 200, protect=3)
    for i, obj in enumerate(drawn):
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            # The namespace routes the request (PROTECTED): the strategy may change it.
            if obj["kind"] == c.CLUSTER_TRAINING_RUNTIME_KIND:
                meta.pop("namespace", None)
            else:
                meta["namespace"] = namespace
            if meta.get("name") == "hyp":
                meta["name"] = f"d-hyp-{i}"
        p.cases.append(Case(f"hypothesis #{i}", obj))
    return p


def _value_for(key: str) -> Any:
    return {"managedBy": "kueue.x-k8s.io/multikueue", "suspend": False}.get(key, {"x": "y"})


def combinations(base: Obj) -> list[Case]:
    """Combinations a CEL rule on a parent refuses."""
    name = base["metadata"]["name"]
    out: list[Case] = []
    spec = base.get("spec") or {}
    if base["kind"] in c.RUNTIME_KINDS:
        policy = spec.get("mlPolicy") or {}
        for extra in ("torch", "mpi", "jax", "xgboost", "flux"):
            if extra not in policy:
                two = copy.deepcopy(base)
                two["spec"].setdefault("mlPolicy", {})[extra] = {}
                out.append(Case(f"{base['kind']} {name}: policies + {extra}", two))
        jobs = spec["template"]["spec"]["replicatedJobs"]
        if len(jobs) > 1:
            ordered = copy.deepcopy(base)
            ordered["spec"]["template"]["spec"]["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
            ordered["spec"]["template"]["spec"]["replicatedJobs"][-1]["dependsOn"] = [
                {"name": jobs[0]["name"], "status": "Complete"}
            ]
            out.append(Case(f"{base['kind']} {name}: InOrder with dependsOn", ordered))
        claims = copy.deepcopy(base)
        claims["spec"]["template"]["spec"]["volumeClaimPolicies"] = [
            {"templates": [{"metadata": {"name": "data", "namespace": "elsewhere"}, "spec": {}}]}
        ]
        out.append(Case(f"{base['kind']} {name}: claim template with a namespace", claims))
        for i in range(len(jobs)):
            ancestor = copy.deepcopy(base)
            ancestor["spec"]["template"]["spec"]["replicatedJobs"][i]["replicas"] = 2
            out.append(Case(f"{base['kind']} {name}: replicas 2 of job {i}", ancestor))
            nameless = copy.deepcopy(base)
            pod = nameless["spec"]["template"]["spec"]["replicatedJobs"][i]["template"]["spec"]["template"]
            for container in pod["spec"]["containers"]:
                container["name"] = container["name"] + "-x"
            out.append(Case(f"{base['kind']} {name}: renamed containers of job {i}", nameless))
    else:
        for ref in ({"name": "nowhere"}, {"name": "torch-distributed", "kind": "TrainingRuntime"}):
            missing = copy.deepcopy(base)
            missing["spec"]["runtimeRef"] = ref
            out.append(Case(f"TrainJob {name}: runtimeRef {ref}", missing))
        reserved = copy.deepcopy(base)
        reserved["spec"].setdefault("trainer", {}).setdefault("env", []).append({"name": "PET_NODE_RANK"})
        out.append(Case(f"TrainJob {name}: reserved env", reserved))
        for value in (0, 2**31, 1.0):
            nproc = copy.deepcopy(base)
            nproc["spec"].setdefault("trainer", {})["numProcPerNode"] = value
            out.append(Case(f"TrainJob {name}: numProcPerNode {value}", nproc))
    return out


def trainjob_updates(base: Obj, key: str) -> list[Case]:
    """Updates the webhook rules (not CEL) govern: runtime patches, suspension."""
    out: list[Case] = []
    for suspend in (True, False):
        patched = copy.deepcopy(base)
        patched["spec"]["suspend"] = suspend
        patched["spec"]["runtimePatches"] = [{"manager": "example.com/other"}]
        out.append(Case(f"update {key}: new runtime patch, suspend={suspend}", patched, key))
        resumed = copy.deepcopy(base)
        resumed["spec"]["suspend"] = suspend
        out.append(Case(f"update {key}: suspend={suspend}", resumed, key))
    return out


# --- the two judges -----------------------------------------------------------------------------

ERROR_TYPES = "Invalid value|Required value|Unsupported value|Forbidden|Duplicate value|Too long|Too many|Internal error"
# One error a line (controller/webhooks.py); `[a, b]` is how upstream's webhooks join them.
_WEBHOOK_PATH = re.compile(rf"(?:^|\[|, |\n)([^\s,\[][^\s,]*?): (?:{ERROR_TYPES})")


def offline_verdict(obj: Obj, old: Obj | None, facts: Facts, framework: fw.Framework) -> Verdict:
    try:
        admit(copy.deepcopy(obj), copy.deepcopy(old), facts, framework, NOW, mode=Mode.FULL)
    except AdmissionError as exc:
        return Verdict(False, frozenset(e.path for e in exc.errors), "; ".join(map(str, exc.errors)))
    return Verdict(True)


def server_verdict(code: int, body: Obj) -> Verdict:
    if 200 <= code < 300:
        return Verdict(True)
    message = str(body.get("message", ""))
    denied = re.match(r'admission webhook "[^"]+" denied the request: (.*)', message, re.S)
    if denied:
        return Verdict(False, frozenset(_WEBHOOK_PATH.findall(denied.group(1))), message)
    if code == 400 and "strict decoding error" in message:
        return Verdict(False, frozenset(re.findall(r'unknown field "([^"]+)"', message)), message)
    # ObjectMeta is decoded into Go structs: the decoder names the field so.
    decoding = re.search(r"Go struct field ObjectMeta\.(\S+) of type", message)
    if code == 400 and decoding:
        return Verdict(False, frozenset({f"metadata.{decoding.group(1)}"}), message)
    if code == 400 and "Go value of type v1.ObjectMeta" in message:
        return Verdict(False, frozenset({"metadata"}), message)
    if code == 422:
        causes = (body.get("details") or {}).get("causes") or []
        return Verdict(False, frozenset(str(c.get("field", "")) for c in causes), message)
    return Verdict(False, frozenset({f"<HTTP {code}>"}), message)


class Server:
    """Dry runs over keep-alive HTTPS connections, one per thread."""

    def __init__(self, cluster: RealCluster) -> None:
        url = urllib.parse.urlsplit(cluster.server)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.tls = cluster._tls  # the admin's client certificate (the test's own credentials)
        self.local = threading.local()

    def request(self, method: str, path: str, body: Obj | None = None) -> tuple[int, Obj]:
        for attempt in range(3):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPSConnection(
                    self.host, self.port, context=self.tls, timeout=60
                )
            try:
                data = None if body is None else json.dumps(body)
                headers = {"Accept": "application/json", "Content-Type": "application/json"}
                conn.request(method, path, data, headers)
                response = conn.getresponse()
                raw = response.read()
                return response.status, (json.loads(raw) if raw else {})
            except (http.client.HTTPException, OSError):
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def collection(obj: Obj, namespace: str) -> str:
    kind = obj["kind"]
    base = f"/apis/{c.GROUP}/{c.VERSION}"
    if kind == c.CLUSTER_TRAINING_RUNTIME_KIND:
        return f"{base}/{PLURALS[kind]}"
    return f"{base}/namespaces/{namespace}/{PLURALS[kind]}"


# --- the test -----------------------------------------------------------------------------------


@pytest.fixture
def real_cluster(backend: str, request: pytest.FixtureRequest) -> RealCluster:
    if backend != "real":
        pytest.skip("differential admission compares with the real API server (--backend real)")
    cluster: RealCluster = request.getfixturevalue("cluster")
    return cluster


def test_offline_admission_agrees_with_the_api_server(real_cluster: RealCluster, tmp_path: Path) -> None:
    started = time.monotonic()
    cluster = real_cluster
    namespace = cluster.namespace
    the_plan = plan(namespace)
    assert len(the_plan.cases) >= MINIMUM, len(the_plan.cases)
    framework = fw.default()
    server = Server(cluster)

    # Offline: the bundled runtimes as the cluster has them, then ours.
    facts = Facts()
    for runtime in bundled_runtimes() + the_plan.runtimes:
        admitted, _ = admit(copy.deepcopy(runtime), None, facts, framework, NOW)
        facts.put(admitted)

    cluster.add_user(OPERATOR_USER, ["system:serviceaccounts"])
    cluster.grant(OPERATOR_USER)
    kubeconfig = cluster.write_kubeconfig(tmp_path / "operator.kubeconfig", user=OPERATOR_USER)
    with EmbeddedOperator(kubeconfig, Configuration(), [namespace], webhooks=True) as op:
        for runtime in the_plan.runtimes:
            cluster.create(copy.deepcopy(runtime))
        deadline = time.monotonic() + 30
        while any(
            op.operator.cache.get(c.TRAINING_RUNTIME_KIND, namespace, r["metadata"]["name"]) is None
            for r in the_plan.runtimes
        ):
            assert time.monotonic() < deadline, "the operator's cache did not see the TrainingRuntimes"
            time.sleep(0.1)

        # The stored bases of the updates: the server's copy, and ours (admitted offline).
        offline_old: dict[str, Obj] = {}
        for key, base in the_plan.bases.items():
            code, body = server.request("POST", collection(base, namespace), copy.deepcopy(base))
            assert code == 201, (key, code, body.get("message"))
            admitted, _ = admit(copy.deepcopy(base), None, facts, framework, NOW)
            offline_old[key] = admitted

        def judge(case: Case) -> tuple[Case, Verdict, Verdict]:
            old = offline_old.get(case.base) if case.base else None
            obj = case.obj
            if case.base is None:
                code, body = server.request(
                    "POST", collection(obj, namespace) + "?dryRun=All&fieldValidation=Strict", obj
                )
            else:
                item = (
                    collection(the_plan.bases[case.base], namespace)
                    + "/"
                    + the_plan.bases[case.base]["metadata"]["name"]
                )
                for _ in range(5):  # the operator may write the stored TrainJob's status meanwhile
                    _, stored = server.request("GET", item)
                    sent = copy.deepcopy(obj)
                    sent["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
                    code, body = server.request("PUT", item + "?dryRun=All&fieldValidation=Strict", sent)
                    if code != 409:
                        break
            return case, server_verdict(code, body), offline_verdict(obj, old, facts, framework)

        with ThreadPoolExecutor(max_workers=6) as pool:
            results = list(pool.map(judge, the_plan.cases))

    disagreements = []
    for case, theirs, ours in results:
        if theirs.accepted != ours.accepted or theirs.paths != ours.paths:
            disagreements.append(
                f"{case.label}\n  server:  {'accept' if theirs.accepted else 'refuse'} {sorted(theirs.paths)}"
                f" {theirs.detail[:300]}\n  offline: {'accept' if ours.accepted else 'refuse'}"
                f" {sorted(ours.paths)} {ours.detail[:300]}\n  object: {json.dumps(case.obj)[:3000]}"
            )
    accepted = sum(theirs.accepted for _, theirs, _ in results)
    by_webhook = sum("admission webhook" in theirs.detail for _, theirs, _ in results)
    agreed = len(results) - len(disagreements)
    print(
        f"\ndifferential admission: {len(results)} objects compared ({accepted} accepted by the server,"
        f" {by_webhook} refused by our webhook through it), "
        f"{agreed} agree, {len(disagreements)} disagree, in {time.monotonic() - started:.0f} s"
    )
    report = tmp_path / "disagreements.txt"
    report.write_text("\n".join(disagreements))
    assert not disagreements, f"{len(disagreements)} disagreements (all in {report}):\n" + "\n".join(
        disagreements[:40]
    )
    assert accepted >= 50, "nearly valid objects: some must be accepted, or the bases are broken"
    assert by_webhook >= 50, "the server must have called our webhook (registered by URL) and heard it refuse"
