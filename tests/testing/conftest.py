"""The local API server fixtures (projects load them with ``pytest_plugins = ["trainer_sandbox.fixtures"]``;
a non-root conftest cannot, so they are imported here)."""

from trainer_sandbox.fixtures import apiserver, kube_client, kubeconfig, sandbox_apiserver, trainer_apiserver

__all__ = ["apiserver", "kube_client", "kubeconfig", "sandbox_apiserver", "trainer_apiserver"]
