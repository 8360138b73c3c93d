"""The plugin manager: which plugins exist, which are on, and the order they run in.

Built-in plugins and plugins from other packages are found the same way, through the
``trainer.plugins`` entry-point group; the built-ins are simply listed here as well so that a
source checkout (or a wheel whose metadata was not regenerated) still finds them. Built-ins are
on unless disabled by configuration; a plugin from another package loads only when the
configuration allow-lists it by name, because the operator holds cluster-wide rights and nothing
should load into it implicitly.

Order within a phase is fixed (docs/decisions.md §1): PlainML; Torch, MPI, JAX, XGBoost, Flux;
Coscheduling, Volcano, Workload; TrainJobStatus; JobSet; then other packages' plugins by name. A built-in
behind a feature gate (``GATED``) loads only when its gate is on. pluggy calls the
implementations of a hook last-registered-first, so registration runs in reverse.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pluggy

from trainer.api.views import TrainingRuntimeSpec
from trainer.runtime import hookspecs
from trainer.runtime.kinds import Builds, Declaration, DeclarationConflict, by_kind, declared_kinds

ENTRY_POINT_GROUP = "trainer.plugins"

# Name -> module of every built-in plugin, in the order they run within a phase.
BUILTIN_PLUGINS: dict[str, str] = {
    "PlainML": "trainer.plugins.plainml",
    "Torch": "trainer.plugins.torch",
    "MPI": "trainer.plugins.mpi",
    "JAX": "trainer.plugins.jax",
    "XGBoost": "trainer.plugins.xgboost",
    "Flux": "trainer.plugins.flux",
    "CoScheduling": "trainer.plugins.coscheduling",
    "Volcano": "trainer.plugins.volcano",
    "Workload": "trainer.plugins.workload",
    "TrainJobStatus": "trainer.plugins.trainjob_status",
    "JobSet": "trainer.plugins.jobset",
}

# Built-in plugins that load only when a feature gate is on: plugin name -> gate (upstream's names).
GATED: dict[str, str] = {"TrainJobStatus": "TrainJobStatus"}


class Plugin(Protocol):
    """What the framework asks of a plugin object besides its hook implementations."""

    name: str

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        """True when a runtime with this spec cannot be rendered correctly without the plugin."""
        ...


class PluginConfigError(Exception):
    """The plugin configuration names something that does not exist or cannot load."""


@dataclass(frozen=True)
class PluginConfig:
    """The part of the operator configuration that decides which plugins load."""

    disabled: frozenset[str] = frozenset()
    allowed_external: frozenset[str] = frozenset()
    feature_gates: dict[str, bool] = field(default_factory=dict)


class Framework:
    """The loaded plugins of one process, and the hooks to call them."""

    def __init__(self, plugins: Sequence[Plugin], known: Sequence[Plugin] = ()) -> None:
        self.plugins = list(plugins)
        self.known = {p.name: p for p in [*known, *plugins]}
        self.manager = pluggy.PluginManager(hookspecs.PROJECT)
        self.manager.add_hookspecs(hookspecs)
        for plugin in reversed(self.plugins):
            self.manager.register(plugin, name=plugin.name)
        try:
            # An implementation whose name matches no hook (a misspelt hook) would register
            # silently and never run: refuse it by name, as pytest refuses an unknown hook.
            self.manager.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginConfigError(f"plugin {self.manager.get_name(exc.plugin)!r}: {exc}") from exc
        # What the render core and each enabled plugin read and build, by who declared it
        # (``core`` for the core): the operator's watch table and the chart's rules are made of
        # it, and the render core refuses an object of a kind nobody declares to build.
        from trainer.runtime.snapshot import CORE_KINDS

        self.declarations: list[tuple[str, Declaration]] = [("core", d) for d in CORE_KINDS]
        for plugin in self.plugins:
            try:
                self.declarations.extend((plugin.name, d) for d in declared_kinds(plugin))
            except TypeError as exc:
                raise PluginConfigError(f"plugin {plugin.name!r}: {exc}") from exc
        try:
            by_kind(self.declarations)
        except DeclarationConflict as exc:
            raise PluginConfigError(str(exc)) from exc
        self.built_kinds = frozenset(
            (d.kind.api_version, d.kind.kind) for _, d in self.declarations if isinstance(d, Builds)
        )
        self.deletable_kinds = frozenset(
            (d.kind.api_version, d.kind.kind)
            for _, d in self.declarations
            if isinstance(d, Builds) and d.delete
        )
        providers = [p for p in self.plugins if hasattr(p, "trainer_compute_status")]
        if len(providers) > 1:
            names = ", ".join(p.name for p in providers)
            raise PluginConfigError(f"too many TrainJobStatus plugins are registered: {names}")

    @property
    def hook(self) -> Any:
        return self.manager.hook

    @property
    def enabled(self) -> list[str]:
        return [p.name for p in self.plugins]

    def missing_for(self, spec: TrainingRuntimeSpec) -> list[str]:
        """Plugins a runtime needs that this process has disabled, by name."""
        enabled = set(self.enabled)
        return [name for name, p in self.known.items() if name not in enabled and p.needed_by(spec)]


def _load_builtin(name: str) -> Plugin:
    # The "module:plugin" object the package's entry points declare for it (pyproject.toml),
    # loaded as EntryPoint.load() loads one; resolved here rather than scanned for, because
    # importlib.metadata and a scan of every installed distribution cost more than a whole render.
    plugin: Plugin = importlib.import_module(BUILTIN_PLUGINS[name]).plugin
    return plugin


def _external_entry_points() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in BUILTIN_PLUGINS}


# Hook options that would let a plugin step out of the fixed order (docs/decisions.md §1).
_ORDER_OPTIONS = ("tryfirst", "trylast", "hookwrapper", "wrapper")


def _check_plugin(plugin: Any, name: str) -> None:
    """Refuse, at start-up and by name, a plugin from another package (or one handed to
    ``load(extra=...)`` while it is developed) that would fail later or run out of order: the
    operator should not start with a plugin it cannot run as documented."""
    if getattr(plugin, "name", None) != name:
        raise PluginConfigError(
            f"plugin {name!r}: its object's name is {getattr(plugin, 'name', None)!r}; it must equal the "
            f"entry-point name, which is what the allow-list and error messages use"
        )
    if not callable(getattr(plugin, "needed_by", None)):
        raise PluginConfigError(f"plugin {name!r} has no needed_by(spec) method")
    marker = f"{hookspecs.PROJECT}_impl"
    for attr in dir(plugin):
        opts = getattr(getattr(plugin, attr, None), marker, None)
        if not isinstance(opts, dict):
            continue
        hook = opts.get("specname") or attr
        if not callable(getattr(hookspecs, hook, None)) or not hook.startswith(f"{hookspecs.PROJECT}_"):
            raise PluginConfigError(
                f"plugin {name!r} implements {hook!r}, which is not a hook of trainer.runtime.hookspecs"
            )
        ordered = [opt for opt in _ORDER_OPTIONS if opts.get(opt)]
        if ordered:
            raise PluginConfigError(
                f"plugin {name!r}: {hook} is marked {', '.join(ordered)}; plugins from other packages run after "
                "the built-ins in a fixed order, so these options are not supported"
            )


def load(config: PluginConfig | None = None, extra: Iterable[Plugin] = ()) -> Framework:
    """Build the framework for a configuration: built-ins minus disabled, plus allowed externals.

    A plugin from another package is imported only when ``config.allowed_external`` names it:
    installing a package must not be enough to run code inside the operator.
    """
    config = config or PluginConfig()
    builtin_allowed = sorted(set(config.allowed_external) & set(BUILTIN_PLUGINS))
    if builtin_allowed:
        raise PluginConfigError(f"built-in plugins need no allow-listing: {', '.join(builtin_allowed)}")
    external = _external_entry_points() if config.allowed_external else {}
    unknown = sorted(set(config.disabled) - set(BUILTIN_PLUGINS) - set(external))
    if unknown:
        raise PluginConfigError(f"cannot disable unknown plugins: {', '.join(unknown)}")
    missing = sorted(set(config.allowed_external) - set(external))
    if missing:
        raise PluginConfigError(
            f"allow-listed plugins not installed (entry-point group {ENTRY_POINT_GROUP!r}): {', '.join(missing)}"
        )
    builtins = [_load_builtin(name) for name in BUILTIN_PLUGINS]
    enabled: list[Plugin] = [
        p
        for p in builtins
        if p.name not in config.disabled and (p.name not in GATED or config.feature_gates.get(GATED[p.name]))
    ]
    for name in sorted(config.allowed_external):
        if name in config.disabled:
            continue
        try:
            loaded = external[name].load()
            plugin = loaded() if isinstance(loaded, type) else loaded
        except Exception as exc:  # a broken third-party package must say so, not crash obscurely
            raise PluginConfigError(f"plugin {name!r} failed to load: {exc}") from exc
        _check_plugin(plugin, name)
        enabled.append(plugin)
    for plugin in extra:
        plugin_name = getattr(plugin, "name", None)
        if not isinstance(plugin_name, str) or not plugin_name:
            raise PluginConfigError(f"a {type(plugin).__name__} plugin object has no name: give it one")
        _check_plugin(plugin, plugin_name)
        enabled.append(plugin)
    return Framework(enabled, known=builtins)


_default: Framework | None = None


def default() -> Framework:
    """The framework with every built-in plugin on, built once per process."""
    global _default
    if _default is None:
        _default = load()
    return _default
