"""Protobuf request bodies: the decoder, against the bytes kubectl really sends, and the stand-in's
create, update and delete endpoints with protobuf bodies.

The golden tests run kubectl against a recorder (plain HTTP on loopback) that keeps the body of each
``kubectl create <subcommand>`` and compare its decoding with what the same kubectl prints for the
same command with ``--dry-run=client -o json``: Go's JSON of the same object, so both sides come
from client-go, not from us. The only allowed difference is ``creationTimestamp: null``: the kubectl
builds here predate ``omitzero`` on it, which the v1.36 types the stand-in follows carry.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubectl_json import without_null_creation_timestamps
from trainer_sandbox import gen_k8s_protobuf
from trainer_sandbox.apiserver import LocalAPIServer, discovery, protobuf
from trainer_sandbox.apiserver.resources import Registry, builtin_types
from trainer_sandbox.apiserver.tls import serving_cert

CORE = "k8s.io.api.core.v1."
META = "k8s.io.apimachinery.pkg.apis.meta.v1."


# -- a minimal encoder, for bodies kubectl never sends -----------------------------------------------


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative numbers: ten bytes of two's complement, as Go writes int32/64
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def num(message: str, json_name: str) -> int:
    """A field's number, looked up in the table by its JSON name (the tests then read as JSON)."""
    for f in protobuf.decoder().messages[message]:
        if f.name == json_name:
            return f.number
    raise KeyError(f"{message}.{json_name}")


