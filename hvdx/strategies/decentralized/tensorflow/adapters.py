"""Decentralized SGD over a graph for TensorFlow: local steps, then neighbour averaging.

The spec and the algorithm are :class:`hvdx.Decentralized` (Ying et al., arXiv
2110.13363); the numpy reference is
:func:`hvdx.strategies.decentralized.core_reference.simulate_decentralized`. The step, the SWA
merge, the tape and the Keras optimizer are the parameter-mixing strategies' shared part
(:mod:`hvdx.tensorflow.mixing`); this module is the graph's mixer, :class:`DecentralizedState`. At a
mixing step ``t`` it runs inside one ``tf.py_function`` (eagerly, inside ``tf.function`` and in
Keras ``fit`` alike):

1. pack the mixed variables into ONE contiguous buffer per dtype family
   (:mod:`hvdx.core.fused_layout`);
2. exchange it with the step's neighbours by mpi4py non-blocking point-to-point on
   hvdx's duplicated communicator (:mod:`hvdx.mpi.neighbor_exchange`) and
   combine ``w_ii x_i + sum_j w_ij x_j`` in the buffer's dtype, sources in rank order;
3. unpack into the variables. With ``global_every``, every ``global_every``-th step
   averages over all ranks instead (Horovod's allreduce); with ``mix_every=J``, only
   every J-th step mixes.

Entry points and orders:

- ``hvd.DistributedOptimizer(opt, sync=hvdx.Decentralized(...))`` (Keras):
  adapt-then-combine (the default) steps locally, then mixes;
  ``order="combine_then_adapt"`` mixes ``x_t``, then applies the gradients taken at
  ``x_t``.
- ``hvd.DistributedGradientTape(tape, sync=hvdx.Decentralized(order="combine_then_adapt"))``:
  the tape returns the gradients before the optimizer applies them, so it can only mix
  before the update: combine-then-adapt, ``x_{t+1} = sum_j W_t[i, j] x_j - lr g(x_t)``.
  Adapt-then-combine on the tape is refused with a ``ValueError`` that says so, except
  where ``HVDX_SYNC`` chose the strategy and left ``order`` out: the tape then runs
  combine-then-adapt (:func:`tape_fit`), as an unchanged Horovod script expects. The
  state (step, SWA means, byte counters) belongs to the ``Decentralized`` object,
  because a script builds a new tape every step: create one object per model, once,
  outside the step, and use :func:`decentralized_state` to checkpoint it, to call
  ``synchronize_parameters`` or ``consensus_distance``.

Unlike PyTorch's combine-then-adapt, the TensorFlow exchange completes inside the step
that starts it (a ``tf.py_function`` cannot leave MPI requests in flight across graph
executions safely), so it does not overlap with the next forward and backward pass.
"""

from __future__ import annotations

import inspect
from typing import List

import horovod.tensorflow as _hvd
import numpy as np
import tensorflow as tf

from hvdx.core.group_averaging import ADAPT_THEN_COMBINE, COMBINE_THEN_ADAPT
from hvdx.environment_variables import call_of, refused
from hvdx.mpi.comm import world
from hvdx.mpi.neighbor_exchange import FusedExchange, consensus_distance
from hvdx.strategies.decentralized.spec import Decentralized, DecentralizedStats, MixingGraph
from hvdx.tensorflow.mixing import (MixingState, adapters, average_over_all_ranks,
                                    state_of)

__all__ = ["DecentralizedState", "decentralized_state", "keras_adapter", "tape_adapter",
           "tape_fit"]

#: MPI tags of the fused buffers, per family: hvdx's communicator only (torch's are
#: 0x4876 and 0x4877; one framework runs per process, but distinct tags cost nothing).
_TAGS = {np.dtype(np.float32): 0x4878, np.dtype(np.float64): 0x4879}


