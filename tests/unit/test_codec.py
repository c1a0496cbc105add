"""Unit tests for engine.wire.codec: exact (state/control) and fast (data frame) msgpack flavours."""

from __future__ import annotations

import dataclasses
import math

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import CodecError, ReflowError
from engine.wire.codec import (
    pack_exact,
    pack_fast,
    register_codec,
    register_dataclass,
    unpack_exact,
    unpack_fast,
)

# Extension codes 120..127 are reserved for this test module (codes are process-global).


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int


@dataclasses.dataclass
class Order:
    order_id: int
    customer: str
    lines: list
    origin: Point
    tags: tuple


register_dataclass(Point, 120)
register_dataclass(Order, 121)


class Money:
    """A user type with a hand-written codec."""

    def __init__(self, cents: int, currency: str) -> None:
        self.cents = cents
        self.currency = currency

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Money)
            and (self.cents, self.currency) == (other.cents, other.currency)
        )

    def __hash__(self) -> int:
        return hash((self.cents, self.currency))


register_codec(Money, 122, lambda m: [m.cents, m.currency], lambda v: Money(v[0], v[1]))


class Unregistered:
    pass


def assert_same(a, b):
    """Equal values of identical types, recursively (== alone says (1,) != [1] but 1 == True)."""
    assert type(a) is type(b), f"{a!r} ({type(a).__name__}) vs {b!r} ({type(b).__name__})"
    if isinstance(a, dict):
        assert len(a) == len(b)
        for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True):
            assert_same(ka, kb)
            assert_same(va, vb)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert a == b


def exact_rt(value):
    return unpack_exact(pack_exact(value))


def fast_rt(value):
    return unpack_fast(pack_fast(value))


# ---------------------------------------------------------------- exact flavour


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -1,
        1.25,
        -0.0,
        float("inf"),
        "text",
        "ключ",
        b"bytes",
        b"",
        (),
        [],
        {},
        (1, 2),
        [1, 2],
        [(1, 2), [3, (4, [5])]],
        ((1,), [(2,)]),
        {"a": (1, 2), "b": [1, 2]},
        {"nested": {"deeper": ((1, "x"), [b"y"])}},
        {(1, "a"): "tuple key", 2: "int key", "s": "str key"},
        {("outer", (1, 2)): [(3,)]},
        {1, 2, 3},
        {"a", ("b", 1)},
        set(),
        2**63 - 1,
        -(2**63),
        2**64 - 1,
        2**32,
    ],
    ids=lambda v: repr(sorted(v, key=repr)) if isinstance(v, (set, frozenset)) else repr(v),
)  # a set's repr follows string hashing, which differs per process: pytest-xdist's
#    workers must collect the same ids
def test_exact_round_trip_keeps_types(value):
    assert_same(value, exact_rt(value))


def test_exact_keeps_tuple_vs_list_and_bytes_vs_str():
    out = exact_rt({"t": (1, 2), "l": [1, 2], "b": b"ab", "s": "ab"})
    assert type(out["t"]) is tuple and out["t"] == (1, 2)
    assert type(out["l"]) is list and out["l"] == [1, 2]
    assert type(out["b"]) is bytes and out["b"] == b"ab"
    assert type(out["s"]) is str and out["s"] == "ab"


def test_exact_set_round_trip():
    value = {"ids": {3, 1, 2}, "pairs": {(1, "a"), (2, "b")}}
    out = exact_rt(value)
    assert out == value
    assert type(out["ids"]) is set
    assert all(type(p) is tuple for p in out["pairs"])


def test_exact_encoding_of_sets_is_deterministic():
    a = {f"k{i}" for i in range(50)}
    b = set(sorted(a, reverse=True))
    assert pack_exact(a) == pack_exact(b)


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 2**100], ids=repr)
def test_exact_round_trip_ints_beyond_64_bits(value):
    assert_same(value, exact_rt(value))


def test_exact_round_trip_frozenset_as_dict_key():
    value = {frozenset({1, 2}): "x"}
    assert_same(value, exact_rt(value))


