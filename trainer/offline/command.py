"""`trainer render`: manifests in, the objects the operator would write out. See the README for
the contract (inputs, ordering, exit codes), which other tools depend on."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import TYPE_CHECKING

from trainer.api.objects import Obj
from trainer.exit_codes import EXIT_OK, EXIT_REFUSED, EXIT_USAGE

if TYPE_CHECKING:
    from trainer.runtime.info import StatusServer

REDACTED = "<redacted>"
# The keys are derived from each TrainJob's namespace and name (cluster.render_seed) so that the
# output is reproducible: anyone with the manifest can compute them.
SHOWN_SECRETS_WARNING = (
    "Warning: --show-secrets: the key material in these Secrets is derived from the input (each "
    "TrainJob's namespace and name), so anyone can compute it; never use it for real jobs: the "
    "operator generates random keys"
)


RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")


def _redact(obj: Obj) -> Obj:
    if obj.get("kind") != "Secret":
        return obj
    out = dict(obj)
    for key in ("data", "stringData"):
        if isinstance(out.get(key), dict):
            out[key] = {k: REDACTED for k in out[key]}
    return out


def parse_feature_gates(text: str) -> dict[str, bool]:
    """``--feature-gates`` as Kubernetes components take it: ``Name=true,Other=false``."""
    gates: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or value.lower() not in ("true", "false") or not name:
            raise ValueError(f"--feature-gates {item!r}: expected Name=true or Name=false")
        gates[name] = value.lower() == "true"
    return gates


def _status_server(url: str, ca_file: str | None) -> StatusServer:
    """The TrainJobStatus facts an operator would have: its URL, and the CA given (or why not)."""
    from trainer.runtime.info import StatusServer

    if not re.fullmatch(r"https://[^/?#]+", url):
        raise ValueError(f"--status-server-url {url!r}: expected https://HOST[:PORT]")
    if ca_file is None:
        return StatusServer(url=url, ca_error="no CA given (--status-server-ca FILE)")
    try:
        with open(ca_file, encoding="utf-8") as handle:
            return StatusServer(url=url, ca_cert=handle.read())
    except OSError as exc:
        raise ValueError(f"--status-server-ca: {exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"--status-server-ca {ca_file}: not UTF-8 text (a PEM file is ASCII)") from None


def run_render(args: argparse.Namespace) -> int:
    from trainer.offline.cluster import OfflineCluster
    from trainer.offline.manifests import ManifestError, read_manifests
    from trainer.runtime import framework as fw
    from trainer.runtime.render import parse_time

    try:
        if not RFC3339.fullmatch(args.now):
            raise ValueError(args.now)
        parse_time(args.now)
    except ValueError:
        print(
            f"error: --now {args.now!r}: not an RFC 3339 time such as 2026-01-01T00:00:00Z", file=sys.stderr
        )
        return EXIT_USAGE

    try:
        objects = read_manifests(args.filename)
    except ManifestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        gates = parse_feature_gates(args.feature_gates)
        status_server = _status_server(args.status_server_url, args.status_server_ca)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        framework = (
            fw.load(fw.PluginConfig(disabled=frozenset(args.disable_plugin), feature_gates=gates))
            if args.disable_plugin or gates
            else fw.default()
        )
    except fw.PluginConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    cluster = OfflineCluster(framework=framework, now=args.now)
    cluster.facts.status_server = status_server
    if not args.no_default_runtimes:
        cluster.load_default_runtimes()
    for obj in objects:
        cluster.apply(obj)
    for line in [*cluster.notes, *cluster.lifetimes.values(), *cluster.warnings]:
        print(line, file=sys.stderr)
    if cluster.refusals:
        for refusal in cluster.refusals:
            note = refusal.note()
            for line in [*refusal.lines(), *([note] if note else [])]:
                print(line, file=sys.stderr)
        return EXIT_REFUSED
    items = cluster.output()
    if not args.show_secrets:
        items = [_redact(o) for o in items]
    elif any(o.get("kind") == "Secret" for o in items):
        print(SHOWN_SECRETS_WARNING, file=sys.stderr)
    if args.output == "json":
        sys.stdout.write(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2) + "\n")
    else:
        import yaml

        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        sys.stdout.write(yaml.dump_all(items, Dumper=dumper, sort_keys=False, default_flow_style=False))
    return EXIT_OK