def ld(number: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def vi(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def entry(number: int, key: str, value: bytes | str) -> bytes:
    return ld(number, ld(1, key) + ld(2, value))


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    return protobuf.MAGIC + ld(1, ld(1, api_version) + ld(2, kind)) + ld(2, raw)


def meta(name: str, **extra: bytes) -> bytes:
    """ObjectMeta as gogo writes it: every string field, empty or not, and the zero generation."""
    m = META + "ObjectMeta"
    body = ld(num(m, "name"), name)
    for field in ("generateName", "namespace", "selfLink", "uid", "resourceVersion"):
        body += extra.get(field) or ld(num(m, field), "")
    return body + vi(num(m, "generation"), 0) + ld(num(m, "creationTimestamp"), b"")


# -- the decoder -----------------------------------------------------------------------------------


def test_zero_values_are_written_as_go_writes_them() -> None:
    decode = protobuf.decode
    # omitempty: no data; a struct is never empty (spec, status); a nil slice without omitempty is null.
    assert decode(envelope("v1", "ConfigMap", ld(1, meta("c")))) == {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {"name": "c"},
    }
    assert decode(envelope("v1", "Namespace", ld(1, meta("n")))) == {
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": {"name": "n"},
        "spec": {},
        "status": {},
    }
    role = decode(envelope("rbac.authorization.k8s.io/v1", "Role", ld(1, meta("r"))))
    assert role["rules"] is None
    # A pointer that is set is written even when zero: immutable false, replicas 0.
    secret = CORE + "Secret"
    body = ld(1, meta("s")) + vi(num(secret, "immutable"), 0) + entry(num(secret, "data"), "k", b"\x00\xff")
    assert decode(envelope("v1", "Secret", body))["immutable"] is False
    assert decode(envelope("v1", "Secret", body))["data"] == {"k": base64.b64encode(b"\x00\xff").decode()}
    spec = "k8s.io.api.apps.v1.DeploymentSpec"
    deployment = decode(envelope("apps/v1", "Deployment", ld(2, vi(num(spec, "replicas"), 0))))
    assert deployment["spec"]["replicas"] == 0
    assert deployment["spec"]["template"] == {"metadata": {}, "spec": {"containers": None}}


def test_types_that_write_their_own_json() -> None:
    event = CORE + "Event"
    time = META + "Time"
    body = (
        ld(1, meta("e"))
        + ld(num(event, "firstTimestamp"), vi(1, 1704164645) + vi(2, 999))  # nanos are dropped
        + ld(num(event, "lastTimestamp"), b"")  # the zero time
        + ld(num(event, "eventTime"), vi(1, -62135596800))  # the zero time, in seconds (a MicroTime)
        + vi(num(event, "count"), -3)
    )
    decoded = protobuf.decode(envelope("v1", "Event", body))
    assert decoded["firstTimestamp"] == "2024-01-02T03:04:05Z"
    assert decoded["lastTimestamp"] is None
    assert decoded["count"] == -3
    assert decoded["eventTime"] is None
    deletion = ld(num(META + "ObjectMeta", "deletionTimestamp"), vi(1, -62135596800))
    assert protobuf.decode(envelope("v1", "Event", ld(1, deletion)))["metadata"] == {
        "deletionTimestamp": None
    }
    assert "creationTimestamp" not in decoded["metadata"]  # omitzero
    assert num(time, "seconds") == 1
    lease = "k8s.io.api.coordination.v1.LeaseSpec"
    micro = ld(num(lease, "acquireTime"), vi(1, 1704164645) + vi(2, 123456789))
    spec = protobuf.decode(envelope("coordination.k8s.io/v1", "Lease", ld(2, micro)))["spec"]
    assert spec == {"acquireTime": "2024-01-02T03:04:05.123456Z"}
    # Quantities are written canonical; IntOrString as a number or a string.
    hard = num(CORE + "ResourceQuotaSpec", "hard")
    quota = ld(
        2,
        entry(hard, "cpu", ld(1, "1000m")) + entry(hard, "memory", ld(1, "1.5Gi")) + entry(hard, "pods", b""),
    )
    assert protobuf.decode(envelope("v1", "ResourceQuota", quota))["spec"]["hard"] == {
        "cpu": "1",
        "memory": "1536Mi",
        "pods": "0",
    }
    port = CORE + "ServicePort"
    ports = vi(num(port, "port"), 80) + ld(num(port, "targetPort"), vi(1, 1) + ld(3, "http"))
    ports2 = ld(num(port, "targetPort"), vi(1, 0) + vi(2, 8080))
    service = ld(
        2, ld(num(CORE + "ServiceSpec", "ports"), ports) + ld(num(CORE + "ServiceSpec", "ports"), ports2)
    )
    decoded_ports = protobuf.decode(envelope("v1", "Service", service))["spec"]["ports"]
    assert [p["targetPort"] for p in decoded_ports] == ["http", 8080]


def test_wire_format_details() -> None:
    pc = "k8s.io.api.scheduling.v1.PriorityClass"
    # A negative int32 is ten bytes; unknown fields are skipped; the last of a scalar wins.
    body = ld(1, meta("pc")) + vi(num(pc, "value"), 7) + vi(99, 1) + ld(98, "x") + vi(num(pc, "value"), -5)
    assert protobuf.decode(envelope("scheduling.k8s.io/v1", "PriorityClass", body))["value"] == -5
    # Repeated int32, unpacked (as gogo writes it) or packed: the same list.
    requirement = "k8s.io.api.batch.v1.PodFailurePolicyOnExitCodesRequirement"
    values = num(requirement, "values")
    unpacked = vi(values, 1) + vi(values, 42)
    packed = ld(values, _varint(1) + _varint(42))
    for encoded in (unpacked, packed):
        rule = ld(num("k8s.io.api.batch.v1.PodFailurePolicyRule", "onExitCodes"), encoded)
        policy = ld(num("k8s.io.api.batch.v1.PodFailurePolicy", "rules"), rule)
        job = ld(2, ld(num("k8s.io.api.batch.v1.JobSpec", "podFailurePolicy"), policy))
        spec = protobuf.decode(envelope("batch/v1", "Job", job))["spec"]
        assert spec["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] == [1, 42]
    # A message given twice is merged (proto's rule, and gogo's Unmarshal into the same struct).
    merged = ld(1, ld(num(META + "ObjectMeta", "name"), "c")) + ld(
        1, ld(num(META + "ObjectMeta", "namespace"), "n")
    )
    assert protobuf.decode(envelope("v1", "ConfigMap", merged))["metadata"] == {"name": "c", "namespace": "n"}
    # An inlined embedded struct (Volume's VolumeSource) puts its fields in the outer object.
    volume = ld(1, "v") + ld(2, ld(num(CORE + "VolumeSource", "emptyDir"), b""))
    pod = ld(2, ld(num(CORE + "PodSpec", "volumes"), volume))
    assert protobuf.decode(envelope("v1", "Pod", pod))["spec"]["volumes"] == [{"name": "v", "emptyDir": {}}]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{}", "expected prefix"),
        (protobuf.MAGIC + ld(2, b""), "Kind"),
        (envelope("v1", "ConfigMap", ld(1, b"\x0a\x05ab")), "unexpected end"),
        (envelope("v1", "ConfigMap", vi(1, 3)), "wrong wire type"),
        (protobuf.MAGIC + ld(1, ld(1, "v1") + ld(2, "ConfigMap")) + ld(3, "gzip"), "content encoding"),
    ],
)
def test_malformed_bodies_are_refused(body: bytes, message: str) -> None:
    with pytest.raises(protobuf.DecodeError, match=message):
        protobuf.decode(body)


def test_a_map_value_of_the_wrong_wire_type_is_a_decode_error() -> None:
    """A message-typed map value (a Quantity in a ResourceList) sent as a varint: a 400, not a crash."""
    limits = ld(num(CORE + "ResourceRequirements", "limits"), ld(1, "cpu") + vi(2, 5))
    container = ld(1, "c") + ld(num(CORE + "Container", "resources"), limits)
    pod = ld(2, ld(num(CORE + "PodSpec", "containers"), container))
    with pytest.raises(protobuf.DecodeError, match="wrong wire type"):
        protobuf.decode(envelope("v1", "Pod", pod))


def test_unknown_kinds_are_named() -> None:
    with pytest.raises(protobuf.UnsupportedKind, match=r"example\.com/v1 Widget"):
        protobuf.decode(envelope("example.com/v1", "Widget", b""))
    # DeleteOptions comes under any group-version.
    options = protobuf.decode(envelope("batch/v1", "DeleteOptions", ld(4, "Foreground") + ld(5, "All")))
    assert options == {
        "kind": "DeleteOptions",
        "apiVersion": "batch/v1",
        "propagationPolicy": "Foreground",
        "dryRun": ["All"],
    }


def test_go_duration() -> None:
    cases = {
        0: "0s",
        1500: "1.5µs",
        2_500_000: "2.5ms",
        3_723_500_000_000: "1h2m3.5s",
        3600 * 10**9: "1h0m0s",
    }
    for nanos, text in cases.items():
        assert protobuf.go_duration(nanos) == text
        if nanos:
            assert protobuf.go_duration(-nanos) == "-" + text


def test_every_served_builtin_kind_has_a_message() -> None:
    for rt in builtin_types():
        assert protobuf.decoder().message_for(rt.api_version, rt.kind), rt.kind


def test_protobuf_table_is_current() -> None:
    """The committed table is what the generator derives from the Go module cache; where the
    modules are not downloaded, only the committed file is checked (by the other tests)."""
    modcache = gen_k8s_protobuf.default_modcache()
    version = gen_k8s_protobuf.STAGING_VERSION
    if not all((modcache / f"{m}@{version}").is_dir() for m in gen_k8s_protobuf.MODULES):
        pytest.skip(f"the Go modules {gen_k8s_protobuf.MODULES} @{version} are not in {modcache}")
    fresh = gen_k8s_protobuf.build(modcache)
    committed = gen_k8s_protobuf.decode(gen_k8s_protobuf.OUTPUT.read_bytes())
    assert committed == fresh, "run: python -m trainer_sandbox.gen_k8s_protobuf"


def test_generator_reads_tags_and_refuses_unhandled_custom_json(tmp_path: Path) -> None:
    package = tmp_path / f"k8s.io/api@{gen_k8s_protobuf.STAGING_VERSION}" / "demo" / "v1"
    package.mkdir(parents=True)
    (package / "generated.proto").write_text(
        """syntax = "proto2";
package k8s.io.api.demo.v1;
option go_package = "k8s.io/api/demo/v1";
/* the license */
message Widget {
  // a comment
  optional string name = 1;
  map<string, bytes> blobs = 3;
  optional Base base = 2;
  repeated Stamp stamps = 4;
}
message Base {
  optional int32 size = 1;
}
message Stamp {
  optional int64 at = 1;
}
"""
    )
    (package / "types.go").write_text(
        """package v1

type Widget struct {
	metav1.TypeMeta `json:",inline"`
	Base `json:",inline" protobuf:"bytes,2,opt,name=base"`
	// Name names it.
	Name *string `json:"name,omitempty" protobuf:"bytes,1,opt,name=name"` // trailing
	Blobs map[string][]byte `json:"blobs" protobuf:"bytes,3,rep,name=blobs"`
	Stamps []Stamp `json:"stamps,omitzero" protobuf:"bytes,4,rep,name=stamps"`
	cache string
}

type Base struct {
	Size int32 `json:"size" protobuf:"varint,1,opt,name=size"`
}

type Stamp struct {
	At int64 `json:"at" protobuf:"varint,1,opt,name=at"`
}

func (s Stamp) MarshalJSON() ([]byte, error) { return nil, nil }
"""
    )
    sources = gen_k8s_protobuf.Sources(tmp_path)
    sources.load("k8s.io/api/demo/v1")
    assert gen_k8s_protobuf.message_fields(sources, "k8s.io.api.demo.v1.Widget") == [
        [2, "", "k8s.io.api.demo.v1.Base", "i"],
        [1, "name", "string", "po"],
        [3, "blobs", ["string", "bytes"], ""],
        [4, "stamps", "k8s.io.api.demo.v1.Stamp", "rz"],
    ]
    with pytest.raises(gen_k8s_protobuf.ProtobufSourceError, match="MarshalJSON"):
        gen_k8s_protobuf.message_fields(sources, "k8s.io.api.demo.v1.Stamp")


# -- what kubectl sends ----------------------------------------------------------------------------


class _Recorder(ThreadingHTTPServer):
    """Serves /version and discovery (as the stand-in does: ``kubectl create role`` maps its
    resources) and keeps every POST; answers it with ``reply``, the object kubectl printed for the
    same command in a client-side dry run."""

    reply: dict[str, Any] = {}

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _RecorderHandler)
        self.posts: list[tuple[str, str, str, bytes]] = []
        self.registry = Registry()


