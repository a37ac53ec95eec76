"""Fixtures for the emulated-cluster tests.

Tests that build a cluster need root (network namespaces); without it they are skipped
with that reason, while the spec tests still run.
"""

import pytest

from cluster_helpers import NIC, UPLINK, root_skip_reason
from hvdx.cluster import ClusterSpec, ClusterUnavailable, EmulatedCluster


@pytest.fixture(scope="module")
def cluster():
    """A running 2 racks x 2 hosts cluster, NIC 200mbit, uplink 50mbit."""
    reason = root_skip_reason()
    if reason:
        pytest.skip(reason)
    try:
        running = EmulatedCluster(ClusterSpec(racks=2, hosts_per_rack=2, nic=NIC,
                                              uplink=UPLINK)).start()
    except ClusterUnavailable as error:
        pytest.skip(str(error))
    with running:
        yield running
