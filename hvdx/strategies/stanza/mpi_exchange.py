"""Stanza's traffic with mpi4py: activations up, activation gradients down, role allreduces.

Stanza (Wu, Xu, Li, Xiong, arXiv 1812.10624) separates the layers: conv workers train
the feature extractor, FC workers the head (roles: :mod:`hvdx.strategies.stanza.core_roles`). This
module moves contiguous host buffers (numpy; bytes for the point-to-point messages, so
any dtype travels as itself) on a private duplicate of hvdx's world communicator, and
counts every byte it hands to MPI (Horovod's timeline does not see mpi4py traffic):

1. role communicators: ``MPI.Comm.Split`` of that duplicate by role, so the conv
   workers' allreduce never involves an FC worker and the reverse (no Horovod process
   sets: no dynamic process-set mode is needed);
2. conv worker: :meth:`StanzaExchange.post_gradient_receive` (the receives go first, so
   the reply lands straight in its buffer), :meth:`StanzaExchange.send_activations`
   (activations and labels, non-blocking, to its FC worker), :meth:`wait`;
3. FC worker: :meth:`StanzaExchange.probe_batches` learns each conv worker's batch size
   from the size of its activation message (``MPI_Improbe``: no header travels, and
   batches may change size from step to step), :meth:`receive_activations` into one
   contiguous buffer, in conv-rank order; after the head's backward pass
   :meth:`send_gradients` returns each conv worker its slice of the activation
   gradient and the mean loss over its samples (8 bytes: ``control``);
4. :meth:`allreduce_sum`: a role's gradients in one fused buffer per dtype, summed in
   place (``MPI_Iallreduce``) over the role communicator; nothing is sent when the role
   has one rank. The adapters end the first buffer with one presence flag per
   parameter (:class:`hvdx.core.fused_layout.FusedLayout`), so the same sum tells every
   rank which parameters no rank of the role had a gradient for (counted with the
   gradients' bytes). :meth:`global_batch` sums the FC workers' sample counts (8 bytes);
5. :meth:`first_error`: one small allgather over the world, so that an error found on
   one rank (a head that does not fit the activations) is raised on every rank with the
   same message instead of leaving the others waiting;
6. the whole model on one rank (``full_model``): :meth:`agree_on_target` checks that
   every rank asked for the same rank of the job, then :meth:`assemble` hands it each
   part from the first rank of the part's role (its own part it copies itself).

Byte counters (:class:`StanzaStats`) per kind: ``activations`` (activations and labels,
conv to FC), ``activation_gradients`` (FC to conv), ``conv_allreduce`` and
``fc_allreduce`` (the size of the buffer this rank hands to the allreduce: what it
contributes; the network carries about ``2 (m - 1) / m`` times that for ``m`` ranks),
``control`` (losses, batch sizes) and ``setup`` (one-off transfers of parameters:
the initial broadcast, ``full_model``), the last step's separately.

Waiting tests the requests, yielding the core for 2 ms, then sleeping
``HVDX_MPI_POLL_US`` between tests, like :mod:`hvdx.mpi.neighbor_exchange`:
a rank waiting for a late peer must not take the core from it.
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from hvdx.core.counters import Counters
from hvdx.strategies.stanza.core_roles import CONV, FC, StanzaRoles, auto_fc_workers, median_probe
from hvdx.mpi import sparse, timeline
from hvdx.strategies.stanza.core_checks import target_error

__all__ = ["KINDS", "StanzaExchange", "StanzaStats", "agree_on_probe", "role_communicators"]

#: Byte-counter kinds, in report order.
KINDS = ("activations", "activation_gradients", "conv_allreduce", "fc_allreduce",
         "control", "setup")

# Tags on Stanza's own communicator (nothing else uses it). Micro-batches reuse them:
# MPI does not let messages of one source, tag and communicator overtake each other, so
# the k-th activation message of a conv worker is its k-th micro-batch.
_ACTIVATIONS, _LABELS, _GRADIENTS, _LOSS, _SETUP, _BATCH = 1, 2, 3, 4, 5, 6

_MPI_FLOATS = {np.dtype(np.float64): MPI.DOUBLE, np.dtype(np.float32): MPI.FLOAT}

#: ``"world"`` -> Stanza's duplicate; ``(size, fc_workers)`` -> this rank's role comm.
_cache: Dict[object, MPI.Comm] = {}


class StanzaStats(Counters):
    """Bytes this rank handed to MPI (``sent``) and got from it (``received``), by kind.

    ``sent`` / ``received``: totals; ``last_sent`` / ``last_received``: the last step
    only (``setup`` transfers happen outside steps and are in the totals only).
    ``steps``: steps completed.
    """

    INITIAL = {"steps": 0, "sent": dict.fromkeys(KINDS, 0),
               "received": dict.fromkeys(KINDS, 0), "last_sent": dict.fromkeys(KINDS, 0),
               "last_received": dict.fromkeys(KINDS, 0)}
    __slots__ = tuple(INITIAL)

    def begin_step(self) -> None:
        """Open a step: its ``last_*`` figures start from zero."""
        self.last_sent = dict.fromkeys(KINDS, 0)
        self.last_received = dict.fromkeys(KINDS, 0)

    def record(self, kind: str, sent: int = 0, received: int = 0) -> None:
        """Add ``sent`` and ``received`` bytes of ``kind`` (one of :data:`KINDS`) to the
        totals, and to this step's ``last_*`` unless ``kind`` is ``"setup"``."""
        self.sent[kind] += int(sent)
        self.received[kind] += int(received)
        if kind != "setup":
            self.last_sent[kind] += int(sent)
            self.last_received[kind] += int(received)

    def end_step(self) -> None:
        """Close a step: add one to ``steps``."""
        self.steps += 1


