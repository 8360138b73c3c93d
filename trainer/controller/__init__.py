"""The operator: all of the project's I/O with a cluster.

kopf imports the official ``kubernetes`` client, when it is installed, only to recognise its
model classes, which this operator never hands to kopf; that import is about 800 modules and
40 MiB of resident memory. The first import of kopf therefore happens here, with the client
hidden from it. Nothing else changes: ``import kubernetes`` works afterwards as usual (the
credentials module uses it for kubeconfigs with exec plugins).
"""

from __future__ import annotations

import sys

if "kopf" not in sys.modules and "kubernetes" not in sys.modules:
    sys.modules["kubernetes"] = None  # type: ignore[assignment]  # makes `import kubernetes` fail
    try:
        import kopf  # noqa: F401
    finally:
        del sys.modules["kubernetes"]
