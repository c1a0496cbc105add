"""Issue 32 item 13: how an actor's death reads in a job's error (``failures.actor_death``),
on Ray's own texts (Ray 2.60: a process killed by a signal, ``ray.kill``, and a kill by
Ray's memory monitor). No Ray runs here."""

from __future__ import annotations

from engine.runtime.failures import actor_death

HEAD = ("The actor died unexpectedly before finishing this task.\n"
        "\tclass_name: TaskActor\n\tactor_id: 5cbdc560b079abbfda17281701000000\n"
        "\tpid: 1092\n\tname: job-1/sum/0/g0\n\tnamespace: reflow\n\tip: 192.0.2.2\n")
SIGKILLED = HEAD + (
    "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR "
    "Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of "
    "file. Some common causes include: (1) the process was killed by the OOM killer due to "
    "high memory usage, (2) ray stop --force was called, or (3) the worker crashed "
    "unexpectedly due to SIGSEGV or another unexpected error. If the process was killed by "
    "the kernel OOM killer (verifiable by checking for OOM in dmesg of the OOMing node), "
    "consider enabling resource isolation via --enable-resource-isolation to prevent node "
    "deaths by resource contention and significant loss of progress by uninformed kernel "
    "OOM killing.")
RAY_KILLED = HEAD + "The actor is dead because it was killed by `ray.kill`."
OOM = HEAD + (
    "The actor is dead because its worker process has died. Worker exit type: "
    "NODE_OUT_OF_MEMORY Worker exit detail: Task was killed due to the node running low on "
    "memory. Memory on the node (IP: 192.0.2.2) was 7.5GB / 7.8GB (0.96). Refer to the "
    "documentation on how to address the out of memory issue: https://docs.ray.io/en/latest/"
    "ray-observability/user-guides/debug-apps/debug-memory.html. To adjust the kill "
    "threshold, set the environment variable `RAY_memory_usage_threshold`.")


def test_a_killed_process_keeps_what_happened_and_loses_rays_advice():
    text = actor_death(SIGKILLED)
    assert text.startswith("The actor is dead because its worker process has died.")
    assert "SYSTEM_ERROR" in text and "(pid 1092 on 192.0.2.2)" in text
    for advice in ("Some common causes", "dmesg", "resource isolation", "actor_id", "\t"):
        assert advice not in text, text
    assert "killed (a SIGKILL, e.g. the kernel's OOM killer) or crashed" in text
    assert len(text) < 0.5 * len(SIGKILLED), (len(text), len(SIGKILLED))


def test_ray_kill_reads_in_one_line():
    assert actor_death(RAY_KILLED) == ("The actor is dead because it was killed by `ray.kill`. "
                                       "(pid 1092 on 192.0.2.2)")


def test_an_out_of_memory_kill_keeps_rays_advice_whole():
    text = actor_death(OOM)
    assert "running low on memory" in text and "RAY_memory_usage_threshold" in text
    assert "\n" not in text


def test_a_text_without_rays_fields_stays_as_it_is():
    lost = "data connection to task j/sum/0/g0 lost: IncompleteReadError: 0 bytes read"
    assert actor_death(lost) == lost


def test_a_report_the_job_restarted_under_says_so():
    from migration.report import RescaleReport

    r = RescaleReport("sum", "drrs", 2, 4, 0.0, 23.07, 23.07, 12, 260, (), restarts=1)
    text = str(r)
    assert text.startswith("drrs rescale of 'sum' 2 -> 4 done in 23.07 s"), text
    assert "the job restarted 1 time during it" in text and "'sum' now runs 4 tasks" in text
    assert "restarted" not in str(RescaleReport("sum", "drrs", 2, 4, 0.0, 1.0, 1.0, 12, 260, ()))


def test_status_counts_restarts_begun_and_completed_apart():
    from engine.wire.messages import JobStatus, decode_message, encode_message

    st = decode_message(encode_message(JobStatus("j", "restarting", restarts=1)))
    assert (st.restarts, st.restarts_completed) == (1, 0)
