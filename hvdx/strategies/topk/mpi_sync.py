"""One step of bidirectional TopK with error feedback over mpi4py, shared by the adapters.

Zou, De Sterck & Liu, "Downlink Compression Improves TopK Sparsification", arXiv
2209.15203. The math (selection, residuals, aggregation, downlink) is
:mod:`hvdx.strategies.topk.core_bidirectional`; the pair collectives are :mod:`hvdx.mpi.sparse`.
:class:`TopKSynchronizer` holds everything that is neither torch nor TensorFlow: the
residual memories, the step counter, the byte counters, the NaN/Inf agreement, the
dense/compressed split and the fused exchange. The framework adapters
(:mod:`hvdx.strategies.topk.torch.optimizer`, :mod:`hvdx.strategies.topk.tensorflow.adapters`) only
turn their gradients into flat float32 numpy arrays, run Horovod's allreduce for the tensors the
synchronizer leaves dense, and write the updates back.

One :meth:`TopKSynchronizer.synchronize` call, with the tensors in a fixed order (the
same on every rank):

1. agree on NaN/Inf: each rank names its first non-finite tensor and one tiny allgather
   combines them. If any rank has one, the step is skipped on every rank alike: nothing
   is exchanged, no residual, step counter, autotune timing or byte counter changes, and
   :meth:`~TopKSynchronizer.synchronize` returns ``None`` so that the adapter makes
   every gradient NaN. Horovod's allreduce would carry the inf/NaN into every rank's
   average; a loss scaler (``torch.amp.GradScaler``, Keras ``LossScaleOptimizer``)
   relies on that to skip the step and lower its scale on every rank together. A bad
   gradient must not enter the residuals, where error feedback would resend it forever;
   rank 0 reports the first such step on stderr;
2. split: tensors with fewer than ``min_size`` entries, tensors the adapter marks
   (sparse gradients), and every tensor during ``warmup_steps`` stay dense; the adapter's
   ``start_dense`` callback starts Horovod's allreduce of those before the sparse
   exchange, so that the two overlap. With ``small_tensors="in_topk_step"`` the tensors
   below ``min_size`` of a compressed step are averaged here instead, by one
   non-blocking MPI allreduce of their float32 concatenation that also overlaps the
   exchange, and Horovod carries nothing during the step;
3. uplink, per tensor: :func:`~hvdx.strategies.topk.core_bidirectional.uplink` with the worker
   residual (each tensor keeps its own ``k``). With ``selection="global"`` the compressed
   tensors are first concatenated, in the fixed order, into one vector that steps 3 and 4
   treat as a single tensor (one ``k``, one residual, shards of the whole vector), and
   its update is cut back into the tensors afterwards;
4. exchange all tensors' pairs at once in one flat index space (tensor ``t`` shifted by
   its offset in the concatenation): ``gathered`` (one Allgatherv; every rank aggregates
   and runs the downlink of each tensor with its replica of the server residual) or
   ``sharded`` (each tensor keeps its own shards; one Alltoallv carries all tensors'
   pieces to the shard owners, which aggregate their shards, run the downlink with their
   shard of the server residual, and one Allgatherv returns the results). A step costs a
   fixed number of collectives whatever the number of tensors, and the result is bitwise
   the per-tensor one. ``m`` is the average over ranks (``op=Sum`` multiplies by the
   size). With ``error_feedback=False`` no residual is kept (plain TopK);
5. wait for the dense allreduces, count the step.

With ``autotune_steps=N`` the N steps after ``warmup_steps`` are dense (step 2 keeps
every tensor dense) and each also runs steps 3 and 4 as a timed dry run on the same
gradients, with empty residuals that are thrown away; after the N-th, one allgather of
every rank's timings gives every rank the same decision: TopK from then on if its
exchange was faster than the dense allreduce on the slowest rank (medians), else
dense for good (:meth:`TopKSynchronizer.decide`). Once dense for good, a step is
Horovod's: no NaN/Inf agreement (no residual is at stake), and an adapter that can
start the allreduces during the backward pass does so and only counts the step
(:meth:`TopKSynchronizer.dense_step`).

The updates come back as flat float32 arrays; the adapter writes them (and the dense
results) where its optimizer reads gradients.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from hvdx.core.sharding import shard_bounds, split_by_shard
from hvdx.mpi import timeline
from hvdx.mpi.sparse import (allgather_int, allgatherv_floats, allgatherv_pairs,
                              alltoallv_pairs, wait)
from hvdx.strategies.topk.core_bidirectional import (aggregate, compensate_server, downlink,
                                                     downlink_from, select, selection_rng, to_dense,
                                                     uplink)
from hvdx.strategies.topk.core_error_feedback import ResidualMemory
from hvdx.strategies.topk.core_global import agree_shares
from hvdx.strategies.topk.core_sparsity_warmup import config_at
from hvdx.strategies.topk.spec import TopKCompression

__all__ = ["JOINED", "TopKStats", "TopKSynchronizer", "check_saved_rank", "first_nonfinite"]

#: The most entries one fused exchange covers: its indices must fit in int32.
_GROUP_LIMIT = 2 ** 31

#: The residuals' key of the concatenated vector under ``selection="global"``.
GLOBAL_NAME = "hvdx.global"

#: What a rank that has joined (``hvd.join()``) gives the NaN/Inf agreement instead of
#: its first bad position (:meth:`TopKSynchronizer.joined_step`).
JOINED = -1

#: ``start_dense(positions)`` returns a callable that waits for those allreduces (or None).
StartDense = Callable[[List[int]], Optional[Callable[[], None]]]
#: ``joined(positions)``: those tensors' flat arrays one after another as one array, or None.
Joined = Callable[[List[int]], Optional[np.ndarray]]
#: ``out(position)``: where to write that tensor's update (a flat float32 array), or None.
Out = Callable[[int], Optional[np.ndarray]]


class _Sparse(NamedTuple):
    """An update that is zero outside ``indices`` (ascending), before it is written."""

    indices: np.ndarray
    values: np.ndarray
    size: int


def _write(update, out: Optional[np.ndarray]) -> np.ndarray:
    """The dense update: in ``out`` when given (zeroed, then the entries set; no dense
    temporary to allocate and copy), else a new array."""
    if isinstance(update, _Sparse):
        if out is None:
            return to_dense(update.indices, update.values, update.size)
        out.fill(0)
        out[update.indices] = update.values
        return out
    if out is None:
        return update
    np.copyto(out, update)
    return out


class TopKStats:
    """Bytes this rank handed to MPI (``sent``) and got from it (``received``).

    ``last_*``: the last step; ``total_*``: since construction. Sparse exchanges count
    the buffers given to mpi4py (pairs and counts); Horovod's dense allreduce is counted
    as a ring allreduce, ``2 (P - 1) / P`` times the tensor's bytes each way.

    ``phases`` splits the totals by the path the bytes took: ``"up"`` (the workers'
    pairs: the allgather of gathered mode, the alltoall of sharded mode), ``"down"``
    (sharded mode's allgather of the selected shards; gathered mode computes the
    downlink on every rank and sends nothing), ``"agree"`` (sharded mode's agreement on
    each shard's share of the global downlink TopK,
    :mod:`hvdx.strategies.topk.core_global`) and ``"dense"`` (Horovod's allreduce of the
    small tensors), each ``[sent, received]``; the dry runs of ``autotune_steps``
    travel too and are counted.

    ``autotune``: with ``autotune_steps``, after the decision, the medians on the
    slowest rank (``"dense_s"``, ``"topk_s"``, seconds per step) and ``"choice"``
    (``"topk"`` or ``"dense"``); ``None`` before.
    """

    __slots__ = ("last_sent", "last_received", "total_sent", "total_received",
                 "last_sparse_tensors", "last_dense_tensors", "steps", "phases", "autotune")

    def __init__(self):
        self.last_sent = self.last_received = 0.0
        self.total_sent = self.total_received = 0.0
        self.last_sparse_tensors = self.last_dense_tensors = 0
        self.steps = 0
        self.phases = {"up": [0.0, 0.0], "down": [0.0, 0.0], "agree": [0.0, 0.0],
                       "dense": [0.0, 0.0]}
        self.autotune: Optional[Dict] = None

    def _begin(self):
        self.last_sent = self.last_received = 0.0
        self.last_sparse_tensors = self.last_dense_tensors = 0

    def record(self, sent, received, phase):
        """Add ``sent`` and ``received`` bytes to ``phase``'s counters in :attr:`phases`
        (``"up"``, ``"down"``, ``"agree"`` or ``"dense"``), to this step's ``last_*``
        and to the run's ``total_*``."""
        self.phases[phase][0] += sent
        self.phases[phase][1] += received
        self.last_sent += sent
        self.last_received += received
        self.total_sent += sent
        self.total_received += received

    def as_dict(self) -> Dict[str, float]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self):
        return f"TopKStats({self.as_dict()})"


