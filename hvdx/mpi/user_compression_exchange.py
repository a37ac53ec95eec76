"""A registered compressor's step across ranks: one collective per step.

The algorithm is :mod:`hvdx.core.user_compression`; this module runs it around one
exchange and keeps each rank's residuals and the step counter, for the PyTorch
optimizer and the TensorFlow tape and Keras optimizer alike.

With the ``"allgather"`` communicator (:mod:`hvdx.core.compression_protocol`) the
exchange is one ``comm.allgather`` (mpi4py's pickled collective) of
``(finite, payloads)``, where ``payloads`` lists every tensor's payloads in the fixed
order. A registered compressor's payloads are arrays of any number, shape and dtype,
chosen by user code and possibly different on every rank (a random-k's values and
indices, a scale): the pickled allgather carries them with their shapes and dtypes in
one collective, where an ``Allgatherv`` of raw bytes would need a header of sizes,
dtypes and shapes written and parsed here, for the same single round. The same round
carries the NaN/Inf agreement: a rank with a non-finite gradient sends ``(False,
None)`` and compresses nothing.

With the ``"allreduce"`` communicator a step is two collectives: a small allgather of
``(finite, signature)`` (the NaN/Inf agreement, and every payload's shape and dtype,
which must be the same on every rank: a rank whose payloads differ would sum unrelated
entries, so every rank refuses the step alike, before any residual changes), then one
``MPI_Allreduce`` (sum) of every payload of every tensor, concatenated in float64.
"""

from __future__ import annotations

import sys
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from hvdx.core.counters import Counters
from hvdx.core.user_compression import (Compressor, combine, combine_summed,
                                        compress_with_feedback)
from hvdx.mpi import timeline

__all__ = ["JOINED", "UserCompressionStats", "UserCompressionSynchronizer"]

#: What a rank that has joined (``hvd.join()``) sends instead of its first bad position.
JOINED = "joined"


class UserCompressionStats(Counters):
    """Bytes this rank's exchanges sent and received, since construction, as TopK's
    counters (``total_sent``, ``total_received``, ``steps``: the exchanges)."""

    INITIAL = {"total_sent": 0, "total_received": 0, "steps": 0}
    __slots__ = tuple(INITIAL)

    def record(self, sent: int, received: int) -> None:
        """Count one exchange that sent ``sent`` and received ``received`` bytes."""
        self.total_sent += sent
        self.total_received += received
        self.steps += 1


