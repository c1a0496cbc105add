"""Which source partitions a source task reads.

Sources are partitioned independently of tasks (``Source.partitions`` lists ids once, when
the job is first deployed); task i of p reads the partitions at positions j with
``j % p == i``. Pure functions, shared by the deployment (which records each source's
partition list) and the source readers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.errors import ConfigError


def partitions_of_task(partitions: Sequence[str], task_index: int,
                       parallelism: int) -> tuple[str, ...]:
    """The partitions source task ``task_index`` of ``parallelism`` reads: those at
    positions j with ``j % parallelism == task_index``."""
    return tuple(partitions[task_index::parallelism])


def check_partitions(partitions: Any, source: str) -> tuple[str, ...]:
    """``Source.partitions``'s result as a tuple, or ``ConfigError`` saying what is wrong."""
    if isinstance(partitions, (str, bytes)) or not isinstance(partitions, Sequence):
        raise ConfigError(f"source {source!r}: partitions() must return a list of partition "
                          f"ids (str), not {type(partitions).__name__}")
    out = tuple(partitions)
    bad = [p for p in out if not isinstance(p, str) or not p]
    if bad:
        raise ConfigError(f"source {source!r}: partition ids must be non-empty strings; got "
                          f"{bad[0]!r}")
    if len(set(out)) != len(out):
        dup = next(p for p in out if out.count(p) > 1)
        raise ConfigError(f"source {source!r}: partition id {dup!r} appears twice; ids must "
                          "be unique")
    return out
