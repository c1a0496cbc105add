"""Jobs and functions the Spark examples, tests and benchmark ship to Ray and Spark workers.

They live in an importable module so workers import them by name rather than receiving
pickled code from a script or test file.
"""

from __future__ import annotations

from typing import Any


def split_words(line: str) -> list[str]:
    return line.split()


def word_pair(word: str) -> tuple[str, int]:
    return (word, 1)


def pair_key(pair: Any) -> Any:
    return pair[0]


def add_counts(a: Any, b: Any) -> tuple[Any, int]:
    return (a[0], a[1] + b[1])


def build_wordcount(job: Any, source: Any, sink: Any, *, source_parallelism: int = 1,
                    count_parallelism: int | None = None, extra_sinks: tuple[Any, ...] = (),
                    word_filter: Any = None) -> Any:
    """lines -> split -> (word, 1) -> key_by word -> running count -> ``sink`` (records
    ``(word, count)``, one per count update). Returns the counts stream."""
    words = job.source(source, name="lines", parallelism=source_parallelism).flat_map(
        split_words, name="split")
    if word_filter is not None:
        words = words.map(word_filter, name="check")
    counts = (words.map(word_pair, name="pair")
              .key_by(pair_key)
              .reduce(add_counts, name="count", parallelism=count_parallelism))
    counts.sink(sink, name="out")
    for i, extra in enumerate(extra_sinks):
        counts.sink(extra, name=f"out{i + 1}")
    return counts


class RaiseOn:
    """A map function that raises ``ValueError(message)`` on ``value`` (for failure tests)."""

    def __init__(self, value: Any, message: str) -> None:
        self.value = value
        self.message = message

    def __call__(self, x: Any) -> Any:
        if x == self.value:
            raise ValueError(self.message)
        return x


def key_of(record: Any) -> Any:
    return record[0]


def sum_second(a: Any, b: Any) -> tuple[Any, int]:
    return (a[0], a[1] + b[1])


class SpoilAt:
    """A map function that replaces the count of ``key`` by a string once it reaches
    ``at`` (a record the output schema refuses; for dead-letter tests)."""

    def __init__(self, key: Any, at: int) -> None:
        self.key = key
        self.at = at

    def __call__(self, r: Any) -> Any:
        if r[0] == self.key and r[1] >= self.at:
            return (r[0], "not a number")
        return r
