"""``engine.runtime.gcs.GcsProbe``: a GCS that does not answer is reported within the
deadline, without piling up threads; one that answers (again) is reported as answering."""

from __future__ import annotations

import asyncio
import threading

from engine.runtime.gcs import GcsProbe


def test_an_absent_gcs_is_reported_in_time_with_one_call_outstanding() -> None:
    back = threading.Event()
    calls: list[int] = []

    def call() -> list[str]:
        calls.append(1)
        back.wait(60)  # the GCS is away until the test says it is back
        return ["node"]

    probe = GcsProbe(call)

    async def main() -> None:
        assert await probe.answers(0.05) is False
        assert await probe.answers(0.05) is False
        assert len(calls) == 1  # the second probe awaited the first call
        back.set()
        assert await probe.answers(30) is True
        assert await probe.answers(30) is True
        assert len(calls) == 2  # an answered call is not reused

    asyncio.run(main())


def test_a_failing_call_counts_as_not_answering() -> None:
    def call() -> None:
        raise ConnectionError("GCS unavailable")

    assert asyncio.run(GcsProbe(call).answers(30)) is False
