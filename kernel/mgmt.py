"""The management model: one live tree per router of config entities and usage.

Theory of operation
-------------------
The tree mirrors the config file. Its root is the ``<router>`` entity; under it sits one
:class:`Entity` per swiftlet, whose children are the swiftlet's fixed child entities
(:class:`Entity`), entity lists (:class:`EntityList`), the kernel-owned ``pools`` list and a
read-only ``usage`` part (:class:`Usage`, :class:`UsageList`) for runtime state and counters.
Paths are slash-separated names: ``/sys$log``, ``/xt$echo/pools/echo.worker``,
``/xt$echo/usage/pools/echo.worker``, ``/usage`` (the router's own runtime state).

A change follows one protocol, fixing SwiftMQ's defect of assigning before asking:

1. the new value is parsed and checked (:func:`kernel.schema.parse_value`);
2. the owner's listener is offered the change and may refuse it by raising :class:`Veto`
   (a property marked ``reboot_required`` is not offered: it takes effect at the next start);
3. only then is it committed;
4. watchers are told after the commit, through a :class:`kernel.bus.PropertyChanged`,
   ``EntityAdded`` or ``EntityRemoved`` event on the router's bus.

Adding and removing entities of an entity list works the same way. A swiftlet that binds a
list with :meth:`EntityList.bind` first gets every entry already present through the same
``on_add`` callback as later additions, so startup and runtime share one code path.

Names. The tree, its paths, :meth:`Entity.get`/:meth:`Entity.set` and the bus events speak
XML names (``max-batch``), as the config file and the operator do; what a swiftlet's code
sees speaks Python: a :class:`Change` names the property by its config-class field
(``change.field == "max_batch"``) and :attr:`Entity.config` is the config-class object.

Two frozen views of an entity:

- :attr:`Entity.config` — the config *in effect*, what the owning swiftlet should act on
  (``SwiftletContext.config`` is this view of the swiftlet's entity). Built from the live
  values and cached; a commit anywhere below an entity drops the cached objects of it and
  its ancestors (each node knows its parent), so reading it per use costs an attribute
  lookup. A reboot-required property keeps here the value it had when its owner started
  (:meth:`Entity.settle`); its new value takes effect at the next start.
- :meth:`Entity.snapshot` — the config as configured, every committed value included, for
  ``save``.

Operations. A usage entity may offer operations (:meth:`Usage.add_operation`), e.g.
``commit`` and ``rollback`` on each in-doubt transaction of ``sys$xa``: named actions with
a description and declared parameters (:class:`Operation`, :class:`Parameter` — plain data,
so a remote management front end can list and describe them), invoked with
:meth:`Tree.invoke`. An operation's callable may be synchronous or ``async``; ``invoke`` is
``async`` and awaits it. It refuses by raising :class:`Veto` (or :class:`ManagementError`).
An operation lives and dies with its usage entity: removing the entry removes it, and
invoking it then fails like any unknown path.

Everything here runs in the router's trio thread; nothing is locked.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs

from .bus import EntityAdded, EntityRemoved, EventBus, PropertyChanged
from .schema import Child, ListOf, Prop, fields_of, parse_value, shown, xml_name
from .xmlconfig import ElementReader, suggest

__all__ = [
    "ManagementError",
    "Veto",
    "Change",
    "Entity",
    "EntityList",
    "Usage",
    "UsageList",
    "Operation",
    "Parameter",
    "Tree",
]


class ManagementError(Exception):
    """A management request failed: unknown path or property, invalid value, or vetoed."""


class Veto(Exception):
    """Raised by a change listener to refuse a change; the message is the reason."""


@attrs.frozen(kw_only=True)
class Change:
    """A property change offered to a listener, and the result of :meth:`Tree.set`.

    A listener identifies the property by ``field``, the Python name under which the
    entity's config class declares it, so it can compare and evolve without translating::

        def on_change(change: Change) -> None:
            if change.field == "max_batch":
                store.max_batch = change.new

        settings = attrs.evolve(settings, **{change.field: change.new})

    ``xml_name`` is the same property's name in the config file, in paths and in
    :class:`kernel.bus.PropertyChanged` (``max-batch``); use it in messages to operators.
    The listener is called *before* the commit: inside it, :attr:`Entity.config` and
    :meth:`Entity.get` still hold ``old``.

    Attributes:
        path: the entity's path in the management tree, e.g. ``/sys$store``.
        field: the property's config-class field name, e.g. ``max_batch``.
        xml_name: the property's XML name, e.g. ``max-batch``.
        old: the value before the change, typed as the config class holds it.
        new: the value after the change (already parsed and checked), typed likewise.
        reboot_required: the property takes effect at the next start; such a change is
            committed without being offered to the listener.
    """

    path: str
    field: str
    xml_name: str
    old: Any
    new: Any
    reboot_required: bool = False


def _join(path: str, name: str) -> str:
    return f"{path.rstrip('/')}/{name}"


class Entity:
    """A config entity: scalar properties plus child entities and lists.

    ``children`` maps XML names to child nodes (entities, lists, usage parts). ``parent``
    is the entity or entity list whose config holds this one (``None`` for a root, and
    for the swiftlet entities and pools lists the router hangs below the tree's root).
    """

    def __init__(self, tree: Tree, path: str, value: Any, parent: Entity | EntityList | None = None):
        self.tree = tree
        self.path = path
        self.parent = parent
        self.config_type = type(value)
        self.props: dict[str, tuple[attrs.Attribute[Any], Prop]] = {}
        self._values: dict[str, Any] = {}
        self._at_start: dict[str, Any] = {}  # reboot-required props changed since settle()
        self._config: Any = value  # the config in effect; None when it must be rebuilt
        self.children: dict[str, Entity | EntityList | Usage | UsageList] = {}
        self._config_children: dict[str, str] = {}  # XML name -> field name
        self._listener: Callable[[Change], None] | None = None
        for field, meta in fields_of(type(value)):
            key = xml_name(field.name)
            current = getattr(value, field.name)
            if isinstance(meta, Prop):
                self.props[key] = (field, meta)
                self._values[key] = current
            elif isinstance(meta, Child):
                self.children[key] = Entity(tree, _join(path, key), current, self)
                self._config_children[key] = field.name
            else:
                self.children[key] = EntityList(tree, _join(path, key), meta, current, self)
                self._config_children[key] = field.name

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1] or "/"

    def get(self, name: str) -> Any:
        """The current value of property ``name`` (its XML name).

        Raises:
            ManagementError: no such property.
        """
        _field, meta = self._prop(name)
        return shown(meta, self._values[name])

    def properties(self) -> dict[str, Any]:
        """All properties and their current values, by XML name (secret ones masked)."""
        return {
            key: shown(self.props[key][1], value) if key in self.props else value for key, value in self._values.items()
        }

    @property
    def config(self) -> Any:
        """The entity's config in effect, as a frozen object of its config class.

        Every property has its current committed value, except that a reboot-required one
        keeps its value from the owner's start (see :meth:`settle`); child entities and
        entity lists are included, the kernel's ``pools`` and ``usage`` are not. The object
        is cached until something below this entity changes, so reading it per use is
        cheap; keep it no longer than one use if it should follow runtime changes.
        During a change listener it still holds the old value (the change is offered
        before it is committed).
        """
        if self._config is None:
            kwargs = {field.name: self._at_start.get(key, self._values[key]) for key, (field, _) in self.props.items()}
            for key, field_name in self._config_children.items():
                child = self.children[key]
                assert isinstance(child, (Entity, EntityList))  # config children only
                kwargs[field_name] = child.config
            self._config = self.config_type(**kwargs)
        return self._config

    def settle(self) -> None:
        """Make every committed value of this entity and below it the value in effect.

        The kernel calls this when the owning swiftlet starts, so reboot-required changes
        made before that take effect at this start.
        """
        self._at_start.clear()
        self._invalidate()
        for child in self.children.values():
            if isinstance(child, Entity):
                child.settle()
            elif isinstance(child, EntityList):
                for entity in child.entities.values():
                    entity.settle()

    def _invalidate(self) -> None:
        """Drop the cached :attr:`config` of this entity and of every ancestor."""
        self._config = None
        if self.parent is not None:
            self.parent._invalidate()

    def describe(self, name: str) -> Prop:
        """The declaration of property ``name``: description, bounds, choices, reboot flag."""
        return self._prop(name)[1]

    def entity_list(self, name: str) -> EntityList:
        """The child entity list ``name`` (its XML name), e.g. ``listeners``.

        Raises:
            ManagementError: no such entity list.
        """
        node = self.children.get(name)
        if not isinstance(node, EntityList):
            raise ManagementError(f"{self.path}: no entity list '{name}'")
        return node

    def on_change(self, listener: Callable[[Change], None] | None) -> None:
        """Set the owner's listener; it may raise :class:`Veto` to refuse a change."""
        self._listener = listener

    def clear_listeners(self) -> None:
        """Forget the listeners of this entity and everything below it (its owner stopped):
        later changes commit without being offered."""
        self._listener = None
        for child in self.children.values():
            if isinstance(child, EntityList):
                child.bind(None, None)
                for entity in child.entities.values():
                    entity.clear_listeners()
            elif isinstance(child, Entity):
                child.clear_listeners()

    def set(self, name: str, raw: Any) -> Change:
        """Validate, offer to the listener, commit and announce a new value.

        ``raw`` is XML text or an already typed value.

        Raises:
            ManagementError: unknown or read-only property, invalid value, or vetoed;
                the old value stays in place.
        """
        field, meta = self._prop(name)
        where = f"{self.path}: property '{name}'"
        if meta.read_only:
            raise ManagementError(f"{where} is read-only")
        assert field.type is not None  # config_class resolved every field's type
        try:
            value = parse_value(field.type, meta, raw)
        except ValueError as exc:
            raise ManagementError(f"{where}: {exc}") from None
        change = Change(
            path=self.path,
            field=field.name,
            xml_name=name,
            old=self._values[name],
            new=value,
            reboot_required=meta.reboot_required,
        )
        if self._listener is not None and not meta.reboot_required:
            try:
                self._listener(change)
            except Veto as veto:
                raise ManagementError(f"{where}: change refused: {veto}") from None
        if meta.reboot_required:
            self._at_start.setdefault(name, change.old)  # in effect until the next start
        self._values[name] = value
        self._invalidate()
        self.tree.bus.publish(
            PropertyChanged(path=self.path, name=name, old=shown(meta, change.old), new=shown(meta, value))
        )
        return change

    def snapshot(self) -> Any:
        """The entity as configured, as a frozen config object: every committed value,
        reboot-required ones included (what ``save`` writes). Built anew on each call."""
        kwargs = {field.name: self._values[key] for key, (field, _) in self.props.items()}
        for key, field_name in self._config_children.items():
            kwargs[field_name] = self.children[key].snapshot()  # type: ignore[union-attr]
        return self.config_type(**kwargs)

    def _prop(self, name: str) -> tuple[attrs.Attribute[Any], Prop]:
        try:
            return self.props[name]
        except KeyError:
            raise ManagementError(f"{self.path}: no property '{name}'{suggest(name, list(self.props))}") from None


class EntityList:
    """A keyed list of entities of one config class (listeners, queues, pools …)."""

    def __init__(
        self,
        tree: Tree,
        path: str,
        meta: ListOf,
        items: Mapping[str, Any],
        parent: Entity | None = None,
    ):
        self.tree = tree
        self.path = path
        self.meta = meta
        self.parent = parent
        self.entities: dict[str, Entity] = {
            name: Entity(tree, _join(path, name), item, self) for name, item in items.items()
        }
        self._on_add: Callable[[Entity], None] | None = None
        self._on_remove: Callable[[Entity], None] | None = None
        self._destroys: Callable[[Entity], int] | None = None

    def bind(
        self,
        on_add: Callable[[Entity], None] | None = None,
        on_remove: Callable[[Entity], None] | None = None,
        destroys: Callable[[Entity], int] | None = None,
    ) -> None:
        """Set the owner's listeners, replaying every present entry through ``on_add``.

        Listeners may raise :class:`Veto` to refuse an addition or a removal. ``destroys``
        (for a list whose entries hold messages, as queues do): how many messages removing
        an entry would drop now; management asks for a confirmation when it is not 0.

        Raises:
            ManagementError: ``on_add`` vetoed an entry already present.
        """
        self._on_add, self._on_remove, self._destroys = on_add, on_remove, destroys
        if on_add is not None:
            for entity in list(self.entities.values()):
                try:
                    on_add(entity)
                except Veto as veto:
                    raise ManagementError(f"{entity.path}: refused: {veto}") from None

    def destroys(self, name: str) -> int:
        """How many messages removing entry ``name`` would drop now (0: none, or unknown
        entry, or a list whose entries hold none)."""
        entity = self.entities.get(name)
        return self._destroys(entity) if entity is not None and self._destroys is not None else 0

    def add(self, name: str, values: Mapping[str, Any] | None = None) -> Entity:
        """Create entry ``name`` from property values (XML names), offer it, then add it.

        Raises:
            ManagementError: the name exists, a value is invalid, or the owner vetoed.
        """
        where = f"{self.path}: cannot add {name!r}"
        if name in self.entities:
            raise ManagementError(f"{where}: it exists already")
        if not name or "/" in name:
            raise ManagementError(f"{where}: a name must be non-empty and contain no '/'")
        try:
            item = self.tree.reader.structure({**(values or {}), "name": name}, self.meta.item_type)
        except ValueError as exc:
            raise ManagementError(f"{where}: {exc}") from None
        entity = Entity(self.tree, _join(self.path, name), item, self)
        if self._on_add is not None:
            try:
                self._on_add(entity)
            except Veto as veto:
                raise ManagementError(f"{where}: refused: {veto}") from None
        self.entities[name] = entity
        self._invalidate()
        self.tree.bus.publish(EntityAdded(path=self.path, name=name))
        return entity

    def remove(self, name: str) -> None:
        """Offer the removal of entry ``name`` to the owner, then remove it.

        Raises:
            ManagementError: no such entry, or the owner vetoed.
        """
        entity = self.entities.get(name)
        if entity is None:
            raise ManagementError(f"{self.path}: no entry {name!r}")
        if self._on_remove is not None:
            try:
                self._on_remove(entity)
            except Veto as veto:
                raise ManagementError(f"{self.path}: cannot remove {name!r}: refused: {veto}") from None
        del self.entities[name]
        self._invalidate()
        self.tree.bus.publish(EntityRemoved(path=self.path, name=name))

    @property
    def config(self) -> dict[str, Any]:
        """The entries' configs in effect, by name (see :attr:`Entity.config`)."""
        return {name: entity.config for name, entity in self.entities.items()}

    def snapshot(self) -> dict[str, Any]:
        """The entries as configured, by name (see :meth:`Entity.snapshot`)."""
        return {name: entity.snapshot() for name, entity in self.entities.items()}

    def _invalidate(self) -> None:
        if self.parent is not None:
            self.parent._invalidate()


_PARAMETER_TYPES = (str, int, float, bool)


@attrs.frozen(kw_only=True)
class Parameter:
    """A declared parameter of an :class:`Operation`.

    Attributes:
        name: its name, as :meth:`Tree.invoke` takes it (``**{name: value}``).
        description: what it means, for the operator.
        type: ``str``, ``int``, ``float`` or ``bool``; a ``str`` argument for another
            type is parsed (``"true"``/``"false"`` for ``bool``), as a remote front end
            sends text.
        required: the caller must give it; else ``default`` is passed when it does not.
        default: the value of an optional parameter not given.
    """

    name: str
    description: str
    type: type = str
    required: bool = True
    default: Any = None

    def __attrs_post_init__(self) -> None:
        if self.type not in _PARAMETER_TYPES:
            raise TypeError(f"parameter {self.name!r}: type must be one of str, int, float, bool")

    def parse(self, value: Any) -> Any:
        """``value`` as this parameter's type.

        Raises:
            ValueError: it is not one.
        """
        if self.type is bool:
            if isinstance(value, bool):
                return value
            if value in ("true", "false"):
                return value == "true"
            raise ValueError(f"expected 'true' or 'false', found {value!r}")
        if isinstance(value, self.type) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return self.type(value)
            except ValueError:
                pass
        raise ValueError(f"expected {self.type.__name__}, found {value!r}")


@attrs.frozen(kw_only=True)
class Operation:
    """An action offered on a usage entity (:meth:`Usage.add_operation`).

    Attributes:
        name: e.g. ``commit``.
        description: what it does, for the operator.
        parameters: the declared parameters, in order.
        call: the implementation, called with the parameters as keyword arguments; sync
            or ``async``; it refuses by raising :class:`Veto`. Not part of the data a
            front end shows.
        destroys: for an operation that drops messages (a purge, a rollback), how many it
            would drop if run now; management asks for a confirmation when it is not 0.
    """

    name: str
    description: str
    parameters: tuple[Parameter, ...] = ()
    call: Callable[..., Any | Awaitable[Any]] = attrs.field(eq=False, repr=False)
    destroys: Callable[[], int] | None = attrs.field(default=None, eq=False, repr=False)

    def describe(self) -> dict[str, Any]:
        """The operation as plain data: name, description and each parameter's name,
        description, type name, required flag and default."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": [
                {
                    "name": p.name,
                    "description": p.description,
                    "type": p.type.__name__,
                    "required": p.required,
                    "default": p.default,
                }
                for p in self.parameters
            ],
        }


class Usage:
    """A read-only runtime entity; its values come from a callable, read when asked. It
    may offer operations (:meth:`add_operation`)."""

    def __init__(self, path: str, values: Callable[[], Mapping[str, Any]] | None = None):
        self.path = path
        self._values = values or dict
        self.children: dict[str, Usage | UsageList] = {}
        self.operations: dict[str, Operation] = {}

    def add_operation(
        self,
        name: str,
        call: Callable[..., Any | Awaitable[Any]],
        description: str,
        parameters: tuple[Parameter, ...] | list[Parameter] = (),
        destroys: Callable[[], int] | None = None,
    ) -> Operation:
        """Offer (or replace) operation ``name`` on this entity; :meth:`Tree.invoke` calls
        ``call`` with the parameters as keyword arguments (awaiting it if it is async);
        ``destroys``: see :class:`Operation`."""
        operation = self.operations[name] = Operation(
            name=name, description=description, parameters=tuple(parameters), call=call, destroys=destroys
        )
        return operation

    def provide(self, values: Callable[[], Mapping[str, Any]]) -> None:
        """Set the callable that supplies this entity's values."""
        self._values = values

    def properties(self) -> dict[str, Any]:
        return dict(self._values())

    def get(self, name: str) -> Any:
        values = self._values()
        if name not in values:
            raise ManagementError(f"{self.path}: no usage property '{name}'")
        return values[name]

    def child(self, name: str, values: Callable[[], Mapping[str, Any]] | None = None) -> Usage:
        """Add (or replace) a fixed child usage entity."""
        node = self.children[name] = Usage(_join(self.path, name), values)
        return node

    def add_list(self, name: str) -> UsageList:
        """Add (or replace) a usage list, e.g. ``connections``."""
        node = self.children[name] = UsageList(_join(self.path, name))
        return node


class UsageList:
    """A runtime list of usage entities that the owning swiftlet adds and removes."""

    def __init__(self, path: str):
        self.path = path
        self.children: dict[str, Usage] = {}

    def add(self, name: str, values: Callable[[], Mapping[str, Any]] | None = None) -> Usage:
        node = self.children[name] = Usage(_join(self.path, name), values)
        return node

    def remove(self, name: str) -> None:
        self.children.pop(name, None)


Node = Entity | EntityList | Usage | UsageList


class Tree:
    """A router's management tree. The root entity is the ``<router>`` element."""

    def __init__(self, bus: EventBus, root: Any):
        self.bus = bus
        self.reader = ElementReader("<management>")
        self.root = Entity(self, "/", root)

    def resolve(self, path: str) -> Node:
        """The node at ``path`` (``/`` is the root).

        Raises:
            ManagementError: nothing at that path.
        """
        node: Node = self.root
        walked = ""
        for part in (p for p in path.split("/") if p):
            children = node.entities if isinstance(node, EntityList) else node.children
            if part not in children:
                known = ", ".join(children) or "none"
                raise ManagementError(f"no {part!r} under {walked or '/'}; there is: {known}")
            node = children[part]
            walked += "/" + part
        return node

    def entity(self, path: str) -> Entity:
        """The config entity at ``path``.

        Raises:
            ManagementError: nothing there, or a list or usage (read-only) node.
        """
        node = self.resolve(path)
        if not isinstance(node, Entity):
            kind = "usage (read-only)" if isinstance(node, (Usage, UsageList)) else "an entity list"
            raise ManagementError(f"{path} is {kind}, not a config entity")
        return node

    def entity_list(self, path: str) -> EntityList:
        node = self.resolve(path)
        if not isinstance(node, EntityList):
            raise ManagementError(f"{path} is not an entity list")
        return node

    def get(self, path: str, name: str) -> Any:
        """A property of a config or usage entity."""
        node = self.resolve(path)
        if isinstance(node, (Entity, Usage)):
            return node.get(name)
        raise ManagementError(f"{path} is a list; name one of its entries")

    def set(self, path: str, name: str, value: Any) -> Change:
        """Change a property; see :meth:`Entity.set`."""
        return self.entity(path).set(name, value)

    def add(self, path: str, name: str, values: Mapping[str, Any] | None = None) -> Entity:
        """Add an entry to the entity list at ``path``; see :meth:`EntityList.add`."""
        return self.entity_list(path).add(name, values)

    def remove(self, path: str, name: str) -> None:
        """Remove an entry of the entity list at ``path``; see :meth:`EntityList.remove`."""
        self.entity_list(path).remove(name)

    def operations(self, path: str) -> dict[str, Operation]:
        """The operations the usage entity at ``path`` offers, by name (empty for one
        without; ``Operation.describe()`` gives each as data).

        Raises:
            ManagementError: nothing there, or not a usage entity.
        """
        return dict(self._usage(path).operations)

    async def invoke(self, path: str, operation: str, **args: Any) -> Any:
        """Run ``operation`` of the usage entity at ``path`` with ``args`` (by parameter
        name; text is parsed to the declared type) and return what it returns; an async
        operation is awaited here. Cancelling the caller cancels the operation as far as the
        operation allows.

        Raises:
            ManagementError: nothing at ``path`` (e.g. the entry is gone), not a usage
                entity, no such operation, unknown, missing or invalid arguments, or the
                operation refused (:class:`Veto`, or its own ManagementError).
        """
        node = self._usage(path)
        op = node.operations.get(operation)
        if op is None:
            known = ", ".join(node.operations) or "none"
            raise ManagementError(f"{path}: no operation {operation!r}; operations: {known}")
        where = f"{path}: operation {operation!r}"
        declared = {p.name: p for p in op.parameters}
        unknown = sorted(set(args) - set(declared))
        if unknown:
            known = ", ".join(declared) or "none"
            raise ManagementError(f"{where}: unknown argument(s) {', '.join(unknown)}; parameters: {known}")
        kwargs: dict[str, Any] = {}
        for name, parameter in declared.items():
            if name not in args:
                if parameter.required:
                    raise ManagementError(f"{where}: argument {name!r} missing ({parameter.description})")
                kwargs[name] = parameter.default
                continue
            try:
                kwargs[name] = parameter.parse(args[name])
            except ValueError as exc:
                raise ManagementError(f"{where}: argument {name!r}: {exc}") from None
        try:
            result = op.call(**kwargs)
            if inspect.isawaitable(result):
                result = await result
        except Veto as veto:
            raise ManagementError(f"{where} refused: {veto}") from None
        return result

    def _usage(self, path: str) -> Usage:
        node = self.resolve(path)
        if not isinstance(node, Usage):
            kind = (
                "a usage list"
                if isinstance(node, UsageList)
                else "a config entity"
                if isinstance(node, Entity)
                else "an entity list"
            )
            raise ManagementError(f"{path} is {kind}; operations are on usage entities")
        return node
