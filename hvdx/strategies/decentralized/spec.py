"""``hvdx.Decentralized``: decentralized SGD over a graph, the framework-neutral spec.

Decentralized SGD (DSGD; with the optimizer's local momentum, DmSGD) replaces the
gradient allreduce by neighbour averaging: every rank takes a local step and averages its
parameters with a few peers, chosen by a mixing graph. Over an exponential graph a rank
talks to one peer per step (one-peer) or to ``log2 n`` peers (static), and information
still reaches every rank in ``log2 n`` steps (Ying, Yuan, Chen, Hu, Pan and Yin,
"Exponential Graph is Provably Efficient for Decentralized Deep Training", NeurIPS 2021,
arXiv 2110.13363; the graphs follow BlueFog's ``topology_util.py``).

At step ``t`` on every rank ``i`` (``W_t`` the graph's mixing matrix for the mix at
step ``t``, item 3, :mod:`hvdx.core.mixing_graphs`; the numpy reference is
:func:`hvdx.strategies.decentralized.core_reference.simulate_decentralized`):

1. adapt-then-combine (the default): the local optimizer step, ``x_i - lr d_i``, then
   ``x_i <- sum_j W_t[i, j] (x_j - lr d_j)``: the new parameters are sent to the
   out-neighbours as soon as the step is done and combined before they are next read;
2. combine-then-adapt: ``x_i <- sum_j W_t[i, j] x_j - lr d_i``, with ``d_i`` taken at
   ``x_i``: the parameters are sent when the previous step ends, so the exchange runs
   during this step's forward and backward pass;
3. with ``mix_every=J``, only the steps ``t`` with ``(t + 1) % J == 0`` mix; the others
   are local steps. The graph follows the mixes, not the steps: the mix at step ``t``
   is mix ``m = t // J`` (:func:`hvdx.core.mixing_graphs.mix_index`) and ``W_t`` is the
   graph's matrix ``m``, so a one-peer graph takes every shift in turn whatever ``J``
   is;
4. the options of every mixing strategy (:class:`hvdx.strategy_contract.MixingStrategy`):
   ``global_every``, the SWA merge, ``average_optimizer_state``.

The optimizer's momentum stays local (DmSGD): mixing it too is
``average_optimizer_state=True``.

Exactness: for ``n`` a power of two, ``log2 n`` consecutive one-peer mixes
(``log2 n * mix_every`` steps) average exactly: every rank holds the global mean when
lr = 0. For other ``n`` they do not (about 0.2 contraction per period); hvdx warns on
rank 0 when a one-peer graph is chosen there, and the static exponential graph is the
better choice.

Example::

    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   sync=hvdx.Decentralized("one-peer-exp"))
"""

from __future__ import annotations

import warnings
from typing import Dict, List, Tuple

from hvdx.core import mixing_graphs
from hvdx.core.counters import MixingStats
from hvdx.core.group_averaging import ADAPT_THEN_COMBINE, COMBINE_THEN_ADAPT
from hvdx.core.validation import check_integer
from hvdx.strategy_contract import Job, MixingStrategy, validating

__all__ = ["DEFAULT_GRAPH", "ORDERS", "Decentralized", "DecentralizedStats", "MixingGraph"]

#: Accepted ``order`` values.
ORDERS = (ADAPT_THEN_COMBINE, COMBINE_THEN_ADAPT)

#: The graph when none is given: one peer per step, exact every ``log2 n`` mixes for
#: ``n`` a power of two.
DEFAULT_GRAPH = "one-peer-exp"


