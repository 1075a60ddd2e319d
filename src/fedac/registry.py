"""One registry pattern for every kind of part fedac can be extended with (docs/extending.md).

A `Registry` maps a name to what is registered under it: an `Entry` (a "module:attr" target imported
only when the part is used, a one-line description, and the class of the part's own settings), or a
ready object (a dataset's `DatasetSpec`, which carries its settings class too). Built-in names come
from a torch-free table (fedac/settings/); third-party packages add names through Python entry
points, one group per kind:

    [project.entry-points."fedac.algorithms"]
    mine = "my_package.registry:MINE"        # an Entry (or the object itself)

Only names are read to list them (`fedac list`, `--help`, an unknown-name error); an entry point is
loaded when its name is used. No torch here: settings are resolved and checked before torch loads.

A setting whose value names a part or one of a fixed list is declared with `choice` and checked when
the config loads (config.check_ranges), so `--set aggregation.method=nosuch` stops before any data
or torch.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib
import importlib.util
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from fedac.errors import ConfigError

log = logging.getLogger(__name__)

#: The entry-point group of each kind, in the order `fedac list` shows them.
GROUPS = {
    "algorithm": "fedac.algorithms",
    "model": "fedac.models",
    "dataset": "fedac.datasets",
    "aggregator": "fedac.aggregators",
    "attack": "fedac.attacks",
    "clock_mode": "fedac.clock_modes",
    "availability": "fedac.availability",
    "codec": "fedac.codecs",
    "selector": "fedac.selection",
}


def resolve(target: str) -> Any:
    """The object a "module:attr" string names, imported now."""
    module, _, attr = target.partition(":")
    if not attr:
        raise ConfigError(f"registry target {target!r} must read 'module:attr'")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load {target!r}: {exc}") from None
    return obj


@dataclass(frozen=True)
class Entry:
    """A registered part, imported lazily."""

    target: str
    """"module:attr" of the class or function (imported on first use)."""
    description: str | Callable[[], str] = ""
    """One line for `fedac list`, or a function giving it (called only to list the part: a table
    that must stay torch-free names its parts here and describes them from their torch-side
    specs)."""
    settings: str | type | None = None
    """The part's settings dataclass, or its "module:Class" in a module that imports no torch
    (settings are read and checked before torch loads). None: the part has no settings of its own.
    An algorithm's settings are a section of their own (`cfg.fedmlac`); a model's, dataset's,
    aggregator's or attack's fields join its kind's section (`model`, `data`, `aggregation`,
    `attack`: `--set aggregation.v_l=0.2`)."""
    section: str | None = None
    """Algorithms: the config section that holds those settings; None: the algorithm's name. Several
    algorithms may share one (fedadam, fedyogi, ... all read `fedopt`)."""
    defaults: str | dict | None = None
    """Algorithms: their run defaults, {"train.rounds": 40, ...} or its "module:attr" (no torch): a
    layer between the built-in defaults and a config file, flags and --set (config.load_config)."""
    finish: str | None = None
    """Algorithms: "module:function" called as function(cfg, given) once every layer is applied, for
    settings that resolve one another (zero-shot's rounds); `given` maps a dotted key to its
    layer."""

    def load(self) -> Any:
        return resolve(self.target)

    def settings_class(self) -> type | None:
        return resolve(self.settings) if isinstance(self.settings, str) else self.settings

    def run_defaults(self) -> dict:
        return dict(
            resolve(self.defaults) if isinstance(self.defaults, str) else self.defaults or {}
        )


def settings_class(value: Any) -> type | None:
    """The settings dataclass a registered value declares (an Entry's or a DatasetSpec's
    `settings`), or None."""
    if isinstance(value, Entry):
        return value.settings_class()
    # a part registered itself, not its entry: no settings
    if isinstance(value, type) or callable(value):
        return None
    declared = getattr(value, "settings", None)
    return resolve(declared) if isinstance(declared, str) else declared


def _first_paragraph(text: str) -> str:
    return " ".join(text.strip().split("\n\n")[0].split())


def source_docstring(target: str) -> str | None:
    """The docstring of the class or function a "module:attr" target defines at its module's top
    level, read from the module's source without importing it (listing the parts must not load
    torch: the attacks live in a torch module); None where the source or the definition is not
    found (the target is then imported)."""
    module, _, attr = target.partition(":")
    try:
        spec = importlib.util.find_spec(module)
        origin = spec.origin if spec is not None else None
        if origin is None or not origin.endswith(".py"):
            return None
        with open(origin, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (ImportError, OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name == attr:
            return ast.get_docstring(node)
    return None


def describe(value: Any) -> str:
    """The one-line description of a registered value: its `description`, else its docstring's first
    paragraph (an Entry without one: its target's, read from the source, else imported now)."""
    if isinstance(value, Entry):
        text = value.description() if callable(value.description) else value.description
        if not text:
            text = source_docstring(value.target) or ""
        return _first_paragraph(text) if text else describe(value.load())
    text = getattr(value, "description", None) or getattr(value, "__doc__", None) or ""
    return _first_paragraph(text)


@functools.lru_cache(maxsize=1)
# (metadata.EntryPoints; typeshed's varies with the Python version)
def _installed_entry_points() -> Any:
    """Every installed entry point, read once per process (one scan of the installed
    distributions)."""
    return metadata.entry_points()


class Registry:
    """Name -> registered value (`Entry` or a ready object) for one kind: built-ins, then
    plug-ins."""

    def __init__(self, kind: str, builtins: dict[str, Any], setting: str | None = None):
        """`setting`: the config key that names a part of this kind (aggregation.method), for error
        messages."""
        if kind not in GROUPS:
            raise ValueError(f"unknown registry kind {kind!r}; one of {', '.join(GROUPS)}")
        self.kind, self.group, self.setting = kind, GROUPS[kind], setting or kind
        self._values: dict[str, Any] = dict(builtins)
        self._plugins: dict[str, metadata.EntryPoint] | None = None

    # --- names ------------------------------------------------------------------------------------
    def plugins(self) -> dict[str, metadata.EntryPoint]:
        """The entry points of this kind's group, by name (a built-in name is never replaced)."""
        if self._plugins is None:
            found: dict[str, metadata.EntryPoint] = {}
            for point in _installed_entry_points().select(group=self.group):
                if point.name in self._values:
                    log.warning(
                        "entry point %s = %s in group %s is ignored: %s is a built-in %s",
                        point.name,
                        point.value,
                        self.group,
                        point.name,
                        self.kind,
                    )
                else:
                    found.setdefault(point.name, point)
            self._plugins = found
        return self._plugins

    def names(self) -> list[str]:
        """Built-ins in their table's order, then plug-ins by name."""
        return [*(n for n in self._values if n not in self.plugins()), *sorted(self.plugins())]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self._values or name in self.plugins()

    def is_plugin(self, name: str) -> bool:
        return name in self.plugins()  # (built-in names are never among them)

    # --- values -----------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        """The registered value (a plug-in's entry point is loaded the first time); ConfigError
        naming the registered names when `name` is not one of them."""
        if name not in self._values:
            point = self.plugins().get(name)
            if point is None:
                raise ConfigError(
                    unknown(self.setting, name, self.names(), f"Registered {self.kind}s")
                )
            try:
                value = point.load()
            # a broken plug-in names itself, not a traceback deep in importlib
            except Exception as exc:
                raise ConfigError(
                    f"{self.kind} '{name}' (entry point {point.value} in group {self.group}) does "
                    f"not load: {type(exc).__name__}: {exc}"
                ) from exc
            # An entry point may name the part itself instead of an Entry: it is then loaded
            # already.
            self._values[name] = value
        return self._values[name]

    def items(self) -> list[tuple[str, Any]]:
        """(name, value) of every part that loads; a broken plug-in is left out with a warning
        (naming it in a run still gives its error)."""
        out = []
        for name in self.names():
            try:
                out.append((name, self[name]))
            except ConfigError as exc:
                log.warning("%s", exc)
        return out

    def load(self, name: str) -> Any:
        """The registered class / function / object itself (an Entry's target imported now)."""
        value = self[name]
        return value.load() if isinstance(value, Entry) else value

    def description(self, name: str) -> str:
        return describe(self[name])

    def register(self, name: str, value: Any) -> None:
        """Add a part at run time (a notebook, a test); a name already registered is refused."""
        if name in self:
            raise ConfigError(f"{self.kind} '{name}' is registered already")
        self._values[name] = value

    def settings_classes(self, plugins: bool = True) -> dict[str, type]:
        """Name -> settings dataclass of every part that declares one (built-ins only when `plugins`
        is false: no entry point is read). A plug-in that does not load is left out with one
        warning; naming it in a run gives its error."""
        out = {}
        for name in self.names() if plugins else list(self._values):
            try:
                cls = settings_class(self[name])
            except ConfigError as exc:
                if (self.kind, name) not in _WARNED:
                    _WARNED.add((self.kind, name))
                    log.warning("%s", exc)
                continue
            if cls is not None:
                if not dataclasses.is_dataclass(cls):
                    raise ConfigError(
                        f"{self.kind} '{name}': its settings {cls!r} must be a dataclass"
                    )
                out[name] = cls
        return out


_WARNED: set[tuple[str, str]] = set()  # broken plug-ins already warned about


def unknown(setting: str, value: Any, names: list[str], what: str = "Choices") -> str:
    """The message for a name that is none of `names`: the setting, the value, the names and the
    closest one."""
    close = difflib.get_close_matches(str(value), [str(n) for n in names], n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown {setting} '{value}'. {what}: {', '.join(map(str, names))}{hint}"


def choice(default: Any, among: tuple[str, ...] | Registry, *, default_factory: Any = None) -> Any:
    """A setting whose value is a name (or a list of names): one of `among`, a tuple of names or a
    Registry, checked when the config loads (config.check_ranges). None is always accepted (it means
    "the default")."""
    meta = {"choices": among}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def check_choice(key: str, value: Any, among: tuple[str, ...] | Registry) -> None:
    """ConfigError naming `key`, the value and the choices when `value` (or an item of a list) is
    none of `among`."""
    for item in value if isinstance(value, list) else [value]:
        if item is None or item in among:
            continue
        if isinstance(among, Registry):
            raise ConfigError(unknown(key, item, among.names(), f"Registered {among.kind}s"))
        raise ConfigError(unknown(key, item, list(among)))
