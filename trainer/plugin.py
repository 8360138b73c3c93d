"""The plugin API: everything a plugin may import from this project, and nothing more.

Built-in plugins are held to it as a plugin from another package is (a test checks their
imports), so what they need is what a third-party plugin can have, and the modules behind these
names can move without breaking anyone. docs/plugins.md explains each name.
"""

from __future__ import annotations

from trainer.api import constants
from trainer.api.objects import Obj, contains
from trainer.api.quantity import cpu_count, gpu_count
from trainer.api.views import (
    CoschedulingPolicy,
    FluxPolicy,
    JAXPolicy,
    MLPolicy,
    MPIPolicy,
    PodGroupPolicy,
    TorchPolicy,
    TrainingRuntimeSpec,
    VolcanoPolicy,
    WorkloadPolicy,
    XGBoostPolicy,
)
from trainer.apimachinery.errors import FieldError, forbidden, internal, invalid, required, unsupported
from trainer.apimachinery.object_meta import dns1123_subdomain
from trainer.runtime.build import effective_resources, gang_totals
from trainer.runtime.hookspecs import hookimpl
from trainer.runtime.info import (
    Endpoints,
    Facts,
    Info,
    PluginError,
    PodSet,
    StatusServer,
    ValidationContext,
    controlled_by,
)
from trainer.runtime.kinds import CONFIG_MAP, SECRET, Builds, Kind, Reads
from trainer.runtime.podspec import (
    canonical_jobset_quantities,
    env_field_ref,
    env_value,
    find,
    upsert_env,
    upsert_ports,
    upsert_volume_mounts,
    upsert_volumes,
)

__all__ = [
    "CONFIG_MAP",
    "SECRET",
    "Builds",
    "CoschedulingPolicy",
    "Endpoints",
    "Facts",
    "FieldError",
    "FluxPolicy",
    "Info",
    "JAXPolicy",
    "Kind",
    "MLPolicy",
    "MPIPolicy",
    "Obj",
    "PluginError",
    "PodGroupPolicy",
    "PodSet",
    "Reads",
    "StatusServer",
    "TorchPolicy",
    "TrainingRuntimeSpec",
    "ValidationContext",
    "VolcanoPolicy",
    "WorkloadPolicy",
    "XGBoostPolicy",
    "canonical_jobset_quantities",
    "constants",
    "contains",
    "controlled_by",
    "cpu_count",
    "dns1123_subdomain",
    "effective_resources",
    "env_field_ref",
    "env_value",
    "find",
    "forbidden",
    "gang_totals",
    "gpu_count",
    "hookimpl",
    "internal",
    "invalid",
    "required",
    "unsupported",
    "upsert_env",
    "upsert_ports",
    "upsert_volume_mounts",
    "upsert_volumes",
]
