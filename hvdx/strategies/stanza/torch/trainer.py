"""Stanza for PyTorch: conv workers train the feature extractor, FC workers the head.

Stanza (Wu, Xu, Li, Xiong, "Layer Separation for Distributed Training in Deep
Learning", arXiv 1812.10624): in a CNN most bytes are in the fully connected head and
most compute in the feature extractor, so most ranks (the ``S`` *conv workers*) train
only the features and a few (the ``F`` *FC workers*, the last ``F`` ranks) only the
head; head parameters and gradients never travel to a conv worker. Roles and scaling:
:mod:`hvdx.strategies.stanza.core_roles`; messages: :mod:`hvdx.strategies.stanza.mpi_exchange`;
the step's protocol, the same in TensorFlow: :mod:`hvdx.strategies.stanza.mpi_step` (this
module runs PyTorch's part of it). One :meth:`Stanza.step`, called on every rank:

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
from typing import Any, Dict, List, Optional, Tuple, Union

import horovod.torch as _hvd
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from hvdx.strategies.stanza.core_roles import AUTO, CONV, FC, weighted_loss
from hvdx.mpi import communicator_for
from hvdx.strategies.stanza.core_checks import (Samples, check_settings, head_error, layout_error,
                                                micro_batch_bounds)
from hvdx.strategies.stanza.mpi_exchange import StanzaExchange, StanzaStats, role_communicators
from hvdx.strategies.stanza.mpi_gradients import RoleGradientSum
from hvdx.strategies.stanza.mpi_setup import agree_on_arguments, probe_roles
from hvdx.strategies.stanza.mpi_step import StanzaStep
from hvdx.torch.host_buffers import family_dtype, pack, unpack

__all__ = ["FORMAT", "Stanza", "StanzaStats"]

#: The ``format`` entry of :meth:`Stanza.state_dict`.
FORMAT = "hvdx-stanza-1"


class Stanza:
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

    Raises:
        ValueError: on every rank, for a bad argument or a model that differs between
            ranks; ``TypeError`` for arguments of the wrong type.
    """

    def __init__(self, features: nn.Module, head: Optional[nn.Module] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None,
                 loss_fn=F.cross_entropy, fc_workers: Union[int, str] = 1, *,
                 split: Optional[int] = None, example: Optional[torch.Tensor] = None,
                 micro_batches: int = 1):
        comm = communicator_for(_hvd.global_process_set, _hvd.global_process_set,
                                _hvd.size())
        size, rank = comm.Get_size(), comm.Get_rank()
        error: Optional[Exception] = None
        roles = None
        auto = isinstance(fc_workers, str) and fc_workers == AUTO
        try:
            # In the order of the arguments: the model, then fc_workers.
            features, head, keep_names = _parts(features, head, split)
            _check_training(features, head, optimizer, loss_fn)
            roles = check_settings(size, fc_workers, micro_batches, _is_batch(example),
                                   _what(example), "loader")
        except (TypeError, ValueError) as exc:
            error = exc
        agree_on_arguments(comm, _entries(features, head) if error is None else (),
                           [("fc_workers", fc_workers), ("split", split),
                            ("micro_batches", micro_batches)], error)
        #: fc_workers="auto": the agreed probe ``{"conv_s", "head_s", "fc_workers"}``.
        self.probe: Optional[Dict[str, object]] = None
        if example is not None:
            error = comm.allgather(_fit_error(features, head, example, rank))
            error = next((e for e in error if e is not None), None)
            if error is not None:
                raise ValueError(error)
        if auto:
            roles, self.probe = probe_roles(comm, len(example), _what(example),
                                            lambda: _probe(features, head, example))

        self.features, self.head, self.optimizer, self.loss_fn = features, head, optimizer, loss_fn
        self.micro_batches = int(micro_batches)
        self.roles = roles
        self.rank = rank
        self.role = roles.role(rank)
        self.stats = StanzaStats()
        self._keep_names = keep_names
        self._steps = 0
        world, role_comm = role_communicators(comm, roles)
        self._exchange = StanzaExchange(world, role_comm, roles, self.stats)
        self._protocol = StanzaStep(self._exchange, rank, micro_batches)
        self._adapter = _Adapter(self)
        self._broadcast_initial()

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
        self.stats.begin_step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.role == CONV:
            loss = self._protocol.conv(_micro_batches(x, y, self.micro_batches),
                                      self._adapter)
        else:
            loss = self._protocol.fc(self._adapter)
        self.optimizer.step()
        self._steps += 1
        self.stats.steps += 1
        return loss

    @property
    def _samples(self) -> Optional[Samples]:
        return self._protocol.samples

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
        target = self._exchange.agree_on_target(rank)
        copies = {}

        def part(name, module, role):
            def received(buffer):
                copies[name] = copy.deepcopy(module)
                _load_state_bytes(copies[name], buffer)
            return (role, lambda: copies.__setitem__(name, copy.deepcopy(module)),
                    lambda: _state_bytes(module), lambda: _state_size(module), received)

        self._exchange.assemble(target, [part("features", self.features, CONV),
                                         part("head", self.head, FC)])
        if self.rank != target:
            return None
        if self._keep_names:
            return nn.Sequential(OrderedDict(list(copies["features"].named_children()) +
                                             list(copies["head"].named_children())))
        return nn.Sequential(copies["features"], copies["head"])

    def state_dict(self) -> Dict[str, Any]:
        """This rank's state: its role's module, the optimizer, the step and the role
        layout (``hvdx.torch.save_checkpoint(path, trainer)`` keeps every rank's)."""
        module = self.features if self.role == CONV else self.head
        return {"format": FORMAT,
                "layout": dict(self.roles.layout(), rank=self.rank, role=self.role),
                "module": module.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "step": self._steps}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Load :meth:`state_dict` (collective).

        Raises:
            ValueError: on every rank, nothing loaded, if any rank's state is not a
                Stanza state, or was saved in another layout (world size,
                ``fc_workers``, this rank's role) or for another module.
        """
        module = self.features if self.role == CONV else self.head
        expected = dict(self.roles.layout(), rank=self.rank, role=self.role)
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            error = (f"Stanza.load_state_dict: rank {self.rank} got {_what(state)}, not a "
                     "Stanza.state_dict()")
        else:
            error = layout_error("Stanza.load_state_dict", self.rank, state.get("layout"),
                                 expected) or _module_mismatch(module, state.get("module"),
                                                               self.rank)
        error = self._exchange.first_error(error)
        if error is not None:
            raise ValueError(error)
        module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._steps = int(state["step"])

    # --- internals --------------------------------------------------------------------

    def _broadcast_initial(self) -> None:
        """The conv workers take rank 0's features, the FC workers rank 0's head."""
        parts = {CONV: self.features, FC: self.head}
        self._exchange.share_initial(lambda role: _state_bytes(parts[role]),
                                     lambda role: _state_size(parts[role]),
                                     lambda role, buffer: _load_state_bytes(parts[role], buffer))


# --- helpers -----------------------------------------------------------------------------


class _Adapter:
    """PyTorch's part of a step (:mod:`hvdx.strategies.stanza.mpi_step` calls it): the passes
    forward and backward, the head and its loss, the role's sum (step 5)."""

    def __init__(self, trainer: Stanza):
        self.t = trainer
        # Step 5, in host buffers (one per dtype family) of this role's gradients.
        self._sum = RoleGradientSum(
            trainer._exchange, "conv_allreduce" if trainer.role == CONV else "fc_allreduce",
            lambda family, count: torch.empty(count, dtype=family_dtype(family)),
            lambda buffer: buffer.numpy())
        self._fc = None  # the FC worker's inputs, labels and outputs of the part in hand

    def forward(self, x, y):
        """Conv worker, step 1: ``(activations, samples)``; checks the batch."""
        if not torch.is_tensor(x) or not torch.is_tensor(y):
            raise ValueError(f"Stanza.step: rank {self.t.rank} is a conv worker and needs a "
                             f"batch and its labels, got x={_what(x)}, y={_what(y)}")
        activations = self.t.features(x)
        if not torch.is_tensor(activations) or activations.dim() < 1:
            raise ValueError(f"Stanza.step: rank {self.t.rank}'s features returned "
                             f"{_what(activations)}, not a batch of activations")
        if y.dim() < 1 or y.shape[0] != activations.shape[0]:
            raise ValueError(f"Stanza.step: rank {self.t.rank} has {activations.shape[0]} "
                             f"samples of activations but labels of shape {tuple(y.shape)}")
        return activations, Samples(tuple(activations.shape[1:]), str(activations.dtype),
                                    tuple(y.shape[1:]), str(y.dtype))

    @staticmethod
    def count(y) -> int:
        return len(y)

    def host(self, activations, y, count: int):
        """Conv worker: the host buffers of one micro-batch (an empty one: no
        activations), and the buffer its activation gradient comes back in."""
        if activations is None:
            samples = self.t._samples
            sent = self.empty((count,) + samples.activation_shape, samples.activation_dtype)[0]
        else:
            sent = activations.detach().to("cpu").contiguous()
        labels = y.detach().to("cpu").contiguous()
        gradient = torch.empty(sent.shape, dtype=sent.dtype)  # host: MPI's buffer
        return _bytes(sent), _bytes(labels), _bytes(gradient), gradient

    @staticmethod
    def backward(activations, gradient) -> None:
        """Conv worker, step 4: the features' gradients add up over micro-batches."""
        if activations is not None and activations.requires_grad:
            activations.backward(gradient.to(activations.device))

    @staticmethod
    def itemsize(dtype: str) -> int:
        return torch.empty(0, dtype=_dtype(dtype)).element_size()

    @staticmethod
    def empty(shape, dtype: str):
        """FC worker: a host tensor to receive into, and its byte view."""
        tensor = torch.empty(shape, dtype=_dtype(dtype))
        return tensor, _bytes(tensor)

    def run_head(self, activations, labels, sizes, bounds, global_batch):
        """FC worker, step 3 on one (micro-)batch: ``(objective, losses)``."""
        device = _device(self.t.head)
        inputs = activations.to(device).requires_grad_(True)
        self._fc = [inputs, labels.to(device), None]
        outputs = self._fc[2] = self.t.head(inputs) if len(inputs) else None

        def loss_of(lo, hi):
            part = self.t.loss_fn(outputs[lo:hi], self._fc[1][lo:hi])
            if not torch.is_tensor(part) or part.dim() != 0:
                raise ValueError(f"loss_fn returned {_what(part)}, not a scalar "
                                 "tensor (the mean over the samples)")
            return part, part.item()

        return weighted_loss(sizes, bounds, global_batch, loss_of,
                             lambda part, weight: part * weight)

    def head_error(self, exc: Exception) -> str:
        return _head_error(self.t.head, self.t.rank, *self._fc, exc)

    def head_backward(self, objective) -> np.ndarray:
        """FC worker: the head's gradients accumulate; the activation gradient's bytes."""
        inputs = self._fc[0]
        if objective is not None:
            objective.backward()
        gradient = inputs.grad if inputs.grad is not None else torch.zeros_like(inputs)
        return _bytes(gradient.detach().to("cpu").contiguous())

    def sum_gradients(self) -> None:
        """Step 5 (:class:`~hvdx.strategies.stanza.mpi_gradients.RoleGradientSum`): each
        parameter's ``grad`` is the role's sum, ``None`` where no rank had one."""
        params = _trainable(self.t.features if self.t.role == CONV else self.t.head)
        with torch.no_grad():
            summed = self._sum([p.grad for p in params], lambda i: torch.zeros_like(params[i]),
                               lambda g: (str(g.dtype), g.numel()), _pack, _unpack)
            for p, grad in zip(params, summed):
                p.grad = grad


# --- helpers -----------------------------------------------------------------------------

def _parts(features, head, split):
    """``(features, head, layer names or None)`` from the two forms of the arguments."""
    if split is None:
        if not isinstance(features, nn.Module) or not isinstance(head, nn.Module):
            raise TypeError(f"Stanza: features and head must be torch.nn.Module, got "
                            f"features={_what(features)}, head={_what(head)} (or pass one "
                            "nn.Sequential and split=)")
        return features, head, False
    if not isinstance(features, nn.Sequential) or head is not None:
        raise TypeError(f"Stanza: split={split!r} takes one nn.Sequential and head=None, got "
                        f"{_what(features)} and head={_what(head)}")
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)) or \
            not 1 <= split < len(features):
        raise ValueError(f"split={split!r} must be an integer from 1 to {len(features) - 1} "
                         f"for a Sequential of {len(features)} layers")
    return features[:int(split)], features[int(split):], True