class Decentralized(MixingStrategy):
    """Decentralized SGD: local steps, then averaging with the graph's neighbours.

    Args:
        graph: ``"one-peer-exp"`` (default: one peer per step, exact averaging every
            ``log2 n`` steps for ``n`` a power of two), ``"static-exp"`` (``log2 n``
            peers every step), ``"one-peer-hypercube"`` (pairwise exchanges),
            ``"ring"``, ``"torus"``, ``"complete"`` (every rank: the exact average, the
            most bytes), or an ``n x n`` doubly stochastic mixing matrix ``W``
            (``x_i <- sum_j W[i, j] x_j``). ``None``: the default.
        order: ``"adapt_then_combine"`` (default) or ``"combine_then_adapt"`` (module
            docstring).
        mix_every: mix every ``mix_every`` steps (local steps in between).
        global_every, swa_start, swa_every, average_optimizer_state: as for every
            mixing strategy (:class:`hvdx.strategy_contract.MixingStrategy`).
        topology: the old name of ``graph`` (a ``DeprecationWarning``): "topology"
            means the racks of the cluster (:mod:`hvdx.core.topology`).

    Raises:
        ValueError: naming the argument and its value: an unknown graph, a matrix
            that is not doubly stochastic, ``mix_every`` below 1, an unknown order;
            ``graph`` and ``topology`` both given, naming both.
    """

    name = "decentralized"
    state_key = "hvdx_decentralized"

    @validating
    def __init__(self, graph=None, order: str = ADAPT_THEN_COMBINE,
                 mix_every: int = 1, global_every: int = 0, swa_start=None,
                 swa_every: int = 1, average_optimizer_state: bool = False, *,
                 topology=None):
        graph = _graph_or_old_name(graph, topology)
        if isinstance(graph, str):
            if graph not in mixing_graphs.GRAPHS:
                raise ValueError(f"graph={graph!r} must be one of "
                                 f"{mixing_graphs.GRAPHS} or a mixing matrix")
            self.graph = graph
        else:
            try:
                self.graph = mixing_graphs.check_mixing_matrix(graph, name="graph")
            except (TypeError, ValueError) as error:
                if isinstance(error, ValueError) and str(error).startswith("graph"):
                    raise
                raise ValueError(f"graph={graph!r} must be one of "
                                 f"{mixing_graphs.GRAPHS} or a mixing matrix") from None
        if order not in ORDERS:
            raise ValueError(f"order={order!r} must be one of {ORDERS}")
        self.order = order
        self.mix_every = check_integer("mix_every", mix_every, 1)
        self._init_mixing(global_every=global_every, swa_start=swa_start,
                          swa_every=swa_every,
                          average_optimizer_state=average_optimizer_state)

    # --- the strategy contract (hvdx.strategy_contract) ---------------------------------------

    def prepare(self, job: Job) -> "MixingGraph":
        """Check the arguments against the job and return this rank's graph."""
        self.check_gradient_arguments(job, "decentralized SGD")
        graph = MixingGraph(self.graph, job.size, job.rank, self.mix_every)
        if job.rank == 0 and isinstance(self.graph, str) and \
                self.graph.startswith("one-peer") and not graph.exact:
            warnings.warn(
                f"hvdx.Decentralized(graph={self.graph!r}) on {job.size} ranks: "
                "one-peer graphs average exactly only when the number of ranks is a "
                "power of two; consensus is slower here. Consider graph='static-exp'.",
                stacklevel=4)
        return graph

    def fingerprint_settings(self, job: Job, setup) -> List[Tuple[str, object]]:
        # The key keeps its old word: a mismatch names it, and scripts and tests that
        # read the message know it (the fingerprint is compared, never saved).
        return [("decentralized.topology", mixing_graphs.graph_name(self.graph)),
                ("decentralized.size", job.size),
                ("decentralized.order", self.order),
                ("decentralized.mix_every", self.mix_every),
                ("decentralized.global_every", self.global_every),
                ("decentralized.swa_start", self.swa_start),
                ("decentralized.swa_every", self.swa_every),
                ("decentralized.average_optimizer_state", self.average_optimizer_state)]

    def make_mixer(self, graph: "MixingGraph"):
        """The graph's mixer (:class:`hvdx.strategies.decentralized.mixer.GraphMixer`)."""
        from hvdx.strategies.decentralized.mixer import GraphMixer

        return GraphMixer(self, graph)

    def check_tape(self) -> None:
        """``DistributedGradientTape`` returns the gradients before the optimizer applies
        them, so it mixes before the update only: adapt-then-combine is refused (every
        rank gets here, after the cross-rank check of the order)."""
        if self.order == ADAPT_THEN_COMBINE and self.environment is not None:
            # HVDX_SYNC named the order (left out, the tape runs the other: tape_fit):
            # the fix is the variable's value, which hvdx's hook prints without a
            # traceback, once (a VariableError).
            from hvdx.environment_variables import refused
            from hvdx.strategies.decentralized.tape_fit import with_order

            raise refused(*self.environment, (
                "DistributedGradientTape can only mix before the update, so it runs "
                "order='combine_then_adapt' only; leave order out, or set "
                f"{self.environment[0]}=\"{with_order(self, COMBINE_THEN_ADAPT)}\""))
        if self.order == ADAPT_THEN_COMBINE:
            raise ValueError(
                "order='adapt_then_combine': DistributedGradientTape returns the "
                "gradients before the optimizer applies them, so it can only mix before "
                "the update; pass hvdx.Decentralized(..., order='combine_then_adapt') to "
                "the tape, or use hvdx.tensorflow.keras.DistributedOptimizer, which runs "
                "both orders")

    def mixes_at(self, step: int) -> bool:
        """Whether step ``step`` (0-based) mixes (``mix_every``)."""
        return (step + 1) % self.mix_every == 0

    def __repr__(self) -> str:
        if self.error is not None:
            return self.invalid_repr()
        graph = self.graph if isinstance(self.graph, str) else \
            mixing_graphs.graph_name(self.graph)
        return (f"Decentralized(graph={graph!r}, order={self.order!r}, "
                f"mix_every={self.mix_every}, global_every={self.global_every}, "
                f"swa_start={self.swa_start}, swa_every={self.swa_every}, "
                f"average_optimizer_state={self.average_optimizer_state})")


    @property
    def topology(self):
        """The old name of :attr:`graph` (a ``DeprecationWarning``)."""
        warnings.warn("hvdx.Decentralized.topology is deprecated; use .graph (the word "
                      "'topology' now means the racks only)", DeprecationWarning,
                      stacklevel=2)
        return self.graph