class _RecorderHandler(BaseHTTPRequestHandler):
    server: _Recorder

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, doc: Any) -> None:
        data = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        parts = path.strip("/").split("/")
        registry = self.server.registry
        doc: Any = None
        if path == "/version":
            doc = discovery.version_info(32)
        elif path == "/api":
            doc = discovery.api_versions("127.0.0.1")
        elif path == "/apis":
            doc = discovery.api_group_list(registry)
        elif parts[0] == "api" and len(parts) == 2:
            doc = discovery.resource_list(registry, "", parts[1])
        elif parts[0] == "apis" and len(parts) == 3:
            doc = discovery.resource_list(registry, parts[1], parts[2])
        if doc is None:
            self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})
        else:
            self._send(200, doc)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.posts.append(
            (self.path, self.headers["Content-Type"], self.headers.get("User-Agent", ""), body)
        )
        self._send(201, self.server.reply)


@pytest.fixture(scope="module")
def recorder() -> Iterator[_Recorder]:
    server = _Recorder()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("kubectl-create")
    cert = serving_cert()
    (directory / "tls.crt").write_bytes(cert.cert_pem)
    (directory / "tls.key").write_bytes(cert.key_pem)
    (directory / "blob").write_bytes(b"\xff\x00\x01 not UTF-8")
    (directory / "kubeconfig").write_text("")
    return directory


