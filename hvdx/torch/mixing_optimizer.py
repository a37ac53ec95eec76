"""The PyTorch wrapper shared by every parameter-mixing strategy (DS-Sync, graphs).

After PyTorch's ``PostLocalSGDOptimizer`` / ``ModelAverager`` split: the wrapper takes a
local optimizer step, then hands the parameters to a *mixer* that averages them with
other ranks. The wrapper knows nothing of how a mixer averages; a mixer knows nothing of
optimizers. What every mixing strategy shares lives here, once:

1. ``step()``: the wrapped optimizer's own step on the local gradients (no gradient
   communication); a mixer that mixes before the local step ("combine-then-adapt")
   first completes its exchange of the current parameters;
2. the tensors to mix, in one fixed order on every rank: the parameters, then (with
   ``average_optimizer_state``) their optimizer state tensors, then the floating-point
   buffers given as ``named_buffers`` (BatchNorm running statistics);
3. every ``global_every``-th step (:meth:`hvdx.strategy_contract.MixingStrategy.global_due`)
   an average over all ranks instead of mixing; otherwise the mixer's step, which may
   stay in flight until the parameters are next read (the mixer says when it must
   complete);
4. with ``swa_start``, the mixed parameters join this rank's SWA running mean (Izmailov
   et al., arXiv 1803.05407), which ``synchronize_parameters(swa=True)`` finally
   averages over all ranks into the parameters;
5. ``t += 1``; ``state_dict()`` holds ``t``, the SWA mean and the mixer's state under
   the strategy's key, so a resumed run continues the same schedule.

The mixer is framework-neutral (:class:`hvdx.core.mixer_protocol.Mixer`: DS-Sync's,
the graphs', a user's); :class:`hvdx.torch.mixing_driver.MixingDriver` runs the
exchanges it asks for on the tensors and keeps the step counter and the SWA count.
"""

from __future__ import annotations

import contextlib
from typing import Dict, List, Optional, Sequence

import horovod.torch as _hvd
import torch

from hvdx.core.group_averaging import running_mean
from hvdx.strategy_contract import MixingStrategy
from hvdx.torch.finite import first_nonfinite
from hvdx.torch.mixing_driver import MixingDriver, average_over_all_ranks
from hvdx.torch.wrapping import subclass_of

__all__ = ["adapter", "make_mixing_optimizer", "mixed_tensors"]


def adapter(optimizer, sync: MixingStrategy, setup, args):
    """Every mixing strategy's adapter in :mod:`hvdx.torch.registry` (the catalogue
    names it): the shared optimizer with the spec's own mixer
    (:meth:`hvdx.strategy_contract.MixingStrategy.make_mixer`). Collective where the mixer
    registers process sets."""
    return make_mixing_optimizer(optimizer, args.named_parameters, sync,
                                 sync.make_mixer(setup), args.named_buffers)


def make_mixing_optimizer(optimizer, named_parameters, sync: MixingStrategy, mixer,
                          named_buffers):
    """An instance of a class made at run time from ``optimizer``'s class, mixing with
    ``mixer`` (:class:`hvdx.core.mixer_protocol.Mixer`) after each local step.

    ``isinstance(result, type(optimizer))`` holds. The class also shows the mixer's
    :attr:`~hvdx.core.mixer_protocol.Mixer.views` (``hvdx_graph``, ``hvdx_groups``).
    """
    namespace = dict(_MixingOptimizer.__dict__)
    for name, attribute in type(mixer).views.items():
        namespace[name] = property(
            lambda self, a=attribute: getattr(self._hvdx_mixer.mixer, a),
            doc=f"The mixer's ``{attribute}`` (read-only).")
    cls = subclass_of(optimizer, type("_Methods", (), namespace))
    driver = MixingDriver(sync, mixer)
    return cls(optimizer.param_groups, sync, driver, named_buffers, sync.state_key)


