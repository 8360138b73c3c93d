"""The phases of turning a TrainJob into objects, one hook each.

Every plugin, built-in or from another package, implements some of these hooks. The render
core calls them in this order for one TrainJob:

    trainer_enforce_ml_policy -> trainer_enforce_pod_group_policy -> trainer_enforce_pod_spec
    -> trainer_pre_build_sync -> trainer_build -> trainer_compute_status

and ``trainer_validate`` at admission. Within a phase, plugins run in the fixed order of
docs/decisions.md §1 (see :mod:`trainer.runtime.framework`). Hooks are synchronous and do no I/O:
everything they may read about the cluster is in ``info.facts``.

A hook signals a reconcile failure by raising :class:`trainer.runtime.info.PluginError`; a
validation hook returns field errors instead of raising.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from trainer.apimachinery.errors import FieldError
    from trainer.runtime.info import Facts, Info, ValidationContext

PROJECT = "trainer"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def trainer_validate(ctx: ValidationContext) -> list[FieldError] | None:
    """Admission of a TrainJob (create, and update when ``ctx.old`` is set).

    Runs for every enabled plugin; a plugin checks only what its own policy configures.
    ``ctx.info`` is the Info built from the runtime with the TrainJob's runtimePatches applied,
    or None when it could not be built. Return the field errors found (all of them), or None.
    Warnings go to ``ctx.warnings``.
    """


@hookspec
def trainer_enforce_ml_policy(info: Info) -> None:
    """Apply the runtime's mlPolicy: pod counts, framework env vars, ports, commands.

    Only the plugin whose policy is configured acts (PlainML acts when no torch/mpi/jax policy
    is). Changes go into ``info.pod_sets`` (whose containers are the template's own dicts).
    """


@hookspec
def trainer_enforce_pod_group_policy(info: Info) -> None:
    """Apply the runtime's podGroupPolicy: the gang label or annotation every pod carries.

    Runs after every ML policy, so pod counts are final.
    """


@hookspec
def trainer_enforce_pod_spec(info: Info) -> None:
    """Pod spec changes not tied to a policy (the TrainJobStatus feature's env and volume)."""


@hookspec
def trainer_pre_build_sync(info: Info) -> None:
    """Last changes before objects are built: endpoints and replicated-job parallelism."""


@hookspec
def trainer_build(info: Info) -> list[dict[str, Any]] | None:
    """Return the objects this plugin owns for the TrainJob (JobSet, Secret, PodGroup, ...).

    Return None or [] when the plugin builds nothing, including when an object it owns exists
    and must not be rewritten (a running JobSet, an SSH Secret).
    """


@hookspec(firstresult=True)
def trainer_compute_status(trainjob: dict[str, Any], facts: Facts) -> dict[str, Any] | None:
    """What the TrainJob's status takes from the objects that run it (the JobSet).

    Return ``{"conditions": [...], "jobsStatus": [...]}`` (terminal conditions only), or None when
    nothing runs the TrainJob. At most one plugin provides it.
    """