# Every `kubectl create` subcommand but `token` (a subresource, TokenRequest), the stored kinds and
# those the stand-in does not serve (ResourceQuota, CronJob, Ingress); "{files}" is a directory of
# inputs.
KUBECTL_CREATE = {
    "namespace": ["namespace", "ns1"],
    "configmap": ["configmap", "cm1", "--from-literal=a=b", "--from-file=blob={files}/blob"],
    "secret-generic": ["secret", "generic", "s1", "--from-literal=k=v"],
    "secret-tls": ["secret", "tls", "t1", "--cert={files}/tls.crt", "--key={files}/tls.key"],
    "secret-docker-registry": [
        *("secret", "docker-registry", "dr1", "--docker-server=r.io"),
        *("--docker-username=u", "--docker-password=p", "--docker-email=e@x.io"),
    ],
    "serviceaccount": ["serviceaccount", "sa1"],
    "role": ["role", "r1", "--verb=get,list", "--resource=pods,deployments.apps", "--resource-name=x"],
    "rolebinding": ["rolebinding", "rb1", "--role=r1", "--user=u", "--group=g", "--serviceaccount=ns:sa1"],
    "clusterrole": ["clusterrole", "cr1", "--verb=get", "--non-resource-url=/logs/*"],
    "clusterrole-aggregated": ["clusterrole", "cr2", "--aggregation-rule=example.com/aggregate=true"],
    "clusterrolebinding": ["clusterrolebinding", "crb1", "--clusterrole=cr1", "--user=u"],
    "priorityclass": ["priorityclass", "pc1", "--value=1000", "--description=d", "--preemption-policy=Never"],
    "priorityclass-negative": ["priorityclass", "pc2", "--value=-5", "--global-default"],
    "deployment": [
        "deployment",
        "d1",
        "--image=nginx:1.27",
        "--image=busybox",
        "--replicas=3",
        "--port=8080",
    ],
    "deployment-zero": ["deployment", "d0", "--image=nginx", "--replicas=0"],
    "job": ["job", "j1", "--image=busybox", "--", "sh", "-c", "echo hi"],
    "cronjob": [
        "cronjob",
        "cj1",
        "--image=busybox",
        "--schedule=*/5 * * * *",
        "--restart=OnFailure",
        "--",
        "date",
    ],
    "ingress": [
        *("ingress", "ing1", "--class=nginx", "--rule=foo.com/bar*=svc1:8080,tls=my-cert"),
        *("--annotation=a=b", "--default-backend=defsvc:http"),
    ],
    "poddisruptionbudget-int": ["poddisruptionbudget", "pdb1", "--selector=app=x", "--max-unavailable=1"],
    "poddisruptionbudget-percent": ["poddisruptionbudget", "pdb2", "--selector=app=x", "--min-available=50%"],
    "quota": ["quota", "q1", "--hard=cpu=1500m,memory=1Gi,pods=2", "--scopes=BestEffort"],
    "service-clusterip": ["service", "clusterip", "svc1", "--tcp=80:8080", "--tcp=443:https"],
    "service-headless": ["service", "clusterip", "svc2", "--clusterip=None"],
    "service-nodeport": ["service", "nodeport", "np1", "--tcp=80:8080", "--node-port=30080"],
    "service-loadbalancer": ["service", "loadbalancer", "lb1", "--tcp=80:8080"],
    "service-externalname": ["service", "externalname", "en1", "--external-name=example.com"],
}


