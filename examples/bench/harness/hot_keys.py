"""A source whose state is built once, then whose updates touch only a hot share of the keys.

Why: the overhead of checkpoints "with state and 1 % of keys updated per interval" (issue
29) needs a job that runs at full speed for minutes while holding hundreds of MB of keyed
state, and whose updates between two checkpoints touch a known, small share of the keys.
``GeneratorSource`` draws keys at random, so covering every key once takes ~K ln K padded
records, and at full speed it touches most keys in every interval.

``HotKeysSource``: partition j of n (``"j-of-n"``) first emits every key ``k`` of
``[0, num_keys)`` with ``k % n == j`` once, in order, as ``(k, seq, state_bytes)`` (the
``PaddedCount`` of ``harness.jobs`` makes ``state_bytes`` of padding on a key's first
record), then, at full speed, ``(k, seq)`` records cycling over the hot keys
``[0, hot_keys)`` with ``k % n == j``, until ``num_records`` (None: never). Every
interval of the hot phase therefore updates exactly the hot keys, and no other. Timestamps
are the poll time (ms). Resume state: the records the partition emitted (an int); reopening
at it continues the same sequence.

Importable by Ray workers as ``examples.bench.harness.hot_keys``; starts nothing.
"""

from __future__ import annotations

from typing import Any

from engine.errors import ConfigError
from engine.io.sources import (
    Source,
    SourceBatch,
    SourceReader,
    indexed_partitions,
    parse_indexed,
)
from engine.time.clock import Clock, now_ms


class HotKeysSource(Source):
    """Every key once with ``state_bytes`` of padding, then the hot keys only (module
    docstring). ``hot_keys`` must be in ``[1, num_keys]``."""

    def __init__(self, num_keys: int, hot_keys: int, state_bytes: int,
                 num_records: int | None = None, partitions: int | None = None) -> None:
        if num_keys < 1 or not 1 <= hot_keys <= num_keys:
            raise ConfigError(f"HotKeysSource needs num_keys >= 1 and 1 <= hot_keys <= "
                              f"num_keys; got {num_keys} and {hot_keys}")
        if state_bytes < 0 or (num_records is not None and num_records < 0):
            raise ConfigError(f"HotKeysSource state_bytes and num_records must be >= 0; got "
                              f"{state_bytes} and {num_records}")
        self.num_keys, self.hot_keys, self.state_bytes = num_keys, hot_keys, state_bytes
        self.num_records, self.num_partitions = num_records, partitions

    def partitions(self, parallelism: int) -> list[str]:
        return indexed_partitions(self.num_partitions or parallelism)

    def open_partition(self, partition: str, resume: Any, clock: Clock) -> SourceReader:
        index, count = parse_indexed(partition, "HotKeysSource")
        if resume is not None and (not isinstance(resume, int) or resume < 0):
            raise ValueError(f"HotKeysSource resume state must be an int >= 0; got {resume!r}")
        return _HotKeysReader(self, index, count, resume or 0, clock)

    def build_records(self, index: int, count: int) -> int:
        """The records of partition ``index`` of ``count``'s build phase (its keys)."""
        return len(range(index, self.num_keys, count))


class _HotKeysReader(SourceReader):
    def __init__(self, src: HotKeysSource, index: int, count: int, pos: int,
                 clock: Clock) -> None:
        self._build = list(range(index, src.num_keys, count))
        self._hot = list(range(index, src.hot_keys, count)) or [index % src.num_keys]
        self._extra = src.state_bytes
        self._limit = None
        if src.num_records is not None:
            base, extra = divmod(src.num_records, count)
            self._limit = base + (1 if index < extra else 0)
        self._pos = pos
        self._clock = clock

    def poll(self, max_records: int) -> SourceBatch | None:
        end = self._pos + max(0, max_records)
        if self._limit is not None:
            if self._pos >= self._limit:
                return None
            end = min(end, self._limit)
        values: list[Any] = []
        pos, nb = self._pos, len(self._build)
        if pos < nb:
            hi = min(end, nb)
            values.extend((k, s, self._extra) for k, s in zip(self._build[pos:hi],
                                                              range(pos, hi), strict=True))
            pos = hi
        if pos < end:
            hot, nh = self._hot, len(self._hot)
            values.extend((hot[(s - nb) % nh], s) for s in range(pos, end))
        self._pos = end
        return SourceBatch(values, [now_ms(self._clock)] * len(values))

    def offset(self) -> Any:
        return self._pos
