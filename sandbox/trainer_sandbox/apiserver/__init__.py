"""An in-memory Kubernetes API server for tests and demos (the role envtest plays for Go).

It speaks the Kubernetes API over real HTTP to unmodified clients (kubectl, the ``kubernetes``
client, kopf, the Kubeflow SDK). It is a test tool: no authorization, no persistence, one process.
"""

from trainer_sandbox.apiserver.audit import AuditLog, AuditRecord
from trainer_sandbox.apiserver.errors import APIError
from trainer_sandbox.apiserver.faults import FaultRule, Faults
from trainer_sandbox.apiserver.server import ADMIN, JOBSET_CONTROLLER_USER, LocalAPIServer

__all__ = [
    "ADMIN",
    "JOBSET_CONTROLLER_USER",
    "APIError",
    "AuditLog",
    "AuditRecord",
    "FaultRule",
    "Faults",
    "LocalAPIServer",
]
