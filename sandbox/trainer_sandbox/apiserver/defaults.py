"""The defaults kube-apiserver writes into built-in kinds, for the fields controllers read back.

An operator that compares what it sent with what it reads back sees these on a real cluster; the
stand-in writes them too so that such a comparison fails here first.
"""

from __future__ import annotations

from typing import Any


def _container(c: dict[str, Any]) -> None:
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    image = str(c.get("image", ""))
    tag = image.rsplit("/", 1)[-1]
    if "imagePullPolicy" not in c:
        c["imagePullPolicy"] = "Always" if ":" not in tag or tag.endswith(":latest") else "IfNotPresent"
    c.setdefault("resources", {})
    for p in c.get("ports") or []:
        p.setdefault("protocol", "TCP")


def pod_spec(spec: dict[str, Any], restart_policy: str = "Always") -> None:
    spec.setdefault("restartPolicy", restart_policy)
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        if isinstance(c, dict):
            _container(c)


def apply(plural: str, group: str, obj: dict[str, Any]) -> None:
    if plural == "secrets" and not group:
        # SetDefaults_Secret: `kubectl create secret generic` sends none.
        if not obj.get("type"):
            obj["type"] = "Opaque"
        return
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if plural == "pods" and not group:
        pod_spec(spec)
        spec.setdefault("enableServiceLinks", True)
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
        spec.setdefault("priority", 0)
    elif plural == "jobs" and group == "batch":
        spec.setdefault("parallelism", 1)
        spec.setdefault(
            "completions", spec.get("parallelism", 1) if spec.get("completionMode") == "Indexed" else 1
        )
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
        tmpl = spec.get("template")
        if isinstance(tmpl, dict) and isinstance(tmpl.get("spec"), dict):
            # PodSpec defaulting makes an unset restartPolicy Always, which Job validation then
            # refuses ("Required value"): a Job must say OnFailure or Never itself.
            pod_spec(tmpl["spec"])
    elif plural == "deployments" and group == "apps":
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        # kubectl sends "strategy": {} (a struct, never omitted): default inside it, as the
        # registry does, not only when it is missing.
        strategy = spec.setdefault("strategy", {})
        if isinstance(strategy, dict):
            if not strategy.get("type"):
                strategy["type"] = "RollingUpdate"
            if strategy["type"] == "RollingUpdate":
                rolling = strategy.get("rollingUpdate")
                if not isinstance(rolling, dict):
                    rolling = strategy["rollingUpdate"] = {}
                rolling.setdefault("maxUnavailable", "25%")
                rolling.setdefault("maxSurge", "25%")
        tmpl = spec.get("template")
        if isinstance(tmpl, dict) and isinstance(tmpl.get("spec"), dict):
            pod_spec(tmpl["spec"])
    elif plural == "services" and not group:
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for p in spec.get("ports") or []:
            p.setdefault("protocol", "TCP")
            p.setdefault("targetPort", p.get("port"))
        spec.setdefault("internalTrafficPolicy", "Cluster")
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        spec.setdefault("ipFamilies", ["IPv4"])


# The labels the Job registry strategy derives from a Job's name and uid (batch/v1 constants).
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
CONTROLLER_UID_LABELS = ("batch.kubernetes.io/controller-uid", "controller-uid")


def prepare_for_create(plural: str, group: str, obj: dict[str, Any]) -> None:
    """What a kind's registry strategy derives on create once the object has its uid.

    A Job without ``manualSelector`` gets a generated selector on its controller-uid and the
    matching labels on its pod template, so that its pods, and only its pods, carry them:
    ``kubectl logs job/NAME`` and the Job controller select pods by them.
    """
    if plural == "jobs" and group == "batch":
        _generate_job_selector(obj)


def _generate_job_selector(job: dict[str, Any]) -> None:
    spec = job.get("spec")
    if not isinstance(spec, dict) or spec.get("manualSelector") is True:
        return
    meta = job["metadata"]
    tmpl = spec.setdefault("template", {})
    if not isinstance(tmpl, dict):
        return
    tmeta = tmpl.setdefault("metadata", {})
    if not isinstance(tmeta, dict):
        return
    labels = tmeta.get("labels")
    if not isinstance(labels, dict):
        labels = tmeta["labels"] = {}
    # Labels the user set are kept (a conflict is validation's to report), as the strategy does.
    for key in JOB_NAME_LABELS:
        labels.setdefault(key, meta.get("name", ""))
    for key in CONTROLLER_UID_LABELS:
        labels.setdefault(key, meta["uid"])
    selector = spec.get("selector")
    if not isinstance(selector, dict):
        selector = spec["selector"] = {}
    match = selector.get("matchLabels")
    if not isinstance(match, dict):
        match = selector["matchLabels"] = {}
    match.setdefault(CONTROLLER_UID_LABELS[0], meta["uid"])
