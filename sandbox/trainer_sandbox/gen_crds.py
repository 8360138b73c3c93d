"""Copy the JobSet and PodGroup CRDs the sandbox installs into ``sandbox/trainer_sandbox/crds/``.

They are stored as JSON without descriptions: the originals are large YAML files that take seconds
to parse, and the server needs only their schemas. Run
``python -m trainer_sandbox.gen_crds REFERENCE/crds``, where REFERENCE is the upstream reference
data (docs/reference-data.md); without an argument, ``$TRAINER_REFERENCE_DIR/crds``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

SOURCES = (
    "jobset/jobset.x-k8s.io_jobsets.yaml",
    "scheduler-plugins/scheduling.x-k8s.io_podgroups.yaml",
    "volcano/scheduling.volcano.sh_podgroups.yaml",
)
TARGET = Path(__file__).with_name("crds")


def strip_descriptions(node: Any, in_properties: bool = False) -> Any:
    """Drop ``description`` from schema nodes, keeping fields that are named ``description``."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "description" and not in_properties:
                continue
            out[key] = strip_descriptions(value, in_properties=key == "properties" and not in_properties)
        return out
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if args:
        source = Path(args[0])
    elif os.environ.get("TRAINER_REFERENCE_DIR"):
        source = Path(os.environ["TRAINER_REFERENCE_DIR"]) / "crds"
    else:
        print(
            "usage: python -m trainer_sandbox.gen_crds REFERENCE/crds (or set TRAINER_REFERENCE_DIR)",
            file=sys.stderr,
        )
        return 2
    TARGET.mkdir(exist_ok=True)
    for rel in SOURCES:
        doc = yaml.load((source / rel).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        out = TARGET / (Path(rel).stem + ".json")
        out.write_text(json.dumps(strip_descriptions(doc), sort_keys=True, separators=(",", ":")) + "\n")
        print(f"wrote {out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
