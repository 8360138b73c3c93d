"""The container runtime of kwok's fake nodes, as far as logs go: what each container "prints".

kwok plays kubelet for the fake nodes (``stages.py`` moves their pods through their phases) and
its server answers the kubelet's ``/containerLogs``, which the API server calls for ``pods/log``
(``kubectl logs``, the Kubeflow SDK's ``get_job_logs``). It reads each container's log from the file
a ``Logs`` object (``kwok.x-k8s.io/v1alpha1``, one per pod, named as the pod) points at, in the CRI
format container runtimes write. Nothing in kwok writes those files, as on a real node the
runtime and not the kubelet does; this process does, from the pods the API server reports:

- when a pod is bound to a kwok node, one file per container with the lines the stand-in's
  simulated kubelet writes when it starts one (``trainer_sandbox.controllers.kubelet``): its
  image, its command and its args; and the pod's ``Logs`` object, owned by the pod so that the
  garbage collector removes it with the pod. Init containers get an empty file (nothing to say,
  as on the stand-in). A container's first lines are in its log before the kubelet reports it
  running, as on a real node, so a client that waits for Running and reads the log finds them;
- for each restart kwok reports (``restartCount`` up, ``lastState.terminated``), the line the
  stand-in writes when ``restartPolicy: OnFailure`` restarts a container;
- when kwok reports a container terminated, ``exited with code N`` with its exit code (which the
  stages computed from ``SANDBOX_EXIT_CODE``, or 137 for a pod killed on deletion); when a client
  sets the pod's phase while its containers run, the stand-in's ``... by a client status update``.

So the same env gives the same lines on both backends: the exit code and the moment come from
what kwok did, the rest from the pod's spec. When a pod is deleted its files are removed (its
``Logs`` object goes with it through the owner reference).

It runs as a component of the control plane (``kwok-logs``, started and stopped with the others),
as kwok's own client (the same certificate). One list, then a watch of bound pods; on any error it
lists again a second later, so a pod missed while disconnected is caught up on.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import shlex
import shutil
import ssl
import sys
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from trainer.api.objects import Obj
from trainer_sandbox.cluster.kube import KubeError, tls_context
from trainer_sandbox.cluster.stages import NODE_ANNOTATION, NODE_ANNOTATION_VALUE

LOGS_API = "/apis/kwok.x-k8s.io/v1alpha1"
WATCH_SECONDS = 300
REQUEST_TIMEOUT = 30.0
# Bound pods only: the scheduler's own filter for assigned pods, so pending ones cost nothing here.
_BOUND = "spec.nodeName!="


def start_lines(namespace: str, name: str, container: Obj) -> list[str]:
    """What the stand-in's kubelet logs when it starts ``container`` (its ``_start_pod``)."""
    lines = [
        f"[sandbox] pod {namespace}/{name} container {container['name']} image {container.get('image', '')}"
    ]
    if container.get("command"):
        lines.append("[sandbox] command: " + shlex.join(str(x) for x in container["command"]))
    if container.get("args"):
        lines.append("[sandbox] args: " + shlex.join(str(x) for x in container["args"]))
    return lines


def restart_line(code: int) -> str:
    return f"[sandbox] exited with code {code}; restarting (restartPolicy OnFailure)"


def exit_line(code: int) -> str:
    return f"[sandbox] exited with code {code}"


def client_line(phase: str) -> str:
    return f"[sandbox] {phase.lower()} by a client status update"


def cri_lines(lines: Iterable[str], now: dt.datetime | None = None) -> bytes:
    """``lines`` as a container runtime writes them (``<RFC 3339 time> stdout F <text>``), which is
    what kwok's log reader (``k8s.io/cri-client/pkg/logs``) parses. A line with newlines in it (a
    command with a script as an argument) is one record per line, as its output would be."""
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return "".join(f"{stamp} stdout F {part}\n" for line in lines for part in line.split("\n")).encode()


def append(path: Path, lines: Iterable[str]) -> None:
    """Append in one write: kwok may be reading the file, and must not see half a line."""
    data = cri_lines(lines)
    if data:
        with path.open("ab", buffering=0) as f:
            f.write(data)


