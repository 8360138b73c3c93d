"""pytest fixtures for the local API server; load with ``pytest_plugins = ["trainer_sandbox.fixtures"]``.

``apiserver``: a fresh ``LocalAPIServer`` with the JobSet simulator (``local_apiserver``) per test on
a free port, stopped promptly afterwards (open watches included). ``kubeconfig``: the path of an
admin kubeconfig for it, in the test's temp dir.
``kube_client``: an official ``kubernetes`` ApiClient on that kubeconfig (the client is not a
dependency of the operator or of this package: the tests' dev extra installs it). ``trainer_apiserver``: a
server with the trainer, JobSet and PodGroup CRDs installed. ``sandbox_apiserver``: what
``trainer sandbox`` serves (those CRDs, the default runtimes, the ``kubeflow-trainer-public`` ConfigMap).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainer_sandbox.apiserver import LocalAPIServer


@pytest.fixture
def apiserver() -> Iterator[LocalAPIServer]:
    from trainer_sandbox.sandbox import local_apiserver

    server = local_apiserver().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def kubeconfig(apiserver: LocalAPIServer, tmp_path: Path) -> Path:
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def kube_client(kubeconfig: Path) -> Iterator[Any]:
    from kubernetes import config

    api_client = config.new_client_from_config(str(kubeconfig))
    try:
        yield api_client
    finally:
        api_client.close()


@pytest.fixture
def trainer_apiserver(apiserver: LocalAPIServer) -> LocalAPIServer:
    from trainer_sandbox.sandbox import install_crds

    install_crds(apiserver)
    return apiserver


@pytest.fixture
def sandbox_apiserver(apiserver: LocalAPIServer) -> LocalAPIServer:
    from trainer_sandbox.sandbox import prepare

    prepare(apiserver)
    return apiserver