class DecentralizedState(MixingState):
    """The decentralized state of one model: step, SWA running mean, byte counters.

    A ``tf.Module``: put it in a ``tf.train.Checkpoint`` (the Keras optimizer tracks its
    own), and a restored run continues the same peer sequence.

    Attributes:
        step, swa_count, swa: see :class:`~hvdx.tensorflow.mixing.MixingState`.
        graph: this rank's :class:`~hvdx.strategies.decentralized.spec.MixingGraph`.
        hvdx_stats: :class:`DecentralizedStats`.
    """

    STRATEGY = Decentralized
    ATTRIBUTE = "hvdx_decentralized"

    @classmethod
    def from_plan(cls, sync: Decentralized, graph: MixingGraph) -> "DecentralizedState":
        return cls(sync, graph)

    @classmethod
    def check_tape(cls, sync: Decentralized) -> None:
        """The tape mixes before the update only (module docstring); every rank gets
        here, after the cross-rank check of the order."""
        if sync.order == ADAPT_THEN_COMBINE and sync.environment is not None:
            # HVDX_SYNC named the order (left out, the tape runs the other: tape_fit):
            # the fix is the variable's value, which hvdx's hook prints without a
            # traceback, once (a VariableError).
            raise refused(*sync.environment, (
                "DistributedGradientTape can only mix before the update, so it runs "
                "order='combine_then_adapt' only; leave order out, or set "
                f"{sync.environment[0]}=\"{_with_order(sync, COMBINE_THEN_ADAPT)}\""))
        if sync.order == ADAPT_THEN_COMBINE:
            raise ValueError(
                "order='adapt_then_combine': DistributedGradientTape returns the "
                "gradients before the optimizer applies them, so it can only mix before "
                "the update; pass hvdx.Decentralized(..., order='combine_then_adapt') to "
                "the tape, or use hvdx.tensorflow.keras.DistributedOptimizer, which runs "
                "both orders")

    @classmethod
    def combines_first(cls, sync: Decentralized) -> bool:
        return sync.order == COMBINE_THEN_ADAPT

    def __init__(self, sync: Decentralized, graph: MixingGraph):
        super().__init__(sync, name="hvdx_decentralized")
        self.graph = graph
        self.hvdx_stats = DecentralizedStats()
        self._comm = world(_hvd.global_process_set)
        self._exchange = FusedExchange(self._comm, _TAGS)

    # --- the mixer ----------------------------------------------------------------------

    def _mix_at(self, step: int, values: List[tf.Tensor]) -> List[tf.Tensor]:
        # (A global_every step never gets here: MixingState._mix_step decides it.)
        if not self._sync.mixes_at(step):
            self.hvdx_stats.record(0, 0)
            return values
        arrays = [v.numpy() for v in values]
        # The layout is built at the first step, rebuilt if the variables change (slots
        # joining the mix); every family is posted before any is waited for.
        exchange = self._exchange
        layout = exchange.layout_for((a.dtype.name, a.size) for a in arrays)
        layout.pack(arrays, out=exchange.buffers)
        neighbours = self.graph.neighbors(step)
        exchange.start(neighbours.send_to, neighbours.recv_from)
        self.hvdx_stats.record(*exchange.finish(neighbours.self_weight,
                                                neighbours.recv_weights))
        return [tf.convert_to_tensor(a) for a in layout.unpack(exchange.mixed, arrays)]

    def _average_all(self, values: List[tf.Tensor]) -> List[tf.Tensor]:
        return average_over_all_ranks(values, "hvdx.decentralized.all")

    def _average_everyone(self, values: List[tf.Tensor]) -> List[tf.Tensor]:
        """A ``global_every`` step: Horovod's average, counted as its ring allreduce."""
        nbytes = sum(int(v.shape.num_elements()) * v.dtype.size for v in values)
        self.hvdx_stats.add_everyone(nbytes, self.graph.n)
        return self._average_all(values)

    # --- diagnostics --------------------------------------------------------------------

    def consensus_distance(self) -> float:
        """``sqrt(mean_i ||x_i - mean_j x_j||^2)`` over the mixed variables (eager,
        collective, float64): how far the ranks' models are apart."""
        if self._bound.variables is None:
            raise ValueError("consensus_distance: no step taken yet, so Decentralized "
                             "does not know the variables")
        x = np.concatenate([np.asarray(v.numpy(), dtype=np.float64).reshape(-1)
                            for v in self._variables] or [np.zeros(0)])
        return consensus_distance(self._comm, x)


@tf.autograph.experimental.do_not_convert
def decentralized_state(sync: Decentralized) -> DecentralizedState:
    """The state ``DistributedGradientTape(tape, sync=sync)`` keeps for ``sync``.

    Created at the first call (collective: every rank calls it, or builds its first
    tape, at the same point). Put it in a ``tf.train.Checkpoint`` to resume the same
    peer sequence; ``decentralized_state(sync).synchronize_parameters()`` averages over
    all ranks.
    """
    return state_of(DecentralizedState, sync)


# --- decentralized SGD's entries in hvdx.tensorflow.registry (the catalogue names them) --

#: The attribute of an ``HVDX_SYNC`` spec that keeps the spec its tapes run.
_TAPE_SPEC = "_hvdx_tape_spec"


def tape_fit(sync: Decentralized) -> Decentralized:
    """``sync`` as ``DistributedGradientTape`` runs it (the catalogue's
    ``tensorflow_tape_fit``).

    A spec ``HVDX_SYNC`` built from a value that leaves ``order`` out runs
    combine-then-adapt, the one order a tape can run: the variable is set for an
    unchanged script, whose tape cannot take an argument, and the same value keeps
    adapt-then-combine in a Keras optimizer. Its own arguments are kept, and it is one
    spec per value (kept on ``sync``): a tape is made every step, and its state lives on
    its spec. A spec from the code, or a value that names an order, runs as given
    (adapt-then-combine is refused by :meth:`DecentralizedState.check_tape`).
    """
    if sync.environment is None or sync.order != ADAPT_THEN_COMBINE:
        return sync
    fitted = getattr(sync, _TAPE_SPEC, None)
    if fitted is None:
        given = _given(sync)
        if "order" in given:
            fitted = sync
        else:
            fitted = Decentralized(**dict(given, order=COMBINE_THEN_ADAPT))
            # The variable it came from, which the ranks compare (environment.parse).
            object.__setattr__(fitted, "environment", sync.environment)
        setattr(sync, _TAPE_SPEC, fitted)
    return fitted


def _given(sync: Decentralized) -> dict:
    """The arguments the ``HVDX_SYNC`` value that built ``sync`` gives, by name."""
    _, args, kwargs = call_of(*sync.environment)
    return dict(inspect.signature(Decentralized).bind(*args, **kwargs).arguments)


def _with_order(sync: Decentralized, order: str) -> str:
    """The ``HVDX_SYNC`` value that built ``sync``, with ``order`` instead of its own."""
    arguments = dict(_given(sync), order=order)
    return f"Decentralized({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


#: A graph-mixing tape (combine-then-adapt; ``order="adapt_then_combine"`` is refused by
#: :meth:`DecentralizedState.check_tape`, on every rank: the order was compared first) or
#: Keras optimizer (either order) in place of Horovod's
#: (:func:`hvdx.tensorflow.mixing.adapters`).
tape_adapter, keras_adapter = adapters(DecentralizedState)
