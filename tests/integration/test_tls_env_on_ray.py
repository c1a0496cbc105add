"""The deployment's TLS on real Ray: with ``REFLOW_TLS_CERT_FILE`` / ``_KEY_FILE`` /
``_CA_FILE`` set as deploy/k8s sets them (the Secret's three files, a self-signed pair the
test makes; ``REFLOW_DATA_HOST=0.0.0.0`` as on the pod network) and a job whose code sets no
``tls``, every task's data port speaks only TLS, presenting the deployment's certificate (a
client with the task's own token but no TLS is cut off before any frame is read), and the
job's output is exact."""

from __future__ import annotations

import asyncio
import random
import ssl
from pathlib import Path

import pytest
import ray

from engine import JobConfig
from engine.dataflow.config import TLS_ENV
from engine.errors import ConnectionLost
from engine.io.testing import TestingSink
from engine.runtime.job_master import NAMESPACE
from engine.wire.transport import TLS, DataClient, tls_contexts
from tests.jobs import Moment, per_key, running_sum_job, running_sum_reference, task_actors
from tests.tls import self_signed

pytestmark = pytest.mark.ray


def _mount_secret(directory: Path) -> dict[str, str]:
    """The Secret reflow-tls as the manifests mount it (tls.crt, tls.key, ca.crt = tls.crt),
    and the variables naming its files."""
    pair = self_signed(directory / "made")
    mount = directory / "etc-reflow-tls"
    mount.mkdir()
    for key, source in (("tls.crt", pair.cert_file), ("tls.key", pair.key_file),
                        ("ca.crt", pair.cert_file)):
        (mount / key).write_bytes(Path(source).read_bytes())
    return dict(zip(TLS_ENV, (str(mount / k) for k in ("tls.crt", "tls.key", "ca.crt")),
                    strict=True))


async def _probe(host: str, port: int, token: bytes, tls: TLS) -> tuple[str, bytes]:
    """(TLS version, server certificate in DER) of a TLS connection to a task's data port
    with the deployment's pair; and a plain connection with the task's own token must be
    cut off (its frame never acknowledged)."""
    _, client_ctx = tls_contexts(tls)
    secure = await DataClient.connect(host, port, token, "probe", tls=client_ctx)
    try:
        ssl_object: ssl.SSLObject = secure._writer.get_extra_info("ssl_object")
        seen = ssl_object.version(), ssl_object.getpeercert(binary_form=True)
    finally:
        await secure.aclose()
    plain = await DataClient.connect(host, port, token, "probe")
    try:
        with pytest.raises(ConnectionLost):
            await plain.send(2**31, 0, b"clear text")
    finally:
        await plain.aclose()
    return seen


def test_a_job_with_the_tls_variables_runs_over_tls(ray_cluster, tmp_path, monkeypatch):
    env = _mount_secret(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("REFLOW_DATA_HOST", "0.0.0.0")
    cfg = JobConfig(batch_size=50, linger_ms=2, metrics_port=None)  # no tls in the job's code
    assert cfg.tls == TLS(env[TLS_ENV[0]], env[TLS_ENV[1]], env[TLS_ENV[2]])
    assert cfg.data_host == "0.0.0.0"
    der = ssl.PEM_cert_to_DER_cert(Path(env[TLS_ENV[0]]).read_text())

    rng = random.Random(11)
    records = [(rng.randrange(40), rng.randrange(10)) for _ in range(4000)]
    sink = TestingSink()
    moment = Moment.at(1500, 1000, len(records))  # records crossed the sockets by then
    h = running_sum_job(records, 2, sink, rate=2000, config=cfg, gates=moment.gates).run()

    def probe_every_sum_task() -> list[tuple[str, bytes]]:
        seen = []
        for name in task_actors(h, "sum"):
            actor = ray.get_actor(name, namespace=NAMESPACE)
            host, port, token = ray.get(actor.data_address.remote(), timeout=60)
            seen.append(asyncio.run(_probe(host, port, token, cfg.tls)))
        return seen

    seen = moment.run(h, probe_every_sum_task, job_timeout=120)
    assert len(seen) == 2, seen
    for version, presented in seen:
        assert version in ("TLSv1.2", "TLSv1.3")
        assert presented == der  # the deployment's certificate, not some other
    assert per_key(sink.results()) == per_key(running_sum_reference(records))
