"""A registered mixer (:mod:`hvdx.mixer_registry`) for PyTorch.

The optimizer is the parameter-mixing strategies' shared wrapper
(:mod:`hvdx.torch.mixing_optimizer`: the local step, ``global_every``, the SWA merge,
``synchronize_parameters``, the optimizer state, the step counter in ``state_dict()``)
with :class:`UserMixer` below, which hands the tensors to the user's mixer as numpy
arrays (float copies on the host) and writes its result back. Adapt-then-combine:
the mix completes inside ``step()``.
"""

from __future__ import annotations

from typing import List, Sequence

import horovod.torch as _hvd
import numpy as np
import torch

from hvdx.core.counters import MixingStats
from hvdx.mixer_registry import UserMixing
from hvdx.mpi.comm import world
from hvdx.mpi.user_mixer_exchange import Peers
from hvdx.torch.mixing_optimizer import (MixerDefaults, average_over_all_ranks,
                                         make_mixing_optimizer, tensor_bytes)

__all__ = ["STATE_KEY", "UserMixer", "adapter"]

#: Key of the mixer's entry in ``state_dict()``.
STATE_KEY = "hvdx_mixer"


class UserMixer(MixerDefaults):
    """The torch mixer protocol (:mod:`hvdx.torch.mixing_optimizer`) around a user's
    :class:`hvdx.Mixer`."""

    def __init__(self, sync: UserMixing, comm):
        self.sync = sync
        self.stats = MixingStats()
        self.peers = Peers(comm, self.stats)
        self.peers._what = f"{type(sync.mixer).__qualname__}.matrix"
        self.step = 0
        self.swa_count = 0

    def mix(self, tensors: List[torch.Tensor], step: int, everyone: bool) -> None:
        if everyone:
            average_over_all_ranks(tensors, f"hvdx.{self.sync.name}.all")
            self.count_everyone(tensors)
            return
        arrays = [t.detach().to("cpu").numpy() if t.dtype != torch.bfloat16 else
                  t.detach().to("cpu", torch.float32).numpy() for t in tensors]
        mixed = self.sync.mixed(step, arrays, self.peers)
        with torch.no_grad():
            for t, value in zip(tensors, mixed):
                t.copy_(torch.from_numpy(np.ascontiguousarray(value)).to(t.device, t.dtype))

    def count_everyone(self, tensors: Sequence[torch.Tensor]) -> None:
        self.stats.add_everyone(tensor_bytes(tensors), self.peers.size)

    def state(self):
        state = {"step": self.step, "mixer": dict(self.sync.mixer.state())}
        if self.sync.swa_start is not None:
            state["swa_count"] = self.swa_count
        return state

    def load_state(self, state) -> None:
        self.step = int(state["step"])
        self.swa_count = int(state.get("swa_count", 0))
        self.sync.mixer.load_state(dict(state.get("mixer") or {}))


def adapter(optimizer, sync: UserMixing, plan, args):
    """A registered mixer's adapter in :mod:`hvdx.torch.registry` (the catalogue names
    it for every registered mixer)."""
    mixer = UserMixer(sync, world(_hvd.global_process_set))
    return make_mixing_optimizer(optimizer, args.named_parameters, sync, mixer,
                                 args.named_buffers, STATE_KEY)
