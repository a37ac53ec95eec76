"""The PyTorch driver of every mixer (:mod:`hvdx.core.mixer_protocol`): it runs the
exchange a mixer asks for on torch tensors.

The parameter-mixing optimizer (:mod:`hvdx.torch.mixing_optimizer`) calls it around the
local step; at step ``t`` it asks the mixer for ``exchange(t, everyone)`` and runs it:

1. :class:`~hvdx.core.mixer_protocol.Everyone`, :class:`~hvdx.core.mixer_protocol.Group`:
   Horovod's ``grouped_allreduce_(op=Average)`` on the tensors themselves, one call per
   dtype, over all ranks or the group's process set (a group of one sends nothing);
2. :class:`~hvdx.core.mixer_protocol.Neighbours`: the tensors are packed into ONE fused
   host buffer per dtype family (float64, and float32 for every other floating dtype:
   :mod:`hvdx.core.fused_layout`) and exchanged by mpi4py non-blocking point-to-point
   on hvdx's duplicated communicator (:class:`hvdx.mpi.neighbor_exchange.FusedExchange`);
   the combination ``w_ii x_i + sum_j w_ij x_j`` is computed in the buffer's dtype,
   sources in rank order, and written back:

   - after the local step (adapt-then-combine), the exchange completes before
     ``step()`` returns (a model checkpoint taken after ``step()`` must hold the mixed
     parameters, and torch has no hook on a module's ``state_dict``);
   - with the mixer's ``combines_first`` (combine-then-adapt), the exchange of ``x_t``
     starts when step ``t - 1`` ends and completes in step ``t``'s ``step()``, so it
     runs during the forward and backward pass (forward pre-hooks poll it, because
     MPICH moves large messages only while some MPI call polls). The change
     ``sum_j w_ij (x_j - x_i)`` is added, so that a buffer a forward pass updated in
     the meantime (BatchNorm's running mean) keeps that update; a checkpoint then holds
     ``x_t`` unmixed, the step ``t`` and that change, which the resumed step applies;
3. :class:`~hvdx.core.mixer_protocol.Custom`: the mixer's ``mix`` on float copies on
   the host (numpy), written back;
4. :class:`~hvdx.core.mixer_protocol.Skip`: nothing.

Each step is counted by the mixer (``Mixer.count``).
"""

from __future__ import annotations

import atexit
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import horovod.torch as _hvd
import numpy as np
import torch

from hvdx.core.counters import MixingStats
from hvdx.core.mixer_protocol import (Custom, Everyone, Group, Mixer, Neighbours, Skip,
                                      mixed_arrays)
from hvdx.mpi.comm import world
from hvdx.mpi.neighbor_exchange import FusedExchange, consensus_distance
from hvdx.mpi.user_mixer_exchange import Peers
from hvdx.torch.host_buffers import family_dtype, pack, unpack

__all__ = ["MixingDriver", "average_over_all_ranks", "tensor_bytes"]

#: MPI tags of the fused buffers (float32 family, float64) on hvdx's communicator: a
#: mixer's :class:`Neighbours` exchange; :class:`Peers` uses its own for ``mix``.
_TAGS = {np.dtype(np.float32): 0x4876, np.dtype(np.float64): 0x4877}