class _Api:
    """JSON over one kept-alive HTTPS connection (a handshake per write would cost more than the
    write), opened again after an error; watches get connections of their own."""

    def __init__(self, server: str, ctx: ssl.SSLContext) -> None:
        url = urllib.parse.urlsplit(server)
        self.host = url.hostname or "127.0.0.1"
        self.port = url.port or 443
        self.ctx = ctx
        self._conn: http.client.HTTPSConnection | None = None

    def _connect(self, timeout: float) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def request(self, method: str, path: str, body: Obj | None = None) -> Obj:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self._conn is None:
            self._conn = self._connect(REQUEST_TIMEOUT)
        try:
            self._conn.request(method, path, body=data, headers=headers)
            response = self._conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException):
            self._conn.close()
            self._conn = None
            raise
        if response.status >= 300:
            raise KubeError(response.status, _message(raw))
        answer: Obj = json.loads(raw) if raw else {}
        return answer

    def stream(self, path: str) -> Iterator[Obj]:
        """The events of a watch, until the server ends it."""
        conn = self._connect(WATCH_SECONDS + REQUEST_TIMEOUT)
        try:
            conn.request("GET", path, headers={"Accept": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                raise KubeError(response.status, _message(response.read()))
            for line in response:
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()


def _message(raw: bytes) -> str:
    text = raw.decode(errors="replace")
    try:
        return str(json.loads(text).get("message") or text)
    except (ValueError, AttributeError):
        return text


@dataclass
class _Container:
    path: Path
    restarts: int = 0  # restarts already logged
    ended: bool = False


@dataclass
class _Pod:
    namespace: str
    name: str
    directory: Path
    files: dict[str, Path]  # every container, init containers included: what the Logs object names
    containers: dict[str, _Container] = field(default_factory=dict)  # the ones that print
    registered: bool = False  # its Logs object exists


class PodLogs:
    """Keeps every kwok pod's log files as its status says its containers ran."""

    def __init__(self, api: _Api, root: Path) -> None:
        self.api = api
        self.root = root
        self.pods: dict[str, _Pod] = {}
        self.kwok_nodes: dict[str, bool] = {}

    def run(self, ready: Path | None = None) -> None:
        """List, watch, and list again after any error; never returns."""
        while True:
            try:
                version = self.resync()
                if ready is not None:
                    ready.touch()
                while version:
                    version = self.watch(version)
            except (OSError, http.client.HTTPException, KubeError, ValueError) as e:
                print(f"kwok-logs: {type(e).__name__}: {e}; listing pods again in 1 s", flush=True)
                time.sleep(1)

    def resync(self) -> str:
        """Observe every bound pod, forget those gone; returns the list's resourceVersion."""
        listing = self.api.request("GET", "/api/v1/pods?" + urllib.parse.urlencode({"fieldSelector": _BOUND}))
        seen = set()
        for pod in listing.get("items") or []:
            seen.add(pod["metadata"]["uid"])
            self.observe(pod)
        for uid in set(self.pods) - seen:
            self.forget(uid)
        return str(listing["metadata"]["resourceVersion"])

    def watch(self, version: str) -> str:
        """Follow pod events from ``version``; returns where to go on from, "" to list again."""
        query = urllib.parse.urlencode(
            {
                "fieldSelector": _BOUND,
                "watch": "true",
                "resourceVersion": version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(WATCH_SECONDS),
            }
        )
        for event in self.api.stream(f"/api/v1/pods?{query}"):
            kind = event.get("type")
            obj = event.get("object") or {}
            if kind == "ERROR":  # 410 Expired and the like: start over from a list
                print(f"kwok-logs: watch ended: {obj.get('message', obj)}", flush=True)
                return ""
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if kind == "DELETED":
                self.forget(str(obj["metadata"]["uid"]))
            elif kind in ("ADDED", "MODIFIED"):
                self.observe(obj)
        return version

    def observe(self, pod: Obj) -> None:
        """Bring the pod's files up to what its status says happened."""
        meta = pod["metadata"]
        uid = str(meta["uid"])
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        if not node or not self._on_kwok_node(str(node)):
            return
        state = self.pods.get(uid)
        if state is None:
            state = self._start(pod)
            self.pods[uid] = state
        if not state.registered:
            self._register(pod, state)
        status = pod.get("status") or {}
        phase = str(status.get("phase") or "")
        statuses = {str(s.get("name")): s for s in status.get("containerStatuses") or []}
        for name, container in state.containers.items():
            current = statuses.get(name) or {}
            lines: list[str] = []
            restarts = int(current.get("restartCount") or 0)
            last = ((current.get("lastState") or {}).get("terminated") or {}).get("exitCode")
            while container.restarts < restarts:
                lines.append(restart_line(int(last or 0)))
                container.restarts += 1
            terminated = (current.get("state") or {}).get("terminated")
            if not container.ended and terminated is not None:
                lines.append(exit_line(int(terminated.get("exitCode") or 0)))
                container.ended = True
            elif not container.ended and phase in ("Succeeded", "Failed"):
                lines.append(client_line(phase))
                container.ended = True
            append(container.path, lines)

    def forget(self, uid: str) -> None:
        """The pod is gone: so are its files, as the kubelet removes a deleted pod's logs."""
        state = self.pods.pop(uid, None)
        if state is not None:
            shutil.rmtree(state.directory, ignore_errors=True)

    def _start(self, pod: Obj) -> _Pod:
        meta = pod["metadata"]
        namespace, name = str(meta["namespace"]), str(meta["name"])
        directory = self.root / f"{namespace}_{name}_{meta['uid']}"  # as under /var/log/pods
        directory.mkdir(parents=True, exist_ok=True)
        state = _Pod(namespace, name, directory, {})
        spec = pod.get("spec") or {}
        for container in spec.get("initContainers") or []:
            path = directory / f"{container['name']}.log"
            path.touch()
            state.files[str(container["name"])] = path
        for container in spec.get("containers") or []:
            path = directory / f"{container['name']}.log"
            path.touch()
            append(path, start_lines(namespace, name, container))
            state.files[str(container["name"])] = path
            state.containers[str(container["name"])] = _Container(path)
        return state

    def _register(self, pod: Obj, state: _Pod) -> None:
        """Create the pod's ``Logs`` object (or take over a stale one of an earlier pod of that
        name). A namespace being deleted refuses it (403, 404): the pod goes with it anyway."""
        meta = pod["metadata"]
        body: Obj = {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Logs",
            "metadata": {
                "name": state.name,
                "namespace": state.namespace,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": state.name, "uid": str(meta["uid"])}
                ],
            },
            "spec": {"logs": [{"containers": [c], "logsFile": str(p)} for c, p in state.files.items()]},
        }
        collection = f"{LOGS_API}/namespaces/{state.namespace}/logs"
        try:
            for _ in range(3):  # a namesake's stale object, removed by the collector meanwhile: again
                body["metadata"].pop("resourceVersion", None)  # a create carries none
                try:
                    self.api.request("POST", collection, body)
                    break
                except KubeError as e:
                    if e.status != 409:
                        raise
                try:
                    current = self.api.request("GET", f"{collection}/{state.name}")
                    owners = current["metadata"].get("ownerReferences") or []
                    if not any(o.get("uid") == meta["uid"] for o in owners):
                        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                        self.api.request("PUT", f"{collection}/{state.name}", body)
                    break
                except KubeError as e:
                    if e.status not in (404, 409):
                        raise
        except KubeError as e:
            if e.status not in (403, 404):
                raise
            print(f"kwok-logs: no Logs for {state.namespace}/{state.name}: {e}", flush=True)
        state.registered = True

    def _on_kwok_node(self, node: str) -> bool:
        known = self.kwok_nodes.get(node)
        if known is None:
            try:
                obj = self.api.request("GET", f"/api/v1/nodes/{node}")
            except KubeError as e:
                if e.status == 404:
                    return False  # not (yet) a node: asked again next time
                raise
            annotations = obj["metadata"].get("annotations") or {}
            known = annotations.get(NODE_ANNOTATION) == NODE_ANNOTATION_VALUE
            self.kwok_nodes[node] = known
        return known


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_sandbox.cluster.podlogs", description=__doc__)
    parser.add_argument("--server", required=True, help="the API server's URL")
    parser.add_argument("--ca", type=Path, required=True, help="the cluster CA's certificate")
    parser.add_argument("--cert", type=Path, required=True, help="the client certificate (kwok's)")
    parser.add_argument("--key", type=Path, required=True, help="its key")
    parser.add_argument("--dir", type=Path, required=True, help="where the log files go")
    parser.add_argument("--ready", type=Path, help="a file touched once the first list is done")
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    api = _Api(args.server, tls_context(args.ca, args.cert, args.key))
    print(f"kwok-logs: writing pod logs under {args.dir}", flush=True)
    PodLogs(api, args.dir.resolve()).run(args.ready)
    return 0


if __name__ == "__main__":
    sys.exit(main())
