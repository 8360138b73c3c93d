"""The kwok Stages that play kubelet for the fake nodes, steered like the stand-in's JobSet simulator.

A pod's fate comes from the env of its container named ``node`` (else its first container), the
same control surface as the stand-in's kubelet (``trainer_sandbox.controllers.kubelet``):

- ``SANDBOX_RUN_SECONDS`` (default 2): how long the pod stays Running; negative: until something
  else ends it. Unparseable: the default. kwok delays are durations, so the value is rounded to the
  nearest millisecond (``0.1`` -> ``100ms``, ``0.0004`` -> ``0ms``) and capped at 10^12 ms.
- ``SANDBOX_EXIT_CODE`` (default 0): 0 succeeds; any other integer ends every container with that
  exit code; a value that is not an integer counts as 1 (as ``int()`` failing does in the stand-in).

kwok chooses the Stage whose selector matches the pod's current state, waits its delay, applies it,
and matches again on the resulting pod; a change to the pod in the meantime starts that over. The
stages, in the order a pod meets them:

``pod-ready``
    a scheduled Pending pod: every container running and ready, the pod Running with kwok's pod IP.
``pod-succeed`` / ``pod-fail``
    after ``SANDBOX_RUN_SECONDS``: every container terminated with the exit code (``Completed`` for
    0, ``Error`` otherwise), Ready false, the pod Succeeded or Failed. Failing is for
    ``restartPolicy: Never``.
``pod-restart``
    the same delay with ``restartPolicy: OnFailure`` and a non-zero code: the kubelet restarts the
    containers in place, so each gets ``restartCount + 1`` and ``lastState.terminated`` with the
    exit code, and runs again (the Job controller counts those restarts against ``backoffLimit``).
    No crash-loop back-off is simulated.
``pod-terminate``
    a pod being deleted that has not finished: the kubelet kills its containers (exit code 137, as
    for a PID 1 that ignores SIGTERM) and reports the pod Failed. Job's pod-replacement and
    finalizer accounting wait for this terminal phase.
``pod-remove``
    a pod being deleted that has finished and has no finalizers left: deleted with grace period 0,
    as the kubelet's status manager does. A finalizer (the Job controller's tracking finalizer)
    holds it until its owner removes it, as on a real node.

Pods with ``restartPolicy: Always`` (Deployments, bare pods left at the default) run until deleted:
a real kubelet would restart them whatever their exit code. The JQ in the selectors and delays
computes the fate; the Go templates compute the exit code again the same way (kwok templates cannot
call JQ).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

NODE_ANNOTATION = "kwok.x-k8s.io/node"
NODE_ANNOTATION_VALUE = "fake"
KILLED_EXIT_CODE = 137
MAX_DELAY_MS = 10**12

# JQ (gojq) definitions shared by every selector and delay. ``ctl`` reads the last env entry of that
# name from the ``node`` container, else the first container; a valueFrom entry reads as unset.
_JQ_PRELUDE = r"""
def ctl($n): (.spec.containers // [])
  | ((map(select(.name == "node")) + .)[0].env // [])
  | map(select(.name == $n)) | (last | .value) // "";
def num: gsub("\\s"; "") | ltrimstr("+")
  | sub("^(?<s>-?)\\."; "\(.s)0.") | sub("\\.(?<e>[eE]|$)"; ".0\(.e)") | tonumber;
def secs: ctl("SANDBOX_RUN_SECONDS") as $v
  | if ($v | test("^\\s*[-+]?([0-9]+\\.?[0-9]*|\\.[0-9]+)([eE][-+]?[0-9]+)?\\s*$"))
    then ($v | num) else 2 end;
def code: ctl("SANDBOX_EXIT_CODE") as $v
  | if $v == "" then 0
    elif ($v | test("^\\s*[-+]?[0-9]+\\s*$")) then ($v | num)
    else 1 end;
def fate:
  if .spec.restartPolicy == "Always" or secs < 0 then "Run"
  elif code == 0 then "Succeed"
  elif .spec.restartPolicy == "OnFailure" then "Restart"
  else "Fail" end;
""".strip()

FATE = _JQ_PRELUDE + "\nfate"
RUN_DELAY = (
    _JQ_PRELUDE
    + f'\n(secs * 1000 | round) as $ms | "\\(if $ms > {MAX_DELAY_MS} then {MAX_DELAY_MS} else $ms end)ms"'
)

# The same exit code in Go template (sprig) terms, for the templates that write it.
_TPL_EXIT_CODE = r"""
{{- $ctr := index .spec.containers 0 }}
{{- range .spec.containers }}{{ if eq .name "node" }}{{ $ctr = . }}{{ break }}{{ end }}{{ end }}
{{- $raw := "" }}
{{- range $ctr.env }}{{ if eq .name "SANDBOX_EXIT_CODE" }}{{ $raw = toString (default "" .value) }}{{ end }}{{ end }}
{{- $code := 0 }}
{{- if ne $raw "" }}
{{- if regexMatch `^\s*[-+]?[0-9]+\s*$` $raw }}{{ $code = atoi (trimPrefix "+" (trim $raw)) }}{{ else }}{{ $code = 1 }}{{ end }}
{{- end }}
"""

# Looks up the container's current status by name (not by index: a client may have rewritten them).
_TPL_PREVIOUS = r"""
  {{- $name := .name }}
  {{- $prev := dict }}
  {{- range $root.status.containerStatuses }}{{ if eq .name $name }}{{ $prev = . }}{{ end }}{{ end }}
  {{- $started := $now }}
  {{- with $prev.state }}{{ with .running }}{{ $started = .startedAt }}{{ end }}{{ end }}
"""

_READY = r"""
{{ $now := Now }}
conditions:
- {type: PodReadyToStartContainers, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
{{- range .spec.readinessGates }}
- {type: {{ .conditionType | Quote }}, status: "True", lastTransitionTime: {{ $now | Quote }}}
{{- end }}
containerStatuses:
{{- range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  imageID: ""
  ready: true
  started: true
  restartCount: 0
  state: {running: {startedAt: {{ $now | Quote }}}}
{{- end }}
{{- with .spec.initContainers }}
initContainerStatuses:
{{- range . }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  imageID: ""
  restartCount: 0
{{- if eq (default "" .restartPolicy) "Always" }}
  ready: true
  started: true
  state: {running: {startedAt: {{ $now | Quote }}}}
{{- else }}
  ready: true
  state: {terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now | Quote }}, finishedAt: {{ $now | Quote }}}}
{{- end }}
{{- end }}
{{- end }}
{{- with NodeIPWith .spec.nodeName }}
hostIP: {{ . | Quote }}
hostIPs: [{ip: {{ . | Quote }}}]
{{- end }}
{{- with PodIPWith .spec.nodeName (or .spec.hostNetwork false) (or .metadata.uid "") (or .metadata.name "") (or .metadata.namespace "") }}
podIP: {{ . | Quote }}
podIPs: [{ip: {{ . | Quote }}}]
{{- end }}
phase: Running
startTime: {{ $now | Quote }}
"""


def _terminal(phase: str, code: str) -> str:
    """Every container terminated with ``code``, Ready false, the pod in ``phase``."""
    return (
        "{{ $now := Now }}\n{{ $root := . }}\n"
        + (_TPL_EXIT_CODE if code == "$code" else "")
        + r"""
conditions:
- {type: Ready, status: "False", reason: PodCompleted, lastTransitionTime: {{ $now | Quote }}}
- {type: ContainersReady, status: "False", reason: PodCompleted, lastTransitionTime: {{ $now | Quote }}}
containerStatuses:
{{- range .spec.containers }}"""
        + _TPL_PREVIOUS
        + r"""
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  imageID: ""
  ready: false
  started: false
  restartCount: {{ default 0 $prev.restartCount }}
  {{- with $prev.lastState }}
  lastState: {{ toJson . }}
  {{- end }}
  state:
    terminated:
      exitCode: {{ CODE }}
      reason: {{ if eq (int CODE) 0 }}Completed{{ else }}Error{{ end }}
      startedAt: {{ $started | Quote }}
      finishedAt: {{ $now | Quote }}
{{- end }}
phase: PHASE
""".replace("CODE", code).replace("PHASE", phase)
    )


_RESTART = (
    "{{ $now := Now }}\n{{ $root := . }}\n"
    + _TPL_EXIT_CODE
    + r"""
containerStatuses:
{{- range .spec.containers }}"""
    + _TPL_PREVIOUS
    + r"""
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  imageID: ""
  ready: true
  started: true
  restartCount: {{ add1 (default 0 $prev.restartCount) }}
  lastState:
    terminated:
      exitCode: {{ $code }}
      reason: Error
      startedAt: {{ $started | Quote }}
      finishedAt: {{ $now | Quote }}
  state: {running: {startedAt: {{ $now | Quote }}}}
{{- end }}
"""
)


def _jq(key: str, operator: str, *values: str) -> dict[str, Any]:
    expr: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        expr["values"] = list(values)
    return {"jq": expr}


_NOT_DELETING = _jq(".metadata.deletionTimestamp", "DoesNotExist")
_DELETING = _jq(".metadata.deletionTimestamp", "Exists")
_RUNNING = _jq(".status.phase", "In", "Running")


def _status_patch(template: str) -> dict[str, Any]:
    return {"patch": {"subresource": "status", "root": "status", "template": template.strip() + "\n"}}


def _stage(
    name: str, kind: str, matches: list[dict[str, Any]], steps: list[dict[str, Any]], **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": kind},
            "selector": {"matchExpressions": matches},
            **spec,
            "steps": steps,
        },
    }


def _guarded_status_patch(template: str) -> dict[str, Any]:
    """A status patch that applies only to the pod as it was when its timer started.

    kwok renders a Stage from the pod it matched and applies it after the delay. A client that
    sets the phase meanwhile leaves no Stage to match, so the timer is not replaced and would
    overwrite the client's phase; the stand-in lets such a client take the pod over. The
    resourceVersion in the patch makes the API server refuse it (409) once the pod has changed.
    """
    status = "\n".join("  " + line if line.strip() else line for line in template.strip().splitlines())
    guarded = (
        "metadata:\n  resourceVersion: {{ .metadata.resourceVersion | Quote }}\nstatus:\n" + status + "\n"
    )
    return {"patch": {"subresource": "status", "root": "", "template": guarded}}


def _after_run(name: str, fate: str, template: str) -> dict[str, Any]:
    return _stage(
        name,
        "Pod",
        [_NOT_DELETING, _RUNNING, _jq(FATE, "In", fate)],
        [_guarded_status_patch(template)],
        delay={"durationMilliseconds": 2000, "durationFrom": {"jq": {"expression": RUN_DELAY}}},
    )


def pod_stages() -> list[dict[str, Any]]:
    return [
        _stage(
            "pod-ready",
            "Pod",
            [_NOT_DELETING, _jq(".status.phase", "In", "Pending")],
            [_status_patch(_READY)],
        ),
        _after_run("pod-succeed", "Succeed", _terminal("Succeeded", "0")),
        _after_run("pod-fail", "Fail", _terminal("Failed", "$code")),
        _after_run("pod-restart", "Restart", _RESTART),
        _stage(
            "pod-terminate",
            "Pod",
            [_DELETING, _jq(".status.phase", "NotIn", "Succeeded", "Failed")],
            [_status_patch(_terminal("Failed", str(KILLED_EXIT_CODE)))],
        ),
        _stage(
            "pod-remove",
            "Pod",
            [
                _DELETING,
                _jq(".status.phase", "In", "Succeeded", "Failed"),
                _jq(".metadata.finalizers", "DoesNotExist"),
            ],
            [{"delete": True}],
        ),
    ]


def node_stages() -> list[dict[str, Any]]:
    """Nodes become Ready once and stay so. No heartbeat: the node-lifecycle controller is not
    running, so nothing would read one, and the audit log stays free of it.

    Each node reports kwok's address (``--node-ip``) and port (``--node-port``, where kwok's server
    listens) as its kubelet's, as kwok's own node stages do: the API server reaches a node's kubelet
    there for ``pods/log``."""
    return [
        _stage(
            "node-initialize",
            "Node",
            [_jq('.status.conditions.[] | select(.type == "Ready") | .status', "NotIn", "True")],
            [_status_patch(_NODE_INITIALIZE)],
        )
    ]


_NODE_INITIALIZE = r"""
{{ $now := Now }}
{{ $since := or .metadata.creationTimestamp $now }}
conditions:
{{- range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $since | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{- end }}
addresses:
- {type: InternalIP, address: {{ NodeIP | Quote }}}
- {type: Hostname, address: {{ .metadata.name | Quote }}}
{{- with NodePort }}
daemonEndpoints:
  kubeletEndpoint: {Port: {{ . }}}
{{- end }}
{{- with .status.allocatable }}
allocatable: {{ toJson . }}
{{- end }}
{{- with .status.capacity }}
capacity: {{ toJson . }}
{{- end }}
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
  kubeProxyVersion: {{ printf "kwok-%s" Version | Quote }}
  containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
  kernelVersion: {{ printf "kwok-%s" Version | Quote }}
  osImage: ""
  machineID: ""
  systemUUID: ""
  bootID: ""
phase: Running
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the templates and JQ programs) as literal blocks, so the written file
    reads like the Stages in kwok's own kustomize directory."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def write_stages(path: Path) -> Path:
    """Write every Stage as one kwok ``--config`` file (kwok loads only these: it has no built-in
    stages of its own when run standalone)."""
    docs = [*node_stages(), *pod_stages()]
    path.write_text(yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=10_000))
    return path