def first_nonfinite(arrays: Sequence[np.ndarray]) -> int:
    """The position of the first array holding NaN or Inf, ``len(arrays)`` if none."""
    for position, a in enumerate(arrays):
        if not np.isfinite(a).all():
            return position
    return len(arrays)


def check_saved_rank(state, rank: int) -> None:
    """Refuse TopK state holding another rank's residuals (``ValueError`` naming both)."""
    saved = state.get("rank")
    if saved is not None and int(saved) != rank and (state["worker"] or state["server"]):
        raise ValueError(
            f"this TopK checkpoint holds the residuals of rank {int(saved)} and this is "
            f"rank {rank}: TopK's residuals belong to the rank that accumulated them. "
            "Save a checkpoint on every rank, one file per rank (e.g. named after "
            "hvd.rank()), and load each rank's own, or use hvd.save_checkpoint / "
            "hvd.load_checkpoint, which keep every rank's state in one file")


class TopKSynchronizer:
    """Residuals, counters and the fused exchange of one TopK run (steps 1 to 5 above).

    Args:
        names: one unique name per tensor, in the fixed order every rank uses; they key
            the residuals and name a tensor in errors.
        compression: the :class:`~hvdx.strategies.topk.spec.TopKCompression` spec.
        comm: an mpi4py communicator with exactly the ranks of the Horovod process set.
        sum_op: ``True`` for ``op=Sum`` (the update is multiplied by the size),
            ``False`` for ``op=Average``.
        labels: what errors call each tensor (default: its name). TensorFlow keys the
            residuals by position (``variable[i]``: Keras names change between model
            instances) and names the variables in errors.

    Attributes:
        worker, server: the :class:`~hvdx.strategies.topk.core_error_feedback.ResidualMemory` of
            this rank's uplink residuals and of its replica (gathered) or shard (sharded) of
            the server residuals.
        step: steps taken (it seeds the sampled threshold and ends the warm-up).
        stats: :class:`TopKStats`.
        comm: the communicator; assignable (tests wrap it to count collectives).
    """

    def __init__(self, names: Sequence[str], compression: TopKCompression, comm,
                 sum_op: bool = False, labels: Optional[Sequence[str]] = None):
        names = [str(n) for n in names]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"parameter names must be unique, found duplicates: {duplicates}")
        self.names = tuple(names)
        self.labels = self.names if labels is None else tuple(str(n) for n in labels)
        if len(self.labels) != len(self.names):
            raise ValueError(f"got {len(self.labels)} labels for {len(self.names)} names")
        self.compression = compression
        self.comm = comm
        self.size = comm.Get_size()
        self.rank = comm.Get_rank()
        self.mode = compression.resolve_mode(self.size)
        self.sum_op = bool(sum_op)
        self.selection = compression.selection
        keys = (GLOBAL_NAME,) if self.selection == "global" else self.names
        self.worker = ResidualMemory(keys)
        self.server = ResidualMemory(keys)
        #: ``selection="global"``: the ``(name, size)`` of the concatenated tensors, fixed
        #: at the first compressed step (it keys the checkpoint's residuals).
        self.layout: Optional[Tuple[Tuple[str, int], ...]] = None
        self.step = 0
        self.stats = TopKStats()
        #: ``autotune_steps``: this rank's ``(dense, topk)`` seconds per tuning step, and
        #: the decision (``None`` before it, ``"topk"`` or ``"dense"`` after).
        self.timings: List[Tuple[float, float]] = []
        self.choice: Optional[str] = None
        self._timing_target = False  # inside an autotune dry run (see _config)
        #: Whether the last NaN/Inf agreement found every rank joined (joined_step).
        self.everyone_joined = False
        #: ``{position: indices}``: the entries of each compressed tensor this rank sent
        #: in the last step (DGC's momentum factor masking zeroes them).
        self.last_sent: Dict[int, np.ndarray] = {}
        self._global_buffer: Optional[np.ndarray] = None
        self._reported_nonfinite = False  # rank 0 reports the first skipped step only

    # --- one step ------------------------------------------------------------------------

    def synchronize(self, sizes: Sequence[int], flat: Callable[[int], np.ndarray],
                    start_dense: StartDense, first_bad: Optional[int],
                    force_dense: Sequence[int] = (),
                    itemsizes: Optional[Sequence[int]] = None,
                    joined: Optional[Joined] = None,
                    out: Optional[Out] = None) -> Optional[Dict[int, np.ndarray]]:
        """Run steps 1 to 5 for every tensor.

        Args:
            sizes: the number of entries of each tensor, in the order of ``names``.
            flat: ``position -> flat float32 numpy array`` of that tensor's gradient;
                called once per compressed tensor, after the NaN/Inf agreement (never
                in a skipped step).
            start_dense: ``positions -> wait`` starts the adapter's dense allreduce
                (Horovod's) of those tensors and returns a callable that waits for it,
                or ``None`` when it already finished. Called on every rank, also with an
                empty list, so that it may run collectives of its own.
            first_bad: this rank's first tensor with NaN or Inf (``len(sizes)`` if none);
                ``None`` when the adapter ran :meth:`check_finite` itself this step and
                every rank was finite (it keeps state of its own that a bad gradient
                must not reach first).
            force_dense: positions that must stay dense (sparse gradients).
            itemsizes: bytes per entry of each tensor, for the dense byte count
                (default 4).
            joined: ``positions -> array``: the flat float32 arrays of those positions
                one after another as one array (a view, when the adapter keeps them in
                one buffer), or ``None``; ``selection="global"`` then reads it instead
                of concatenating ``flat`` of each.
            out: ``position -> array``: a flat float32 array to write that tensor's
                update into (the gradient's own memory, when the adapter can offer it),
                or ``None``. Written only once every exchange of the step has finished.

        Returns:
            ``{position: update}`` for the compressed tensors (and, with
            ``small_tensors="in_topk_step"``, the small ones hvdx averaged): flat float32
            arrays, the arrays ``out`` gave where it gave one. ``None`` on every rank
            when a gradient has NaN or Inf on some rank (step 1): the step is skipped
            before any collective but the agreement, nothing in this object changed,
            ``start_dense``, ``flat`` and ``out`` were not called, and the adapter makes
            every gradient non-finite (NaN), as Horovod's allreduce would have.
        """
        if len(sizes) != len(self.names):
            raise ValueError(f"got {len(sizes)} tensors for {len(self.names)} names")
        if first_bad is not None and not self.overlaps_dense() \
                and not self.check_finite(first_bad):
            return None
        stats = self.stats
        stats._begin()
        dense, sparse = self.split(sizes, force_dense)
        small = self._averaged_here(dense, sparse, force_dense)
        if small:
            dense = sorted(set(dense) - set(small))  # what stays with Horovod
        self.last_sent = {}
        tuning = self.tuning()
        if tuning:
            # The dry run first: the dense allreduce may work in place on the gradients.
            would_be = self.compressible(sizes, force_dense)
            topk_s = self._dry_run([(p, sizes[p]) for p in would_be], flat, joined)
        started = time.perf_counter()
        wait = start_dense(dense)
        if tuning:
            if wait is not None:
                wait()
                wait = None
            self.timings.append((time.perf_counter() - started, topk_s))
        self._count_dense(dense, sizes, itemsizes)
        finish_small = self._start_small([(p, sizes[p]) for p in small], flat)
        try:
            updates = self._exchange_all([(p, sizes[p]) for p in sparse], flat, joined)
        finally:
            # Every rank started the allreduce: complete it even if the exchange raised,
            # so that no request is left pending on the communicator.
            averaged = finish_small() if finish_small is not None else {}
        updates.update(averaged)
        if wait is not None:
            wait()
        self._count_step(len(sparse), len(dense) + len(small))
        if tuning and not self.tuning():
            self.decide()
        return {p: _write(u, None if out is None else out(p)) for p, u in updates.items()}

    def joined_step(self, sizes: Sequence[int], agree_first: bool = False) -> bool:
        """The step of the others, taken by a rank that has joined (``hvd.join()``: it
        ran out of data), with zero gradients; ``True`` once every rank has joined.

        Horovod answers the others' allreduces for a joined rank with zeros, and so does
        this for hvdx's own collectives, which Horovod cannot answer:

        1. the NaN/Inf agreement with :data:`JOINED` (``agree_first``: the adapter runs
           it before :meth:`synchronize`, as it does for its own steps); when every rank
           has joined, nothing else runs and the answer is ``True``;
        2. otherwise :meth:`synchronize` on zero gradients, with an empty worker memory
           in place of this rank's residuals, which sit the step out unchanged: its
           pairs are zeros and add nothing, and the average still divides by every rank,
           as Horovod's average with a joined rank does. The server side runs in full
           (the replica in ``gathered`` mode, the shard in ``sharded`` mode), and the step
           counter advances, so that this rank's state stays the others' and training
           may go on after the join;
        3. Horovod's own allreduces (the tensors left dense) are Horovod's join's to
           answer: none is started here.

        Call it only while :meth:`overlaps_dense` is false (otherwise hvdx runs no
        collective of its own and Horovod's join answers everything).
        """
        def zeros(position):
            return np.zeros(sizes[position], np.float32)

        worker, self.worker = self.worker, ResidualMemory(self.worker.names)
        try:
            if agree_first and not self.check_finite(JOINED):
                return self.everyone_joined
            updates = self.synchronize(sizes, zeros, lambda positions: None,
                                       None if agree_first else JOINED)
            return updates is None and self.everyone_joined
        finally:
            self.worker = worker

    def dense_step(self, sizes: Sequence[int],
                   itemsizes: Optional[Sequence[int]] = None) -> None:
        """Count a step that the adapter ran wholly on Horovod's allreduce, started while
        the gradients were being computed, as Horovod's own optimizer does.

        Only after autotune chose ``"dense"`` (:meth:`overlaps_dense`): no tensor is
        compressed any more, so no residual is at stake and hvdx adds nothing of its own
        to Horovod's step, not even the NaN/Inf agreement (Horovod has none either).
        """
        if not self.overlaps_dense():
            raise RuntimeError("dense_step is for runs whose autotune chose dense")
        self.stats._begin()
        self._count_dense(range(len(sizes)), sizes, itemsizes)
        self._count_step(0, len(sizes))

    def overlaps_dense(self) -> bool:
        """Whether every step from now on is Horovod's allreduce of every tensor (autotune
        chose dense), which adapters may then start during the backward pass."""
        return self.choice == "dense"

    def tuning(self) -> bool:
        """Whether this step is one of the ``autotune_steps`` (dense, with a dry run)."""
        c = self.compression
        return self.choice is None and \
            c.warmup_steps <= self.step < c.warmup_steps + c.autotune_steps

    def decide(self) -> str:
        """The autotune decision, the same on every rank. Collective.

        1. one allgather of every rank's ``(dense, topk)`` timings;
        2. per rank the median of each; per method the slowest rank's median (a step
           waits for the slowest rank);
        3. ``"topk"`` if TopK's is below the dense allreduce's, else ``"dense"``; rank 0
           logs the figures and the choice.
        """
        everyone = self.comm.allgather([tuple(t) for t in self.timings])
        medians = [np.median(np.asarray(t, dtype=np.float64), axis=0) for t in everyone if t]
        if not medians:  # resumed past the tuning steps without their timings
            self.choice = "topk"
            return self.choice
        dense_s, topk_s = (float(x) for x in np.max(np.stack(medians), axis=0))
        self.choice = "topk" if topk_s < dense_s else "dense"
        self.stats.autotune = {"dense_s": dense_s, "topk_s": topk_s, "choice": self.choice}
        if self.rank == 0:
            then = "compressing from now on" if self.choice == "topk" else \
                "staying dense (Horovod's allreduce) for the rest of the run"
            print(f"[hvdx] TopK autotune over {len(self.timings)} steps: dense allreduce "
                  f"{1e3 * dense_s:.1f} ms, TopK exchange {1e3 * topk_s:.1f} ms per step "
                  f"on the slowest rank; {then}", file=sys.stderr, flush=True)
        return self.choice

    def check_finite(self, first_bad: int) -> bool:
        """Step 1: whether every rank's gradients are finite, the same answer on every rank.

        Collective: every rank calls it once per step, with ``len(names)`` when all its
        gradients are finite, or :data:`JOINED` when it has joined (:meth:`joined_step`):
        when every rank has, the answer is ``False`` and :attr:`everyone_joined` is set.

        1. one allgather of every rank's first bad position;
        2. ``True`` if no rank named one;
        3. else ``False`` on every rank, and the caller skips the step and makes every
           gradient non-finite (what a loss scaler expects of Horovod's allreduce).
           Rank 0 says so on stderr the first time only: a loss scaler meets such steps
           routinely while its scale settles, and a line per step would bury the log.
        """
        began = timeline.now() if timeline.active else 0
        everyone = [int(i) for i in allgather_int(self.comm, int(first_bad))]
        if began:
            others = 8 * (self.size - 1)
            timeline.record("HVDX_TOPK_FINITE_CHECK", self._row(), began, others, others)
        self.everyone_joined = all(i == JOINED for i in everyone)
        if self.everyone_joined:
            return False  # nothing left to synchronize (joined_step)
        worst = min([i for i in everyone if i != JOINED], default=len(self.names))
        if worst >= len(self.names):
            return True
        if self.rank == 0 and not self._reported_nonfinite:
            ranks = [r for r, i in enumerate(everyone) if i == worst]
            print(f"[hvdx] TopK: the gradient of '{self.labels[worst]}' has NaN or Inf "
                  f"values on rank(s) {ranks}; every rank's gradients are set to NaN and "
                  "TopK skips the step (no residual changes), as Horovod's allreduce "
                  "passes NaN/Inf on to a loss scaler; reported once",
                  file=sys.stderr, flush=True)
        self._reported_nonfinite = True
        return False

    def split(self, sizes: Sequence[int], force_dense: Sequence[int] = ()
              ) -> Tuple[List[int], List[int]]:
        """Step 2: ``(dense positions, compressed positions)``, each in the fixed order."""
        compression = self.compression
        warm = self.step < compression.warmup_steps or self.tuning() or self.overlaps_dense()
        sparse = [] if warm else self.compressible(sizes, force_dense)
        chosen = set(sparse)
        return [p for p in range(len(sizes)) if p not in chosen], sparse

    def compressible(self, sizes: Sequence[int], force_dense: Sequence[int] = ()
                     ) -> List[int]:
        """The positions TopK takes outside any warm-up: not forced dense, not below
        ``min_size``."""
        forced = set(force_dense)
        return [p for p, d in enumerate(sizes)
                if p not in forced and d >= self.compression.min_size]

    # --- state ---------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The step, the layout the server residuals belong to, and copies of the residuals."""
        return {"step": self.step, "mode": self.mode, "size": self.size, "rank": self.rank,
                "selection": self.selection, "choice": self.choice,
                "timings": [list(t) for t in self.timings],
                "layout": None if self.layout is None else [list(e) for e in self.layout],
                "worker": self.worker.state_dict(), "server": self.server.state_dict()}

    def check_state_dict(self, state) -> None:
        """Raise what :meth:`load_state_dict` would raise, changing nothing.

        Adapters call it before loading anything else, so that a refused checkpoint
        leaves the wrapped optimizer as it was too.

        Raises:
            ValueError: the residuals were saved by another rank (naming both), the
                server residuals for another mode or number of ranks (a shard means
                nothing in another layout), or the residuals for another ``selection``.
        """
        check_saved_rank(state, self.rank)
        if state["server"] and (state["mode"], state["size"]) != (self.mode, self.size):
            raise ValueError(
                f"the checkpoint's TopK server residuals are for mode={state['mode']} on "
                f"{state['size']} ranks, this optimizer runs mode={self.mode} on {self.size}")
        selection = state.get("selection", "layerwise")
        if selection != self.selection and (state["worker"] or state["server"]):
            raise ValueError(
                f"the checkpoint's TopK residuals are for selection={selection!r}, this "
                f"optimizer runs selection={self.selection!r}")

    def load_state_dict(self, state) -> None:
        """Restore :meth:`state_dict`'s content (residuals as numpy arrays).

        Raises:
            ValueError: see :meth:`check_state_dict`; nothing is changed.
        """
        self.check_state_dict(state)
        layout = state.get("layout")
        if layout is not None:
            layout = tuple((str(n), int(d)) for n, d in layout)
        self.worker.load_state_dict(state["worker"])
        self.server.load_state_dict(state["server"])
        self.layout = layout
        self.step = int(state["step"])
        self.choice = state.get("choice")
        self.timings = [(float(a), float(b)) for a, b in state.get("timings", [])]

    def shared_state(self) -> dict:
        """What every rank must hold alike, as a broadcast from one rank gives it.

        The step (it seeds the sampled threshold and ends the warm-up and the autotune
        steps: ranks at different steps would run different collectives), autotune's
        choice, the global layout, and in ``gathered`` mode the server residuals (every
        rank runs the downlink with its replica: replicas that differ give the ranks
        different updates). Not the worker residuals, nor a ``sharded`` server's shard:
        those are each rank's own.
        """
        return {"step": self.step, "choice": self.choice, "mode": self.mode,
                "size": self.size, "selection": self.selection,
                "layout": None if self.layout is None else [list(e) for e in self.layout],
                "server": self.server.state_dict() if self.mode == "gathered" else None}

    def load_shared_state(self, state) -> None:
        """Take :meth:`shared_state` from another rank (after a broadcast).

        Raises:
            ValueError: it comes from a run of another mode, size or selection;
                nothing is changed.
        """
        theirs = (state["mode"], state["size"], state["selection"])
        if theirs != (self.mode, self.size, self.selection):
            raise ValueError(
                f"the broadcast TopK state is for mode={theirs[0]} on {theirs[1]} ranks with "
                f"selection={theirs[2]!r}; this optimizer runs mode={self.mode} on "
                f"{self.size} ranks with selection={self.selection!r}")
        layout = state["layout"]
        self.layout = None if layout is None else tuple((str(n), int(d)) for n, d in layout)
        self.step = int(state["step"])
        self.choice = state["choice"]
        if state["server"] is not None:
            self.server.load_state_dict(state["server"])

    # --- internals -----------------------------------------------------------------------

    def _exchange_all(self, tensors, flat, joined=None) -> Dict[int, object]:
        """Steps 3 and 4 for every compressed tensor, fused into a fixed number of collectives.

        The tensors share one flat index space: tensor ``t`` occupies
        ``[offsets[t], offsets[t] + d_t)`` in the fixed order, so the pairs of all tensors
        travel in one buffer and each rank's received pairs are cut back per tensor by
        ``searchsorted`` on the offsets. Selection, aggregation (rank order) and the
        downlink stay per tensor, so the result is bitwise the per-tensor one. Tensors are
        grouped so that every group's index space fits in int32 (one group in practice).

        Returns ``{position: update}``, each a dense array or a :class:`_Sparse` (written
        by :func:`_write` at the end of the step).
        """
        if self.selection == "global":
            return self._exchange_global(tensors, flat, joined)
        updates: Dict[int, object] = {}
        start, total = 0, 0
        for i, (_, d) in enumerate(tensors):
            if i > start and total + d > _GROUP_LIMIT:
                updates.update(self._exchange_group(tensors[start:i], flat))
                start, total = i, 0
            total += d
        if tensors:
            updates.update(self._exchange_group(tensors[start:], flat))
        return updates

    def _exchange_global(self, tensors, flat, joined=None) -> Dict[int, object]:
        """``selection="global"``: steps 3 and 4 on the concatenation of all ``tensors``.

        The concatenation is one virtual tensor at position ``len(names)`` (its selection
        seed) keyed ``GLOBAL_NAME`` in the residuals, so the exchange is exactly that of
        one tensor of ``sum(d)`` entries: the reference is
        :func:`~hvdx.strategies.topk.core_bidirectional.simulate_step` on the concatenated gradient.
        """
        if not tensors:
            return {}
        layout = tuple((self.names[p], d) for p, d in tensors)
        if self.layout is not None and layout != self.layout:
            raise ValueError(
                "TopK selection='global': the compressed tensors changed since the first "
                f"compressed step ({len(self.layout)} tensors, now {len(layout)}); the "
                "residual of the concatenation no longer lines up")
        sizes = [d for _, d in tensors]
        total = int(sum(sizes))
        if total > _GROUP_LIMIT:
            raise ValueError(f"TopK selection='global' over {total} entries: indices must fit "
                             "in int32; use selection='layerwise'")
        self.layout = layout
        whole = None if joined is None else joined([p for p, _ in tensors])
        if whole is not None:
            if whole.shape != (total,) or whole.dtype != np.float32:
                raise RuntimeError(f"joined gave {whole.dtype}{list(whole.shape)} for "
                                   f"{total} float32 entries")
        elif len(tensors) > 1:
            # One buffer for every step's concatenation: a fresh one would pay its page
            # faults each step (selection only reads it; the residual is its own array).
            if self._global_buffer is None or self._global_buffer.size != total:
                self._global_buffer = np.empty(total, np.float32)
            whole = np.concatenate([flat(p) for p, _ in tensors], out=self._global_buffer)
        else:
            whole = flat(tensors[0][0])
        virtual = len(self.names)
        update = self._exchange_group([(virtual, total)], lambda _: whole)[virtual]
        offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        sent = self.last_sent.pop(virtual)
        cuts = np.searchsorted(sent, offsets)
        for t, (p, _) in enumerate(tensors):
            self.last_sent[p] = sent[cuts[t]:cuts[t + 1]] - offsets[t]
        if not isinstance(update, _Sparse):
            return {p: update[offsets[t]:offsets[t + 1]] for t, (p, _) in enumerate(tensors)}
        cuts = np.searchsorted(update.indices, offsets)
        return {p: _Sparse(update.indices[cuts[t]:cuts[t + 1]] - offsets[t],
                           update.values[cuts[t]:cuts[t + 1]], d)
                for t, (p, d) in enumerate(tensors)}

    def _count_dense(self, positions, sizes, itemsizes) -> None:
        """Horovod's ring allreduce of ``positions``: ``2 (P - 1) / P`` of each tensor's
        bytes sent and received."""
        for position in positions:
            itemsize = 4 if itemsizes is None else itemsizes[position]
            nbytes = 2 * (self.size - 1) / self.size * sizes[position] * itemsize
            self.stats.record(nbytes, nbytes, "dense")

    def _averaged_here(self, dense: Sequence[int], sparse: Sequence[int],
                       force_dense: Sequence[int] = ()) -> List[int]:
        """The dense positions hvdx averages itself: with ``small_tensors="in_topk_step"``,
        in a compressed step, those below ``min_size`` (sparse gradients stay with
        Horovod)."""
        if self.compression.small_tensors != "in_topk_step" or not sparse:
            return []
        forced = set(force_dense)
        return [p for p in dense if p not in forced]

    def _start_small(self, tensors, flat):
        """``small_tensors="in_topk_step"``: start one MPI allreduce (sum) of the ``(position,
        size)`` tensors' float32 concatenation; return a callable that waits for it and
        returns ``{position: average}`` (the sum with ``op=Sum``), or ``None`` if there is
        nothing to average. Counted as Horovod's ring allreduce would be."""
        if not tensors:
            return None
        send = np.concatenate([flat(p) for p, _ in tensors]).astype(np.float32, copy=False)
        total = np.empty_like(send)
        began = timeline.now() if timeline.active else 0
        request = self.comm.Iallreduce(send, total)
        self._count_dense([p for p, _ in tensors], dict(tensors), None)

        def finish():
            wait(request)
            if began:
                ring = 2 * (self.size - 1) * send.nbytes // self.size
                timeline.record("HVDX_TOPK_SMALL_ALLREDUCE", self._row(), began, ring, ring)
            if not self.sum_op:
                np.divide(total, np.float32(self.size), out=total)
            cuts = np.cumsum([0] + [d for _, d in tensors])
            return {p: total[cuts[t]:cuts[t + 1]] for t, (p, _) in enumerate(tensors)}
        return finish

    def _count_step(self, sparse: int, dense: int) -> None:
        """The end of every step, compressed or not: tensor counts, then the clocks."""
        self.stats.last_sparse_tensors, self.stats.last_dense_tensors = sparse, dense
        self.stats.steps += 1
        self.step += 1

    def _row(self) -> str:
        """This synchronizer's row in Horovod's timeline (:mod:`hvdx.mpi.timeline`)."""
        return "topk autotune dry run" if self._timing_target else "topk"

    def _name(self, position: int) -> str:
        """The residuals' key of ``position`` (the virtual global tensor included)."""
        return GLOBAL_NAME if position == len(self.names) else self.names[position]

    def _config(self):
        """The core settings of this step: the ratios of the sparsity warm-up, whose clock
        starts when compression does (after ``warmup_steps`` and ``autotune_steps``)."""
        c = self.compression
        if self._timing_target:
            # An autotune dry run times what the run would send once compressing for
            # good: the target ratios, not the sparsity warm-up's first (0.25), which
            # would make TopK look slow and choose dense for the rest of the run.
            return c.config
        return config_at(c.config, self.step - c.warmup_steps - c.autotune_steps,
                         c.sparsity_warmup_steps)

    def _dry_run(self, tensors, flat, joined=None) -> float:
        """Seconds of steps 3 and 4 on ``tensors`` with fresh residuals, which are then
        dropped: the running residuals, layout and ``last_sent`` stay as they were."""
        saved = self.worker, self.server, self.layout
        keys = self.worker.names
        self.worker, self.server = ResidualMemory(keys), ResidualMemory(keys)
        self._timing_target = True
        started = time.perf_counter()
        try:
            for update in self._exchange_all(tensors, flat, joined).values():
                _write(update, None)  # a real step writes its updates too
        finally:
            self.worker, self.server, self.layout = saved
            self.last_sent = {}
            self._timing_target = False
        return time.perf_counter() - started

    def _rng(self, role, index, position):
        config = self.compression.config
        if config.topk_method != "sampled_threshold":
            return None
        return selection_rng(config.seed, self.step, role, index, position)

    def _agree_shares(self, compensated, ks) -> np.ndarray:
        """This shard's share of each tensor's global top ``k_down``
        (:func:`hvdx.strategies.topk.core_global.agree_shares`), its bytes counted as
        ``"agree"``."""
        comm, others = self.comm, self.size - 1
        moved = [0, 0]

        def allgather(array):
            everyone = allgatherv_floats(comm, array)
            moved[0] += others * everyone[self.rank].nbytes
            moved[1] += sum(a.nbytes for r, a in enumerate(everyone) if r != self.rank)
            return everyone

        def allreduce(array):
            array = np.ascontiguousarray(array, np.int64)
            total = np.empty_like(array)
            wait(comm.Iallreduce(array, total))
            moved[0] += 2 * others * array.nbytes // max(self.size, 1)
            moved[1] += 2 * others * array.nbytes // max(self.size, 1)
            return total

        began = timeline.now() if timeline.active else 0
        shares = agree_shares(compensated, ks, self.rank, allgather, allreduce)
        self.stats.record(moved[0], moved[1], "agree")
        if began:
            timeline.record("HVDX_TOPK_AGREE", self._row(), began, moved[0], moved[1])
        return shares

    def _exchange_group(self, group, flat) -> Dict[int, object]:
        config = self._config()
        feedback = self.compression.error_feedback
        rank = self.rank
        sizes = [d for _, d in group]
        offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        ups = []
        for position, d in group:
            g = flat(position)
            name = self._name(position)
            if feedback:
                # checked: every rank agreed that the gradients are finite (check_finite)
                # before the exchange, so the residual's own scan would only repeat it.
                ups.append(uplink(self.worker, name, g, config.k_up(d), config,
                                  self._rng("up", rank, position), checked=True))
            else:
                ups.append(select(g, config.k_up(d), config, self._rng("up", rank, position)))
        for (position, _), (indices, _) in zip(group, ups):
            self.last_sent[position] = indices
        if self.mode == "gathered":
            updates = self._gathered(group, offsets, ups)
        else:
            updates = self._sharded(group, offsets, ups)
        if self.sum_op:
            updates = [u._replace(values=u.values * np.float32(self.size))
                       if isinstance(u, _Sparse) else u * np.float32(self.size)
                       for u in updates]
        return {position: u for (position, _), u in zip(group, updates)}

    def _gathered(self, group, offsets, ups):
        """One Allgatherv of every tensor's pairs; every rank aggregates and runs the downlink."""
        config, size = self._config(), self.size
        feedback = self.compression.error_feedback
        indices = np.concatenate([i.astype(np.int64) + offsets[t]
                                  for t, (i, _) in enumerate(ups)])
        values = np.concatenate([v for _, v in ups])
        began = timeline.now() if timeline.active else 0
        gathered, sent, received = allgatherv_pairs(self.comm, indices, values)
        self.stats.record(sent, received, "up")
        if began:
            timeline.record("HVDX_TOPK_ALLGATHER", self._row(), began, sent, received)
        cuts = [np.searchsorted(i, offsets) for i, _ in gathered]
        updates = []
        for t, (position, d) in enumerate(group):
            name = self._name(position)
            pieces = [(i[c[t]:c[t + 1]], v[c[t]:c[t + 1]]) for (i, v), c in zip(gathered, cuts)]
            m = aggregate(pieces, d, size, offset=offsets[t], dtype=np.float32)
            k_down = config.k_down(d)
            if k_down is None:
                updates.append(m)
                continue
            server = self.server.get(name) if feedback else None
            u_indices, u_values, residual = downlink(m, server, k_down, config,
                                                     self._rng("down", 0, position))
            if feedback:
                self.server.set(name, residual, copy=False)  # downlink's own array
            updates.append(_Sparse(u_indices, u_values, d))
        return updates

    def _sharded(self, group, offsets, ups):
        """One Alltoallv of the pairs to the shard owners, one Allgatherv of their picks.

        Every tensor keeps its own shards (:func:`~hvdx.core.sharding.shard_bounds` of its
        length); what one rank sends an owner is all tensors' pieces for it, in order.
        """
        config, size, rank = self._config(), self.size, self.rank
        feedback = self.compression.error_feedback
        all_bounds = [shard_bounds(d, size) for _, d in group]
        outgoing = [[] for _ in range(size)]
        for t, ((indices, values), bounds) in enumerate(zip(ups, all_bounds)):
            for owner, (i, v) in enumerate(split_by_shard(indices, values, bounds)):
                outgoing[owner].append((i.astype(np.int64) + offsets[t], v))
        pieces = [(np.concatenate([i for i, _ in out]), np.concatenate([v for _, v in out]))
                  for out in outgoing]
        began = timeline.now() if timeline.active else 0
        incoming, sent, received = alltoallv_pairs(self.comm, pieces)
        self.stats.record(sent, received, "up")
        if began:
            timeline.record("HVDX_TOPK_ALLTOALL", self._row(), began, sent, received)
        cuts = [np.searchsorted(i, offsets) for i, _ in incoming]
        chosen, compensated = [], {}
        for t, ((position, d), bounds) in enumerate(zip(group, all_bounds)):
            lo, hi = int(bounds[rank]), int(bounds[rank + 1])
            mine = [(i[c[t]:c[t + 1]], v[c[t]:c[t + 1]]) for (i, v), c in zip(incoming, cuts)]
            m_s = aggregate(mine, hi - lo, size, offset=offsets[t] + lo, dtype=np.float32)
            if config.k_down(d) is None:
                local = np.flatnonzero(m_s)
                chosen.append((local + (offsets[t] + lo), m_s[local]))
            else:
                server = self.server.get(self._name(position)) if feedback else None
                compensated[t] = compensate_server(m_s, server)
                chosen.append(None)  # selected below, once the shares are agreed
        if compensated:
            # The global top k_down of every tensor's b: this shard's share of each.
            order = sorted(compensated)
            shares = self._agree_shares([compensated[t] for t in order],
                                        [config.k_down(group[t][1]) for t in order])
            for t, share in zip(order, shares):
                position = group[t][0]
                lo = int(all_bounds[t][rank])
                local, values, residual = downlink_from(
                    compensated[t], int(share), config, self._rng("down", rank, position))
                if feedback:
                    self.server.set(self._name(position), residual, copy=False)
                chosen[t] = (local + (offsets[t] + lo), values)
        began = timeline.now() if timeline.active else 0
        selected, sent, received = allgatherv_pairs(
            self.comm, np.concatenate([i for i, _ in chosen]),
            np.concatenate([v for _, v in chosen]))
        self.stats.record(sent, received, "down")
        if began:
            timeline.record("HVDX_TOPK_SHARD_ALLGATHER", self._row(), began, sent, received)
        cuts = [np.searchsorted(i, offsets) for i, _ in selected]
        updates = []
        for t, (_, d) in enumerate(group):
            # Shards in rank order, each owner's picks ascending: the indices ascend.
            indices = np.concatenate([i[c[t]:c[t + 1]] for (i, _), c in zip(selected, cuts)])
            values = np.concatenate([v[c[t]:c[t + 1]] for (_, v), c in zip(selected, cuts)])
            updates.append(_Sparse(indices.astype(np.int64) - offsets[t], values, d))
        return updates
