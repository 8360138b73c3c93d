"""``scripts/cluster up|down``: a real Kubernetes control plane on loopback, built from source.

See ``controlplane.py`` for what runs and why, ``stages.py`` for how kwok's fake kubelets move pods
through their phases (the stand-in's ``SANDBOX_RUN_SECONDS`` / ``SANDBOX_EXIT_CODE``).
"""

from __future__ import annotations

from trainer_sandbox.cluster.controlplane import (
    AlreadyRunning,
    ControlPlane,
    StartError,
    build_binaries,
    default_dir,
    running,
    stop_directory,
)

__all__ = [
    "AlreadyRunning",
    "ControlPlane",
    "StartError",
    "build_binaries",
    "default_dir",
    "running",
    "stop_directory",
]
