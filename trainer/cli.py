"""The `trainer` command.

Imports are kept inside the subcommands: ``trainer render`` is started once per check by other
tools, so it must not pay for the operator, kopf or the Kubernetes client.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from trainer.exit_codes import EXIT_INTERNAL, EXIT_OK, EXIT_USAGE


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse exits 2 on usage errors already; keep it
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def version_line() -> str:
    """What `trainer --version` prints: this package's version and the upstream release it implements."""
    import trainer

    return f"trainer {trainer.__version__} (Kubeflow Trainer {trainer.UPSTREAM_VERSION} API)"


class _Version(argparse.Action):
    """`trainer --version`, read only when asked: the distribution's metadata is not free to look up."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        kwargs.setdefault("help", "print the version and the Kubeflow Trainer release it implements")
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(version_line())
        parser.exit(EXIT_OK)


# `render -o` and `migrate -o`: both print the same two shapes (README, "The contract").
_OUTPUT_HELP = (
    "yaml: a YAML stream, one document per object; json: one v1 List holding every object "
    "(default: %(default)s)"
)


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trainer", description="Kubeflow Trainer v2 control plane, in Python.")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    render = sub.add_parser("render", help="render TrainJobs offline: what the operator would create")
    render.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE",
        help="manifest file, directory (its *.yaml, *.yml, *.json) or - for stdin; repeatable",
    )
    render.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json"),
        default="yaml",
        help=_OUTPUT_HELP,
    )
    render.add_argument("--no-default-runtimes", action="store_true", help="do not load the bundled runtimes")
    render.add_argument(
        "--now",
        default="1970-01-01T00:00:00Z",
        metavar="TIME",
        help="the time every timestamp takes, in RFC 3339: YYYY-MM-DDTHH:MM:SS, an optional "
        ".fraction, then Z or +HH:MM/-HH:MM, e.g. 2026-01-01T00:00:00Z or 2026-01-01T09:30:00+05:30 "
        "(default: %(default)s)",
    )
    render.add_argument(
        "--show-secrets",
        action="store_true",
        help="print Secret data instead of <redacted> (keys derived from the input: never for real jobs)",
    )
    render.add_argument(
        "--disable-plugin",
        action="append",
        default=[],
        metavar="NAME",
        help="render as an operator with this built-in plugin disabled",
    )
    render.add_argument(
        "--feature-gates",
        default="",
        metavar="GATES",
        help="render as an operator with these feature gates, e.g. TrainJobStatus=true",
    )
    render.add_argument(
        "--status-server-url",
        default="https://kubeflow-trainer-controller-manager.kubeflow-system.svc:10443",
        metavar="URL",
        help="with TrainJobStatus: the status server's base URL the pods are given",
    )
    render.add_argument(
        "--status-server-ca",
        default=None,
        metavar="FILE",
        help="with TrainJobStatus: the PEM of the CA the pods trust (the <name>-tls-config ConfigMap)",
    )

    _migrate_parser(sub)

    crds = sub.add_parser(
        "crds",
        help="generate the CRDs in crds/ and the typed views in trainer/api/views/ from the API models",
    )
    crds.add_argument(
        "--output-dir",
        default=None,
        metavar="DIR",
        help="where to write the CRDs (default: the package's crds/)",
    )
    crds.add_argument(
        "--vendor-from",
        default=None,
        metavar="DIR",
        help="first refresh the vendored Kubernetes sub-schemas from upstream's reference CRDs",
    )

    run = sub.add_parser(
        "run",
        help="run the operator against the cluster in KUBECONFIG or in-cluster",
        description="Run the operator against the cluster in KUBECONFIG or in-cluster. Outside a cluster "
        "its webhook, metrics and status servers listen on 127.0.0.1 unless --config says otherwise, "
        "and it registers its admission webhooks itself (ValidatingWebhookConfiguration and "
        "MutatingWebhookConfiguration trainer.kubeflow.org) when the API server can call them, "
        "removing them on a clean exit; start-up logs which webhooks are live. See docs/configuration.md.",
    )
    scope = run.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        metavar="NAMESPACE",
        help="watch this namespace (repeatable)",
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch every namespace (the default)"
    )
    # kopf's `kopf run --standalone` turns its peering off; the operator always runs kopf that way
    # (controller/operator.py passes standalone=True), so the flag is parsed and never read.
    run.add_argument(
        "--standalone",
        action="store_true",
        help="has no effect (kept so that command lines passing it still work): the operator never "
        "peers with other kopf operators; its replicas coordinate through leaderElection in --config",
    )
    run.add_argument(
        "--liveness",
        metavar="URL",
        help="serve the liveness endpoint here, e.g. http://0.0.0.0:8081/healthz "
        "(default: the --config file's health.healthProbeBindAddress and livenessEndpointName)",
    )
    run.add_argument(
        "--log-format",
        choices=("plain", "json"),
        default="plain",
        help="plain: one 'TIME LEVEL LOGGER: MESSAGE' line per record; json: one JSON object per line, "
        "with time, level, logger, message and, for a line about an object, kind, namespace, name, "
        "uid and reason (default: %(default)s)",
    )
    run.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log more; repeatable. Without it: one INFO line per TrainJob transition and per "
        "webhook refusal, leadership changes, start-up, and every warning and error; -v: also the "
        "operator's debug lines (requeued reconciles, watch restarts, certificate checks) and other "
        "libraries' INFO lines (kopf's excepted); -vv: also kopf's and the HTTP libraries' debug lines",
    )
    run.add_argument(
        "--config",
        metavar="FILE",
        help="the operator's Configuration, a YAML file (docs/configuration.md; default: every "
        "field's default)",
    )

    sub.add_parser(
        "demo", help="run the control plane on a local API server and watch example TrainJobs", add_help=False
    )

    sub.add_parser(
        "sandbox",
        help="run the local API server stand-in with the CRDs and runtimes installed",
        add_help=False,
    )
    return parser


def _migrate_parser(sub: Any) -> None:
    """`trainer migrate` (trainer/migrate/cmd.py; docs/migration.md)."""
    migrate = sub.add_parser(
        "migrate",
        help="turn Training Operator v1 jobs (PyTorchJob, MPIJob, XGBoostJob, JAXJob, PaddleJob, TFJob) "
        "into TrainJobs",
    )
    source = migrate.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "-f",
        "--filename",
        action="append",
        metavar="FILE",
        help="manifest file, directory (its *.yaml, *.yml, *.json) or - for stdin; repeatable",
    )
    source.add_argument(
        "--from-cluster",
        action="store_true",
        help="read the v1 jobs from the cluster the kubeconfig names (read only)",
    )
    scope = migrate.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        metavar="NAMESPACE",
        help="with --from-cluster: this namespace (default: the kubeconfig context's, else default)",
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="with --from-cluster: every namespace"
    )
    migrate.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml", help=_OUTPUT_HELP)
    migrate.add_argument(
        "--lossy",
        action="store_true",
        help="convert what cannot be carried faithfully, each loss a 'Warning:' line on stderr",
    )
    migrate.add_argument(
        "--no-suspend-running",
        action="store_true",
        help="do not suspend the TrainJob of a v1 job that is still running",
    )
    migrate.add_argument(
        "--fix-names",
        action="store_true",
        help="give a job whose name is not a valid TrainJob name the nearest valid one (each a 'Warning:' "
        "line on stderr)",
    )
    migrate.add_argument(
        "--gang-scheduler",
        choices=("volcano", "coscheduling"),
        default=None,
        help="the gang scheduler v1's operator ran with, for runPolicy.schedulingPolicy "
        "(default: volcano where the pods name it as schedulerName, else coscheduling)",
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in _SANDBOX_COMMANDS:
        return _sandbox_command(argv[0], argv[1:])
    args = _build_parser().parse_args(argv)
    try:
        if args.command == "render":
            from trainer.offline.command import run_render

            return run_render(args)
        if args.command == "migrate":
            from trainer.migrate.cmd import run_migrate

            return run_migrate(args)
        if args.command == "crds":
            return _crds(args)
        if args.command == "run":
            from trainer.controller.main import run as run_operator

            return run_operator(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:  # the contract: exit 3 for an internal error, with a short reason
        import traceback

        if "TRAINER_DEBUG" in __import__("os").environ:
            traceback.print_exc()
        print(f"trainer: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INTERNAL
    return EXIT_USAGE


# `trainer demo` and `trainer sandbox` run on the local API server stand-in, which is a package
# of its own (trainer-sandbox, in this repository's sandbox/): the operator's wheel and image
# carry none of it.
_SANDBOX_COMMANDS = {"demo": "trainer_sandbox.demo", "sandbox": "trainer_sandbox.sandbox_cmd"}


def _sandbox_command(name: str, argv: list[str]) -> int:
    import importlib

    try:
        module = importlib.import_module(_SANDBOX_COMMANDS[name])
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith("trainer_sandbox"):
            raise
        print(
            f"trainer {name}: needs the trainer-sandbox package (the local API server stand-in), "
            "which is not installed; from a checkout of this repository: pip install ./sandbox",
            file=sys.stderr,
        )
        return EXIT_USAGE
    code: int = module.main(argv)
    return code


def _crds(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from trainer.api import crdgen, viewgen

    if args.vendor_from:
        data = crdgen.vendor(Path(args.vendor_from))
        crdgen.EMBEDDED_FILE.write_text(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")
    for path in [*crdgen.write(Path(args.output_dir) if args.output_dir else None), *viewgen.write()]:
        print(path)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
