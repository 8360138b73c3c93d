"""The kinds a plugin reads from the cluster and the kinds it builds, declared by the plugin.

The render core does no I/O: whatever a plugin reads about the cluster must already be in
``info.facts``, and whatever it returns from ``trainer_build`` is written by someone else. So the
operator has to know, before any TrainJob arrives, which kinds to list, watch, cache and write,
and the chart which rights to grant. A plugin says so itself, as upstream's plugins do through
their watch extensions and component builders, in a ``kinds`` attribute::

    class VolcanoPlugin:
        name = "Volcano"
        kinds = (
            Builds(Kind("scheduling.volcano.sh/v1beta1", "PodGroup", "podgroups"), optional=True),
            Reads(Kind("scheduling.k8s.io/v1", "PriorityClass", "priorityclasses", namespaced=False)),
        )

The operator's watch table, its writable kinds and the chart's RBAC rules are derived from the
enabled plugins' declarations (``controller/resources.py``), so a plugin from another package
that reads or builds a kind the core has never heard of works without a change here, and a
disabled plugin's kinds are neither watched nor granted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trainer.apimachinery.object_meta import qualified_name


@dataclass(frozen=True)
class Kind:
    """An API kind and where its API serves it (``plural`` is the resource in the URL)."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]


@dataclass(frozen=True)
class Reads:
    """Objects of a kind the plugin reads from ``info.facts`` (or ``ctx.facts`` at admission).

    The operator lists, watches and caches them; a change reconciles nothing by itself.
    ``label``: only objects carrying this label key, a filter the API server applies, so the rest
    of the cluster's objects of the kind never reach the operator. ``optional``: the kind's API
    may not be installed (a gang scheduler's CRD): then there are none, which is not an error.
    """

    kind: Kind
    label: str | None = None
    optional: bool = False


@dataclass(frozen=True)
class Builds:
    """Objects of a kind the plugin returns from ``trainer_build``: the TrainJob's children.

    The operator creates them, watches them (a change or a deletion reconciles the TrainJob that
    owns them) and caches them as facts. ``patch``: an object that differs from what the plugin
    builds is patched; False for what is written once and never changed (key material). A kind
    every declaration of which is such a create-only child is never listed or watched: the
    operator knows it by its own creates and, when a create finds the name taken, by reading that
    one object's metadata by name (so it is granted ``create`` and ``get``, never ``list``).
    ``delete``: the render core may ask for it to be deleted (the JobSet, when a deadline passes).
    ``label`` and ``optional`` as for :class:`Reads`; children carry the TrainJob's name label.
    """

    kind: Kind
    label: str | None = None
    optional: bool = False
    patch: bool = True
    delete: bool = False


Declaration = Reads | Builds


class DeclarationConflict(ValueError):
    """Two declarations of one kind disagree: on where its API is, its label, or patching."""


def by_kind(declarations: Iterable[tuple[str, Declaration]]) -> dict[Kind, list[tuple[str, Declaration]]]:
    """Declarations grouped by kind, by who made them, checked to agree on what would otherwise
    be weakened for all of them: where the kind's API is, the label the server filters by (one
    unlabelled declaration would bring every Secret of the cluster into the cache) and whether
    children are patched (one plugin's Builds must not make another's keys rewritable)."""
    grouped: dict[tuple[str, str], list[tuple[str, Declaration]]] = {}
    for who, declaration in declarations:
        grouped.setdefault((declaration.kind.api_version, declaration.kind.kind), []).append(
            (who, declaration)
        )
    found: dict[Kind, list[tuple[str, Declaration]]] = {}
    for same in grouped.values():
        kind = same[0][1].kind
        builds = [(who, d.patch) for who, d in same if isinstance(d, Builds)]
        for field_name, values in (
            ("API (plural, namespaced)", [(who, (d.kind.plural, d.kind.namespaced)) for who, d in same]),
            ("label", [(who, d.label) for who, d in same]),
            ("patch", builds),
        ):
            if len({value for _, value in values}) > 1:
                said = "; ".join(f"{who}: {value!r}" for who, value in values)
                raise DeclarationConflict(
                    f"the declarations of {kind.kind} ({kind.api_version}) differ in their {field_name}: {said}"
                )
        found[kind] = same
    return found


# Kinds every cluster serves that more than one plugin builds.
CONFIG_MAP = Kind("v1", "ConfigMap", "configmaps")
SECRET = Kind("v1", "Secret", "secrets")


def declared_kinds(plugin: object) -> tuple[Declaration, ...]:
    """A plugin's declarations, checked: a plugin without ``kinds`` reads and builds nothing."""
    found = getattr(plugin, "kinds", ())
    if not isinstance(found, tuple | list) or not all(isinstance(d, Reads | Builds) for d in found):
        raise TypeError("kinds must be a tuple of trainer.plugin.Reads and Builds declarations")
    for declaration in found:
        if declaration.label is not None and qualified_name(declaration.label):
            raise TypeError(
                f"the label of {declaration.kind.kind} must be a label key (objects carrying it are "
                f"watched), not {declaration.label!r}"
            )
    return tuple(found)
