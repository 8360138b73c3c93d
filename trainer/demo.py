"""`trainer demo`: what the operator would create for the bundled example TrainJobs.

Runs entirely offline on the render core: the bundled runtimes, the examples in
``trainer/examples``, and a summary a person can read, followed by the objects themselves.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

Obj = dict[str, Any]


def _summary(obj: Obj) -> str:
    kind = obj["kind"]
    name = obj["metadata"]["name"]
    if kind == "JobSet":
        jobs = ", ".join(
            f"{rj['name']} x{rj['template']['spec'].get('parallelism', 1)}"
            for rj in obj["spec"].get("replicatedJobs", [])
        )
        return f"JobSet {name}: {jobs} (suspend={obj['spec'].get('suspend')})"
    if kind == "ConfigMap":
        return f"ConfigMap {name}: keys {', '.join(sorted(obj.get('data', {})))}"
    if kind == "Secret":
        return f"Secret {name}: {obj.get('type', 'Opaque')}, keys {', '.join(sorted(obj.get('data', {})))} (redacted)"
    if kind == "PodGroup":
        return f"PodGroup {name}: minMember {obj['spec'].get('minMember')}"
    return f"{kind} {name}"


def run(out: TextIO = sys.stdout) -> int:
    from trainer.manifests import read_manifests
    from trainer.offline import OfflineCluster
    from trainer.runtime import framework

    examples = Path(str(resources.files("trainer.examples")))
    cluster = OfflineCluster(framework=framework.default())
    cluster.load_default_runtimes()
    for obj in read_manifests([str(examples)]):
        cluster.apply(obj)
    for refusal in cluster.refusals:
        for line in refusal.lines():
            print(f"refused: {line}", file=out)
    current = None
    for obj in cluster.output():
        if obj["kind"] == "TrainJob":
            current = obj["metadata"]["name"]
            ref = obj["spec"]["runtimeRef"]["name"]
            print(f"\nTrainJob {current} (runtime {ref}) would create:", file=out)
            continue
        print(f"  - {_summary(obj)}", file=out)
    return 1 if cluster.refusals else 0