class UserCompressionSynchronizer:
    """Residuals, step counter and the exchange of one registered compressor's run.

    Args:
        names: the tensors' keys in the fixed order (the same on every rank).
        compressor: the user's :class:`~hvdx.core.user_compression.Compressor`.
        comm: the communicator of the ranks that average.
        sum_op: ``op=Sum`` (no division by the number of ranks).
        labels: the tensors' names for messages (default ``names``).
    """

    #: The key of this state in a torch ``optimizer.state_dict()``; the attribute of a
    #: Keras optimizer that holds it (:mod:`hvdx.torch.compression_driver`,
    #: :mod:`hvdx.tensorflow.compression_driver`).
    STATE_KEY = "hvdx_user_compression"
    TENSORFLOW_ATTRIBUTE = "hvdx_compression"
    #: The entries of :meth:`state_dict` that map tensor names to arrays.
    #: What each rank keeps of its own (the words of a broadcast's note).
    RESIDUALS = "compression residuals"
    ARRAY_ENTRIES = ("residuals",)
    #: Float64 gradients are compressed in float64 (anything else in float32).
    KEEPS_FLOAT64 = True
    STATS = UserCompressionStats

    def __init__(self, names: Sequence[str], compressor: Compressor, comm,
                 sum_op: bool = False, labels: Optional[Sequence[str]] = None,
                 shapes: Optional[Sequence[Sequence[int]]] = None):
        self.names = tuple(names)
        #: Each tensor's shape (a compressor sees the gradient in its shape); ``None``:
        #: the flat arrays are compressed flat.
        self.shapes = None if shapes is None else tuple(tuple(s) for s in shapes)
        self.labels = tuple(labels) if labels is not None else self.names
        self.compressor = compressor
        self.comm = comm
        self.sum_op = sum_op
        self.step = 0
        self.residuals: Dict[str, np.ndarray] = {}
        self._reported_nonfinite = False
        self.stats = UserCompressionStats()

    @classmethod
    def for_spec(cls, names, spec, comm, sum_op=False, labels=None, shapes=None):
        """The synchronizer of a :class:`~hvdx.compression_registry.UserCompression`
        spec (the compression drivers' constructor, shared with TopK's)."""
        return cls(names, spec.compressor, comm, sum_op, labels, shapes)

    mode = property(lambda self: self.compressor.communicator,
                    doc="The communicator this run uses (``\"allgather\"`` or "
                        "``\"allreduce\"``).")

    # --- the synchronizer protocol (hvdx.core.compression_protocol) ----------------------

    def synchronize(self, sizes: Sequence[int], flat: Callable[[int], np.ndarray],
                    start_dense: Optional[Callable] = None,
                    first_bad: Optional[int] = None, force_dense: Sequence[int] = (),
                    itemsizes=None, joined=None, out=None
                    ) -> Optional[Dict[int, np.ndarray]]:
        """One step of every tensor (:data:`~hvdx.core.compression_protocol.
        SYNCHRONIZER_METHODS`): ``{position: flat result}`` (the average of every
        rank's decompressed payloads), or ``None`` when some rank's gradient was not
        finite (then no residual and no step counter changed). Collective.

        Nothing is left dense (``start_dense`` is called with no tensor), so a sparse
        gradient (``force_dense``) is compressed densified; ``flat`` is called only when
        this rank's gradients are finite (``first_bad`` is ``None`` or ``len(sizes)``).
        ``itemsizes``, ``joined`` and ``out`` are TopK's and are not used here.
        """
        if len(sizes) != len(self.names):
            raise ValueError(f"got {len(sizes)} gradients for {len(self.names)} tensors")
        if start_dense is not None:
            wait = start_dense([])
            if wait is not None:
                wait()
        bad = None if first_bad is None or first_bad >= len(sizes) else first_bad
        arrays = None
        if bad is None:
            arrays = [self._shaped(p, flat(p)) for p in range(len(sizes))]
        results = self._step(bad, arrays)
        if results is None:
            return None
        return {p: r.reshape(-1) for p, r in enumerate(results)}

    def synchronize_arrays(self, arrays: Sequence[np.ndarray]
                           ) -> Optional[List[np.ndarray]]:
        """:meth:`synchronize` on whole arrays (numpy callers and tests): every
        tensor's result in its array's shape, or ``None`` (a gradient was not finite
        on some rank). Collective."""
        if len(arrays) != len(self.names):
            raise ValueError(f"got {len(arrays)} gradients for {len(self.names)} tensors")
        first_bad = next((i for i, a in enumerate(arrays) if not np.all(np.isfinite(a))),
                         None)
        return self._step(first_bad, None if first_bad is not None else list(arrays))

    def _shaped(self, position: int, array: np.ndarray) -> np.ndarray:
        return array if self.shapes is None else array.reshape(self.shapes[position])

    def _step(self, first_bad: Optional[int], arrays) -> Optional[List[np.ndarray]]:
        """Error feedback, the exchange and the average (module docstring); ``arrays``
        is ``None`` where ``first_bad`` names this rank's first non-finite tensor."""
        sent, fresh = None, {}
        if first_bad is None:
            sent = []
            for name, array in zip(self.names, arrays):
                payloads, fresh[name] = compress_with_feedback(
                    self.compressor, array, self.residuals.get(name), self.step, name)
                sent.append(payloads)
        if self.compressor.communicator == "allreduce":
            return self._summed_step(first_bad, sent, fresh, arrays)
        everyone = self._allgather((first_bad, sent))
        if self._any_bad(everyone):
            return None
        self._keep(fresh)
        present = [payloads for i, payloads in everyone if i != JOINED]
        out = [combine(self.compressor, [payloads[t] for payloads in present],
                       array.shape, array.dtype, self.step, name, not self.sum_op,
                       ranks=len(everyone))
               for t, (name, array) in enumerate(zip(self.names, arrays))]
        self.step += 1
        return out

    def _keep(self, fresh: Dict[str, Optional[np.ndarray]]) -> None:
        """Store the step's new residuals (none with the memory ``"none"``)."""
        self.residuals.update({n: r for n, r in fresh.items() if r is not None})

    def _summed_step(self, first_bad, sent, fresh, arrays) -> Optional[List[np.ndarray]]:
        """The ``"allreduce"`` communicator's step (module docstring)."""
        everyone = self.comm.allgather((first_bad, None if sent is None else
                                        _signature(sent)))
        if self._any_bad(everyone):
            return None
        signature = self._agreed_signature(everyone)
        summed = self._allreduce(sent, signature)
        self._keep(fresh)
        out = [combine_summed(self.compressor, summed[t], array.shape, array.dtype,
                              self.step, name, not self.sum_op, ranks=len(everyone))
               for t, (name, array) in enumerate(zip(self.names, arrays))]
        self.step += 1
        return out

    def _agreed_signature(self, everyone):
        """The payloads' shapes and dtypes, the same on every rank that sent any; else
        ``ValueError``, the same on every rank."""
        signatures = [(r, sig) for r, (i, sig) in enumerate(everyone) if i != JOINED]
        first_rank, first = signatures[0]
        for rank, sig in signatures[1:]:
            if sig != first:
                t = next(t for t, (a, b) in enumerate(zip(sig, first)) if a != b)
                raise ValueError(
                    f"{type(self.compressor).__qualname__}.compress: the payloads of "
                    f"'{self.labels[t]}' are {list(sig[t])} on rank {rank} and "
                    f"{list(first[t])} on rank {first_rank}; the communicator "
                    "'allreduce' sums payloads entry by entry, so every rank must send "
                    "the same shapes and dtypes. Declare communicator = 'allgather' for "
                    "payloads that differ between ranks")
        return first

    def _allreduce(self, sent, signature):
        """One ``MPI_Allreduce`` (sum) of every payload (``None``: a joined rank's
        zeros), in float64; returns each tensor's summed payloads in their dtypes."""
        from mpi4py import MPI

        sizes = [int(np.prod(shape)) for tensor in signature for shape, _ in tensor]
        flat = np.zeros(sum(sizes), np.float64) if sent is None else (
            np.concatenate([np.asarray(p, np.float64).ravel() for tensor in sent
                            for p in tensor]) if sizes else np.zeros(0))
        total = np.empty_like(flat)
        began = timeline.now() if timeline.active else 0
        self.comm.Allreduce(flat, total, op=MPI.SUM)
        n = self.comm.Get_size()
        # A ring allreduce's share: each rank sends and receives 2 (n - 1) / n buffers.
        moved = int(2 * (n - 1) * flat.nbytes // n)
        self.stats.record(moved, moved)
        if began:
            timeline.record("HVDX_COMPRESSION_ALLREDUCE",
                            f"compression {type(self.compressor).__name__}", began,
                            moved, moved)
        out, offset = [], 0
        for tensor in signature:
            payloads = []
            for shape, dtype in tensor:
                size = int(np.prod(shape))
                payloads.append(total[offset:offset + size].reshape(shape).astype(dtype))
                offset += size
            out.append(payloads)
        return out

    def joined_step(self, sizes=None, agree_first: bool = False) -> bool:
        """One step of the other ranks, taken by a rank that has joined (``hvd.join()``):
        it sends nothing and counts as zeros in their average, as in Horovod; its
        residuals stay, its step counter follows theirs. ``True`` once every rank has
        joined (then nothing else happens). Collective. (``sizes`` and
        ``agree_first`` are the protocol's: this synchronizer agrees on NaN/Inf in its
        exchange, never before it.)"""
        if self.compressor.communicator == "allreduce":
            everyone = self.comm.allgather((JOINED, None))
            if all(i == JOINED for i, _ in everyone):
                return True
            if not self._any_bad(everyone):
                self._allreduce(None, self._agreed_signature(everyone))
                self.step += 1
            return False
        everyone = self._allgather((JOINED, None))
        if all(i == JOINED for i, _ in everyone):
            return True
        if not self._any_bad(everyone):
            self.step += 1
        return False

    def _allgather(self, mine):
        """The step's one collective, its bytes counted (:attr:`stats`) and, while a
        timeline records, a span there (:mod:`hvdx.mpi.timeline`). The bytes are the
        payloads' array bytes: this rank's go to each of the others, and each other
        rank's come here (pickling's few bytes of framing are not counted)."""
        began = timeline.now() if timeline.active else 0
        everyone = self.comm.allgather(mine)
        rank = self.comm.Get_rank()
        nbytes = [_payload_bytes(payloads) for _, payloads in everyone]
        sent, received = nbytes[rank] * (len(everyone) - 1), sum(nbytes) - nbytes[rank]
        self.stats.record(sent, received)
        if began:
            timeline.record("HVDX_COMPRESSION_ALLGATHER",
                            f"compression {type(self.compressor).__name__}", began,
                            sent, received)
        return everyone

    def _any_bad(self, everyone) -> bool:
        bad = [(r, i) for r, (i, _) in enumerate(everyone) if i not in (None, JOINED)]
        if bad:
            self._report(bad)
        return bool(bad)

    def _report(self, bad) -> None:
        if self.comm.Get_rank() == 0 and not self._reported_nonfinite:
            rank, i = bad[0]
            print(f"[hvdx] compression: the gradient of '{self.labels[i]}' has NaN or Inf "
                  f"values on rank {rank}; every rank's gradients are set to NaN and the "
                  "step leaves the residuals alone, as Horovod's allreduce passes NaN/Inf "
                  "on to a loss scaler; reported once", file=sys.stderr, flush=True)
        self._reported_nonfinite = True

    def state_dict(self) -> dict:
        """``{"step", "rank", "residuals": {name: array}}`` (copies)."""
        return {"step": self.step, "rank": self.comm.Get_rank(),
                "residuals": {n: r.copy() for n, r in self.residuals.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output, checked first (a refused one changes
        nothing): residuals of these tensors only, saved by this rank."""
        self.check_state_dict(state)
        self.step = int(state["step"])
        self.residuals = {n: np.array(r, copy=True) for n, r in state["residuals"].items()}

    def check_state_dict(self, state: dict) -> None:
        """Raise what :meth:`load_state_dict` would raise, changing nothing."""
        unknown = sorted(set(state["residuals"]) - set(self.names))
        if unknown:
            raise ValueError(f"the checkpoint's compression residuals name tensors this "
                             f"optimizer does not have: {unknown[:5]}")
        rank = state.get("rank")
        if rank is not None and int(rank) != self.comm.Get_rank() and state["residuals"]:
            raise ValueError(
                f"this checkpoint holds the compression residuals of rank {int(rank)} and "
                f"this is rank {self.comm.Get_rank()}: residuals belong to the rank that "
                "accumulated them. Save a checkpoint on every rank, one file per rank, "
                "and load each rank's own, or use hvd.save_checkpoint / "
                "hvd.load_checkpoint, which keep every rank's state in one file")

    @staticmethod
    def empty_state() -> dict:
        """The state of a run that has taken no step."""
        return {"step": 0, "rank": None, "residuals": {}}

    @staticmethod
    def check_saved_rank(state: dict, rank: int) -> None:
        """Refuse a restored state that holds another rank's residuals."""
        saved = state.get("rank")
        if saved is not None and int(saved) != rank and state["residuals"]:
            raise ValueError(f"this checkpoint holds the compression residuals of rank "
                             f"{int(saved)} and this is rank {rank}: residuals belong to "
                             "the rank that accumulated them; save and load one "
                             "checkpoint per rank")

    def shared_state(self) -> dict:
        """What every rank must hold alike: the step counter (a compressor's seeds may
        depend on it)."""
        return {"step": self.step}

    def load_shared_state(self, state: dict) -> None:
        self.step = int(state["step"])

    def holds_own_state(self) -> bool:
        """Whether this rank holds state of its own that a broadcast does not copy."""
        return bool(self.residuals)

    def overlaps_dense(self) -> bool:
        """Never: every step is this synchronizer's own exchange."""
        return False


def _signature(sent) -> tuple:
    """Every payload's ``(shape, dtype)`` of every tensor, in order."""
    return tuple(tuple((tuple(np.shape(p)), np.asarray(p).dtype.str) for p in tensor)
                 for tensor in sent)


def _payload_bytes(payloads) -> int:
    """The array bytes of one rank's payloads (``None`` when it sent none)."""
    if not payloads:
        return 0
    return sum(int(np.asarray(p).nbytes) for tensor in payloads for p in tensor)