def _check_training(features, head, optimizer, loss_fn) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"Stanza: optimizer must be a torch.optim.Optimizer, got "
                        f"{_what(optimizer)}")
    if not callable(loss_fn):
        raise TypeError(f"Stanza: loss_fn must be callable, got {_what(loss_fn)}")
    if not _trainable(head):
        raise ValueError(f"Stanza: the head ({type(head).__name__}) has no parameters to "
                         "train: the FC workers would have nothing to do; move the "
                         "parameterised layers that take the features' output into the head")
    shared = {id(p) for p in _trainable(features)} & {id(p) for p in _trainable(head)}
    if shared:
        raise ValueError("Stanza: features and head share parameters; the two roles train "
                         "them apart, so they cannot be tied")
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for part, module in (("features", features), ("head", head)):
        for name, p in module.named_parameters():
            if p.requires_grad and id(p) not in held:
                raise ValueError(f"Stanza: the optimizer does not hold {part}.{name}; build "
                                 "it over the parameters of both parts")


def _micro_batches(x, y, count: int) -> List[Tuple[Any, Any]]:
    """``count`` consecutive parts of a conv worker's batch, sizes differing by at most
    one, the larger first (:func:`hvdx.strategies.stanza.core_checks.micro_batch_bounds`; some
    are empty if the batch has fewer samples). Anything but two tensors stays whole,
    for the first step's check."""
    if count == 1 or not torch.is_tensor(x) or not torch.is_tensor(y) or x.dim() < 1 \
            or y.dim() < 1 or len(x) != len(y):
        return [(x, y)]
    return [(x[lo:hi], y[lo:hi]) for lo, hi in micro_batch_bounds(len(x), count)]


