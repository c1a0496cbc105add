"""The dashboards and alert rules against a real Prometheus scraping a real job.

A real Prometheus (Debian's ``prometheus``; ``.ci/run`` installs it) runs on a free port on
127.0.0.1 with ``deploy/prometheus/prometheus.yml`` and ``rules.yml`` as shipped (only the
intervals shortened, and a file_sd target for the job's endpoint). A job with event time,
keyed state, periodic checkpoints, a controller and a live drrs rescale runs on real Ray;
its checkpoint store then goes away, so checkpoints fail while the job runs on. The test
asserts that every query of every dashboard panel and annotation (``engine.observability.dashboards``,
what ``deploy/grafana/dashboards`` is generated from) returns numbers through Prometheus's
HTTP API, that every alert rule evaluates without error and ``ReflowCheckpointsFailing``
fires for the job, and that ``reflow plot --prometheus`` draws every panel into a PNG.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from controllers.base import Controller, NoChange
from engine import JobConfig, StreamJob, cli
from engine.io.testing import SourceGate, TestingSink, TestingSource
from engine.observability.dashboards import DASHBOARDS, expand
from engine.observability.promplot import api
from engine.time.event_time import WatermarkStrategy
from tests.jobs import Moment, check_reports, wait_until
from tests.system import require

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
SCRAPE_S = 1
RATE_INTERVAL = "10s"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A Prometheus server of this test: the shipped config and rules in ``workdir``,
    scraping ``targets`` every second, listening on a free port on 127.0.0.1."""

    def __init__(self, workdir: Path, targets: list[str]) -> None:
        config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
        config["global"].update(scrape_interval=f"{SCRAPE_S}s",
                                evaluation_interval=f"{SCRAPE_S}s")
        config["scrape_configs"][0]["file_sd_configs"][0]["refresh_interval"] = "1s"
        (workdir / "targets").mkdir(parents=True)
        (workdir / "targets" / "job.json").write_text(json.dumps([{"targets": targets}]))
        shutil.copy(ROOT / "deploy/prometheus/rules.yml", workdir / "rules.yml")
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(workdir / "prometheus.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [require("prometheus", "prometheus"), f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result (no data: [])."""
        return api(self.url, "/api/v1/query", {"query": expr})["result"]

    def query_range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        return api(self.url, "/api/v1/query_range",
                   {"query": expr, "start": start, "end": end, "step": SCRAPE_S})["result"]

    def ready(self) -> bool:
        assert self.proc.poll() is None, "prometheus exited; see prometheus.log"
        try:
            return bool(self.query('up{job="reflow"} == 1'))
        except Exception:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class Observer(Controller):
    """A controller that looks and never acts: its decisions are counted (no-change)."""

    interval_s, window_s = 0.5, 1.0

    def decide(self, metrics: object, view: object) -> NoChange:
        return NoChange("observing")


def _job(n: int, gates: tuple[SourceGate, ...], checkpoints: Path) -> tuple[StreamJob,
                                                                          TestingSink]:
    """Event-time records near the wall clock (so the watermark lag is real), keyed sums,
    checkpoints every 0.3 s into ``checkpoints`` (failures tolerated)."""
    base = int(time.time() * 1000)
    records = [(f"k{i % 40}", base + i, 1) for i in range(n)]
    sink = TestingSink()
    job = StreamJob("observed", num_key_groups=32, parallelism=2,
                    config=JobConfig(batch_size=50, linger_ms=2, metrics_poll_interval_s=0.2,
                                     drrs_subscale_size=2, checkpoint_interval_s=0.3,
                                     checkpoint_dir=str(checkpoints),
                                     tolerable_checkpoint_failures=100_000))
    (job.source(TestingSource(records, rate=1500, timestamp_fn=lambda r: r[1], gate=gates),
                name="events", watermarks=WatermarkStrategy(max_out_of_orderness_ms=50))
        .key_by(lambda r: r[0])
        .reduce(lambda a, b: (a[0], a[1], a[2] + b[2]), name="sum")
        .sink(sink, name="out"))
    return job, sink


def _numbers(result: list[dict[str, Any]]) -> bool:
    """Whether a range query's result holds at least one finite value."""
    return any(math.isfinite(float(v)) for r in result for _, v in r["values"])


def test_every_dashboard_query_returns_data_from_a_real_prometheus(ray_cluster, tmp_path):
    n = 24_000
    moment = Moment.at(4000, 3000, n)
    hold = SourceGate(n - 2000)  # the job runs on (held) until every query has answered
    store = tmp_path / "checkpoints"
    job, _ = _job(n, (*moment.gates, hold), store)
    start = time.time()
    h = job.run(controllers=[Observer()])
    host_port = h.metrics_url.removeprefix("http://").removesuffix("/metrics")
    prom = Prometheus(tmp_path / "prometheus", [host_port])
    try:
        wait_until(prom.ready, "prometheus to scrape the job", h)
        report = moment.act(h, lambda: h.rescale("sum", 3))
        check_reports([report])
        wait_until(lambda: h.status().checkpoints.completed >= 2, "two checkpoints", h)
        # the store goes away (a file where its directory was): checkpoints fail, the job
        # runs on (tolerable_checkpoint_failures), and the alert must fire
        os.rename(store, tmp_path / "checkpoints-moved")
        store.write_text("not a directory")
        wait_until(lambda: h.status().checkpoints.failed >= 1, "a failed checkpoint", h)
        queries = [(d.uid, title, q) for d in DASHBOARDS.values() for title, q in d.queries()]

        def missing() -> list[str]:
            end = time.time()
            return [f"{uid}/{title}: {q.expr}" for uid, title, q in queries
                    if not _numbers(prom.query_range(expand(q.expr, h.job_id, RATE_INTERVAL),
                                                     start, end))]

        # rates need two scrapes after the rescale and the failure; the job still runs
        wait_until(lambda: not missing(), "every dashboard query to return data", h)
        assert missing() == []
        rules = api(prom.url, "/api/v1/rules", {})["groups"]
        evaluated = {r["name"]: (r["health"], r.get("lastError", "")) for g in rules
                     for r in g["rules"]}
        assert set(evaluated) == {"ReflowJobDown", "ReflowTaskUnresponsive",
                                  "ReflowRescaleOverrunning", "ReflowBackpressured",
                                  "ReflowCheckpointsFailing"}
        wait_until(lambda: all(r["health"] == "ok" for g in api(prom.url, "/api/v1/rules", {})
                               ["groups"] for r in g["rules"]),
                   f"every alert rule to evaluate without error: {evaluated}", h)

        def firing() -> set[tuple[str, str]]:
            return {(a["labels"]["alertname"], a["labels"].get("job", ""))
                    for a in api(prom.url, "/api/v1/alerts", {})["alerts"]
                    if a["state"] == "firing"}

        wait_until(lambda: ("ReflowCheckpointsFailing", h.job_id) in firing(),
                   "ReflowCheckpointsFailing to fire for the job", h)
        assert h.status().state == "running"
        # the picture a user without Grafana gets: every panel drew something
        for name in DASHBOARDS:
            png = tmp_path / f"{name}.png"
            assert cli.main(["plot", "--prometheus", prom.url, "--dashboard", name,
                             "--job", h.job_id, "--minutes", "3", "--out", str(png)]) == 0
            assert png.stat().st_size > 20_000
    finally:
        moment.release()
        hold.open()
        h.stop()
        prom.stop()


def test_plot_says_which_panels_have_no_data(tmp_path, capsys):
    """Against a Prometheus that scrapes nothing: the PNG is drawn, every panel says 'no
    data', and the command lists them (exit 0: an empty range is not an error)."""
    prom = Prometheus(tmp_path / "prometheus", [])
    try:
        wait_until(lambda: prom.proc.poll() is None and _answers(prom), "prometheus to start")
        out = tmp_path / "empty.png"
        assert cli.main(["plot", "--prometheus", prom.url, "--dashboard", "rescaling",
                         "--out", str(out), "--json"]) == 0
        drawn = json.loads(capsys.readouterr().out)
        assert drawn["png"] == str(out) and out.stat().st_size > 10_000
        assert set(drawn["series"]) == {p.title for p in DASHBOARDS["rescaling"].panels}
        assert set(drawn["series"].values()) == {0}
    finally:
        prom.stop()
    assert cli.main(["plot", "--prometheus", prom.url, "--dashboard", "overview",
                     "--out", str(out)]) == 1
    assert "cannot reach Prometheus at" in capsys.readouterr().err
    assert cli.main(["plot", "--prometheus", prom.url, "--dashboard", "nope"]) == 2
    assert "no dashboard 'nope'; known: overview, rescaling" in capsys.readouterr().err


def _answers(prom: Prometheus) -> bool:
    try:
        prom.query("1")
        return True
    except Exception:
        return False
