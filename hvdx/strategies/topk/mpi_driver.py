"""GRACE's driver for TopK: one step of bidirectional TopK with error feedback over
mpi4py, shared by the PyTorch and TensorFlow adapters.

Zou, De Sterck & Liu, "Downlink Compression Improves TopK Sparsification", arXiv
2209.15203, in the split of Xu et al., "GRACE: A Compressed Communication Framework
for Distributed Machine Learning" (ICDCS 2021). :class:`TopKSynchronizer` composes

- the compressor, :class:`~hvdx.strategies.topk.core_compressor.TopKCompressor` (TopK
  selection with this step's ratios and generators);
- the memory, :class:`~hvdx.strategies.topk.core_memory.TopKMemory` (the worker and
  server residuals);
- the communicator, :mod:`hvdx.strategies.topk.mpi_communicators` (``gathered`` or
  ``sharded``, and the dense allreduce of the small tensors);

and runs them every step, with the NaN/Inf agreement
(:mod:`hvdx.strategies.topk.mpi_nonfinite`), autotune
(:mod:`hvdx.strategies.topk.mpi_autotune`), the checkpoint state
(:mod:`hvdx.strategies.topk.core_checkpoint`) and the counters
(:mod:`hvdx.strategies.topk.core_counters`). The framework adapters
(the compression drivers, :mod:`hvdx.torch.compression_driver` and
:mod:`hvdx.tensorflow.compression_driver`)
only turn their gradients into flat float32 numpy arrays, run Horovod's allreduce for
the tensors the driver leaves dense, and write the updates back.

One :meth:`TopKSynchronizer.synchronize` call, with the tensors in a fixed order (the
same on every rank):

1. agree on NaN/Inf (:mod:`~hvdx.strategies.topk.mpi_nonfinite`). If any rank has one,
   the step is skipped on every rank alike: nothing is exchanged, no residual, step
   counter, autotune timing or byte counter changes, and ``synchronize`` returns
   ``None`` so that the adapter makes every gradient NaN;
2. split: tensors with fewer than ``min_size`` entries, tensors the adapter marks
   (sparse gradients), and every tensor during ``warmup_steps`` stay dense; the adapter's
   ``start_dense`` callback starts Horovod's allreduce of those before the sparse
   exchange, so that the two overlap. With ``small_tensors="in_topk_step"`` the tensors
   below ``min_size`` of a compressed step are averaged here instead, by one
   non-blocking MPI allreduce that also overlaps the exchange
   (:class:`~hvdx.strategies.topk.mpi_communicators.SmallTensors`), and Horovod
   carries nothing during the step;
3. uplink, per tensor: the memory compensates, the compressor selects (each tensor
   keeps its own ``k``), the memory keeps the rest. With ``selection="global"`` the
   compressed tensors are first concatenated, in the fixed order, into one vector that
   steps 3 and 4 treat as a single tensor (one ``k``, one residual, shards of the whole
   vector), and its update is cut back into the tensors afterwards
   (:mod:`~hvdx.strategies.topk.core_concatenation`);
4. the communicator exchanges all tensors' pairs at once in one flat index space
   (tensor ``t`` shifted by its offset in the concatenation) and runs the downlink: a
   step costs a fixed number of collectives whatever the number of tensors, and the
   result is bitwise the per-tensor one. ``m`` is the average over ranks (``op=Sum``
   multiplies by the size). With ``error_feedback=False`` no residual is kept;
5. wait for the dense allreduces, count the step.

With ``autotune_steps=N`` the N steps after ``warmup_steps`` are dense (step 2 keeps
every tensor dense) and each also runs steps 3 and 4 as a timed dry run on the same
gradients, with empty residuals that are thrown away; after the N-th, every rank takes
the same decision (:mod:`~hvdx.strategies.topk.mpi_autotune`). Once dense for good, a
step is Horovod's: no NaN/Inf agreement (no residual is at stake), and an adapter that
can start the allreduces during the backward pass does so and only counts the step
(:meth:`TopKSynchronizer.dense_step`).

The updates come back as flat float32 arrays; the adapter writes them (and the dense
results) where its optimizer reads gradients.
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from hvdx.strategies.topk.core_checkpoint import TopKCheckpointing
from hvdx.strategies.topk.core_compressor import SparseUpdate, TopKCompressor, decompress
from hvdx.strategies.topk.core_concatenation import INDEX_LIMIT, Concatenation, cut, layout_of
from hvdx.strategies.topk.core_counters import TopKStats
from hvdx.strategies.topk.core_memory import TopKMemory
from hvdx.strategies.topk.mpi_autotune import Autotune
from hvdx.strategies.topk.mpi_communicators import SmallTensors, Wire, communicator_for
from hvdx.strategies.topk.mpi_nonfinite import JOINED, NonfiniteAgreement
from hvdx.strategies.topk.spec import TopKCompression

__all__ = ["TopKSynchronizer"]

#: ``start_dense(positions)`` returns a callable that waits for those allreduces (or None).
StartDense = Callable[[List[int]], Optional[Callable[[], None]]]
#: ``joined(positions)``: those tensors' flat arrays one after another as one array, or None.
Joined = Callable[[List[int]], Optional[np.ndarray]]
#: ``out(position)``: where to write that tensor's update (a flat float32 array), or None.
Out = Callable[[int], Optional[np.ndarray]]


class TopKSynchronizer(TopKCheckpointing):
    """The driver of one TopK run (steps 1 to 5 above).

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
        memory: the :class:`~hvdx.strategies.topk.core_memory.TopKMemory`; ``worker``,
            ``server`` and ``layout`` are its.
        communicator: the sparse exchange of :attr:`mode`; ``small``: the dense
            allreduce of the small tensors.
        nonfinite, autotune: step 1's agreement and autotune's timings and choice.
        concatenation: ``selection="global"``'s buffer
            (:class:`~hvdx.strategies.topk.core_concatenation.Concatenation`).
        step: steps taken (it seeds the sampled threshold and ends the warm-up).
        stats: :class:`~hvdx.strategies.topk.core_counters.TopKStats`; assignable.
        comm: the communicator; assignable (tests wrap it to count collectives).
        timings, choice: autotune's (:class:`~hvdx.strategies.topk.mpi_autotune.Autotune`).
        last_sent: ``{position: indices}``: the entries of each compressed tensor this
            rank sent in the last step (DGC's momentum factor masking zeroes them).
    """

    #: The key of this state in a torch ``optimizer.state_dict()``, and the attribute
    #: of a Keras optimizer that holds it (the compression drivers').
    STATE_KEY = "hvdx_topk"
    TENSORFLOW_ATTRIBUTE = "hvdx_topk"
    #: The entries of :meth:`state_dict` that map tensor names to arrays.
    #: What each rank keeps of its own (the words of a broadcast's note).
    RESIDUALS = "TopK residuals"
    ARRAY_ENTRIES = ("worker", "server")
    #: Every gradient is compressed in float32.
    KEEPS_FLOAT64 = False
    STATS = TopKStats

    @classmethod
    def for_spec(cls, names, spec: TopKCompression, comm, sum_op=False, labels=None,
                 shapes=None) -> "TopKSynchronizer":
        """The compression drivers' constructor (TopK selects on flat tensors: the
        shapes are not needed)."""
        return cls(names, spec, comm, sum_op=sum_op, labels=labels)

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
        self.wire = Wire(comm, TopKStats())
        self.size, self.rank = self.wire.size, self.wire.rank
        self.mode = compression.resolve_mode(self.size)
        self.sum_op = bool(sum_op)
        self.selection = compression.selection
        self.memory = TopKMemory(self.names, self.selection == "global",
                                 compression.error_feedback)
        self.communicator = communicator_for(self.mode, self.wire)
        self.small = SmallTensors(self.wire, self.sum_op)
        self.nonfinite = NonfiniteAgreement(self.wire, self.labels)
        self.autotune = Autotune(compression, self.wire)
        self.step = 0
        self.last_sent: Dict[int, np.ndarray] = {}
        self.concatenation = Concatenation()

    comm = property(lambda self: self.wire.comm,
                    lambda self, comm: setattr(self.wire, "comm", comm))
    stats = property(lambda self: self.wire.stats,
                     lambda self, stats: setattr(self.wire, "stats", stats))
    worker = property(lambda self: self.memory.worker)
    server = property(lambda self: self.memory.server)
    layout = property(lambda self: self.memory.layout)
    timings = property(lambda self: self.autotune.timings,
                       lambda self, timings: setattr(self.autotune, "timings", timings))
    choice = property(lambda self: self.autotune.choice,
                      lambda self, choice: setattr(self.autotune, "choice", choice))
    everyone_joined = property(lambda self: self.nonfinite.everyone_joined,
                               doc="Whether the last NaN/Inf agreement found every "
                                   "rank joined (:meth:`joined_step`).")

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
        stats.begin_step()
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
            self.autotune.record(time.perf_counter() - started, topk_s)
        self._count_dense(dense, sizes, itemsizes)
        finish_small = self.small.start([(p, sizes[p]) for p in small], flat)
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
        return {p: decompress(u, None if out is None else out(p)) for p, u in updates.items()}

    def joined_step(self, sizes: Sequence[int], agree_first: bool = False) -> bool:
        """The step of the others, taken by a rank that has joined (``hvd.join()``: it
        ran out of data), with zero gradients; ``True`` once every rank has joined.

        Horovod answers the others' allreduces for a joined rank with zeros, and so does
        this for hvdx's own collectives, which Horovod cannot answer:

        1. the NaN/Inf agreement with :data:`~hvdx.strategies.topk.mpi_nonfinite.JOINED`
           (``agree_first``: the adapter runs it before :meth:`synchronize`, as it does
           for its own steps); when every rank has joined, nothing else runs and the
           answer is ``True``;
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

        with self.memory.worker_sitting_out():
            if agree_first and not self.check_finite(JOINED):
                return self.everyone_joined
            updates = self.synchronize(sizes, zeros, lambda positions: None,
                                       None if agree_first else JOINED)
            return updates is None and self.everyone_joined

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
        self.stats.begin_step()
        self._count_dense(range(len(sizes)), sizes, itemsizes)
        self._count_step(0, len(sizes))

    def overlaps_dense(self) -> bool:
        """Whether every step from now on is Horovod's allreduce of every tensor (autotune
        chose dense), which adapters may then start during the backward pass."""
        return self.autotune.overlaps_dense()

    def tuning(self) -> bool:
        """Whether this step is one of the ``autotune_steps`` (dense, with a dry run)."""
        return self.autotune.tuning(self.step)

    def decide(self) -> str:
        """The autotune decision, the same on every rank. Collective
        (:meth:`~hvdx.strategies.topk.mpi_autotune.Autotune.decide`)."""
        return self.autotune.decide()

    def check_finite(self, first_bad: int) -> bool:
        """Step 1: whether every rank's gradients are finite, the same answer on every
        rank. Collective: every rank calls it once per step, with ``len(names)`` when
        all its gradients are finite, or ``JOINED`` when it has joined
        (:meth:`~hvdx.strategies.topk.mpi_nonfinite.NonfiniteAgreement.agree`)."""
        return self.nonfinite.agree(first_bad)

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

    # --- internals -----------------------------------------------------------------------

    def _compressor(self) -> TopKCompressor:
        """The compressor of this step (an autotune dry run's: the target ratios)."""
        c = self.compression
        return TopKCompressor(c.config, self.step, c.warmup_steps + c.autotune_steps,
                              c.sparsity_warmup_steps, dry_run=self.wire.dry_run)

    def _exchange_all(self, tensors, flat, joined=None) -> Dict[int, object]:
        """Steps 3 and 4 for every compressed tensor, fused into a fixed number of collectives.

        The tensors share one flat index space: tensor ``t`` occupies
        ``[offsets[t], offsets[t] + d_t)`` in the fixed order, so the pairs of all tensors
        travel in one buffer and each rank's received pairs are cut back per tensor by
        ``searchsorted`` on the offsets. Selection, aggregation (rank order) and the
        downlink stay per tensor, so the result is bitwise the per-tensor one. Tensors are
        grouped so that every group's index space fits in int32 (one group in practice).

        Returns ``{position: update}``, each a dense array or a
        :class:`~hvdx.strategies.topk.core_compressor.SparseUpdate` (written at the end
        of the step).
        """
        if self.selection == "global":
            return self._exchange_global(tensors, flat, joined)
        updates: Dict[int, object] = {}
        start, total = 0, 0
        for i, (_, d) in enumerate(tensors):
            if i > start and total + d > INDEX_LIMIT:
                updates.update(self._exchange_group(tensors[start:i], flat))
                start, total = i, 0
            total += d
        if tensors:
            updates.update(self._exchange_group(tensors[start:], flat))
        return updates

    def _exchange_global(self, tensors, flat, joined=None) -> Dict[int, object]:
        """``selection="global"``: steps 3 and 4 on the concatenation of all ``tensors``
        (:mod:`hvdx.strategies.topk.core_concatenation`), one virtual tensor at position
        ``len(names)`` (its selection seed and its residuals' key)."""
        if not tensors:
            return {}
        self.memory.layout = layout_of(self.names, tensors, self.layout)
        whole = self.concatenation.join(tensors, flat, joined)
        virtual, total = len(self.names), int(sum(d for _, d in tensors))
        update = self._exchange_group([(virtual, total)], lambda _: whole)[virtual]
        updates, sent = cut(update, self.last_sent.pop(virtual), tensors)
        self.last_sent.update(sent)
        return updates

    def _exchange_group(self, group, flat) -> Dict[int, object]:
        """Step 3 (memory, compressor) for every tensor of ``group``, then step 4 (the
        communicator)."""
        compressor, memory, rank = self._compressor(), self.memory, self.rank
        sizes = [d for _, d in group]
        offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        ups = []
        for position, d in group:
            a = memory.compensate_up(position, flat(position))
            indices, values = compressor.compress(a, compressor.k_up(d), rank, position)
            memory.update_up(position, a, indices, values)
            ups.append((indices, values))
        for (position, _), (indices, _) in zip(group, ups):
            self.last_sent[position] = indices
        updates = self.communicator.exchange(group, offsets, ups, compressor, memory)
        if self.sum_op:
            updates = [u._replace(values=u.values * np.float32(self.size))
                       if isinstance(u, SparseUpdate) else u * np.float32(self.size)
                       for u in updates]
        return {position: u for (position, _), u in zip(group, updates)}

    def _dry_run(self, tensors, flat, joined=None) -> float:
        """Seconds of steps 3 and 4 on ``tensors`` with fresh residuals, which are then
        dropped: the running residuals, layout and ``last_sent`` stay as they were."""
        saved = self.memory
        self.memory = saved.fresh()
        self.wire.dry_run = True
        started = time.perf_counter()
        try:
            for update in self._exchange_all(tensors, flat, joined).values():
                decompress(update, None)  # a real step writes its updates too
        finally:
            self.memory = saved
            self.last_sent = {}
            self.wire.dry_run = False
        return time.perf_counter() - started

    def _averaged_here(self, dense: Sequence[int], sparse: Sequence[int],
                       force_dense: Sequence[int] = ()) -> List[int]:
        """The dense positions hvdx averages itself: with ``small_tensors="in_topk_step"``,
        in a compressed step, those below ``min_size`` (sparse gradients stay with
        Horovod)."""
        if self.compression.small_tensors != "in_topk_step" or not sparse:
            return []
        forced = set(force_dense)
        return [p for p in dense if p not in forced]

    def _count_dense(self, positions, sizes, itemsizes) -> None:
        """Horovod's ring allreduce of ``positions``."""
        self.wire.count_dense((sizes[p], 4 if itemsizes is None else itemsizes[p])
                              for p in positions)

    def _count_step(self, sparse: int, dense: int) -> None:
        """The end of every step, compressed or not: tensor counts, then the clocks."""
        self.stats.end_step(sparse, dense)
        self.step += 1
