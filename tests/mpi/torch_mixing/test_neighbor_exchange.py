"""NeighborExchange: one fused buffer to the out-neighbours, mixed with the in-neighbours'.

Every rank's buffer is known everywhere (``arange(m) + 1000 * rank``, shifted by the
step), so each expectation is an explicit numpy loop over the sources, in the buffer's
dtype and in the documented order (self first, then the sources as given): the results
must match bit for bit. Size-agnostic: n = 1, 2, 4.
"""

import math

import horovod.torch as horovod_torch
import numpy as np
import pytest

from hvdx.mpi.comm import world
from hvdx.mpi.neighbor_exchange import NeighborExchange, exchange

pytestmark = pytest.mark.mpi(min_size=1)

M = 1000


@pytest.fixture(scope="module")
def comm(horovod):
    # hvdx's duplicate of Horovod's communicator (the session fixture initialised it).
    return world(horovod_torch.global_process_set)


def values(rank, m=M, dtype=np.float64, step=0):
    """Rank ``rank``'s buffer at ``step`` (any rank can compute any rank's)."""
    return (np.arange(m, dtype=np.float64) + 1000.0 * rank + 0.25 * step).astype(dtype)


def expected(rank, sources, self_weight, weights, m=M, dtype=np.float64, step=0):
    """``w_ii x_i + sum_j w_ij x_j`` with numpy, self first, sources in the given order."""
    dtype = np.dtype(dtype).type
    result = dtype(self_weight) * values(rank, m, dtype, step)
    for source, weight in zip(sources, weights):
        result = result + dtype(weight) * values(source, m, dtype, step)
    return result


def tau(n):
    return math.ceil(math.log2(n)) if n > 1 else 0


def ring(comm):
    n, r = comm.Get_size(), comm.Get_rank()
    return [(r + 1) % n, (r - 1) % n], [(r - 1) % n, (r + 1) % n]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_ring_matches_numpy(comm, dtype):
    # At n = 2 both neighbours are the same peer (two messages each way, matched in
    # order); at n = 1 both are this rank itself.
    r = comm.Get_rank()
    send_to, recv_from = ring(comm)
    nx = NeighborExchange(comm)
    buffer = values(r, dtype=dtype)
    nx.start(buffer, send_to, recv_from)
    assert nx.pending
    mixed = nx.finish(1 / 3, [1 / 3, 1 / 3])
    assert not nx.pending
    assert mixed.dtype == dtype and mixed is not buffer
    np.testing.assert_array_equal(mixed, expected(r, recv_from, 1 / 3, [1 / 3, 1 / 3],
                                                  dtype=dtype))
    np.testing.assert_array_equal(buffer, values(r, dtype=dtype))  # not modified
    assert nx.stats.last_bytes_sent == nx.stats.bytes_sent == 2 * buffer.nbytes
    assert nx.stats.bytes_received == 2 * buffer.nbytes
    assert nx.stats.messages_sent == 2 and nx.stats.exchanges == 1


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_one_peer_exponential(comm, dtype):
    n, r = comm.Get_size(), comm.Get_rank()
    nx = NeighborExchange(comm)
    for step in range(2 * max(tau(n), 1)):
        if n == 1:
            send_to, recv_from = [], []
        else:
            hop = 2 ** (step % tau(n))
            send_to, recv_from = [(r + hop) % n], [(r - hop) % n]
        weights = [0.5] * len(recv_from)
        self_weight = 1.0 - sum(weights)
        buffer = values(r, dtype=dtype, step=step)
        nx.start(buffer, send_to, recv_from)
        mixed = nx.finish(self_weight, weights)
        np.testing.assert_array_equal(
            mixed, expected(r, recv_from, self_weight, weights, dtype=dtype, step=step))
        assert nx.stats.last_bytes_sent == len(send_to) * buffer.nbytes


def test_no_neighbours(comm):
    r = comm.Get_rank()
    nx = NeighborExchange(comm)
    buffer = values(r)
    nx.start(buffer, [], [])
    assert nx.pending and nx.test()
    np.testing.assert_array_equal(nx.finish(0.75, []), 0.75 * values(r))
    assert nx.stats.bytes_sent == nx.stats.bytes_received == nx.stats.messages_sent == 0
    assert nx.stats.allocations == 0 and nx.stats.exchanges == 1


