"""Teardown: nothing a cluster made outlives it, however its process ends."""

import os
import signal
import subprocess
import sys

import pytest

from cluster_helpers import child_env, netns_names, root_skip_reason
from hvdx.cluster import ClusterSpec, ClusterUnavailable, EmulatedCluster, cleanup_stale

pytestmark = pytest.mark.skipif(root_skip_reason() is not None,
                                reason=str(root_skip_reason()))

# A child that builds a small cluster, starts a process inside one host, prints the run
# id and that process's pid, then fails, sleeps or is interrupted as told.
CHILD = """
import subprocess, sys, time
from hvdx.cluster import ClusterSpec, EmulatedCluster
cluster = EmulatedCluster(ClusterSpec(racks=2, hosts_per_rack=1, nic="100mbit",
                                      uplink="10mbit"))
with cluster:
    sleeper = subprocess.Popen(cluster.exec_prefix("h0") + ["sleep", "300"])
    print(cluster.run_id, sleeper.pid, cluster.workdir, flush=True)
    sys.stdin.readline()  # the parent has counted the namespaces
    if sys.argv[1] == "raise":
        raise RuntimeError("boom")
    for _ in range(600):
        time.sleep(0.1)
"""
# Short sleeps in a loop, not one long one: a signal that lands after readline returns
# but before a single time.sleep(60) has begun would wait for the whole sleep, since
# CPython runs Python signal handlers only between bytecodes or when a blocking call is
# interrupted (seen once in 10 runs: the parent signals right after its "go").


def _ours(run_id):
    return {name for name in netns_names() if name.startswith(run_id + "-")}


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start_child(mode):
    child = subprocess.Popen([sys.executable, "-c", CHILD, mode], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=child_env())
    line = child.stdout.readline().split()
    assert len(line) == 3, child.stderr.read()
    run_id, sleeper, workdir = line[0], int(line[1]), line[2]
    # Counted before the child goes on: in "raise" mode its teardown would otherwise
    # race this count (seen once: 5 of 6 namespaces left).
    assert len(_ours(run_id)) == 6  # 2 hosts, 2 racks, core, control
    child.stdin.write("go\n")
    child.stdin.flush()
    return child, run_id, sleeper, workdir


def test_normal_exit_removes_every_namespace_and_the_work_directory():
    with EmulatedCluster(ClusterSpec(racks=1, hosts_per_rack=2)) as cluster:
        assert set(cluster.namespaces) == _ours(cluster.run_id)
        assert len(cluster.namespaces) == 5
        workdir = cluster.workdir
        assert os.path.isdir(workdir)
    assert _ours(cluster.run_id) == set()
    assert not os.path.exists(workdir)


@pytest.mark.parametrize("mode, sig, codes", [
    ("sleep", signal.SIGTERM, {-signal.SIGTERM}),
    ("sleep", signal.SIGINT, {-signal.SIGINT, 1}),
    ("raise", None, {1}),
])
def test_a_terminated_or_failing_process_removes_its_cluster(mode, sig, codes):
    child, run_id, sleeper, workdir = _start_child(mode)
    if sig is not None:
        child.send_signal(sig)
    child.wait(timeout=30)
    assert child.returncode in codes, child.stderr.read()
    assert _ours(run_id) == set()
    assert not _alive(sleeper), "a process inside the cluster outlived it"
    assert not os.path.exists(workdir)


def test_cleanup_stale_removes_what_a_killed_run_left_and_nothing_else():
    with EmulatedCluster(ClusterSpec(racks=1, hosts_per_rack=1)) as live:
        child, run_id, sleeper, workdir = _start_child("sleep")
        child.kill()  # SIGKILL: no handler runs, everything stays behind
        child.wait(timeout=30)
        assert len(_ours(run_id)) == 6 and _alive(sleeper)
        removed = cleanup_stale()
        assert set(removed) >= {f"{run_id}-h0", f"{run_id}-ctl"}
        assert _ours(run_id) == set()
        assert not _alive(sleeper)
        assert not os.path.exists(workdir)
        # This process is alive: its own cluster stays.
        assert _ours(live.run_id) == set(live.namespaces)


def test_an_invalid_spec_creates_nothing():
    before = netns_names()
    with pytest.raises(ValueError, match="uplink='100mbps'"):
        EmulatedCluster(ClusterSpec(uplink="100mbps"))
    assert netns_names() == before


def test_a_failure_half_way_through_set_up_removes_what_was_made(monkeypatch):
    def fail(self):
        raise RuntimeError("tc failed")
    monkeypatch.setattr(EmulatedCluster, "_shape", fail)
    cluster = EmulatedCluster(ClusterSpec(racks=2, hosts_per_rack=1))
    with pytest.raises(RuntimeError, match="tc failed"):
        with cluster:
            pass
    assert _ours(cluster.run_id) == set()
    assert cluster.workdir is None


def test_latency_needs_netem_and_a_kernel_without_it_is_told_so():
    spec = ClusterSpec(racks=2, hosts_per_rack=1, latency="1ms", uplink_latency="2ms")
    cluster = EmulatedCluster(spec)
    try:
        cluster.start()
    except ClusterUnavailable as error:
        assert "netem" in str(error) and "latency" in str(error)
        assert _ours(cluster.run_id) == set()
        return
    with cluster:
        out = subprocess.run(["tc", "-n", cluster.hosts[0].netns, "qdisc", "show", "dev",
                              "data0"], capture_output=True, text=True, check=True).stdout
        assert "netem" in out and "delay 1ms" in out and "tbf" in out
        cluster.set_rate("uplink", "20mbit")
        assert cluster.rate("uplink1") == 20 * 10**6
    assert _ours(cluster.run_id) == set()