def role_communicators(world_comm: MPI.Comm, roles: StanzaRoles) -> Tuple[MPI.Comm, MPI.Comm]:
    """``(Stanza's duplicate of world_comm, this rank's role communicator)``.

    Collective over ``world_comm`` the first time for each layout (every rank must ask
    for the same layouts in the same order); cached afterwards.
    """
    if "world" not in _cache:
        _cache["world"] = world_comm.Dup()
    comm = _cache["world"]
    key = (roles.size, roles.fc_workers)
    if key not in _cache:
        rank = comm.Get_rank()
        _cache[key] = comm.Split(0 if roles.role(rank) == CONV else 1, rank)
    return comm, _cache[key]


def agree_on_probe(comm: MPI.Comm, batch: int, figures, error: Optional[str]) -> Dict:
    """``fc_workers="auto"``'s agreement (collective over ``comm``): every rank's probe
    ``figures`` (``(conv_seconds, {samples: head_seconds})``) or ``error``; the first
    error in rank order is raised on every rank as a ``ValueError``, else the median of
    each figure over the ranks gives ``{"conv_s", "head_s", "fc_workers"}``, the same
    on every rank (:func:`hvdx.strategies.stanza.core_roles.auto_fc_workers`)."""
    everyone = comm.allgather((figures, error))
    error = next((e for _, e in everyone if e is not None), None)
    if error is not None:
        raise ValueError(error)
    conv_s, head_s = median_probe([f for f, _ in everyone])
    return {"conv_s": conv_s, "head_s": head_s,
            "fc_workers": auto_fc_workers(comm.Get_size(), batch, conv_s, head_s)}