# ---------------------------------------------------------------- fast flavour


def test_fast_round_trip_turns_lists_into_tuples():
    out = fast_rt([1, [2, 3], {"a": [4]}])
    assert out == (1, (2, 3), {"a": (4,)})
    assert type(out) is tuple and type(out[1]) is tuple and type(out[2]["a"]) is tuple


def test_fast_round_trip_scalars_and_maps():
    value = {"s": "x", "b": b"y", "i": -5, "f": 0.5, "n": None, "t": True, (1, 2): "tk"}
    out = fast_rt(value)
    assert_same(value, out)


def test_fast_round_trip_sets_stay_sets():
    out = fast_rt(({1, 2}, {("a", 1)}))
    assert out == ({1, 2}, {("a", 1)})
    assert type(out[0]) is set


# ---------------------------------------------------------------- user types


def test_register_dataclass_round_trip_exact():
    order = Order(7, "ada", [1, (2, 3)], Point(1, -2), ("a", "b"))
    out = exact_rt(order)
    assert type(out) is Order
    assert out == order
    assert type(out.lines) is list and type(out.lines[1]) is tuple
    assert type(out.origin) is Point
    assert type(out.tags) is tuple


def test_register_dataclass_round_trip_fast():
    order = Order(7, "ada", [1, [2, 3]], Point(1, -2), ("a", "b"))
    out = fast_rt([order, Point(3, 4)])
    assert type(out) is tuple
    got, p = out
    assert type(got) is Order and type(p) is Point
    assert p == Point(3, 4)
    # fast flavour: lists inside the record arrive as tuples
    assert got.lines == (1, (2, 3))
    assert got.origin == Point(1, -2)
    assert (got.order_id, got.customer, got.tags) == (7, "ada", ("a", "b"))


def test_register_dataclass_returns_the_class():
    @dataclasses.dataclass
    class Local:
        v: int

    assert register_dataclass(Local, 123) is Local
    assert exact_rt(Local(5)) == Local(5)


def test_register_codec_custom_type_in_containers():
    value = {"price": Money(1999, "EUR"), "history": (Money(1, "USD"), [Money(2, "USD")])}
    out = exact_rt(value)
    assert out == value
    assert type(out["history"]) is tuple and type(out["history"][1]) is list
    fout = fast_rt(value)
    assert fout["price"] == Money(1999, "EUR")
    assert fout["history"] == (Money(1, "USD"), (Money(2, "USD"),))


def test_registered_type_as_dict_key_and_set_element():
    value = {Point(1, 2): "a", "s": {Point(3, 4)}}
    out = exact_rt(value)
    assert out == value
    assert type(next(iter(out))) is Point


@pytest.mark.parametrize("pack", [pack_exact, pack_fast], ids=["exact", "fast"])
@pytest.mark.parametrize(
    "value",
    [Unregistered(), [1, Unregistered()], {"k": Unregistered()}, (Unregistered(),)],
    ids=["bare", "in-list", "in-dict", "in-tuple"],
)
def test_unknown_type_raises_codec_error_with_helpful_message(pack, value):
    with pytest.raises(CodecError) as exc:
        pack(value)
    msg = str(exc.value)
    assert "Unregistered" in msg
    assert "register_codec" in msg and "register_dataclass" in msg


def test_codec_error_is_a_reflow_error():
    assert issubclass(CodecError, ReflowError)


@pytest.mark.parametrize("unpack", [unpack_exact, unpack_fast], ids=["exact", "fast"])
@pytest.mark.parametrize("code", [17, 99, 127])
def test_undeclared_extension_code_raises(unpack, code):
    data = msgpack.packb([1, msgpack.ExtType(code, msgpack.packb([1, 2]))], use_bin_type=True)
    with pytest.raises(CodecError, match=f"extension code {code}"):
        unpack(data)


def test_fast_decoder_refuses_exact_tuple_extension():
    # Frames are decoded with the fast codec; an exact-encoded tuple there is not a record.
    with pytest.raises(CodecError, match="extension code 0"):
        unpack_fast(pack_exact((1, 2)))


