"""What a job shows about itself: latency histograms (``latency``), rates and the
metrics history (``rates``), per-task metrics exported to Prometheus (``metrics``), per key
group statistics (``groupstats``), the Grafana dashboards and alert rules (``dashboards``)
and plots from a Prometheus server (``promplot``).

May import: ``engine.errors``, ``engine.names``, ``engine.wire``."""
