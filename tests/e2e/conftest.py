"""Tests against a real cluster: opt in with TRAINER_E2E_KUBECONFIG, never through KUBECONFIG.

The cluster needs JobSet and the trainer CRDs installed (the chart does both but JobSet); the tests
make and delete a namespace of their own.
"""

from __future__ import annotations

import os

import pytest

E2E_VARIABLE = "TRAINER_E2E_KUBECONFIG"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(E2E_VARIABLE):
        return
    skip = pytest.mark.skip(reason=f"needs a real cluster: set {E2E_VARIABLE} to its kubeconfig")
    for item in items:
        if "e2e" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def e2e_kubeconfig() -> str:
    return os.environ[E2E_VARIABLE]