def _protobuf_kubectls() -> dict[str, str]:
    """The kubectl builds to try, by version: the gcloud SDK's versioned binaries beside PATH's
    kubectl (its dispatcher), 1.32 and later (up to 1.31 kubectl sent these bodies as JSON); else
    PATH's kubectl itself."""
    program = shutil.which("kubectl")
    if program is None:
        return {}
    versioned = {
        p.name.removeprefix("kubectl."): p for p in Path(program).resolve().parent.glob("kubectl.1.*")
    }
    if versioned:
        return {v: str(p) for v, p in sorted(versioned.items()) if int(v.split(".")[1]) >= 32}
    return {"kubectl": program}


KUBECTLS = _protobuf_kubectls()


@pytest.mark.parametrize("version", sorted(KUBECTLS) or ["none"])
@pytest.mark.parametrize("case", sorted(KUBECTL_CREATE))
def test_decoding_matches_kubectl_json(
    recorder: _Recorder, files: Path, tmp_path: Path, case: str, version: str
) -> None:
    """What ``kubectl create`` sends, decoded, is what the same kubectl writes as JSON."""
    if version not in KUBECTLS:
        pytest.skip("kubectl is not installed on this machine")
    args = [a.replace("{files}", str(files)) for a in KUBECTL_CREATE[case]]
    base = [KUBECTLS[version], "--server", f"http://127.0.0.1:{recorder.server_port}", "create"]
    env = {**os.environ, "HOME": str(tmp_path), "KUBECONFIG": str(files / "kubeconfig")}

    def run(*extra: str) -> str:
        proc = subprocess.run([*base, *extra, *args], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    expected = json.loads(run("--dry-run=client", "-o", "json"))
    recorder.reply = expected
    recorder.posts.clear()
    run()
    [(_, content_type, user_agent, body)] = recorder.posts
    if content_type != protobuf.CONTENT_TYPE and version == "kubectl":
        pytest.skip(f"{user_agent} sends {content_type}, not protobuf")
    assert content_type == protobuf.CONTENT_TYPE
    assert protobuf.decode(body) == without_null_creation_timestamps(expected)


# -- the stand-in's endpoints ----------------------------------------------------------------------


def _request(
    server: LocalAPIServer, method: str, path: str, body: bytes, content_type: str = protobuf.CONTENT_TYPE
) -> tuple[int, dict[str, Any]]:
    context = ssl.create_default_context(cadata=server.ca_pem.decode())
    conn = http.client.HTTPSConnection(server.host, server.port, context=context, timeout=30)
    try:
        headers = {
            "Authorization": f"Bearer {server.users['admin']}",
            "Content-Type": content_type,
            "Accept": "application/vnd.kubernetes.protobuf, application/json",
        }
        conn.request(method, path, body, headers)
        response = conn.getresponse()
        assert response.getheader("Content-Type") == "application/json"
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def _configmap(name: str, value: str, resource_version: str = "") -> bytes:
    cm = CORE + "ConfigMap"
    rv = {"resourceVersion": ld(num(META + "ObjectMeta", "resourceVersion"), resource_version)}
    return envelope("v1", "ConfigMap", ld(1, meta(name, **rv)) + entry(num(cm, "data"), "a", value))


def test_create_update_and_delete_with_protobuf_bodies(apiserver: LocalAPIServer) -> None:
    path = "/api/v1/namespaces/default/configmaps"
    status, created = _request(apiserver, "POST", path, _configmap("c", "1"))
    assert status == 201, created
    assert created["data"] == {"a": "1"}
    assert created["metadata"]["managedFields"][0]["fieldsV1"] == {"f:data": {"f:a": {}}}
    rv = created["metadata"]["resourceVersion"]
    status, updated = _request(apiserver, "PUT", f"{path}/c", _configmap("c", "2", rv))
    assert status == 200, updated
    assert apiserver.get("v1", "ConfigMap", "c")["data"] == {"a": "2"}
    # DeleteOptions as a typed client sends them: a dry run deletes nothing.
    options = envelope("v1", "DeleteOptions", ld(num(META + "DeleteOptions", "dryRun"), "All"))
    status, _ = _request(apiserver, "DELETE", f"{path}/c", options)
    assert status == 200
    assert apiserver.get("v1", "ConfigMap", "c")["data"] == {"a": "2"}
    status, _ = _request(apiserver, "DELETE", f"{path}/c", envelope("v1", "DeleteOptions", b""))
    assert status == 200
    assert not apiserver.list("v1", "ConfigMap")
    writes = {
        (r.verb, r.content_type)
        for r in apiserver.audit.select(resource="configmaps")
        if r.verb in ("create", "update", "delete")
    }
    assert writes == {(verb, protobuf.CONTENT_TYPE) for verb in ("create", "update", "delete")}


def test_protobuf_bodies_that_cannot_be_read(trainer_apiserver: LocalAPIServer) -> None:
    server = trainer_apiserver
    status, err = _request(server, "POST", "/api/v1/namespaces/default/configmaps", b"k8s\x00\x0a\x05")
    assert (status, err["reason"]) == (400, "BadRequest")
    assert "error decoding request body" in err["message"]
    # A kind the table has no message for, and a custom kind: 415, naming JSON as accepted.
    widget = envelope("example.com/v1", "Widget", b"")
    status, err = _request(server, "POST", "/api/v1/namespaces/default/configmaps", widget)
    assert (status, err["reason"]) == (415, "UnsupportedMediaType")
    assert "application/json" in err["message"] and "example.com/v1 Widget" in err["message"]
    trainjobs = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs"
    status, err = _request(
        server, "POST", trainjobs, envelope("trainer.kubeflow.org/v1alpha1", "TrainJob", b"")
    )
    assert (status, err["reason"]) == (415, "UnsupportedMediaType")
    assert "accepted media types include: application/json, application/yaml (got " in err["message"]
    # CBOR stays a 415 (client-go then falls back to JSON), listing protobuf for a built-in kind.
    status, err = _request(
        server, "POST", "/api/v1/namespaces/default/configmaps", b"\xa0", "application/cbor"
    )
    assert status == 415
    assert "application/vnd.kubernetes.protobuf (got application/cbor)" in err["message"]


def test_delete_options_in_protobuf_for_a_custom_kind(trainer_apiserver: LocalAPIServer) -> None:
    """A typed client deleting a custom resource sends its DeleteOptions as protobuf too."""
    server = trainer_apiserver
    group = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "g", "namespace": "default"},
        "spec": {"minMember": 1},
    }
    server.create(group)
    path = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/default/podgroups/g"
    dry_run = envelope("scheduling.x-k8s.io/v1alpha1", "DeleteOptions", ld(5, "All"))
    status, _ = _request(server, "DELETE", path, dry_run)
    assert status == 200
    assert server.list("scheduling.x-k8s.io/v1alpha1", "PodGroup")
    status, err = _request(server, "DELETE", path, envelope("v1", "ConfigMap", b""))
    assert (status, err["message"]) == (400, "a delete takes DeleteOptions, not ConfigMap")
    status, _ = _request(server, "DELETE", path, envelope("v1", "DeleteOptions", b""))
    assert status == 200
    assert not server.list("scheduling.x-k8s.io/v1alpha1", "PodGroup")
