"""`@frozen` behaves as `@dataclass(frozen=True)` wherever a caller can tell: each case runs under both."""

from __future__ import annotations

import dataclasses
from dataclasses import FrozenInstanceError, dataclass, field

import pytest

from kvops.frozen import frozen

DECORATORS = {"frozen": frozen, "dataclass": dataclass(frozen=True)}
both = pytest.mark.parametrize("decorate", DECORATORS.values(), ids=DECORATORS.keys())


def build(decorate, body: dict, name: str = "Point", base: tuple = ()) -> type:
    return decorate(type(name, base, {"__module__": __name__, "__qualname__": name, **body}))


@both
def test_equality_hash_repr_and_immutability(decorate):
    point = build(decorate, {"__annotations__": {"x": "int", "y": "int", "tags": "tuple"}, "y": 0, "tags": ()})
    one, same, other = point(1, 2, ("a",)), point(1, 2, ("a",)), point(1, 3)
    assert one == same and hash(one) == hash(same) and one != other
    assert (one == (1, 2, ("a",))) is False  # another type: NotImplemented, then identity
    assert repr(one) == "Point(x=1, y=2, tags=('a',))"
    assert dataclasses.replace(one, y=3) == point(1, 3, ("a",))
    assert dataclasses.asdict(one) == {"x": 1, "y": 2, "tags": ("a",)}
    with pytest.raises(FrozenInstanceError):
        one.x = 5
    with pytest.raises(FrozenInstanceError):
        del one.y


@both
def test_field_options(decorate):
    body = {
        "__annotations__": {"key": "str", "note": "str", "cache": "dict"},
        "note": field(default="", compare=False),
        "cache": field(default_factory=dict, hash=False, repr=False),
    }
    point = build(decorate, body)
    one, two = point("k", "first", {"a": 1}), point("k", "second", {"a": 1})
    assert one == two and hash(one) == hash(two)  # note is not compared; cache is compared but not hashed
    assert one != point("k", "first", {"a": 2})
    assert repr(one) == "Point(key='k', note='first')"


@both
def test_a_subclass_is_never_equal_to_its_base(decorate):
    base = build(decorate, {"__annotations__": {"x": "int"}})
    child = build(decorate, {}, "Child", (base,))
    assert base(1) != child(1) and child(1) == child(1)


@both
def test_methods_the_class_defines_are_kept(decorate):
    point = build(
        decorate, {"__annotations__": {"x": "int"}, "__repr__": lambda self: "mine", "__eq__": lambda *_: True}
    )
    assert repr(point(1)) == "mine" and point(1) == point(2)
    assert hash(point(1)) == hash(point(1))  # __eq__ defined and __hash__ not: still hashed by its fields
