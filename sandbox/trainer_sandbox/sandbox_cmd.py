"""`trainer sandbox`: the local API server with everything installed, optionally with the operator.

The server is a test and demo stand-in (``trainer_sandbox``); ``--with-operator`` runs the
operator in the same process, with its webhooks, so kubectl and the Kubeflow SDK see the whole
control plane. Without it, point ``trainer run`` at the written kubeconfig.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

OPERATOR_USER = "system:serviceaccount:kubeflow-system:kubeflow-trainer-controller-manager"


def main(argv: list[str] | None = None) -> int:
    from trainer_sandbox.sandbox import local_apiserver, prepare

    parser = argparse.ArgumentParser(
        prog="trainer sandbox",
        description="Run an in-memory Kubernetes API server with the trainer CRDs and runtimes "
        "(a test and demo tool, not a cluster).",
    )
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: a free port)")
    parser.add_argument(
        "--kubeconfig",
        default="sandbox.kubeconfig",
        help="where to write the kubeconfig (default: %(default)s)",
    )
    parser.add_argument(
        "--with-operator",
        action="store_true",
        help="also run the operator (and its webhooks) in this process",
    )
    args = parser.parse_args(argv)

    server = local_apiserver(port=args.port).start()
    operator = None
    try:
        installed = prepare(server)
        path = server.write_kubeconfig(Path(args.kubeconfig).expanduser().resolve())
        print(f"Local Kubernetes API server (a test stand-in, not a cluster) at {server.url}")
        print(f"Installed {len(installed['crds'])} CRDs and runtimes: {', '.join(installed['runtimes'])}")
        if args.with_operator:
            import logging

            from trainer_sandbox.embedded_operator import EmbeddedOperator

            logging.getLogger("kopf").setLevel(logging.ERROR)
            server.add_user(OPERATOR_USER)
            operator_config = server.write_kubeconfig(
                path.with_name(path.name + ".operator"), user=OPERATOR_USER
            )
            operator = EmbeddedOperator(operator_config, webhooks=True).start()
            print("The operator is running in this process, with its admission webhooks.")
        else:
            command = _operator_command(server, path)
            print(f"Run the operator against it, as its ServiceAccount, with its webhooks:\n  {command}")
        print(f"Kubeconfig: {path}")
        print(f"  export KUBECONFIG={path}")
        print("  kubectl get clustertrainingruntimes")
        print("Pods run for $SANDBOX_RUN_SECONDS (default 2) and exit with $SANDBOX_EXIT_CODE (default 0),")
        print("read from the TrainJob's spec.trainer.env. Press Ctrl-C to stop.")
        sys.stdout.flush()
        # The handler only sets a flag: it runs in the main thread between two bytecodes, and
        # setting a threading.Event there deadlocks when it lands inside that Event's own wait
        # (seen: a sandbox that never exited on SIGTERM). sleep() goes on after the handler, so
        # the flag is seen within half a second.
        stopping: list[int] = []
        signal.signal(signal.SIGTERM, lambda signum, _: stopping.append(signum))
        try:
            while not stopping:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    finally:
        if operator is not None:
            operator.stop()
        server.stop()
    return 0


def _operator_command(server: object, path: Path) -> str:
    """Write what `trainer run` needs to serve this sandbox; return the command that runs it.

    The operator registers its own webhook configurations here (the chart ships them on a
    cluster), on free local ports, with a self-signed certificate it makes at start-up.
    """
    import yaml

    from trainer_sandbox.apiserver import LocalAPIServer
    from trainer_sandbox.ports import free_port

    assert isinstance(server, LocalAPIServer)
    server.add_user(OPERATOR_USER)
    kubeconfig = server.write_kubeconfig(path.with_name(path.name + ".operator"), user=OPERATOR_USER)
    config = {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
        "kind": "Configuration",
        "webhook": {
            "host": "127.0.0.1",
            "port": free_port(),
            "advertiseHost": "127.0.0.1",
            "manageConfiguration": True,
        },
        # Plain HTTP: the stand-in serves no TokenReview or SubjectAccessReview to authorize scrapers.
        "metrics": {"bindAddress": f"127.0.0.1:{free_port()}", "secureServing": False},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{free_port()}"},
    }
    config_path = path.with_name(path.name + ".operator.yaml")
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    return f"KUBECONFIG={kubeconfig} trainer run --config {config_path}"
