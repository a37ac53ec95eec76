r"""An emulated multi-host cluster on one Linux machine, for benchmarks with a bottleneck.

Each emulated host is a network namespace; racks are bridges in their own namespaces;
links are veth pairs shaped with tc's tbf on both ends, so each direction has its own
queue at the configured rate::

                      [core] br0
                     r0 /      \ r1
                       ||      ||             ==  uplink (spec.uplink), per rack
                     up0        up0
              [rack0] br0      [rack1] br0
                h0 /  \ h1       h2 /  \ h3
                  |    |           |    |      --  host NIC (spec.nic)
              data0  data0     data0  data0    10.77.0.<i+1>/16, one L2 subnet
               [h0]   [h1]      [h2]   [h3]    (one namespace per host)
               ctl0   ctl0      ctl0   ctl0    10.78.0.<i+1>/24, unshaped
                  \_____\________/_____/
                    [ctl] br0 10.78.0.254      mpiexec runs here

MPI jobs run with ``mpiexec`` inside ``[ctl]``; Hydra starts its proxies in the host
namespaces through :mod:`hvdx.cluster.netns_exec`, and ``UCX_TLS=tcp,self`` with
``UCX_NET_DEVICES=data0`` make the ranks' traffic cross the shaped links (see
:mod:`hvdx.cluster.launch`). Nothing is created in the caller's namespace.

Needs root and ``ip``/``tc`` (iproute2); without them :class:`ClusterUnavailable` says
so, and callers run on localhost instead. Emulated latency needs the kernel's netem.
This package imports no ML framework, MPI binding or Horovod.

Example::

    from hvdx.cluster import ClusterSpec, EmulatedCluster, run_mpi
    spec = ClusterSpec(racks=2, hosts_per_rack=2, nic="200mbit", uplink="50mbit")
    with EmulatedCluster(spec) as cluster:
        run_mpi(cluster, [sys.executable, "train.py"], ppn=1, timeout=600)
"""

from hvdx.cluster.iproute import ClusterUnavailable
from hvdx.cluster.launch import MPI_ENV, launcher_script, mpiexec_command, run_mpi
from hvdx.cluster.netns import (
    CONTROL_IFACE,
    DATA_IFACE,
    ContentionTimer,
    EmulatedCluster,
    Host,
)
from hvdx.cluster.probe import measure, measure_bandwidth
from hvdx.cluster.spec import (
    ClusterSpec,
    ContentionEvent,
    add_cluster_arguments,
    format_rate,
    parse_contention,
    parse_rate,
    parse_time,
)
from hvdx.cluster.teardown import cleanup_stale

__all__ = [
    "CONTROL_IFACE",
    "ClusterSpec",
    "ClusterUnavailable",
    "ContentionEvent",
    "ContentionTimer",
    "DATA_IFACE",
    "EmulatedCluster",
    "Host",
    "MPI_ENV",
    "add_cluster_arguments",
    "cleanup_stale",
    "format_rate",
    "launcher_script",
    "measure",
    "measure_bandwidth",
    "mpiexec_command",
    "parse_contention",
    "parse_rate",
    "parse_time",
    "run_mpi",
]
