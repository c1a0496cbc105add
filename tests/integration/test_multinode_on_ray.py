"""The TCP data transport across the nodes of a multi-node Ray cluster
(``ray.cluster_utils.Cluster``, real raylets on this machine), and live placement of tasks
on another node, in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.ray

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "multinode_job.py")


@pytest.mark.parametrize("data_host", ["127.0.0.1", "0.0.0.0"])
def test_tasks_on_two_nodes_exchange_frames_and_rescale_live(data_host):
    # 0.0.0.0: each task advertises its node's address (the multi-machine setting)
    env = dict(os.environ, RAY_ADDRESS="")
    proc = subprocess.run([sys.executable, SCRIPT, data_host], capture_output=True, text=True,
                          timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "OK" in proc.stdout


def test_a_task_moves_to_another_node_live_by_the_handle_and_by_a_controller():
    env = dict(os.environ, RAY_ADDRESS="")
    proc = subprocess.run([sys.executable, SCRIPT, "127.0.0.1", "place"], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "OK" in proc.stdout


@pytest.mark.slow  # three raylets' worth of start-up
def test_a_removed_node_restarts_its_tasks_on_the_surviving_node():
    script = os.path.join(os.path.dirname(SCRIPT), "multinode_recovery_job.py")
    env = dict(os.environ, RAY_ADDRESS="")
    proc = subprocess.run([sys.executable, script], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "OK" in proc.stdout
