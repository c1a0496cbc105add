"""Write a deterministic NEXMark event set to Parquet.

    python examples/nexmark/generate.py --events 1000000 --seed 42 --output /tmp/nexmark
    python examples/nexmark/generate.py --events 100000 --seed 1 --output out --rate 50000

Writes ``person.parquet``, ``auction.parquet`` and ``bid.parquet`` into ``--output`` with the
standard snake_case columns (``date_time``/``expires`` are int64 epoch milliseconds; all other
numbers int64, text utf8). The same ``--events/--seed/--rate/--base-time`` always give the same
files. Events are generated and written in batches, so memory stays bounded.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from examples.nexmark.generator import (  # noqa: E402
    AUCTION_FIELDS,
    BID_FIELDS,
    CHUNK_SIZE,
    KIND_NAMES,
    PERSON_FIELDS,
    NexmarkConfig,
    NexmarkGenerator,
)

_STRING_FIELDS = {"name", "email_address", "credit_card", "city", "state", "extra", "item_name",
                  "description", "channel", "url"}

SCHEMAS = tuple(
    pa.schema([(f, pa.string() if f in _STRING_FIELDS else pa.int64()) for f in fields])
    for fields in (PERSON_FIELDS, AUCTION_FIELDS, BID_FIELDS))


def write_parquet(config: NexmarkConfig, output: str, num_events: int,
                  batch_events: int = 64 * CHUNK_SIZE) -> dict[str, int]:
    """Generate events ``[0, num_events)`` into ``output/{person,auction,bid}.parquet``.
    Returns the number of rows written per kind."""
    os.makedirs(output, exist_ok=True)
    generator = NexmarkGenerator(config)
    rows = dict.fromkeys(KIND_NAMES, 0)
    writers = [pq.ParquetWriter(os.path.join(output, f"{name}.parquet"), schema)
               for name, schema in zip(KIND_NAMES, SCHEMAS, strict=True)]
    try:
        for batch in generator.batches(batch_events, 0, num_events):
            for kind, (name, writer) in enumerate(zip(KIND_NAMES, writers, strict=True)):
                cols = batch.by_kind(kind)
                if len(cols):
                    writer.write_table(cols.to_arrow().cast(SCHEMAS[kind]))
                    rows[name] += len(cols)
    finally:
        for writer in writers:
            writer.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, required=True, help="number of events")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", required=True, help="output directory")
    parser.add_argument("--rate", type=float, default=10_000.0,
                        help="events per second of event time (first_event_rate)")
    parser.add_argument("--base-time", type=int, default=0,
                        help="event time (epoch ms) of event 0")
    parser.add_argument("--strict-foreign-keys", action="store_true",
                        help="only reference people/auctions generated earlier")
    parser.add_argument("--batch", type=int, default=64 * CHUNK_SIZE,
                        help="events generated per write")
    args = parser.parse_args(argv)
    if args.events < 0:
        parser.error("--events must be >= 0")
    config = NexmarkConfig(first_event_rate=args.rate, num_events=args.events, seed=args.seed,
                           base_time_ms=args.base_time,
                           strict_foreign_keys=args.strict_foreign_keys)
    started = time.perf_counter()
    rows = write_parquet(config, args.output, args.events, max(args.batch, 1))
    elapsed = time.perf_counter() - started
    print(f"wrote {args.events} events to {args.output} in {elapsed:.2f}s "
          f"({args.events / max(elapsed, 1e-9):,.0f} events/s): "
          + ", ".join(f"{n} {k}" for k, n in rows.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
