"""The name guard every registry uses: one name, one thing (the algorithms', losses', estimators', KL penalties' and
the matrix executors'; ``tasks`` keeps its own copy, since it imports nothing from here, and so does the study
registry, benchmarks/study.py, which the light commands' ``--help`` loads without torch).

A second, different object under a taken name is refused with the names of both; the same object again is a
no-op, so a module may be imported twice. An unknown name is a ValueError listing the choices.

The policy losses and the advantage estimators also share a member's shape, ``Configurable``: a class with its
name and an ``Options`` dataclass of its own knobs, which become settings of the algorithm that picks it
(``algorithms.base.OptionGroup``); ``register_member`` keeps one default per option name across a registry, and
``register_function`` registers a plain function (what an entry point may name) as a member without options.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, fields
from typing import Any, Callable, ClassVar, Optional


def register_named(table: dict, kind: str, name: str, obj: Any) -> Any:
    """``table[name] = obj`` (a function or a class), refusing a second, different one under ``name``."""
    if not callable(obj):
        raise TypeError(f"{obj!r} is not callable: a {kind} is a function or a class")
    taken = table.get(name)
    if taken is not None and taken is not obj:
        raise ValueError(f"{kind} name {name!r} is taken by {taken.__module__}.{taken.__qualname__}; "
                         f"{obj.__module__}.{obj.__qualname__} needs another name")
    table[name] = obj
    return obj


def lookup_named(table: dict, kind: str, name: str):
    """``table[name]``, or ValueError listing the choices (as an unknown algorithm is reported)."""
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; choose from {', '.join(sorted(table))}") from None


class Configurable:
    """A registry member with knobs of its own. Subclasses set ``name`` and may declare an ``Options`` dataclass
    (each field with its help and the paper's value): its fields are settings of the algorithm that picks the member
    by ``selector`` (flags, config keys and matrix keys, grouped in --help under the member). ``options`` holds
    the values the member reads."""

    name: ClassVar[str] = ""
    selector: ClassVar[str] = ""  # the setting that picks a member of this registry ("loss_type", ...)

    @dataclass
    class Options:
        """No knobs of its own."""

        def validate(self) -> None:
            """Raise ValueError naming the field for an impossible value."""

    def __init__(self, options: Optional["Configurable.Options"] = None):
        self.options = self.Options() if options is None else options

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> "Configurable":
        """This member with its options from ``settings`` (names it does not have are left; defaults for the rest)."""
        return cls(cls.Options(**{f.name: settings[f.name] for f in fields(cls.Options) if f.name in settings}))

    @classmethod
    def with_options(cls, options: dict[str, Any]) -> "Configurable":
        """This member with exactly ``options``: a name it does not have is a TypeError."""
        unknown = sorted(set(options) - {f.name for f in fields(cls.Options)})
        if unknown:
            raise TypeError(f"{cls.selector} {cls.name!r} has no option {', '.join(unknown)}")
        return cls(cls.Options(**options))


def _declared_options(table: dict) -> dict[str, tuple[type[Configurable], Field]]:
    """Each option name the members of ``table`` declare -> (the first member declaring it, its field)."""
    out: dict[str, tuple[type[Configurable], Field]] = {}
    for member in table.values():
        for f in fields(member.Options):
            out.setdefault(f.name, (member, f))
    return out


def register_member(table: dict, kind: str, member: type[Configurable]) -> type[Configurable]:
    """``table[member.name] = member``, refusing a taken name (``register_named``) and an option whose name another
    member declares with another default or type (one name, one setting)."""
    if table.get(member.name) is not member:
        declared = _declared_options(table)
        for f in fields(member.Options):
            other, theirs = declared.get(f.name, (None, f))
            if (theirs.default, str(theirs.type)) != (f.default, str(f.type)):
                raise ValueError(f"{kind} {member.name!r}: option {f.name!r} is declared by {kind} {other.name!r} with "
                                 f"default {theirs.default!r} ({theirs.type}); one name, one default")
    return register_named(table, kind, member.name, member)


def register_function(table: dict, kind: str, base: type[Configurable], fn: Callable, name: str, method: str,
                      call: Callable, **declared) -> Callable:
    """Register the plain function ``fn`` as a member of ``base``'s registry named ``name``, with no options: its
    ``method`` is ``call(fn, inputs)``; ``declared`` sets the class properties given (None: not given, the base's
    default). The same function again is a no-op, unless a property given differs from what it was registered with."""
    declared = {key: value for key, value in declared.items() if value is not None}
    taken = table.get(name)
    if taken is not None and getattr(taken, "function", None) is fn:
        for key, value in declared.items():
            if value != getattr(taken, key):
                raise ValueError(f"{kind} name {name!r} is taken by {fn.__module__}.{fn.__qualname__} ({key} "
                                 f"{getattr(taken, key)!r}); another {key} needs another name")
        return fn
    member = type(name, (base,), {"__doc__": fn.__doc__, "__module__": fn.__module__, "name": name, "function": fn,
                                  method: lambda self, inputs: call(fn, inputs), **declared})
    register_named(table, kind, name, member)
    return fn
