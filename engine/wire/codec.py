"""msgpack encoding with declared codecs for user types.

Two flavours:

* **data frames** (records on channels): fast path; arrays decode as tuples, so a record
  that was a list arrives as a tuple. A sequence with few runs of equal values (a frame's
  timestamps: one per source batch it holds) can travel as its runs (``Runs``).
* **state and control** (key-group snapshots, control messages, checkpoints): exact; tuples
  and lists keep their type, dict keys may be tuples.

User types travel only with a declared codec (``register_codec``). Bytes are never
unpickled: decoding an unknown extension code raises ``CodecError``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from itertools import groupby, islice
from typing import TYPE_CHECKING, Any, TypeVar

import msgpack

from engine.errors import CodecError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")
D = TypeVar("D", bound="DataclassInstance")

_TUPLE_CODE = 0
_SET_CODE = 1
_WIRE_CODE = 2  # a declared wire message nested inside another (engine.wire.messages)
_BIGINT_CODE = 3  # an int outside msgpack's 64-bit range, as decimal text
_FROZENSET_CODE = 4
_RUNS_CODE = 5  # data frames: a sequence as runs of equal values (Runs)
_FIRST_USER_CODE = 16
_MAX_CODE = 127


@dataclasses.dataclass(frozen=True)
class _Codec:
    type_: type
    code: int
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


_BY_TYPE: dict[type, _Codec] = {}
_BY_CODE: dict[int, _Codec] = {}
_WIRE_TYPES: set[type] = set()
_wire_to_list: Callable[[Any], list[Any]] | None = None
_wire_from_list: Callable[[Any], Any] | None = None


def register_wire_hooks(
    types: set[type], to_list: Callable[[Any], list[Any]], from_list: Callable[[Any], Any]
) -> None:
    """Let declared wire messages nest inside state/control values (used by engine.wire.messages)."""
    global _WIRE_TYPES, _wire_to_list, _wire_from_list
    _WIRE_TYPES, _wire_to_list, _wire_from_list = types, to_list, from_list


def register_codec(
    type_: type[T], code: int, encode: Callable[[T], Any], decode: Callable[[Any], T]
) -> None:
    """Declare how a user type travels: ``encode`` to msgpack-able values, ``decode`` back.

    ``code`` is an extension code in 16..127, unique per type, the same in every process
    (register at import time of the module that defines the type).
    """
    if not _FIRST_USER_CODE <= code <= _MAX_CODE:
        raise CodecError(f"codec code {code} for {type_.__name__} must be in 16..127")
    existing = _BY_CODE.get(code)
    if existing is not None and existing.type_ is not type_:
        raise CodecError(
            f"codec code {code} is taken by {existing.type_.__name__}; pick another for "
            f"{type_.__name__}"
        )
    codec = _Codec(type_, code, encode, decode)
    _BY_TYPE[type_] = codec
    _BY_CODE[code] = codec


def register_dataclass(cls: type[D], code: int) -> type[D]:
    """Declare a codec for a dataclass from its fields (positional, in field order)."""
    names = [f.name for f in dataclasses.fields(cls)]
    register_codec(
        cls, code, lambda obj: [getattr(obj, n) for n in names], lambda vals: cls(*vals)
    )
    return cls


def _default_common(obj: Any) -> Any:
    t = type(obj)
    if t is int:
        return msgpack.ExtType(_BIGINT_CODE, str(obj).encode())
    if t is set:
        return msgpack.ExtType(_SET_CODE, _pack_exact(sorted(obj, key=repr)))
    if t is frozenset:
        return msgpack.ExtType(_FROZENSET_CODE, _pack_exact(sorted(obj, key=repr)))
    return None


def _ext_common(code: int, data: bytes) -> Any:
    if code == _BIGINT_CODE:
        return int(data.decode())
    if code == _SET_CODE:
        return set(unpack_exact(data))
    if code == _FROZENSET_CODE:
        return frozenset(unpack_exact(data))
    return _NOT_COMMON


_NOT_COMMON = object()


def _default_exact(obj: Any) -> Any:
    if type(obj) is tuple:
        return msgpack.ExtType(_TUPLE_CODE, _pack_exact(list(obj)))
    common = _default_common(obj)
    if common is not None:
        return common
    if type(obj) in _WIRE_TYPES and _wire_to_list is not None:
        return msgpack.ExtType(_WIRE_CODE, _pack_exact(_wire_to_list(obj)))
    return _default_user(obj, _pack_exact)


class Runs:
    """A sequence ``pack_fast`` writes as its runs of equal values and ``unpack_fast``
    reads back as the tuple of the values (``runs_of`` makes the runs).

    Why: a frame of a keyed channel at parallelism p holds the records of about p source
    batches, each with one timestamp; sent one per record they were 9 of a frame's ~20
    bytes per record and their encoding, decoding and the sink's reading of them a cost
    that p = 1 did not have (issue 32, item 9)."""

    __slots__ = ("runs",)

    def __init__(self, runs: list[tuple[int, int]]) -> None:
        self.runs = runs


def runs_of(values: Sequence[Any], max_runs: int = 8) -> list[tuple[Any, int]] | None:
    """``values`` as ``[(value, count), ...]`` of consecutive equal values, or None when
    there are more than ``max_runs`` runs (then it stops after ``max_runs + 1``; one
    C-level pass). Equality is ``==``: ``1`` and ``1.0`` are one run."""
    runs = [(k, len(list(g))) for k, g in islice(groupby(values), max_runs + 1)]
    return None if len(runs) > max_runs else runs


_MAX_RUN_TOTAL = 1 << 22  # values a Runs may expand to: bytes must not grow without bound


def _expand_runs(data: bytes) -> tuple[Any, ...]:
    flat = unpack_fast(data)
    counts = flat[1::2] if type(flat) is tuple and len(flat) % 2 == 0 else None
    if (counts is None or any(type(c) is not int or c < 1 for c in counts)
            or sum(counts) > _MAX_RUN_TOTAL):
        raise CodecError(f"bad runs in a data frame: {flat!r:.100}")
    out: tuple[Any, ...] = ()
    for i in range(0, len(flat), 2):
        out += (flat[i],) * flat[i + 1]
    return out


def _default_fast(obj: Any) -> Any:
    if type(obj) is Runs:
        return msgpack.ExtType(_RUNS_CODE, _pack_fast([x for run in obj.runs for x in run]))
    common = _default_common(obj)
    if common is not None:
        return common
    return _default_user(obj, _pack_fast)


def _default_user(obj: Any, pack: Callable[[Any], bytes]) -> Any:
    codec = _BY_TYPE.get(type(obj))
    if codec is None:
        raise CodecError(
            f"no codec for {type(obj).__name__}; declare one with "
            "engine.wire.codec.register_codec or register_dataclass"
        )
    return msgpack.ExtType(codec.code, pack(codec.encode(obj)))


def _ext_exact(code: int, data: bytes) -> Any:
    if code == _TUPLE_CODE:
        return tuple(unpack_exact(data))
    common = _ext_common(code, data)
    if common is not _NOT_COMMON:
        return common
    if code == _WIRE_CODE and _wire_from_list is not None:
        return _wire_from_list(unpack_exact(data))
    return _ext_user(code, data, unpack_exact)


def _ext_fast(code: int, data: bytes) -> Any:
    if code == _RUNS_CODE:
        return _expand_runs(data)
    common = _ext_common(code, data)
    if common is not _NOT_COMMON:
        return common
    return _ext_user(code, data, unpack_fast)


def _ext_user(code: int, data: bytes, unpack: Callable[[bytes], Any]) -> Any:
    codec = _BY_CODE.get(code)
    if codec is None:
        raise CodecError(
            f"bytes carry extension code {code} but no codec is declared for it in this "
            "process; register the codec at import time of the module defining the type"
        )
    return codec.decode(unpack(data))


def _pack_exact(obj: Any) -> bytes:
    try:
        return msgpack.packb(obj, default=_default_exact, strict_types=True, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise CodecError(f"cannot encode {type(obj).__name__}: {exc}") from exc


def _pack_fast(obj: Any) -> bytes:
    try:
        return msgpack.packb(obj, default=_default_fast, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise CodecError(f"cannot encode {type(obj).__name__}: {exc}") from exc


def pack_exact(obj: Any) -> bytes:
    """Encode state/control values; ``unpack_exact`` gives back equal values of equal types."""
    return _pack_exact(obj)


def unpack_exact(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, ext_hook=_ext_exact, strict_map_key=False, raw=False)
    except CodecError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types on bad bytes
        raise CodecError(f"bytes do not decode as reflow state: {exc}") from exc


def pack_fast(obj: Any) -> bytes:
    """Encode a data frame (records); arrays come back as tuples."""
    return _pack_fast(obj)


def unpack_fast(data: bytes) -> Any:
    try:
        return msgpack.unpackb(
            data, use_list=False, ext_hook=_ext_fast, strict_map_key=False, raw=False
        )
    except CodecError:
        raise
    except Exception as exc:
        raise CodecError(f"bytes do not decode as a reflow data frame: {exc}") from exc