class StanzaExchange:
    """This rank's Stanza messages (module docstring); one step at a time.

    Args:
        comm: Stanza's world communicator (:func:`role_communicators`).
        role_comm: this rank's role communicator.
        roles: the layout.
        stats: where bytes are counted.
    """

    def __init__(self, comm: MPI.Comm, role_comm: MPI.Comm, roles: StanzaRoles,
                 stats: StanzaStats):
        self.comm = comm
        self.role_comm = role_comm
        self.roles = roles
        self.stats = stats
        self.rank = comm.Get_rank()
        self.role = roles.role(self.rank)
        if self.role == CONV:
            self.fc_worker = roles.fc_worker(self.rank)
            self.sources: Tuple[int, ...] = ()
        else:
            self.fc_worker = None
            self.sources = roles.conv_workers(self.rank)
        # Requests in flight, each with what to check once it completes: ``None``, or
        # ``(expected bytes, what, counter kind)`` for a receive; a completed one is
        # ``None`` in both lists until :meth:`wait` clears them.
        self._requests: List[Optional[MPI.Request]] = []
        self._checks: List[Optional[Tuple[int, str, str]]] = []
        self._messages: List[MPI.Message] = []
        self._keep: List[np.ndarray] = []  # send buffers made here, alive until wait()

    # --- conv worker ------------------------------------------------------------------

    def post_gradient_receive(self, gradients: np.ndarray, loss: np.ndarray) -> range:
        """Receive this step's (or micro-batch's) activation gradients (bytes) and loss
        (float64[1]); returns the requests, for :meth:`wait_for`."""
        first = len(self._requests)
        self._irecv([gradients, MPI.BYTE], self.fc_worker, _GRADIENTS,
                    (gradients.nbytes, "activation gradients", "activation_gradients"))
        self._irecv([loss, MPI.DOUBLE], self.fc_worker, _LOSS, (8, "loss", "control"))
        return range(first, len(self._requests))

    def send_batch_size(self, samples: int) -> None:
        """With micro-batches: this step's samples, before the first micro-batch, so
        that the FC workers know the global batch before they weigh any loss."""
        count = np.array([samples], np.int64)
        self._keep.append(count)
        self._isend([count, MPI.INT64_T], self.fc_worker, _BATCH)
        self.stats.record("control", sent=8)

    def send_activations(self, activations: np.ndarray, labels: np.ndarray) -> None:
        """Send activations and labels (bytes, C-contiguous) to this rank's FC worker;
        the arrays must stay untouched until :meth:`wait` returns."""
        for values, tag in ((activations, _ACTIVATIONS), (labels, _LABELS)):
            self._isend([values, MPI.BYTE], self.fc_worker, tag)
        self.stats.record("activations", sent=activations.nbytes + labels.nbytes)

    # --- FC worker --------------------------------------------------------------------

    def probe_batches(self, sample_bytes: int) -> List[int]:
        """Each source's batch size this step, from its activation message's size.

        ``sample_bytes``: bytes of one sample's activations (agreed at the first step).
        """
        began = timeline.now() if timeline.active else 0
        pending = list(range(len(self.sources)))
        messages: List[Optional[MPI.Message]] = [None] * len(self.sources)
        sizes = [0] * len(self.sources)
        spin_until = time.perf_counter() + sparse.SPIN_S
        while pending:
            for k in list(pending):
                status = MPI.Status()
                message = self.comm.Improbe(self.sources[k], _ACTIVATIONS, status)
                if message is None:
                    continue
                count = status.Get_count(MPI.BYTE)
                if count % sample_bytes:
                    # Receive it anyway: a matched message must be received.
                    message.Recv([np.empty(count, np.uint8), MPI.BYTE])
                    raise RuntimeError(
                        f"hvdx.Stanza: rank {self.sources[k]} sent {count} bytes of "
                        f"activations, not a whole number of {sample_bytes}-byte samples")
                messages[k], sizes[k] = message, count // sample_bytes
                pending.remove(k)
            if pending:
                sparse.pause(spin_until)
        if began:
            # Until every conv worker's activations have arrived (to be received next).
            timeline.record("HVDX_STANZA_ACTIVATIONS", f"stanza {self.role}", began, 0,
                            sum(sizes) * sample_bytes)
        self._messages = messages
        return sizes

    def receive_batch_sizes(self) -> List[int]:
        """With micro-batches: each source's samples this step (:meth:`send_batch_size`)."""
        counts = [np.zeros(1, np.int64) for _ in self.sources]
        first = len(self._requests)
        for source, count in zip(self.sources, counts):
            self._irecv([count, MPI.INT64_T], source, _BATCH, (8, "batch size", "control"))
        self.wait_for(range(first, len(self._requests)))
        return [int(c[0]) for c in counts]

    def receive_activations(self, activations: Sequence[np.ndarray],
                            labels: Sequence[np.ndarray]) -> None:
        """Receive the probed activations and the labels, one byte view per source in
        source order, sized from :meth:`probe_batches`; waits for them (only: sends
        still in flight from an earlier micro-batch may go on)."""
        first = len(self._requests)
        for message, values in zip(self._messages, activations):
            # The probe fixed the size: the buffer holds exactly the message.
            self._requests.append(message.Irecv([values, MPI.BYTE]))
            self._checks.append((values.nbytes, "activations", "activations"))
        self._messages = []
        for source, values in zip(self.sources, labels):
            self._irecv([values, MPI.BYTE], source, _LABELS,
                        (values.nbytes, "labels", "activations"))
        self.wait_for(range(first, len(self._requests)))

    def send_gradients(self, gradients: Sequence[np.ndarray], losses: np.ndarray) -> None:
        """Send each source its activation gradients (bytes) and its loss
        (``losses[k]``, float64); the arrays must stay untouched until :meth:`wait`."""
        losses = np.ascontiguousarray(losses, dtype=np.float64)
        self._keep.append(losses)  # alive until the sends complete
        for k, (source, values) in enumerate(zip(self.sources, gradients)):
            self._isend([values, MPI.BYTE], source, _GRADIENTS)
            self._isend([losses[k:k + 1], MPI.DOUBLE], source, _LOSS)
            self.stats.record("activation_gradients", sent=values.nbytes)
            self.stats.record("control", sent=8)

    def global_batch(self, local: int) -> int:
        """The samples of all conv workers this step, from each FC worker's count."""
        if self.role_comm.Get_size() == 1:
            return int(local)
        total = np.zeros(1, np.int64)
        sparse.wait(self.role_comm.Iallreduce(np.array([local], np.int64), total, MPI.SUM))
        self.stats.record("control", sent=8, received=8)
        return int(total[0])

    # --- both roles -------------------------------------------------------------------

    def allreduce_sum(self, buffer: np.ndarray, kind: str) -> None:
        """Sum ``buffer`` (1-D float32/float64) in place over the role communicator."""
        if self.role_comm.Get_size() == 1 or buffer.size == 0:
            return
        began = timeline.now() if timeline.active else 0
        sparse.wait(self.role_comm.Iallreduce(MPI.IN_PLACE, [buffer, _MPI_FLOATS[buffer.dtype]],
                                              MPI.SUM))
        self.stats.record(kind, sent=buffer.nbytes, received=buffer.nbytes)
        if began:
            timeline.record(f"HVDX_STANZA_{kind.upper()}", f"stanza {self.role}", began,
                            buffer.nbytes, buffer.nbytes)

    def wait(self) -> None:
        """Complete every request posted, then check the received sizes."""
        self.wait_for(range(len(self._requests)))
        self._requests, self._checks, self._keep = [], [], []

    def wait_for(self, indices: Sequence[int]) -> None:
        """Complete the requests at ``indices`` (as :meth:`post_gradient_receive`
        returns them), then check what they received."""
        indices = [i for i in indices if self._requests[i] is not None]
        requests = [self._requests[i] for i in indices]
        checks = [self._checks[i] for i in indices]
        for i in indices:
            self._requests[i] = self._checks[i] = None
        statuses = [MPI.Status() for _ in requests]
        began = timeline.now() if timeline.active and requests else 0
        if requests:
            sparse.wait_all(requests, statuses)
        received = 0
        for status, check in zip(statuses, checks):
            if check is None:
                continue
            expected, what, kind = check
            count = status.Get_count(MPI.BYTE)
            if count != expected:
                raise RuntimeError(f"hvdx.Stanza: rank {status.Get_source()} sent {count} "
                                   f"bytes of {what}, this rank expected {expected}")
            self.stats.record(kind, received=count)
            received += count
        if began:
            # The wait for this step's messages from the other role (with none to
            # receive: for its sends to complete).
            timeline.record("HVDX_STANZA_WAIT" if received else "HVDX_STANZA_SENDS",
                            f"stanza {self.role}", began, 0, received)

    def gather_all(self, value) -> list:
        """Every rank's (small, picklable) ``value``, in rank order (collective)."""
        return self.comm.allgather(value)

    def first_error(self, message: Optional[str]) -> Optional[str]:
        """Every rank's ``message`` (``None``: no error); the first error in rank order,
        the same on every rank (collective over the world)."""
        return next((m for m in self.gather_all(message) if m is not None), None)

    # --- one-off transfers of parameters (counted as "setup") --------------------------

    def share_initial(self, part_bytes, part_size, load) -> None:
        """Start (collective): the conv workers take rank 0's features, the FC workers
        rank 0's head (rank 0 sends it to the first FC worker, which broadcasts it over
        the FC role), as ``hvd.broadcast_parameters(..., root_rank=0)`` would.

        ``part_bytes(role)``: this rank's part of ``role`` (:data:`CONV`: the features,
        :data:`FC`: the head) as host bytes; ``part_size(role)``: its size in bytes;
        ``load(role, buffer)``: writes received bytes into that part.
        """
        if self.role == CONV:
            buffer = part_bytes(CONV) if self.rank == 0 else \
                np.empty(part_size(CONV), np.uint8)
            self.broadcast_role(buffer, root=0)
            if self.rank != 0:
                load(CONV, buffer)
        fc_root = self.roles.fc_ranks[0]
        if self.rank == 0:
            self.send(part_bytes(FC), fc_root)
        if self.role == FC:
            buffer = np.empty(part_size(FC), np.uint8)
            if self.rank == fc_root:
                self.recv(buffer, 0)
            self.broadcast_role(buffer, root=0)
            load(FC, buffer)

    def agree_on_target(self, rank, error: Optional[str] = None) -> int:
        """``full_model(rank=...)`` (collective): ``rank`` as an ``int``, or the same
        ``ValueError`` on every rank if the ranks asked for different ranks, for one
        outside the job, or if some rank gave ``error`` (the first in rank order)."""
        integer = isinstance(rank, (int, np.integer)) and not isinstance(rank, bool)
        everyone = self.gather_all((int(rank) if integer else repr(rank), error))
        error = target_error([t for t, _ in everyone], self.roles.size) or \
            next((e for _, e in everyone if e is not None), None)
        if error is not None:
            raise ValueError(error)
        return int(rank)

    def assemble(self, target: int, parts) -> None:
        """Every part of the model onto rank ``target`` (collective): ``parts`` is
        ``[(role, own, to_bytes, nbytes, load), ...]``; on ``target``, its own role's
        part comes from ``own()``, the other from the first rank of that role
        (``to_bytes()`` there, ``load(buffer)`` on ``target``)."""
        roots = {CONV: self.roles.conv_ranks[0], FC: self.roles.fc_ranks[0]}
        target_role = self.roles.role(target)
        for role, own, to_bytes, nbytes, load in parts:
            if target_role == role:
                if self.rank == target:
                    own()  # its own part is current
                continue
            if self.rank == roots[role]:
                self.send(to_bytes(), target)
            elif self.rank == target:
                buffer = np.empty(nbytes(), np.uint8)
                self.recv(buffer, roots[role])
                load(buffer)

    def broadcast_role(self, buffer: np.ndarray, root: int = 0) -> None:
        """Broadcast ``buffer`` (bytes) from role rank ``root`` over the role."""
        if self.role_comm.Get_size() == 1:
            return
        self.role_comm.Bcast([buffer, MPI.BYTE], root)
        mine = self.role_comm.Get_rank() == root
        self.stats.record("setup", sent=buffer.nbytes if mine else 0,
                         received=0 if mine else buffer.nbytes)

    def send(self, buffer: np.ndarray, dest: int) -> None:
        sparse.wait(self.comm.Isend([buffer, MPI.BYTE], dest, _SETUP))
        self.stats.record("setup", sent=buffer.nbytes)

    def recv(self, buffer: np.ndarray, source: int) -> None:
        status = MPI.Status()
        request = self.comm.Irecv([buffer, MPI.BYTE], source, _SETUP)
        sparse.wait_all([request], [status])
        if status.Get_count(MPI.BYTE) != buffer.nbytes:
            raise RuntimeError(f"hvdx.Stanza: rank {source} sent "
                               f"{status.Get_count(MPI.BYTE)} bytes of parameters, this "
                               f"rank expected {buffer.nbytes}")
        self.stats.record("setup", received=buffer.nbytes)

    # --- internals --------------------------------------------------------------------

    def _irecv(self, spec: list, source: int, tag: int, check: Tuple[int, str, str]) -> None:
        self._requests.append(self.comm.Irecv(spec, source, tag))
        self._checks.append(check)

    def _isend(self, spec: list, dest: int, tag: int) -> None:
        self._requests.append(self.comm.Isend(spec, dest, tag))
        self._checks.append(None)