def test_reuse_across_steps_allocates_once(comm):
    # The in-degree alternates 1, 2, 1, 2, ...: the receive buffers grow once to two
    # and are reused from then on.
    r = comm.Get_rank()
    send_to, recv_from = ring(comm)
    nx = NeighborExchange(comm)
    buffer = np.empty(M)
    out = np.empty(M)
    pool_ids = None
    for step in range(20):
        k = 1 + step % 2
        weights = [0.25] * k
        self_weight = 1.0 - 0.25 * k
        buffer[:] = values(r, step=step)
        # In-degree k: send to the first k out-neighbours, receive from the first k
        # in-neighbours (the ring is symmetric, so the two lists match up).
        nx.start(buffer, send_to[:k], recv_from[:k])
        while not nx.test():
            pass
        result = nx.finish(self_weight, weights, out=out)
        assert result is out
        np.testing.assert_array_equal(
            out, expected(r, recv_from[:k], self_weight, weights, step=step))
        if step >= 1:
            assert nx.stats.allocations == 2
            ids = [id(a) for a in nx._pool]
            assert pool_ids is None or ids == pool_ids
            pool_ids = ids
    assert nx.stats.exchanges == 20 and nx.stats.messages_sent == 30
    assert nx.stats.bytes_sent == nx.stats.bytes_received == 30 * buffer.nbytes


def test_out_is_buffer(comm):
    r = comm.Get_rank()
    send_to, recv_from = ring(comm)
    buffer = values(r, dtype=np.float32)
    nx = NeighborExchange(comm)
    nx.start(buffer, send_to, recv_from)
    result = nx.finish(0.5, [0.25, 0.25], out=buffer)
    assert result is buffer
    np.testing.assert_array_equal(
        buffer, expected(r, recv_from, 0.5, [0.25, 0.25], dtype=np.float32))


def test_pending_refuses_second_start_then_finishes(comm):
    r = comm.Get_rank()
    send_to, recv_from = ring(comm)
    nx = NeighborExchange(comm)
    nx.start(values(r), send_to, recv_from)
    with pytest.raises(RuntimeError, match="already pending"):
        nx.start(values(r, step=1), send_to, recv_from)
    assert nx.pending and nx.stats.exchanges == 1
    mixed = nx.finish(0.5, [0.25, 0.25])  # the first exchange, untouched
    np.testing.assert_array_equal(mixed, expected(r, recv_from, 0.5, [0.25, 0.25]))
    assert not nx.pending and nx.test()
    with pytest.raises(RuntimeError, match="without a pending"):
        nx.finish(0.5, [0.25, 0.25])


def test_cancel_completes_and_discards(comm):
    r = comm.Get_rank()
    send_to, recv_from = ring(comm)
    nx = NeighborExchange(comm)
    nx.cancel()  # nothing pending: nothing to do
    nx.start(values(r), send_to, recv_from)
    nx.cancel()
    assert not nx.pending and nx.stats.bytes_received == 2 * values(r).nbytes
    nx.start(values(r, step=3), send_to, recv_from)
    np.testing.assert_array_equal(nx.finish(0.5, [0.25, 0.25]),
                                  expected(r, recv_from, 0.5, [0.25, 0.25], step=3))


def test_large_buffer(comm):
    # 8 MB: far above MPICH's eager limit, so the rendezvous protocol has to make
    # progress while this rank polls with test() and in finish().
    n, r = comm.Get_size(), comm.Get_rank()
    m = 1 << 20
    send_to, recv_from = ([(r + 1) % n], [(r - 1) % n]) if n > 1 else ([], [])
    weights = [0.5] * len(recv_from)
    buffer = values(r, m=m)
    nx = NeighborExchange(comm)
    nx.start(buffer, send_to, recv_from)
    nx.test()
    nx.finish(1.0 - sum(weights), weights, out=buffer)
    np.testing.assert_array_equal(
        buffer, expected(r, recv_from, 1.0 - sum(weights), weights, m=m))
    assert nx.stats.bytes_sent == len(send_to) * 8 * m


class _Recording:
    """``comm`` that notes the order in which point-to-point operations are posted."""

    def __init__(self, comm):
        self._comm, self.posted = comm, []

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def Isend(self, *args, **kwargs):
        self.posted.append("send")
        return self._comm.Isend(*args, **kwargs)

    def Irecv(self, *args, **kwargs):
        self.posted.append("recv")
        return self._comm.Irecv(*args, **kwargs)