class _MixingOptimizer:
    """Methods copied into the run-time class; ``self._hvdx_base`` is the user's class."""

    def __init__(self, params, sync, mixer, named_buffers, state_key):
        self._hvdx_base.__init__(self, params)
        self._hvdx_sync = sync
        self._hvdx_mixer = mixer
        self._hvdx_state_key = state_key
        self.hvdx_stats = mixer.stats
        self._hvdx_buffers = [b for _, b in (named_buffers or ())
                              if torch.is_tensor(b) and b.is_floating_point()]
        #: SWA running mean of the parameters (created at the first sample).
        self._hvdx_swa: Optional[List[torch.Tensor]] = None
        #: Per parameter, whether every rank holds its optimizer state (agreed).
        self._hvdx_everywhere: Optional[List[bool]] = None

    # --- what it shows of its strategy (read-only) ----------------------------------

    hvdx_strategy = property(lambda self: self._hvdx_sync,
                             doc="The spec this optimizer runs: the user's ``hvdx.DSSync`` "
                             "or ``hvdx.Decentralized``.")

    def finish_mixing(self) -> None:
        """Complete the mixing step still in flight, with no collective of its own:
        adapt-then-combine applies it, combine-then-adapt receives it (the next
        ``step()`` combines it). Idempotent; nothing to do for DS-Sync."""
        self._hvdx_mixer.finish()

    def consensus_distance(self) -> float:
        """``sqrt(mean_i ||x_i - mean_j x_j||^2)`` over the parameters (collective): how
        far the ranks' models are apart (0 after ``synchronize_parameters()``)."""
        self._hvdx_mixer.finish()
        return self._hvdx_mixer.consensus_distance(self._hvdx_params())

    # --- the public surface of Horovod's optimizer -----------------------------------

    def set_backward_passes_per_step(self, passes):
        """Accepted for compatibility: parameter mixing sends no gradients."""
        if passes <= 0:
            raise ValueError("backward_passes_per_step must be > 0")

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Accepted for compatibility: there is no gradient synchronization to skip.

        Hence no Horovod warning for ``step()`` after :meth:`synchronize` outside this
        context: ``step()`` never synchronizes gradients here, so nothing is done twice.
        """
        yield

    def synchronize(self):
        """Complete a mixing step still in flight (it completes by itself before the
        parameters are next read by a module's forward), and agree on overflow.

        Mixed precision: ``GradScaler`` skips ``step()`` on a rank whose gradients
        overflowed, and a group or a neighbour would wait for that rank forever. Horovod's
        AMP recipe calls ``optimizer.synchronize()`` before ``scaler.step(optimizer)``
        (inside ``optimizer.skip_synchronize()``); here that call agrees across ranks
        (one small allreduce): if any rank's gradients hold an inf or NaN, every rank's
        do (one entry is set to inf), so every rank's scaler skips the same step and
        lowers its scale alike.
        """
        self._hvdx_mixer.finish()
        grads = [p.grad for p in self._hvdx_params() if p.grad is not None]
        overflow = first_nonfinite(grads) < len(grads)
        flag = torch.tensor([int(overflow)], dtype=torch.int32)
        anyone = int(_hvd.allreduce(flag, op=_hvd.Max,
                                    name=f"hvdx.{self._hvdx_sync.name}.overflow")[0])
        if anyone and not overflow and grads:
            with torch.no_grad():
                grads[0].view(-1)[0] = float("inf")

    def step(self, closure=None):
        """Local step, then mixing (module docstring)."""
        mixer = self._hvdx_mixer
        t = mixer.step
        everyone = self._hvdx_sync.global_due(t)
        mixed_before = mixer.before_step(self._hvdx_tensors, t, everyone)
        loss = self._hvdx_base.step(self, closure)
        # After the local step: the optimizer's state tensors exist from the first step.
        tensors = self._hvdx_tensors()
        if not mixed_before:
            mixer.mix(tensors, t, everyone)
        if self._hvdx_sync.swa_due(t):
            mixer.finish()
            self._hvdx_swa_sample()
        mixer.step = t + 1
        mixer.after_step(tensors)
        return loss

    def synchronize_parameters(self, swa: bool = False):
        """Average parameters (and state and buffers, if configured) over all ranks now
        (collective). Does not advance the schedule.

        Args:
            swa: first replace every rank's parameters by its SWA running mean
                (``swa_start=...``), so the result is the final SWA-style merge: the mean
                over ranks and sampled steps. Call it once, after training.

        Raises:
            ValueError: ``swa=True`` before the first sample (or without ``swa_start``),
                on every rank alike (every rank counts the same steps).
        """
        mixer = self._hvdx_mixer
        mixer.discard()
        if swa:
            if not mixer.swa_count:
                raise ValueError(
                    "synchronize_parameters(swa=True): no SWA sample yet; set "
                    f"swa_start=... and train past it (swa_start="
                    f"{self._hvdx_sync.swa_start}, step {mixer.step})")
            with torch.no_grad():
                for p, mean in zip(self._hvdx_params(), self._hvdx_swa):
                    p.copy_(mean)
        tensors = self._hvdx_tensors()
        average_over_all_ranks(tensors, f"hvdx.{self._hvdx_sync.name}.all")
        mixer.count_everyone(tensors)

    # --- state ----------------------------------------------------------------------

    def state_dict(self):
        # The saved parameters are the mixed ones: complete an adapt-then-combine step
        # in flight (a combine-then-adapt one is redone after loading).
        self._hvdx_mixer.finish()
        state = self._hvdx_base.state_dict(self)
        entry = self._hvdx_mixer.state()
        if self._hvdx_swa is not None:
            entry["swa"] = [t.clone() for t in self._hvdx_swa]
        state[self._hvdx_state_key] = entry
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        entry = state_dict.pop(self._hvdx_state_key, None)
        self._hvdx_mixer.discard()
        self._hvdx_everywhere = None  # the loaded state may differ: agree again
        self._hvdx_base.load_state_dict(self, state_dict)
        if entry is not None:
            self._hvdx_mixer.load_state(entry)
            if entry.get("swa") is not None:
                self._hvdx_swa = [t.detach().clone().to(p.device)
                                  for t, p in zip(entry["swa"], self._hvdx_params())]

    def _hvdx_local_step(self, closure=None):
        """The wrapped optimizer's own step, with no mixing and no communication."""
        return self._hvdx_base.step(self, closure)

    def _hvdx_broadcast_shared(self, root_rank):
        """Give every rank ``root_rank``'s position in the schedule (step, SWA count,
        DS-Sync's adapted rotation) and SWA mean; collective.

        A combine-then-adapt graph's saved change of the parameters is dropped on every
        rank: it belongs to the parameters a rank had, and every rank now has the root's
        (``broadcast_parameters``); the next step starts its exchange afresh.
        """
        entry = self._hvdx_mixer.state()
        entry.pop("change", None)
        entry.pop("layout", None)
        if self._hvdx_swa is not None:
            entry["swa"] = [t.detach().cpu() for t in self._hvdx_swa]
        entry = _hvd.broadcast_object(entry, root_rank,
                                      name=f"hvdx.{self._hvdx_sync.name}.shared_state")
        swa = entry.pop("swa", None)
        self._hvdx_mixer.load_state(entry)
        self._hvdx_swa = None if swa is None else [
            t.clone().to(p.device) for t, p in zip(swa, self._hvdx_params())]

    # --- internals ------------------------------------------------------------------

    def _hvdx_params(self) -> List[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]
                if p.requires_grad]

    def _hvdx_swa_sample(self):
        """Add the mixed parameters to the SWA running mean."""
        params = self._hvdx_params()
        if self._hvdx_swa is None:
            self._hvdx_swa = [torch.zeros_like(p) for p in params]
        count = self._hvdx_mixer.swa_count
        with torch.no_grad():
            for mean, p in zip(self._hvdx_swa, params):
                mean.copy_(running_mean(mean, count, p))
        self._hvdx_mixer.swa_count = count + 1

    def _hvdx_tensors(self) -> List[torch.Tensor]:
        """Step 2 of the module docstring."""
        params = self._hvdx_params()
        with_state = self._hvdx_sync.average_optimizer_state
        return mixed_tensors(params, self.state, with_state, self._hvdx_buffers,
                             self._hvdx_state_everywhere(params) if with_state else None)

    def _hvdx_state_everywhere(self, params) -> List[bool]:
        """Per parameter, whether every rank holds its optimizer state (collective until
        all do). A parameter without a gradient on one rank has no state there yet (SGD
        creates its momentum at its first update); mixing it only where it exists would
        give the ranks different tensor lists, and the exchange would wait forever."""
        known = getattr(self, "_hvdx_everywhere", None)
        if known is not None and len(known) == len(params) and all(known):
            return known  # state is never dropped: no more agreement needed
        mine = torch.tensor([int(bool(_state_tensors(p, self.state.get(p, {}))))
                             for p in params], dtype=torch.int32)
        agreed = _hvd.allreduce(mine, op=_hvd.Min,
                                name=f"hvdx.{self._hvdx_sync.name}.state_present")
        self._hvdx_everywhere = [bool(v) for v in agreed.tolist()]
        return self._hvdx_everywhere


def mixed_tensors(params: Sequence[torch.Tensor], optimizer_state,
                  with_state: bool, buffers: Sequence[torch.Tensor],
                  everywhere: Optional[Sequence[bool]] = None) -> List[torch.Tensor]:
    """Parameters, then (optionally) their state tensors, then buffers, in a fixed
    order (the optimizer's parameter order, the state's keys sorted). ``everywhere``:
    per parameter, whether to take its state (every rank holds it); all when None."""
    tensors = [p.data for p in params]
    if with_state:
        for i, p in enumerate(params):
            if everywhere is None or everywhere[i]:
                tensors += _state_tensors(p, optimizer_state.get(p, {}))
    return tensors + [b.data for b in buffers]


def _state_tensors(p: torch.Tensor, state) -> List[torch.Tensor]:
    """``p``'s state tensors shaped like it (momentum, Adam's moments), keys sorted."""
    return [state[key] for key in sorted(state)
            if key != "step" and torch.is_tensor(state[key]) and
            state[key].is_floating_point() and state[key].shape == p.shape]
