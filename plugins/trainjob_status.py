"""TrainJobStatus: training pods report their progress to the operator (feature gate ``TrainJobStatus``).

The containers of the trainer step get the status server's URL for this TrainJob, and the paths
of a token and a CA in a projected volume: a service-account token whose audience is this
TrainJob's own status path, and the CA from the ``<name>-tls-config`` ConfigMap the plugin
builds. The Kubeflow SDK's ``update_trainjob_status`` reads exactly these (docs/user-guide.md,
"Report progress"). The server's address and CA are cluster facts (``info.facts.status_server``); the
plugin is loaded only when the gate is on.
"""

from __future__ import annotations

from trainer.plugin import (
    CONFIG_MAP,
    Builds,
    Info,
    Obj,
    PluginError,
    StatusServer,
    TrainingRuntimeSpec,
    constants,
    env_value,
    hookimpl,
    upsert_env,
    upsert_volume_mounts,
    upsert_volumes,
)

c = constants


class TrainJobStatusPlugin:
    name = "TrainJobStatus"
    kinds = (Builds(CONFIG_MAP, label=c.TRAINJOB_NAME_LABEL),)  # the status server's CA, for the pods

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        return False  # a runtime renders correctly without progress reporting

    @hookimpl
    def trainer_enforce_pod_spec(self, info: Info) -> None:
        server = _server(info)
        trainer = info.trainer_pod_set()
        if trainer is None:
            return
        path = c.status_server_path(info.namespace, info.name)
        env = [
            env_value(c.STATUS_SERVER_URL_ENV, server.url.rstrip("/") + path),
            env_value(c.STATUS_SERVER_CA_CERT_ENV, f"{c.STATUS_SERVER_MOUNT_PATH}/{c.STATUS_SERVER_CA_KEY}"),
            env_value(c.STATUS_SERVER_TOKEN_ENV, f"{c.STATUS_SERVER_MOUNT_PATH}/token"),
        ]
        mount = {"name": c.STATUS_SERVER_VOLUME, "mountPath": c.STATUS_SERVER_MOUNT_PATH, "readOnly": True}
        for container in trainer.containers:
            upsert_env(container, env)
            upsert_volume_mounts(container, [mount])
        upsert_volumes(trainer.pod_spec, [volume(info.namespace, info.name)])

    @hookimpl
    def trainer_build(self, info: Info) -> list[Obj] | None:
        server = _server(info)
        return [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": info.child_metadata(info.name + c.STATUS_SERVER_TLS_CONFIG_SUFFIX),
                "data": {c.STATUS_SERVER_CA_KEY: server.ca_cert},
            }
        ]


def volume(namespace: str, name: str) -> Obj:
    """The projected volume: a token for this TrainJob's audience, and the status server's CA."""
    return {
        "name": c.STATUS_SERVER_VOLUME,
        "projected": {
            "sources": [
                {
                    "serviceAccountToken": {
                        "audience": c.status_server_audience(namespace, name),
                        "expirationSeconds": c.STATUS_SERVER_TOKEN_SECONDS,
                        "path": "token",
                    }
                },
                {
                    "configMap": {
                        "name": name + c.STATUS_SERVER_TLS_CONFIG_SUFFIX,
                        "items": [{"key": c.STATUS_SERVER_CA_KEY, "path": c.STATUS_SERVER_CA_KEY}],
                    }
                },
            ]
        },
    }


def _server(info: Info) -> StatusServer:
    """The status server as the cluster knows it, or upstream's errors when its CA is not known."""
    server = info.facts.status_server
    if server is None or server.ca_error is not None:
        why = server.ca_error if server is not None else "no status server is configured"
        raise PluginError(f"failed to look up status server tls secret: {why}")
    if not server.ca_cert:
        raise PluginError("failed to find status server ca.crt in tls secret")
    return server


plugin = TrainJobStatusPlugin()
