"""An mpi4py job across emulated hosts: its bytes cross the shaped data links.

Rank 0 (host h0) sends the same message to h1 (same rack, NIC-limited) and to h2
(other rack, uplink-limited). The data interfaces' counters must grow by the message
size and the transfer times must match the shaped rates; with shared memory (no
``UCX_TLS=tcp,self``) the bytes would skip the links and both checks would fail.
"""

import json
import shutil
import subprocess
import sys

import pytest

from cluster_helpers import HERE, NIC, UPLINK, child_env, root_skip_reason
from hvdx.cluster import mpiexec_command, parse_rate, run_mpi

MEGABYTES = 24


def _mpi_skip_reason():
    if root_skip_reason():
        return root_skip_reason()
    if shutil.which("mpiexec") is None:
        return "mpiexec (MPICH Hydra) is not installed"
    probe = subprocess.run([sys.executable, "-c", "import mpi4py"], capture_output=True)
    if probe.returncode != 0:
        return f"mpi4py is not importable by {sys.executable}"
    return None


pytestmark = pytest.mark.skipif(_mpi_skip_reason() is not None,
                                reason=str(_mpi_skip_reason()))


@pytest.fixture(scope="module")
def job(cluster):
    before = {h.name: cluster.interface_counters(h) for h in cluster.hosts}
    proc = run_mpi(cluster, [sys.executable, str(HERE / "mpi_transfer.py"), str(MEGABYTES)],
                   hosts=["h0", "h1", "h2"], timeout=120, process_env=child_env())
    after = {h.name: cluster.interface_counters(h) for h in cluster.hosts}
    assert proc.returncode == 0, proc.stderr[-3000:]
    delta = {name: (after[name][0] - before[name][0], after[name][1] - before[name][1])
             for name in before}
    return json.loads(proc.stdout.strip().splitlines()[-1]), delta


def test_the_command_runs_mpiexec_inside_the_control_namespace(cluster):
    command = mpiexec_command(cluster, ["python", "x.py"], hosts=[0, 2], ppn=2)
    assert command[:5] == ["ip", "netns", "exec", cluster.control_netns, "mpiexec"]
    text = " ".join(command)
    assert "-launcher ssh -launcher-exec " in text
    assert "-localhost 10.78.0.254 -hosts 10.78.0.1,10.78.0.3 -n 4 -ppn 2" in text
    assert "-genv UCX_TLS tcp,self -genv UCX_NET_DEVICES data0 python x.py" in text
    with pytest.raises(ValueError, match="np=5"):
        mpiexec_command(cluster, ["x"], hosts=[0, 2], ppn=2, np=5)


def test_each_rank_runs_on_its_emulated_host(job):
    report, _ = job
    assert report["hosts"] == ["h0", "h1", "h2"]
    # MPI sees three nodes although every namespace shares one hostname.
    assert report["node_groups"] == [1, 1, 1]


def test_the_senders_tx_counter_grows_by_the_bytes_sent(job):
    report, delta = job
    nbytes = MEGABYTES * 10**6
    intra, cross = report["transfers"]
    # Within the rack nothing is dropped: the counter is the payload plus headers.
    assert nbytes <= intra["tx_bytes"] <= 1.10 * nbytes, intra
    # Across racks the uplink queue drops packets and TCP resends them, so the sender
    # counts more; the receiver counts what arrived.
    assert cross["tx_bytes"] >= nbytes
    assert nbytes <= delta["h1"][1] <= 1.10 * nbytes, delta
    assert nbytes <= delta["h2"][1] <= 1.10 * nbytes, delta
    assert delta["h3"][0] + delta["h3"][1] < 10**5, "h3 took no part but saw traffic"


@pytest.mark.parametrize("index, rate", [(0, NIC), (1, UPLINK)], ids=["intra", "cross"])
def test_transfer_time_matches_the_shaped_rate(job, index, rate):
    report, _ = job
    transfer = report["transfers"][index]
    expected = transfer["bytes"] * 8 / parse_rate(rate)
    assert 0.95 * expected <= transfer["seconds"] <= 1.20 * expected, \
        f"{transfer['seconds']:.2f} s for {transfer['bytes']} bytes at {rate}: " \
        f"expected {expected:.2f} s"


def test_without_tcp_only_the_bytes_would_skip_the_links(cluster):
    # The control experiment for the settings in MPI_ENV: UCX's default transports
    # move the bytes through shared memory, and the data links see nothing.
    before = cluster.interface_counters("h0")[0]
    proc = run_mpi(cluster, [sys.executable, str(HERE / "mpi_transfer.py"), str(MEGABYTES)],
                   hosts=["h0", "h2"], env={"UCX_TLS": "all"}, timeout=120,
                   process_env=child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert cluster.interface_counters("h0")[0] - before < 10**6


@pytest.mark.parametrize("order", ["busy", "late"])
def test_the_ranks_exit_whatever_order_they_reach_finalize_in(cluster, order):
    # Both orders deadlock MPICH 4.0's own MPI_Finalize over UCX's TCP transport every
    # time (finalize_job.py, hvdx.mpi.finalize); through hvdx's finalize both ranks exit.
    proc = run_mpi(cluster, [sys.executable, str(HERE / "finalize_job.py"), order, "1"],
                   hosts=["h0", "h2"], timeout=60, process_env=child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "finalized: True"
