"""The fields our API has beyond upstream's, kept through updates by clients that do not know them
(docs/decisions.md §extensions-survive).

A client built on upstream's Go types (Kueue's, upstream's SDK, a platform's own controller)
reads a TrainJob into a struct without our fields and writes the whole object back: an update
that leaves them out. The API server cannot tell that from a user removing them, so the
defaulting webhook does: on an update, an extension field the stored object has and the new one
leaves out is the stored value again. Changing one works as before; removing one is done by
setting it (a TTL can be raised, not dropped).

``EXTENSIONS`` is checked against upstream's CRDs by tests/test_extensions.py: every field our
CRDs add outside ``status`` is listed here.
"""

from __future__ import annotations

import copy

from trainer.api import constants as c
from trainer.api.objects import Obj

# Per kind, the paths (below the object) of each field upstream's API does not have.
EXTENSIONS: dict[str, tuple[tuple[str, ...], ...]] = {
    c.TRAINJOB_KIND: (("spec", "ttlSecondsAfterFinished"),),
    c.TRAINING_RUNTIME_KIND: (("spec", "runPolicy"), ("spec", "podGroupPolicy", "workload")),
    c.CLUSTER_TRAINING_RUNTIME_KIND: (("spec", "runPolicy"), ("spec", "podGroupPolicy", "workload")),
}


# An extension that one of upstream's fields replaces: an update that sets that field chose it.
REPLACED_BY: dict[tuple[str, ...], tuple[str, ...]] = {
    ("spec", "podGroupPolicy", "workload"): ("coscheduling", "volcano"),
}


def keep_extensions(obj: Obj, old: Obj | None) -> list[str]:
    """On an update, put back each extension field ``old`` has and ``obj`` leaves out; the dotted
    paths of those put back. Anything not of the expected shape is left for the schema."""
    if old is None:
        return []
    kept: list[str] = []
    for path in EXTENSIONS.get(str(obj.get("kind", "")), ()):
        *parents, last = path
        source: object = old
        target: object = obj
        for part in parents:
            source = source.get(part) if isinstance(source, dict) else None
            target = target.get(part) if isinstance(target, dict) else None
        if not (isinstance(source, dict) and last in source and isinstance(target, dict)):
            continue
        if last in target or any(other in target for other in REPLACED_BY.get(path, ())):
            continue  # set, or replaced by what it excludes: either way the client's choice
        target[last] = copy.deepcopy(source[last])
        kept.append(".".join(path))
    return kept
