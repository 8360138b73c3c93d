"""JobSet's defaulting and validating webhooks, as the API server runs them on JobSet writes.

On a cluster, JobSet's controller manager serves them over HTTPS; here ``JobSetController``
registers them with the server's core (``Core.mutators`` and ``Core.validators``), which runs them
inside the request. They live apart from the controller because they judge a write before it is
stored, while the controller acts on what was stored.
"""

from __future__ import annotations

import copy

from trainer.api.objects import Obj
from trainer.apimachinery.errors import FieldError, forbidden, invalid


def jobset_defaults(js: Obj) -> None:
    """The defaults of JobSet's mutating webhook (v0.12: registered for CREATE only, so an update
    that drops a defaulted field keeps it dropped, and the update rule then sees the change)."""
    spec = js.setdefault("spec", {})
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    for rjob in spec.get("replicatedJobs") or []:
        jspec = rjob.setdefault("template", {}).setdefault("spec", {})
        jspec.setdefault("completionMode", "Indexed")
        pspec = jspec.setdefault("template", {}).setdefault("spec", {})
        # A batch Job's pods must say how they restart (Job validation refuses none, and Always):
        # JobSet makes the choice for a template that does not.
        if not pspec.get("restartPolicy"):
            pspec["restartPolicy"] = "OnFailure"
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    # A rule's name is defaulted (the CRD requires it); its action is not (required, no default).
    for i, rule in enumerate((spec.get("failurePolicy") or {}).get("rules") or []):
        if not rule.get("name"):
            rule["name"] = f"failurePolicyRule{i}"
    # managedBy is not defaulted: a JobSet without one is the JobSet controller's.


def jobset_validate(js: Obj, old: Obj | None) -> list[FieldError]:
    """JobSet's validating webhook: its create rules, then its update rule."""
    if old is None:
        return _validate_create(js)
    return _validate_update(js, old)


def _validate_create(js: Obj) -> list[FieldError]:
    """The references between replicatedJobs that JobSet refuses to store: a dependency must name
    an earlier replicatedJob (the first can have none), a success target an existing one.

    The messages are JobSet's; each error names the field it is about.
    """
    spec = js.get("spec") or {}
    rjobs = spec.get("replicatedJobs") or []
    errors: list[FieldError] = []
    if rjobs and rjobs[0].get("dependsOn") is not None:
        errors.append(
            forbidden(
                "spec.replicatedJobs[0].dependsOn", "DependsOn can't be set for the first ReplicatedJob"
            )
        )
    seen: set[str] = set()
    for i, rjob in enumerate(rjobs):
        seen.add(rjob.get("name", ""))  # as JobSet does: the replicatedJob itself counts as seen
        if i == 0:
            continue
        for j, dep in enumerate(rjob.get("dependsOn") or []):
            if dep.get("name") not in seen:
                errors.append(
                    invalid(
                        f"spec.replicatedJobs[{i}].dependsOn[{j}].name",
                        dep.get("name"),
                        f"replicatedJob: {rjob.get('name')} cannot depend on replicatedJob: {dep.get('name')}",
                    )
                )
    names = {r.get("name") for r in rjobs}
    targets = (spec.get("successPolicy") or {}).get("targetReplicatedJobs") or []
    for k, target in enumerate(targets):
        if target not in names:
            errors.append(
                invalid(
                    f"spec.successPolicy.targetReplicatedJobs[{k}]",
                    target,
                    f"invalid replicatedJob name '{target}' does not appear in .spec.ReplicatedJobs",
                )
            )
    return errors


def _validate_update(js: Obj, old: Obj) -> list[FieldError]:
    """JobSet's update rule: replicatedJobs are immutable, except the pod-template fields Kueue needs
    while the JobSet is (or is being) suspended."""
    new_rjobs = (js.get("spec") or {}).get("replicatedJobs") or []
    old_rjobs = (old.get("spec") or {}).get("replicatedJobs") or []
    suspended = bool((old.get("spec") or {}).get("suspend")) or bool((js.get("spec") or {}).get("suspend"))
    munged = []
    for i, rjob in enumerate(new_rjobs):
        if suspended and i < len(old_rjobs):
            rjob = _with_mutable_fields_of(rjob, old_rjobs[i])
        munged.append(rjob)
    if munged != old_rjobs:
        return [invalid("spec.replicatedJobs", new_rjobs, "field is immutable")]
    return []


def _with_mutable_fields_of(rjob: Obj, old: Obj) -> Obj:
    out = copy.deepcopy(rjob)
    tmpl = out.get("template", {}).get("spec", {}).get("template", {})
    otmpl = old.get("template", {}).get("spec", {}).get("template", {})
    ometa = otmpl.get("metadata")
    if "metadata" in tmpl or ometa is not None:
        meta = tmpl.setdefault("metadata", {})
        for key in ("annotations", "labels"):
            _copy_key(meta, ometa or {}, key)
        if not meta and ometa is None:
            tmpl.pop("metadata")
    pspec, opspec = tmpl.setdefault("spec", {}), otmpl.get("spec", {})
    for key in ("nodeSelector", "tolerations", "schedulingGates"):
        _copy_key(pspec, opspec, key)
    return out


def _copy_key(dst: Obj, src: Obj, key: str) -> None:
    if key in src:
        dst[key] = src[key]
    else:
        dst.pop(key, None)
