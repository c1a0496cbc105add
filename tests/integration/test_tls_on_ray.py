"""The data transport's TLS on real Ray: a job whose tasks talk over mutually
authenticated TLS (a self-signed pair the test makes) keeps exact results across a live
rescale; a job whose TLS files cannot be loaded is not deployed and says why."""

from __future__ import annotations

import dataclasses
import random

import pytest

from engine.errors import JobFailedError
from engine.io.testing import TestingSink
from engine.wire.transport import TLS
from tests.jobs import (
    SMALL,
    Moment,
    check_reports,
    per_key,
    running_sum_job,
    running_sum_reference,
)
from tests.tls import self_signed

pytestmark = pytest.mark.ray


def test_a_job_over_tls_keeps_results_across_a_live_rescale(ray_cluster, tmp_path):
    rng = random.Random(5)
    records = [(rng.randrange(40), rng.randrange(10)) for _ in range(6000)]
    sink = TestingSink()
    cfg = dataclasses.replace(SMALL, tls=self_signed(tmp_path))
    moment = Moment.at(200, 1000, len(records))
    h = running_sum_job(records, 2, sink, rate=1000, config=cfg, gates=moment.gates).run()
    check_reports(moment.run(h, lambda: [h.rescale("sum", 3)], job_timeout=120))
    assert per_key(sink.results()) == per_key(running_sum_reference(records))


def test_tls_files_that_do_not_load_fail_the_deployment(ray_cluster, tmp_path):
    good = self_signed(tmp_path)
    cfg = dataclasses.replace(SMALL, tls=TLS(good.cert_file, str(tmp_path / "gone.key")))
    job = running_sum_job([(1, 1)] * 10, 1, TestingSink(), config=cfg)
    with pytest.raises(JobFailedError, match=r"could not start: ConfigError: JobConfig.tls: "
                                             r"cannot load .*gone.key"):
        job.run()