def _is_batch(example) -> bool:
    return torch.is_tensor(example) and example.dim() >= 1 and len(example) >= 1


def _fit_error(features: nn.Module, head: nn.Module, example, rank: int) -> Optional[str]:
    """Why ``head(features(example))`` fails on this rank, naming the shapes, or
    ``None``. Without gradients and in eval mode (the training flags are restored), so
    that no parameter, gradient or BatchNorm statistic changes."""
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
            return (f"Stanza: rank {rank}'s example ({_what(example)}) does not go through "
                    f"the features: {type(exc).__name__}: {exc}")
        return _head_error(head, rank, activations, None, None, exc)
    finally:
        for module, training in modes:
            module.training = training


def _probe(features: nn.Module, head: nn.Module, example: torch.Tensor):
    """fc_workers="auto"'s timed runs (:func:`hvdx.strategies.stanza.mpi_setup.probe_roles`):
    features and head forward + backward on copies, so that the model's parameters,
    gradients and BatchNorm statistics stay as they are."""
    features, head = copy.deepcopy(features), copy.deepcopy(head)
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


def _entries(features, head):
    """Fingerprint entries: every parameter and buffer of both parts, in order."""
    for part, module in (("features", features), ("head", head)):
        for name, t in module.state_dict(keep_vars=True).items():
            yield f"{part}.{name}", str(t.dtype).replace("torch.", ""), tuple(t.shape)


