"""Stanza for PyTorch: conv workers train the feature extractor, FC workers the head.

Stanza (Wu, Xu, Li, Xiong, "Layer Separation for Distributed Training in Deep
Learning", arXiv 1812.10624): in a CNN most bytes are in the fully connected head and
most compute in the feature extractor, so most ranks (the ``S`` *conv workers*) train
only the features and a few (the ``F`` *FC workers*, the last ``F`` ranks) only the
head; head parameters and gradients never travel to a conv worker. Roles and scaling:
:mod:`hvdx.strategies.stanza.core_roles`; messages: :mod:`hvdx.strategies.stanza.mpi_exchange`;
the step's protocol, the same in TensorFlow: :mod:`hvdx.strategies.stanza.mpi_step`; the
trainer's life (construction, step, whole model): :mod:`hvdx.strategies.stanza.mpi_trainer`.
This module holds PyTorch's hooks for the modules, the optimizer and the checkpoint;
:mod:`hvdx.strategies.stanza.torch.passes` the passes on tensors. One
:meth:`Stanza.step`, called on every rank:

1. conv worker ``i``: ``a_i = features(x_i)`` on its ``b_i`` samples; ``a_i`` and the
   labels go (host memory, non-blocking) to its FC worker;
2. FC worker ``k``: receives the activations of the conv workers it serves and
   concatenates them in rank order; the FC workers sum their counts into the global
   batch ``B = sum_i b_i``;
3. FC worker: ``loss = sum_i (b_i / B) * loss_fn(head(a)[i], y_i)``, backward: its head
   gradient is ``1 / B`` times the sum over its samples, and the activation gradient
   ``dloss / da_i`` already carries ``1 / B``; it returns each conv worker its slice
   (and the mean loss over its samples);
4. conv worker: ``a_i.backward(dloss / da_i)``: ``1 / B`` times the sum over its
   samples of the features' gradients;
5. the conv workers SUM their feature gradients, the FC workers SUM their head
   gradients (one fused host buffer per dtype, ``MPI_Allreduce`` on a communicator per
   role). Both sums are then the gradient of the mean loss over the global batch:
   averaging instead would give ``1 / S`` (``1 / F``) of it. A parameter that got no
   gradient on some ranks of the role (``grad`` is ``None``: a branch not taken) is
   summed as zeros there, as Horovod's allreduce does; one that got none on ANY rank
   of the role keeps ``grad = None`` on every rank of it. The ranks agree on which
   through one presence flag per parameter, summed in the same allreduce (no message
   of its own);
6. every rank's optimizer steps; parameters without a gradient (the other role's, and
   those no rank of the role had one for) are skipped, so that momentum and weight
   decay leave them as they are, as in single-process training. With ``loss_fn`` a
   mean over samples, the parameters equal single-process training on the
   concatenated global batch (up to rounding).

Overlap: the FC workers' sum (step 5) runs while the conv workers run their backward
pass (step 4). With ``micro_batches=m > 1`` a conv worker splits its batch into ``m``
parts and runs every forward pass, sending each part's activations as soon as they
exist, before any backward pass: its FC worker runs the head on part ``k`` while the
conv worker computes part ``k + 1``, and the conv worker runs part ``k``'s backward pass
while the FC worker still works on the later ones (as in pipeline parallelism). The
conv workers first send their batch sizes (8 bytes each), so that the FC workers know
the global batch ``B`` before they weigh any loss; the weights stay ``b / B`` per part
and gradients add up over the parts, so the step is the same SGD step (up to rounding).

Start: every rank must build the same model (checked, like ``DistributedOptimizer``);
the conv workers then take rank 0's features and the FC workers rank 0's head (one
broadcast each), as ``hvd.broadcast_parameters(..., root_rank=0)`` would: the model
trained is rank 0's. Buffers (BatchNorm statistics) are broadcast at the start only,
then kept per rank.

Checks that cannot hang: bad arguments (``fc_workers``, a head with no parameters, a
model that differs between ranks) raise the same ``ValueError`` on every rank at
construction. The first step checks the data: conv workers whose activations or
labels differ in per-sample shape or dtype, or a head that cannot take the
activations (it runs on the real activations, so no input shape is needed in advance),
raise the same ``ValueError`` on every rank, naming the shapes. From then on the
per-sample shapes are fixed (the batch size may change); a conv worker that passes
another shape raises alone, and ``hvd.init()``'s abort-on-error ends the job.

Example::

    model = nn.Sequential(conv_layers, nn.Flatten(), nn.Linear(4096, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = hvdx.torch.Stanza(model, split=2, optimizer=opt, fc_workers=1)
    for x, y in loader:               # shard the data over trainer.roles.conv_ranks
        loss = trainer.step(x, y)     # FC ranks: trainer.step() (x and y unused)
    full = trainer.full_model(rank=0) # nn.Sequential on rank 0, None elsewhere
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Union

import horovod.torch as _hvd
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from hvdx.mpi import communicator_for
from hvdx.strategies.stanza.core_checks import check_parts, layout_error
from hvdx.strategies.stanza.core_roles import CONV, FC
from hvdx.strategies.stanza.mpi_exchange import StanzaStats
from hvdx.strategies.stanza.mpi_trainer import StanzaTrainer
from hvdx.strategies.stanza.torch.passes import TorchPasses, trainable, what

__all__ = ["FORMAT", "Stanza", "StanzaStats"]

#: The ``format`` entry of :meth:`Stanza.state_dict`.
FORMAT = "hvdx-stanza-1"


class Stanza(StanzaTrainer):
    """Layer-separated training (module docstring). Collective: build it on every rank.

    Args:
        features: the feature extractor (``nn.Module``), trained by the conv workers;
            or an ``nn.Sequential`` holding the whole model, with ``split=``.
        head: the head (``nn.Module``), trained by the FC workers; ``None`` with
            ``split=``.
        optimizer: a ``torch.optim.Optimizer`` over the parameters of both parts (each
            rank steps only those of its role: the others have no gradient).
        loss_fn: ``loss_fn(head_output, labels)``: the mean over the samples given
            (PyTorch's default ``reduction="mean"``), which step 3 rescales.
        fc_workers: ``F``, from 1 to ``size // 2``; the last ``F`` ranks. Or ``"auto"``:
            the smallest ``F`` whose FC side keeps up with the conv side
            (:func:`hvdx.strategies.stanza.core_roles.auto_fc_workers`), from a probe at
            construction that times copies of both parts forward and backward on
            ``example`` (rank 0 prints the figures and the choice; :attr:`probe`).
        split: with a ``Sequential`` ``features``: its layers ``[:split]`` are the
            features and ``[split:]`` the head (the same modules, so an optimizer over
            ``model.parameters()`` holds them); :meth:`full_model` then returns a
            ``Sequential`` with the model's own layer names.
        example: a batch of the features' input (the first batch of the loader does), on
            the model's device: with it, a head that cannot take the features' output
            fails at construction (on every rank, naming both shapes) instead of at the
            first step; ``fc_workers="auto"`` needs it to time both parts.
        micro_batches: parts each conv worker's batch is split into, to overlap its
            forward and backward passes with the FC side (module docstring); 1 (the
            default) sends the batch whole.

    Attributes:
        role: ``"conv"`` or ``"fc"``.
        roles: the :class:`~hvdx.strategies.stanza.core_roles.StanzaRoles` (shard the data over
            ``roles.conv_ranks``: the FC workers read none).
        stats: :class:`~hvdx.strategies.stanza.mpi_exchange.StanzaStats`, bytes by kind.
        probe: with ``fc_workers="auto"``, ``{"conv_s", "head_s", "fc_workers"}``: the
            agreed times (median over ranks) and the choice; ``None`` otherwise.
        steps: steps taken (restored from a checkpoint).

    Raises:
        ValueError: on every rank, for a bad argument or a model that differs between
            ranks; ``TypeError`` for arguments of the wrong type.
    """

    def __init__(self, features: nn.Module, head: Optional[nn.Module] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None,
                 loss_fn=F.cross_entropy, fc_workers: Union[int, str] = 1, *,
                 split: Optional[int] = None, example: Optional[torch.Tensor] = None,
                 micro_batches: int = 1):
        self.optimizer, self.loss_fn = optimizer, loss_fn
        self._keep_names = False
        self._start(communicator_for(_hvd.global_process_set, _hvd.global_process_set,
                                     _hvd.size()),
                    features, head, split, fc_workers, micro_batches, example)

    @property
    def features(self) -> nn.Module:
        """The feature extractor (trained by the conv workers)."""
        return self._parts[CONV]

    @property
    def head(self) -> nn.Module:
        """The head (trained by the FC workers)."""
        return self._parts[FC]

    # --- training ---------------------------------------------------------------------

    def step(self, x: Optional[torch.Tensor] = None, y: Optional[torch.Tensor] = None) -> float:
        """One training step (module docstring, steps 1-6); collective.

        Args:
            x: a conv worker's batch (any device; the features' input).
            y: its labels (``loss_fn``'s target), as many as samples in ``x``. An FC
                worker's ``x`` and ``y`` are ignored: pass nothing.

        Returns:
            conv worker: the mean loss over its samples; FC worker: the mean loss over
            the samples it received (with one FC worker, the global batch).
        """
        return super().step(x, y)

    # --- the whole model, checkpoints ---------------------------------------------------

    def full_model(self, rank: int = 0) -> Optional[nn.Module]:
        """The complete trained model on ``rank``, ``None`` elsewhere (collective).

        A new module (copies): ``nn.Sequential(features, head)``, or with ``split=`` a
        ``Sequential`` of the original model's layers under their original names. The
        features come from rank 0 (every conv worker holds the same), the head from the
        first FC worker.

        Raises:
            ValueError: on every rank, if ``rank`` is not a rank of the job or the ranks
                asked for different ones.
        """
        return super().full_model(rank)

    def state_dict(self) -> Dict[str, Any]:
        """This rank's state: its role's module, the optimizer, the step and the role
        layout (``hvdx.torch.save_checkpoint(path, trainer)`` keeps every rank's)."""
        return {"format": FORMAT,
                "layout": self._layout_of_rank(),
                "module": self._mine.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "step": self.steps}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Load :meth:`state_dict` (collective).

        Raises:
            ValueError: on every rank, nothing loaded, if any rank's state is not a
                Stanza state, or was saved in another layout (world size,
                ``fc_workers``, this rank's role) or for another module.
        """
        module = self._mine
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            error = (f"Stanza.load_state_dict: rank {self.rank} got {what(state)}, not a "
                     "Stanza.state_dict()")
        else:
            error = layout_error("Stanza.load_state_dict", self.rank, state.get("layout"),
                                 self._layout_of_rank()) or \
                _module_mismatch(module, state.get("module"), self.rank)
        self._agree_on_state(error)
        module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["step"])

    # --- hooks of StanzaTrainer ---------------------------------------------------------

    _fit_on_example = True

    def _take_parts(self, features, head, split, example):
        """``(features, head)`` from the two forms of the arguments, checked with the
        optimizer and the loss."""
        layers = len(features) if isinstance(features, nn.Sequential) else None
        parts_ok = isinstance(features, nn.Module) and isinstance(head, nn.Module)
        split = check_parts(split, layers, parts_ok, ("torch.nn.Module", "nn.Sequential"),
                            what(features), what(head))
        if split is not None:
            features, head = features[:split], features[split:]
            self._keep_names = True
        _check_training(features, head, self.optimizer, self.loss_fn)
        return features, head

    @staticmethod
    def _entries(features, head):
        """Fingerprint entries: every parameter and buffer of both parts, in order."""
        for part, module in (("features", features), ("head", head)):
            for name, t in module.state_dict(keep_vars=True).items():
                yield f"{part}.{name}", str(t.dtype).replace("torch.", ""), tuple(t.shape)

    def _fit_error(self, example) -> Optional[str]:
        """Why ``head(features(example))`` fails on this rank, naming the shapes, or
        ``None``. Without gradients and in eval mode (the training flags are restored),
        so that no parameter, gradient or BatchNorm statistic changes."""
        features, head = self.features, self.head
        modes = [(m, m.training) for part in (features, head) for m in part.modules()]
        activations = None
        try:
            features.eval()
            head.eval()
            with torch.no_grad():
                activations = features(example)
                head(activations)
            return None
        except Exception as exc:  # whatever the user's model raises on the example
            if activations is None:
                return (f"Stanza: rank {self.rank}'s example ({what(example)}) does not go "
                        f"through the features: {type(exc).__name__}: {exc}")
            return self._head_error(activations, None, None, exc)
        finally:
            for module, training in modes:
                module.training = training

    def _probe(self, example):
        """fc_workers="auto"'s timed runs (:func:`hvdx.strategies.stanza.mpi_setup.probe_roles`):
        features and head forward + backward on copies, so that the model's parameters,
        gradients and BatchNorm statistics stay as they are."""
        features, head = copy.deepcopy(self.features), copy.deepcopy(self.head)
        with torch.no_grad():
            activations = features(example)
        activations = activations.detach()

        def conv():
            features(example).sum().backward()

        def fc(count):
            index = torch.arange(count, device=activations.device) % len(example)
            inputs = activations[index].requires_grad_(True)
            return lambda: head(inputs).sum().backward()

        return conv, fc

    def _new_adapter(self) -> TorchPasses:
        return TorchPasses(self)

    @staticmethod
    def _part_bytes(module: nn.Module) -> np.ndarray:
        """Every parameter and buffer of ``module``, back to back, as host bytes."""
        with torch.no_grad():
            parts = [t.detach().contiguous().reshape(-1).view(torch.uint8).cpu()
                     for t in _state(module)]
        return torch.cat(parts).numpy() if parts else np.empty(0, np.uint8)

    @staticmethod
    def _part_size(module: nn.Module) -> int:
        return sum(t.numel() * t.element_size() for t in _state(module))

    @staticmethod
    def _load_part(module: nn.Module, buffer: np.ndarray) -> None:
        """Inverse of :meth:`_part_bytes`, into ``module``'s own tensors (on their
        devices)."""
        source = torch.from_numpy(buffer)
        offset = 0
        with torch.no_grad():
            for t in _state(module):
                count = t.numel() * t.element_size()
                # clone(): an aligned copy, so that the bytes can be viewed as t's dtype.
                value = source[offset:offset + count].clone().view(t.dtype).view(t.shape)
                t.copy_(value.to(t.device))
                offset += count

    def _zero_gradients(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _apply_gradients(self) -> None:
        self.optimizer.step()

    @staticmethod
    def _lengths(x, y):
        """Two tensors of the same number of samples split; anything else stays whole."""
        if not torch.is_tensor(x) or not torch.is_tensor(y) or x.dim() < 1 or \
                y.dim() < 1 or len(x) != len(y):
            return None
        return len(x), x, y

    @staticmethod
    def _model_shell() -> Dict[str, nn.Module]:
        return {}

    def _copy_part(self, shell, role: str, buffer: Optional[np.ndarray]) -> None:
        shell[role] = copy.deepcopy(self._parts[role])
        if buffer is not None:
            self._load_part(shell[role], buffer)

    def _whole_model(self, shell) -> nn.Module:
        if self._keep_names:
            return nn.Sequential(OrderedDict(list(shell[CONV].named_children()) +
                                             list(shell[FC].named_children())))
        return nn.Sequential(shell[CONV], shell[FC])

    @staticmethod
    def _is_batch(example) -> bool:
        return torch.is_tensor(example) and example.dim() >= 1 and len(example) >= 1

    _is_tensor = staticmethod(torch.is_tensor)
    _what = staticmethod(what)

    @staticmethod
    def _shape_dtype(tensor):
        return tensor.shape, tensor.dtype

    @staticmethod
    def _takes(head: nn.Module) -> str:
        """What the head's first layer takes, in words, or ``""``."""
        first = next((m for m in head.modules()
                      if hasattr(m, "in_features") or hasattr(m, "in_channels")), None)
        if first is None:
            return ""
        attribute = "in_features" if hasattr(first, "in_features") else "in_channels"
        return (f"; the head's first layer, {type(first).__name__}, takes "
                f"{attribute}={getattr(first, attribute)}")


# --- helpers -----------------------------------------------------------------------------

def _check_training(features, head, optimizer, loss_fn) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"Stanza: optimizer must be a torch.optim.Optimizer, got "
                        f"{what(optimizer)}")
    if not callable(loss_fn):
        raise TypeError(f"Stanza: loss_fn must be callable, got {what(loss_fn)}")
    if not trainable(head):
        raise ValueError(f"Stanza: the head ({type(head).__name__}) has no parameters to "
                         "train: the FC workers would have nothing to do; move the "
                         "parameterised layers that take the features' output into the head")
    shared = {id(p) for p in trainable(features)} & {id(p) for p in trainable(head)}
    if shared:
        raise ValueError("Stanza: features and head share parameters; the two roles train "
                         "them apart, so they cannot be tied")
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for part, module in (("features", features), ("head", head)):
        for name, p in module.named_parameters():
            if p.requires_grad and id(p) not in held:
                raise ValueError(f"Stanza: the optimizer does not hold {part}.{name}; build "
                                 "it over the parameters of both parts")


def _state(module: nn.Module) -> List[torch.Tensor]:
    return list(module.state_dict(keep_vars=True).values())


def _module_mismatch(module: nn.Module, state, rank: int) -> Optional[str]:
    """Why ``state`` does not fit ``module`` (names, shapes, dtypes), or ``None``."""
    mine = module.state_dict()
    if not isinstance(state, dict):
        return f"Stanza.load_state_dict: rank {rank}'s state has no module state"
    if list(state) != list(mine):
        missing = [k for k in mine if k not in state] + [k for k in state if k not in mine]
        return (f"Stanza.load_state_dict: rank {rank}'s module state holds other entries "
                f"than its module ({', '.join(missing[:3]) or 'another order'})")
    for key, value in mine.items():
        other = state[key]
        if not torch.is_tensor(other) or other.shape != value.shape or \
                other.dtype != value.dtype:
            return (f"Stanza.load_state_dict: rank {rank}'s {key} is {what(other)}, its "
                    f"module's is {value.dtype} {tuple(value.shape)}")
    return None
