"""`@frozen`: kvops' value classes, frozen dataclasses that start fast.

A `@frozen` class is a `@dataclass(frozen=True)` in every way a caller sees: its fields, `__init__`, `replace()`,
`fields()`, `asdict()`, immutability, and equality, hashing and repr by its fields (equal only to an instance of
the same class; `field(compare=..., hash=..., repr=...)` honoured; a method the class defines itself is kept).
The difference is where equality, hashing and repr come from: three functions shared by every such class, where
`dataclass` writes and compiles all three again for each class. Python 3.11 compiles each generated method when
its module is imported, and kvops has over a hundred such classes: `kvops plan` spent about half of its start
building them (bench/cold_start.py). A `@frozen` class compiles three (`__init__` and the frozen `__setattr__` and
`__delattr__`).
"""

from __future__ import annotations

import dataclasses
from reprlib import recursive_repr
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # for type checkers alone: typing has it from Python 3.11, and kvops runs on 3.10
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_):
        return lambda decorator: decorator


T = TypeVar("T")


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, dataclasses.Field))
def frozen(cls: type[T]) -> type[T]:
    """`cls` as a frozen dataclass whose equality, hash and repr are the shared ones below."""
    own = vars(cls)
    explicit_hash = "__hash__" in own and not (own["__hash__"] is None and "__eq__" in own)
    made = dataclasses.dataclass(frozen=True, eq=False, repr=False)(cls)
    fields = dataclasses.fields(made)  # type: ignore[arg-type]
    added: dict[str, Any] = {
        "_frozen_compared": tuple(field.name for field in fields if field.compare),
        "_frozen_hashed": tuple(
            field.name for field in fields if (field.compare if field.hash is None else field.hash)
        ),
        "_frozen_shown": tuple(field.name for field in fields if field.repr),
        "__eq__": _eq,
        "__repr__": _repr,
        "__hash__": _hash,
    }
    for name, value in added.items():
        kept = explicit_hash if name == "__hash__" else name in own
        if not kept:
            setattr(made, name, value)
    return made


def _values(instance: Any, names: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(getattr(instance, name) for name in names)


def _eq(self: Any, other: Any) -> bool:
    if other.__class__ is not self.__class__:
        return NotImplemented
    names = self._frozen_compared
    return _values(self, names) == _values(other, names)


def _hash(self: Any) -> int:
    return hash(_values(self, self._frozen_hashed))


@recursive_repr()
def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._frozen_shown)
    return f"{self.__class__.__qualname__}({shown})"
