"""Decentralized SGD over a graph for PyTorch: local steps, then neighbour averaging.

The spec and the algorithm are :class:`hvdx.Decentralized` (Ying et al., arXiv
2110.13363); the numpy reference is
:func:`hvdx.strategies.decentralized.core_reference.simulate_decentralized`. The optimizer is the
shared parameter-mixing wrapper (:mod:`hvdx.torch.mixing_optimizer`) with the :class:`GraphMixer`
below, which sends every mixed tensor in ONE fused contiguous buffer per step (one per dtype family:
float64, and float32 for every other floating dtype: :mod:`hvdx.core.fused_layout`) by
mpi4py non-blocking point-to-point on hvdx's duplicated communicator
(:mod:`hvdx.mpi.neighbor_exchange`):

1. start: copy the tensors into the fused send buffer (host memory: a CUDA tensor is
   copied to the host), post the receives from the step's in-neighbours and the sends
   to its out-neighbours;
2. adapt-then-combine: the exchange starts as soon as the local step is done and
   completes before ``step()`` returns (a model checkpoint taken after ``step()`` must
   hold the mixed parameters, and torch has no hook on a module's ``state_dict``);
   combine-then-adapt: the exchange of ``x_t`` starts when step ``t - 1`` ends and
   completes in step ``t``'s ``step()``, so it runs during the forward and backward
   pass (forward pre-hooks poll it, because MPICH moves large messages only while some
   MPI call polls; ``MPIR_CVAR_ASYNC_PROGRESS=1`` gives MPICH a progress thread). A
   checkpoint then holds ``x_t`` unmixed, the step ``t`` and the change that
   exchange brings (received while the checkpoint is taken); the resumed step ``t``
   applies that change, as the uninterrupted run does;
3. combine: ``w_ii x_i + sum_j w_ij x_j`` in the buffer's dtype, sources in rank order,
   written back into the tensors (adapt-then-combine: copied; combine-then-adapt: the
   change ``sum_j w_ij (x_j - x_i)`` is added, so that a buffer a forward pass updated
   in the meantime, such as BatchNorm's running mean, keeps that update).
"""

from __future__ import annotations

import atexit
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import horovod.torch as _hvd

from hvdx.core.group_averaging import COMBINE_THEN_ADAPT
from hvdx.mpi.comm import world
from hvdx.mpi.neighbor_exchange import FusedExchange, consensus_distance
from hvdx.strategies.decentralized.spec import Decentralized, DecentralizedStats, MixingGraph
from hvdx.torch.host_buffers import family_dtype, pack, unpack
from hvdx.torch.mixing_optimizer import (average_over_all_ranks, make_mixing_optimizer,
                                         tensor_bytes)

__all__ = ["DecentralizedStats", "GraphMixer", "STATE_KEY", "adapter",
           "make_decentralized_optimizer"]

#: Key of the decentralized entry in ``state_dict()``.
STATE_KEY = "hvdx_decentralized"

#: MPI tags of the fused buffers (float32 family, float64): hvdx's communicator only.
_TAGS = {np.dtype(np.float32): 0x4876, np.dtype(np.float64): 0x4877}


def make_decentralized_optimizer(optimizer, named_parameters, sync: Decentralized,
                                 graph: MixingGraph, named_buffers=None):
    """An instance of a class made at run time from ``optimizer``'s class.

    ``isinstance(result, type(optimizer))`` holds.
    """
    mixer = GraphMixer(sync, graph, world(_hvd.global_process_set))
    return make_mixing_optimizer(optimizer, named_parameters, sync, mixer, named_buffers,
                                 STATE_KEY, _DecentralizedMethods)


class _DecentralizedMethods:
    """The decentralized optimizer's own members."""

    def consensus_distance(self) -> float:
        """``sqrt(mean_i ||x_i - mean_j x_j||^2)`` over the parameters (collective): how
        far the ranks' models are apart (0 after ``synchronize_parameters()``)."""
        self._hvdx_mixer.finish()
        return self._hvdx_mixer.consensus_distance(self._hvdx_params())

    @property
    def hvdx_graph(self) -> MixingGraph:
        """This rank's :class:`~hvdx.strategies.decentralized.spec.MixingGraph`."""
        return self._hvdx_mixer.graph