class MixingDriver:
    """Runs one mixer's exchanges on torch tensors (module docstring), and keeps the
    schedule's position: ``step`` and ``swa_count`` (checkpointed with the mixer's
    :meth:`~hvdx.core.mixer_protocol.Mixer.state`)."""

    def __init__(self, sync, mixer: Mixer):
        self.sync = sync
        self.mixer = mixer
        mixer.bind(_hvd)  # collective where the mixer registers process sets
        if mixer.stats is None:
            mixer.stats = MixingStats()
        self.stats = mixer.stats
        self.step = 0
        self.swa_count = 0
        self.comm = world(_hvd.global_process_set)
        self.size = self.comm.Get_size()
        self._cta = bool(mixer.combines_first)
        self._peers: Optional[Peers] = None
        self._exchange = FusedExchange(self.comm, _TAGS)
        #: ``{family: torch view of the exchange's send buffer}`` (rebuilt with it).
        self._send: Dict[np.dtype, torch.Tensor] = {}
        #: ``(tensors, exchange)`` of the :class:`Neighbours` exchange in flight, and
        #: whether it arrived.
        self._pending: Optional[Tuple[List[torch.Tensor], Neighbours]] = None
        self._received = False
        self._hook = None
        #: ``(step, (layout, change))`` of a checkpoint taken with an exchange in flight.
        self._loaded_change = None
        # A combine-then-adapt run ends with its last exchange in flight: complete it
        # before MPI finalizes (every rank has the matching one in flight).
        _ALIVE.add(self)

    # --- the optimizer's calls (hvdx.torch.mixing_optimizer) -------------------------

    def before_step(self, tensors_of, step: int, everyone: bool) -> bool:
        """Combine-then-adapt: complete step ``step``'s mixing on ``tensors_of()``
        before the local step and say ``True``; else complete what is in flight."""
        if not self._cta:
            self.finish()  # no module forward ran since the last step: complete it now
            return False
        tensors = tensors_of()
        exchange = self.mixer.exchange(step, everyone)
        if isinstance(exchange, Neighbours):
            loaded, self._loaded_change = self._loaded_change, None
            if self._pending is None and loaded is not None and loaded[0] == step:
                self._apply_loaded_change(tensors, loaded[1])
                return True
            if self._pending is None:  # first step, or after loading or synchronizing
                self._start(tensors, exchange)
            self._complete(apply=True)
        else:
            self.discard()
            self._run(exchange, tensors, step)
        return True

    def mix(self, tensors: List[torch.Tensor], step: int, everyone: bool) -> None:
        """Adapt-then-combine: step ``step``'s mixing, completed here."""
        exchange = self.mixer.exchange(step, everyone)
        if isinstance(exchange, Neighbours):
            self._start(tensors, exchange)
            self._complete(apply=True)
        else:
            self._run(exchange, tensors, step)

    def after_step(self, tensors) -> None:
        """Combine-then-adapt: send ``x_{t+1}`` now; step ``t + 1`` combines it."""
        if not self._cta:
            return
        t = self.step
        exchange = self.mixer.exchange(t, self.sync.global_due(t))
        if isinstance(exchange, Neighbours):
            self._start(tensors, exchange)

    def finish(self) -> None:
        """Complete what must be visible before the parameters are read (idempotent)."""
        if self._pending is None:
            return
        if self._cta:
            self._wait()  # the combination is applied in the next step()
        else:
            self._complete(apply=True)

    def discard(self) -> None:
        """Complete anything in flight without applying it."""
        if self._pending is not None:
            self._complete(apply=False)

    def count_everyone(self, tensors: Sequence[torch.Tensor]) -> None:
        self.mixer.count(Everyone(), tensor_bytes(tensors), self.size)

    def state(self) -> Dict[str, object]:
        state = {"step": self.step}
        if self.sync.swa_start is not None:
            state["swa_count"] = self.swa_count
        own = dict(self.mixer.state())
        if self.mixer.state_entry is None:
            state.update(own)
        else:
            state[self.mixer.state_entry] = own
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
        entry = self.mixer.state_entry
        self.mixer.load_state(dict(state) if entry is None else
                              dict(state.get(entry) or {}))
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

    # --- the exchanges ----------------------------------------------------------------

    def _run(self, exchange, tensors: List[torch.Tensor], step: int) -> None:
        """Run a synchronous exchange (every kind but :class:`Neighbours`)."""
        if isinstance(exchange, Everyone):
            average_over_all_ranks(tensors, f"hvdx.{self.sync.name}.all")
            self.mixer.count(exchange, tensor_bytes(tensors), self.size)
        elif isinstance(exchange, Group):
            self.mixer.count(exchange, tensor_bytes(tensors), self.size)
            if len(exchange.ranks) >= 2:
                average_over_all_ranks(tensors, exchange.name, exchange.process_set)
        elif isinstance(exchange, Custom):
            self._custom(tensors, step)
        elif isinstance(exchange, Skip):
            self.mixer.count(exchange, 0, self.size)
        else:
            raise TypeError(f"{type(self.mixer).__qualname__}.exchange(step={step}) "
                            f"returned {exchange!r}, not an exchange of "
                            "hvdx.core.mixer_protocol")

    def _custom(self, tensors: List[torch.Tensor], step: int) -> None:
        if self._peers is None:
            self._peers = Peers(self.comm, self.stats)
            self._peers._what = f"{type(self.mixer).__qualname__}.matrix"
        arrays = [t.detach().to("cpu").numpy() if t.dtype != torch.bfloat16 else
                  t.detach().to("cpu", torch.float32).numpy() for t in tensors]
        mixed = mixed_arrays(self.mixer, step, arrays, self._peers)
        with torch.no_grad():
            for t, value in zip(tensors, mixed):
                t.copy_(torch.from_numpy(np.ascontiguousarray(value)).to(t.device, t.dtype))

    def _layout_for(self, tensors: Sequence[torch.Tensor]):
        """The fused layout of these tensors (built once; rebuilt if they change)."""
        previous = self._exchange.layout
        layout = self._exchange.layout_for((str(t.dtype), t.numel()) for t in tensors)
        if layout is not previous:
            self._send = {f: torch.from_numpy(b) for f, b in self._exchange.buffers.items()}
        return layout

    def _start(self, tensors: List[torch.Tensor], exchange: Neighbours) -> None:
        if self._pending is not None:
            self._complete(apply=False)
        neighbours = exchange.neighbours
        layout = self._layout_for(tensors)
        with torch.no_grad():
            for family, slots in layout.slots.items():
                pack([tensors[s.index] for s in slots], self._send[family])
        self._exchange.start(neighbours.send_to, neighbours.recv_from)
        self._pending = (tensors, exchange)
        self._received = False
        if self._hook is None and self._cta:
            self._hook = torch.nn.modules.module.register_module_forward_pre_hook(
                self._poll)

    def _wait(self) -> None:
        """Complete the exchange in flight; the combination waits in the exchange's
        ``mixed`` buffers."""
        if self._pending is None or self._received:
            return
        tensors, exchange = self._pending
        neighbours = exchange.neighbours
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        # Combine-then-adapt: the change, added to tensors a forward pass may have moved.
        traffic = self._exchange.finish(neighbours.self_weight, neighbours.recv_weights,
                                        change=self._cta)
        self.mixer.count(exchange, tensor_bytes(tensors), self.size, traffic)
        self._received = True

    def _complete(self, apply: bool) -> None:
        """Wait for the exchange in flight; with ``apply``, write the combination into
        the tensors."""
        self._wait()
        tensors, _ = self._pending
        self._pending = None
        if not apply:
            return
        for family, slots in self._exchange.layout.slots.items():
            unpack(torch.from_numpy(self._exchange.mixed[family]), tensors, slots,
                   add=self._cta)

    def _apply_loaded_change(self, tensors, loaded) -> None:
        """Add the change saved by :meth:`state` to the tensors, as :meth:`_complete`
        adds a received one."""
        saved, change = loaded
        layout = self._layout_for(tensors)
        if saved != layout.key:
            raise ValueError(f"the checkpoint's {self.sync.name} exchange was saved for "
                             f"other tensors ({len(saved)} of them) than this optimizer "
                             f"mixes ({len(layout.key)})")
        for family, slots in layout.slots.items():
            unpack(torch.from_numpy(change[str(family_dtype(family))]), tensors, slots,
                   add=True)

    def _poll(self, module, inputs):
        """Combine-then-adapt: let MPI move the exchange while the forward pass runs."""
        self._exchange.test()


#: Drivers whose exchange may be in flight at exit.
_ALIVE: "weakref.WeakSet[MixingDriver]" = weakref.WeakSet()


@atexit.register
def _discard_at_exit() -> None:
    for driver in list(_ALIVE):
        try:
            driver.discard()
        except Exception:  # pragma: no cover - MPI may be gone after an abort
            pass


def average_over_all_ranks(tensors: Sequence[torch.Tensor], name: str,
                           process_set=None) -> None:
    """Replace every tensor by its average over ``process_set`` (default all ranks):
    one Horovod grouped allreduce per dtype, in the given order."""
    process_set = process_set if process_set is not None else _hvd.global_process_set
    by_dtype: Dict[torch.dtype, List[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    with torch.no_grad():
        for dtype, same in by_dtype.items():
            _hvd.grouped_allreduce_(same, op=_hvd.Average,
                                    name=f"{name}.{str(dtype).replace('torch.', '')}",
                                    process_set=process_set)


def tensor_bytes(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of ``tensors`` in their own dtypes (what one copy of them weighs)."""
    return sum(t.numel() * t.element_size() for t in tensors)
