"""Kubeflow Trainer v2 control plane, in Python.

Two versions, each said in one place:

- ``__version__``: this package's (and the operator image's) own, from its installed distribution's
  metadata (pyproject.toml); the chart's ``appVersion`` is kept equal to it.
- ``UPSTREAM_VERSION``: the Kubeflow Trainer release whose API (``trainer.kubeflow.org/v1alpha1``)
  and default runtimes this control plane implements. The chart repeats it in its
  ``trainer.kubeflow.org/upstream-version`` annotation, which the ``kubeflow-trainer-public``
  ConfigMap the Kubeflow SDK reads is rendered from; tests/test_version.py and
  tests/chart/test_chart_render.py keep them equal.
"""

from __future__ import annotations

UPSTREAM_VERSION = "v2.3.0"

DISTRIBUTION = "trainer-operator"


def __getattr__(name: str) -> str:
    # Read on first use only: importing the package (every `trainer render`) stays free of
    # importlib.metadata.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version(DISTRIBUTION)
        except PackageNotFoundError:  # a source tree on sys.path, not installed
            return "0+unknown"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