class GraphMixer:
    """The mixer of :class:`hvdx.Decentralized` (see the module docstring)."""

    def __init__(self, sync: Decentralized, graph: MixingGraph, comm):
        self.sync = sync
        self.graph = graph
        self.comm = comm
        self.stats = DecentralizedStats()
        self.step = 0
        self.swa_count = 0
        self._cta = sync.order == COMBINE_THEN_ADAPT
        self._exchange = FusedExchange(comm, _TAGS)
        #: ``{family: torch view of the exchange's send buffer}`` (rebuilt with it).
        self._send: Dict[np.dtype, torch.Tensor] = {}
        #: ``(tensors, neighbours)`` of the exchange in flight, and whether it arrived.
        self._pending: Optional[Tuple[List[torch.Tensor], object]] = None
        self._received = False
        self._hook = None
        #: ``(step, (layout, change))`` of a checkpoint taken with an exchange in flight.
        self._loaded_change = None
        # A combine-then-adapt run ends with its last exchange in flight: complete it
        # before MPI finalizes (every rank has the matching one in flight).
        _ALIVE.add(self)

    # --- the mixer protocol (hvdx.torch.mixing_optimizer) ---------------------------

    def before_step(self, tensors_of, step: int, everyone: bool) -> bool:
        if not self._cta:
            self.finish()  # no module forward ran since the last step: complete it now
            return False
        tensors = tensors_of()
        if everyone:
            self.discard()
            self._average_all(tensors)
        elif self.sync.mixes_at(step):
            loaded, self._loaded_change = self._loaded_change, None
            if self._pending is None and loaded is not None and loaded[0] == step:
                self._apply_loaded_change(tensors, loaded[1])
                return True
            if self._pending is None:  # first step, or after loading or synchronizing
                self._start(tensors, step)
            self._complete(apply=True)
        return True

    def mix(self, tensors, step: int, everyone: bool) -> None:
        if everyone:
            self._average_all(tensors)
        elif self.sync.mixes_at(step):
            # Completed before step() returns: a checkpoint of the model taken after
            # step() must hold the mixed parameters (torch offers no hook on a module's
            # state_dict through which an exchange in flight could be completed).
            self._start(tensors, step)
            self._complete(apply=True)

    def after_step(self, tensors) -> None:
        # Combine-then-adapt: send x_{t+1} now; step t+1 combines it.
        t = self.step
        if self._cta and self.sync.mixes_at(t) and \
                not self.sync.global_due(t):
            self._start(tensors, t)

    def finish(self) -> None:
        if self._pending is None:
            return
        if self._cta:
            self._wait()  # the combination is applied in the next step()
        else:
            self._complete(apply=True)

    def discard(self) -> None:
        if self._pending is not None:
            self._complete(apply=False)

    def count_everyone(self, tensors: Sequence[torch.Tensor]) -> None:
        self.stats.add_everyone(tensor_bytes(tensors), self.graph.n)

    def state(self) -> Dict[str, object]:
        state = {"step": self.step}
        if self.sync.swa_start is not None:
            state["swa_count"] = self.swa_count
        if self._cta and self._pending is not None:
            # Combine-then-adapt: the exchange of x_t is in flight and step t applies
            # its change. A resumed run cannot redo it: the forward pass that ran before
            # step() has moved the buffers (BatchNorm's running mean) since x_t was
            # sent. Save the change itself, so that the resumed step applies the same.
            self._wait()
            state["change"] = {str(family_dtype(f)): torch.from_numpy(mixed.copy())
                               for f, mixed in self._exchange.mixed.items()}
            state["layout"] = [list(entry) for entry in self._exchange.layout.key]
        return state

    def load_state(self, state) -> None:
        self.discard()
        self.step = int(state["step"])
        self.swa_count = int(state.get("swa_count", 0))
        self._loaded_change = None
        if state.get("change") is not None:
            layout = tuple((str(name), int(count)) for name, count in state["layout"])
            change = {name: np.asarray(t.numpy() if torch.is_tensor(t) else t)
                      for name, t in state["change"].items()}
            self._loaded_change = (self.step, (layout, change))

    def consensus_distance(self, params: Sequence[torch.Tensor]) -> float:
        """Collective over hvdx's communicator (float64 on the host)."""
        x = np.concatenate([p.detach().to("cpu", torch.float64).reshape(-1).numpy()
                            for p in params]) if params else np.zeros(0)
        return consensus_distance(self.comm, x)

    # --- internals --------------------------------------------------------------------

    def _average_all(self, tensors) -> None:
        average_over_all_ranks(tensors, "hvdx.decentralized.all")
        self.count_everyone(tensors)

    def _layout_for(self, tensors: Sequence[torch.Tensor]):
        """The fused layout of these tensors (built once; rebuilt if they change)."""
        previous = self._exchange.layout
        layout = self._exchange.layout_for((str(t.dtype), t.numel()) for t in tensors)
        if layout is not previous:
            self._send = {f: torch.from_numpy(b) for f, b in self._exchange.buffers.items()}
        return layout

    def _start(self, tensors: List[torch.Tensor], step: int) -> None:
        if self._pending is not None:
            self._complete(apply=False)
        neighbours = self.graph.neighbors(step)
        layout = self._layout_for(tensors)
        with torch.no_grad():
            for family, slots in layout.slots.items():
                pack([tensors[s.index] for s in slots], self._send[family])
        self._exchange.start(neighbours.send_to, neighbours.recv_from)
        self._pending = (tensors, neighbours)
        self._received = False
        if self._hook is None and self._cta:
            self._hook = torch.nn.modules.module.register_module_forward_pre_hook(
                self._poll)

    def _wait(self) -> None:
        """Complete the exchange in flight; the combination waits in the exchange's
        ``mixed`` buffers."""
        if self._pending is None or self._received:
            return
        _, neighbours = self._pending
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        # Combine-then-adapt: the change, added to tensors a forward pass may have moved.
        self.stats.record(*self._exchange.finish(neighbours.self_weight,
                                                 neighbours.recv_weights, change=self._cta))
        self._received = True

    def _complete(self, apply: bool) -> None:
        """Wait for the exchange in flight; with ``apply``, write the combination into
        the tensors (step 3 of the module docstring)."""
        self._wait()
        tensors, _ = self._pending
        self._pending = None
        if not apply:
            return
        for family, slots in self._exchange.layout.slots.items():
            unpack(torch.from_numpy(self._exchange.mixed[family]), tensors, slots,
                   add=self._cta)

    def _apply_loaded_change(self, tensors, loaded) -> None:
        """Add the change saved by :meth:`state` to the tensors (step 3, as
        :meth:`_complete` adds a received one)."""
        saved, change = loaded
        layout = self._layout_for(tensors)
        if saved != layout.key:
            raise ValueError("the checkpoint's decentralized exchange was saved for "
                             f"other tensors ({len(saved)} of them) than this optimizer "
                             f"mixes ({len(layout.key)})")
        for family, slots in layout.slots.items():
            unpack(torch.from_numpy(change[str(family_dtype(family))]), tensors, slots,
                   add=True)

    def _poll(self, module, inputs):
        """Combine-then-adapt: let MPI move the exchange while the forward pass runs."""
        self._exchange.test()


#: Mixers whose exchange may be in flight at exit.
_ALIVE: "weakref.WeakSet[GraphMixer]" = weakref.WeakSet()


@atexit.register
def _discard_at_exit() -> None:
    for mixer in list(_ALIVE):
        try:
            mixer.discard()
        except Exception:  # pragma: no cover - MPI may be gone after an abort
            pass


def adapter(optimizer, sync: Decentralized, plan, args):
    """Decentralized SGD's adapter in :mod:`hvdx.torch.registry` (the catalogue names
    it)."""
    return make_decentralized_optimizer(optimizer, args.named_parameters, sync, plan,
                                        args.named_buffers)
