"""NEXMark benchmark support: deterministic event generator, Parquet CLI, reference queries."""