def test_a_swap_posts_its_sends_before_its_receives_and_mixes_both_ways(comm):
    # Two ranks that are each other's source and destination (the one-peer graph's
    # i <-> i + n/2): posted receives first, one direction often waited for the other.
    n, r = comm.Get_size(), comm.Get_rank()
    partner = [(r + n // 2) % n] if n > 1 else []
    recording = _Recording(comm)
    nx = NeighborExchange(recording)
    buffer = values(r, m=1 << 18)
    nx.start(buffer, partner, partner)
    assert recording.posted == ["send"] * len(partner) + ["recv"] * len(partner)
    weights = [0.5] * len(partner)
    nx.finish(1.0 - sum(weights), weights, out=buffer)
    np.testing.assert_array_equal(
        buffer, expected(r, partner, 1.0 - sum(weights), weights, m=1 << 18))
    assert nx.stats.bytes_received == len(partner) * 8 * (1 << 18)


def test_one_shot_exchange(comm):
    r = comm.Get_rank()
    send_to, recv_from = ring(comm)
    mixed = exchange(comm, values(r), send_to, recv_from, 0.5, [0.3, 0.2])
    np.testing.assert_array_equal(mixed, expected(r, recv_from, 0.5, [0.3, 0.2]))


def test_size_mismatch_is_reported(comm):
    # Rank 0 sends M values to rank 1, which expects M + 1: a RuntimeError on rank 1,
    # nothing left pending on either.
    n, r = comm.Get_size(), comm.Get_rank()
    if n == 1:
        pytest.skip("needs two ranks")
    nx = NeighborExchange(comm)
    if r == 0:
        nx.start(values(0), [1], [])
        nx.finish(1.0, [])
    elif r == 1:
        nx.start(values(1, m=M + 1), [], [0])
        with pytest.raises(RuntimeError, match=f"rank 0 sent {8 * M} bytes"):
            nx.finish(0.5, [0.5])
    assert not nx.pending


def test_bad_arguments_raise_before_communicating(comm):
    n, r = comm.Get_size(), comm.Get_rank()
    send_to, recv_from = ring(comm)
    nx = NeighborExchange(comm)
    bad_buffers = [np.zeros((2, 3)), np.arange(10.0)[::2], np.arange(4),
                   np.zeros(4, dtype=">f8"), [1.0, 2.0]]
    for bad in bad_buffers:
        with pytest.raises(ValueError, match="buffer"):
            nx.start(bad, send_to, recv_from)
    with pytest.raises(ValueError, match=f"send_to: rank {n} is out of range"):
        nx.start(values(r), [n], [])
    with pytest.raises(ValueError, match="recv_from: rank -1 is out of range"):
        nx.start(values(r), [], [-1])
    with pytest.raises(ValueError, match="recv_from: rank 0.5 is not an integer"):
        nx.start(values(r), [], [0.5])
    with pytest.raises(ValueError, match="recv_weights"):
        exchange(comm, values(r), send_to, recv_from, 0.5, [0.5])
    with pytest.raises(ValueError, match="tag"):
        NeighborExchange(comm, tag=-1)
    assert not nx.pending and nx.stats.exchanges == 0 and nx.stats.bytes_sent == 0

    # In finish(): checked before waiting; the exchange stays pending and finishes.
    nx.start(values(r), send_to, recv_from)
    with pytest.raises(ValueError, match="recv_weights"):
        nx.finish(0.5, [0.5])
    with pytest.raises(ValueError, match="out"):
        nx.finish(0.5, [0.25, 0.25], out=np.empty(M, np.float32))
    assert nx.pending
    np.testing.assert_array_equal(nx.finish(0.5, [0.25, 0.25]),
                                  expected(r, recv_from, 0.5, [0.25, 0.25]))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_finish_change_is_the_mix_minus_the_sent_buffer(comm, dtype):
    # sum_j w_j (x_j - x_i): with w_ii = 1 - sum_j w_j, x_i plus it is the mix.
    r = comm.Get_rank()
    send_to, recv_from = ring(comm)
    nx = NeighborExchange(comm)
    buffer = values(r, dtype=dtype)
    nx.start(buffer, send_to, recv_from)
    change = nx.finish_change([0.25, 0.25])
    mix = expected(r, recv_from, 0.5, [0.25, 0.25], dtype=dtype)
    np.testing.assert_allclose(buffer + change, mix, rtol=1e-6 if dtype == np.float32 else 0,
                               atol=1e-3 if dtype == np.float32 else 1e-9)
    assert not nx.pending


def test_finish_change_refuses_the_sent_buffer_as_out_and_stays_pending(comm):
    r = comm.Get_rank()
    nx = NeighborExchange(comm)
    buffer = values(r)
    nx.start(buffer, [r], [r])
    with pytest.raises(ValueError, match="out must not be the sent buffer"):
        nx.finish_change([0.5], out=buffer)
    assert nx.pending
    nx.cancel()