@pytest.mark.parametrize("unpack", [unpack_exact, unpack_fast], ids=["exact", "fast"])
@pytest.mark.parametrize(
    "data",
    [
        b"",  # nothing
        b"\xc1",  # reserved, never used by msgpack
        b"\x92\x01",  # array of 2 with only 1 element
        b"\x01\x02",  # extra data after a complete value
        b"\xa2\xff\xfe",  # str with invalid UTF-8
        b"\xd4\x00\xc1",  # tuple extension wrapping garbage
        bytes(range(256)),
    ],
    ids=repr,
)
def test_garbage_bytes_raise_codec_error(unpack, data):
    with pytest.raises(CodecError):
        unpack(data)


@pytest.mark.parametrize("code", [-1, 0, 1, 15, 128, 200])
def test_register_codec_rejects_codes_outside_user_range(code):
    class T:
        pass

    with pytest.raises(CodecError, match="must be in 16..127"):
        register_codec(T, code, lambda o: [], lambda v: T())


def test_register_codec_rejects_a_taken_code():
    class Other:
        pass

    with pytest.raises(CodecError, match="taken by Point"):
        register_codec(Other, 120, lambda o: [], lambda v: Other())
    # the original registration is untouched
    assert exact_rt(Point(1, 1)) == Point(1, 1)


def test_register_codec_same_type_same_code_is_idempotent():
    register_dataclass(Point, 120)
    assert exact_rt(Point(5, 6)) == Point(5, 6)


# ---------------------------------------------------------------- property test

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)

_values = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=5)
        | st.lists(children, max_size=5).map(tuple)
        | st.dictionaries(
            st.text(max_size=10) | st.integers(min_value=-(2**63), max_value=2**63),
            children,
            max_size=5,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_values)
def test_property_exact_round_trip(value):
    assert_same(value, exact_rt(value))


@settings(max_examples=150, deadline=None)
@given(_values)
def test_property_fast_round_trip_equals_value_with_lists_as_tuples(value):
    def as_tuples(v):
        if isinstance(v, (list, tuple)):
            return tuple(as_tuples(x) for x in v)
        if isinstance(v, dict):
            return {k: as_tuples(x) for k, x in v.items()}
        return v

    assert_same(as_tuples(value), fast_rt(value))


# ---------------------------------------------------------------- runs (data frames)


@pytest.mark.parametrize("values", [[], [5], [5, 5, 6], [1, 2, 3, 4, 5, 6, 7, 8],
                                    [3, 3, 1, 1, 3]], ids=repr)
def test_runs_travel_as_runs_and_come_back_as_the_tuple(values):
    from engine.wire.codec import Runs, runs_of

    runs = runs_of(values)
    assert runs is not None and [v for v, n in runs for _ in range(n)] == values
    assert unpack_fast(pack_fast([Runs(runs), "x"])) == (tuple(values), "x")


def test_runs_of_gives_up_past_max_runs():
    from engine.wire.codec import runs_of

    assert runs_of(list(range(9))) is None
    assert runs_of(list(range(9)), max_runs=9) == [(i, 1) for i in range(9)]
    assert runs_of([1] * 1000 + [2] * 1000) == [(1, 1000), (2, 1000)]


@pytest.mark.parametrize("flat", [[1, 0], [1, -2], [1, 2, 3], [1, "2"], [1, 1 << 23]],
                         ids=repr)
def test_bad_runs_are_a_codec_error_not_a_huge_tuple(flat):
    from engine.wire.codec import _RUNS_CODE

    data = msgpack.packb(msgpack.ExtType(_RUNS_CODE, msgpack.packb(flat)))
    with pytest.raises(CodecError):
        unpack_fast(data)


def test_runs_are_no_state_value():
    from engine.wire.codec import _RUNS_CODE

    data = msgpack.packb(msgpack.ExtType(_RUNS_CODE, msgpack.packb([1, 2])))
    with pytest.raises(CodecError):
        unpack_exact(data)