def _trainable(module: nn.Module) -> List[torch.Tensor]:
    return [p for p in module.parameters() if p.requires_grad]


def _device(module: nn.Module) -> torch.device:
    return next(iter(module.parameters())).device


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.rsplit(".", 1)[-1])


def _bytes(tensor: torch.Tensor) -> np.ndarray:
    """A host, C-contiguous tensor's bytes as a numpy view (any dtype, bfloat16 too)."""
    return tensor.reshape(-1).view(torch.uint8).numpy()


def _pack(layout, buffers, grads) -> None:
    for family, slots in layout.slots.items():
        pack([grads[s.index] for s in slots], buffers[family][:layout.ends[family]])


def _unpack(layout, buffers, grads) -> List[torch.Tensor]:
    for family, slots in layout.slots.items():
        unpack(buffers[family], grads, slots)
    return grads


def _state(module: nn.Module) -> List[torch.Tensor]:
    return list(module.state_dict(keep_vars=True).values())


def _state_size(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in _state(module))


def _state_bytes(module: nn.Module) -> np.ndarray:
    """Every parameter and buffer of ``module``, back to back, as host bytes."""
    with torch.no_grad():
        parts = [t.detach().contiguous().reshape(-1).view(torch.uint8).cpu()
                 for t in _state(module)]
    return torch.cat(parts).numpy() if parts else np.empty(0, np.uint8)


def _load_state_bytes(module: nn.Module, buffer: np.ndarray) -> None:
    """Inverse of :func:`_state_bytes`, into ``module``'s own tensors (on their devices)."""
    source = torch.from_numpy(buffer)
    offset = 0
    with torch.no_grad():
        for t in _state(module):
            count = t.numel() * t.element_size()
            # clone(): an aligned copy, so that the bytes can be viewed as t's dtype.
            value = source[offset:offset + count].clone().view(t.dtype).view(t.shape)
            t.copy_(value.to(t.device))
            offset += count


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
            return (f"Stanza.load_state_dict: rank {rank}'s {key} is {_what(other)}, its "
                    f"module's is {value.dtype} {tuple(value.shape)}")
    return None


def _head_error(head, rank, inputs, targets, outputs, exc) -> str:
    """The message for a head (or loss) that cannot take the activations
    (:func:`hvdx.strategies.stanza.core_checks.head_error`); ``targets=None``: on ``example=``."""
    if outputs is not None:
        outputs = tuple(outputs.shape) if torch.is_tensor(outputs) else _what(outputs)
    labels = None if targets is None else (targets.shape, targets.dtype)
    return head_error(rank, exc, (inputs.shape, inputs.dtype), labels, outputs, _takes(head))


def _takes(head) -> str:
    """What the head's first layer takes, in words, or ``""``."""
    first = next((m for m in head.modules()
                  if hasattr(m, "in_features") or hasattr(m, "in_channels")), None)
    if first is None:
        return ""
    attribute = "in_features" if hasattr(first, "in_features") else "in_channels"
    return (f"; the head's first layer, {type(first).__name__}, takes "
            f"{attribute}={getattr(first, attribute)}")


def _what(value) -> str:
    if torch.is_tensor(value):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return "None" if value is None else type(value).__name__