def _graph_or_old_name(graph, topology):
    """``graph``, or ``topology``, its old name, with a ``DeprecationWarning``; the
    default graph when neither is given. Both given: ``ValueError`` naming both."""
    if topology is None:
        return DEFAULT_GRAPH if graph is None else graph
    if graph is not None:
        raise ValueError(f"graph={_short(graph)} and topology={_short(topology)}: "
                         "topology is the old name of graph; give graph only")
    warnings.warn("hvdx.Decentralized(topology=...) is deprecated; use graph=... (the "
                  "same values; 'topology' now means the racks of the cluster)",
                  DeprecationWarning, stacklevel=4)
    return topology


def _short(value) -> str:
    """``repr(value)``, or a matrix's shape (a message names it, not its entries)."""
    if isinstance(value, str):
        return repr(value)
    shape = getattr(value, "shape", None)
    return f"<{'x'.join(map(str, shape))} matrix>" if shape else "<a matrix>"


class MixingGraph:
    """One rank's view of the graph: its neighbours and weights at every mixing step.

    The one place where a training step becomes a graph index: the mix at step ``t`` is
    mix ``t // mix_every`` (:func:`hvdx.core.mixing_graphs.mix_index`), so the index
    follows from the step counter a checkpoint holds. The sequence repeats with
    :attr:`period` mixes; each mix's neighbours are computed once.
    """

    def __init__(self, graph, n: int, rank: int, mix_every: int = 1):
        if not isinstance(graph, str):
            graph = mixing_graphs.check_mixing_matrix(graph, n, name="graph")
        self.graph = graph
        self.n = n
        self.rank = rank
        self.mix_every = mix_every
        self.period = mixing_graphs.period(graph, n)
        self.exact = mixing_graphs.is_exact(graph, n)
        self._cache: Dict[int, mixing_graphs.Neighbors] = {}

    @property
    def topology(self):
        """The old name of :attr:`graph` (a ``DeprecationWarning``): scripts read it as
        ``optimizer.hvdx_graph.topology``."""
        warnings.warn("MixingGraph.topology is deprecated; use .graph (the word "
                      "'topology' now means the racks only)", DeprecationWarning,
                      stacklevel=2)
        return self.graph

    def neighbors(self, step: int) -> "mixing_graphs.Neighbors":
        """Send-to and receive-from ranks with the weights of the mix at training step
        ``step`` (0-based, one that mixes)."""
        key = mixing_graphs.mix_index(step, self.mix_every) % self.period
        if key not in self._cache:
            self._cache[key] = mixing_graphs.neighbors(self.graph, self.n, self.rank, key)
        return self._cache[key]


#: Decentralized SGD's counters: the mixers' shared ones (:class:`hvdx.core.counters.MixingStats`),
#: under the name users and tests know.
DecentralizedStats = MixingStats
