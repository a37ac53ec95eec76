"""Stanza for PyTorch: conv workers train the feature extractor, FC workers the head.

Stanza (Wu, Xu, Li, Xiong, "Layer Separation for Distributed Training in Deep
Learning", arXiv 1812.10624): in a CNN most bytes are in the fully connected head and
most compute in the feature extractor, so most ranks (the ``S`` *conv workers*) train
only the features and a few (the ``F`` *FC workers*, the last ``F`` ranks) only the
head; head parameters and gradients never travel to a conv worker. Roles and scaling:
:mod:`hvdx.core.stanza_roles`; messages: :mod:`hvdx.mpi.stanza_exchange`. One
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
import sys
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import horovod.torch as _hvd
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from hvdx.core.fingerprint import Fingerprint
from hvdx.core.fused_layout import FusedLayout
from hvdx.core.stanza_checks import Samples, describe_layout, timed
from hvdx.core.stanza_roles import AUTO, CONV, FC, loss_weights, probe_counts, stanza_roles
from hvdx.mpi import check_consistent, communicator_for
from hvdx.mpi.stanza_exchange import (StanzaExchange, StanzaStats, agree_on_probe,
                                      role_communicators)
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
            (:func:`hvdx.core.stanza_roles.auto_fc_workers`), from a probe at
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
        roles: the :class:`~hvdx.core.stanza_roles.StanzaRoles` (shard the data over
            ``roles.conv_ranks``: the FC workers read none).
        stats: :class:`~hvdx.mpi.stanza_exchange.StanzaStats`, bytes by kind.
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
            _check_micro_batches(micro_batches)
            if auto:
                _check_example(example, size)
            else:
                roles = stanza_roles(size, fc_workers)
        except (TypeError, ValueError) as exc:
            error = exc
        # Fingerprint: the model and the settings, and the local error if any, so that a
        # rank that failed, or was given other arguments, fails every rank alike.
        settings: List[Tuple[str, object]] = [("fc_workers", fc_workers), ("split", split),
                                              ("micro_batches", micro_batches)]
        if error is not None:
            settings.append(("stanza.error", f"{type(error).__name__}: {error}"))
        check_consistent(Fingerprint.build(_entries(features, head) if error is None else (),
                                           settings), comm, "Stanza")
        if error is not None:
            raise error
        #: fc_workers="auto": the agreed probe ``{"conv_s", "head_s", "fc_workers"}``.
        self.probe: Optional[Dict[str, object]] = None
        if example is not None:
            error = comm.allgather(_fit_error(features, head, example, rank))
            error = next((e for e in error if e is not None), None)
            if error is not None:
                raise ValueError(error)
        if auto:
            self.probe = _probe(features, head, example, comm)
            roles = stanza_roles(size, self.probe["fc_workers"])
            if rank == 0:
                head_ms = ", ".join(f"{count} samples {1e3 * t:.1f} ms"
                                    for count, t in self.probe["head_s"].items())
                print(f"[hvdx] Stanza fc_workers='auto': features {1e3 * self.probe['conv_s']:.1f}"
                      f" ms per batch of {len(example)}, head {head_ms} (forward + backward, "
                      f"median over ranks): {roles.fc_workers} FC worker(s) of {size} ranks",
                      file=sys.stderr, flush=True)

        self.features, self.head, self.optimizer, self.loss_fn = features, head, optimizer, loss_fn
        self.micro_batches = int(micro_batches)
        self.roles = roles
        self.rank = rank
        self.role = roles.role(rank)
        self.stats = StanzaStats()
        self._keep_names = keep_names
        self._steps = 0
        self._samples: Optional[Samples] = None
        world, role_comm = role_communicators(comm, roles)
        self._exchange = StanzaExchange(world, role_comm, roles, self.stats)
        # Step 5's host buffers, one per dtype family (the role's gradients).
        self._layout: Optional[FusedLayout] = None
        self._buffers: Dict[np.dtype, torch.Tensor] = {}
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
        loss = self._conv_step(x, y) if self.role == CONV else self._fc_step()
        self.optimizer.step()
        self._steps += 1
        self.stats.steps += 1
        return loss

    def _conv_step(self, x, y) -> float:
        first = self._samples is None
        chunks = _micro_batches(x, y, self.micro_batches)
        try:
            activations, samples = self._forward_features(*chunks[0])
        except Exception as exc:  # whatever the user's features raise at the first step
            if not first:
                raise
            self._agree(None, exc)  # raises, on every rank
        if first:
            self._agree(samples, None)
        else:
            self._check_samples(samples)
        ex = self._exchange
        if self.micro_batches > 1:
            ex.send_batch_size(len(y))
        # Steps 1 and 4 per micro-batch: every forward pass and send first, so that the
        # FC workers run the head on micro-batch k while this rank computes k + 1; then
        # each backward pass as its activation gradient comes back.
        pending = []
        for k, (xk, yk) in enumerate(chunks):
            if k:
                activations = None
                if len(yk):
                    activations, samples = self._forward_features(xk, yk)
                    self._check_samples(samples)
            sent = self._host_activations(activations, len(yk))
            labels = yk.detach().to("cpu").contiguous()
            gradient = torch.empty(sent.shape, dtype=sent.dtype)  # host: MPI's buffer
            loss = np.zeros(1)
            check_head = first and k == 0
            requests = None if check_head else ex.post_gradient_receive(_bytes(gradient), loss)
            ex.send_activations(_bytes(sent), _bytes(labels))
            if check_head:
                # The FC workers run the head on these activations before answering: a
                # head that does not fit fails every rank here (they have received them).
                error = ex.first_error(None)
                if error is not None:
                    ex.wait()
                    self._samples = None  # the next step checks the data again, everywhere
                    raise ValueError(error)
                requests = ex.post_gradient_receive(_bytes(gradient), loss)
            pending.append((activations, gradient, loss, requests, len(yk)))
        total = 0.0
        for activations, gradient, loss, requests, samples_k in pending:
            ex.wait_for(requests)
            if activations is not None and activations.requires_grad:
                activations.backward(gradient.to(activations.device))
            total += samples_k * float(loss[0])
        ex.wait()
        self._sum_gradients(self.features, "conv_allreduce")
        if self.micro_batches == 1:
            return float(pending[0][2][0])
        return total / max(1, len(y))

    def _fc_step(self) -> float:
        first = self._samples is None
        if first:
            self._agree(None, None)
        samples, ex = self._samples, self._exchange
        sample_bytes = _sample_bytes(samples.activation_shape, samples.activation_dtype)
        global_batch = None
        if self.micro_batches > 1:
            # The conv workers' batch sizes come first: every micro-batch's loss is
            # weighed by the global batch.
            global_batch = ex.global_batch(sum(ex.receive_batch_sizes()))
        received, loss_sum, kept = 0, 0.0, []
        for k in range(self.micro_batches):
            sizes = ex.probe_batches(sample_bytes)
            total = sum(sizes)
            activations = torch.empty((total,) + samples.activation_shape,
                                      dtype=_dtype(samples.activation_dtype))
            labels = torch.empty((total,) + samples.label_shape,
                                 dtype=_dtype(samples.label_dtype))
            bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
            ex.receive_activations(_slices(activations, bounds), _slices(labels, bounds))
            if global_batch is None:
                global_batch = ex.global_batch(total)
            gradient, losses = self._fc_micro_batch(activations, labels, sizes, bounds,
                                                    global_batch, first and k == 0)
            ex.send_gradients(_slices(gradient, bounds), losses)
            kept.append(gradient)  # alive until the sends complete
            counted = ~np.isnan(losses)
            received += total
            loss_sum += float(np.dot(np.asarray(sizes)[counted], losses[counted]))
        # The conv workers run their backward passes while the FC workers sum.
        self._sum_gradients(self.head, "fc_allreduce")
        ex.wait()
        return loss_sum / received if received else float("nan")

    def _fc_micro_batch(self, activations, labels, sizes, bounds, global_batch, check):
        """Step 3 on one (micro-)batch: the head forward and backward, the head's
        gradients accumulated; returns the activation gradient (host) and each source's
        mean loss (``nan`` for a source that sent no samples)."""
        device = _device(self.head)
        inputs = activations.to(device).requires_grad_(True)
        targets = labels.to(device)
        losses = np.full(len(sizes), np.nan)
        error: Optional[str] = None
        objective, outputs = None, None
        try:
            if len(inputs):
                outputs = self.head(inputs)
                weights = loss_weights(sizes, max(global_batch, 1))
                for k, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
                    if hi == lo:
                        continue  # an empty batch adds nothing (and its mean is undefined)
                    part = self.loss_fn(outputs[lo:hi], targets[lo:hi])
                    if not torch.is_tensor(part) or part.dim() != 0:
                        raise ValueError(f"loss_fn returned {_what(part)}, not a scalar "
                                         "tensor (the mean over the samples)")
                    losses[k] = part.item()
                    weighted = part * weights[k]
                    objective = weighted if objective is None else objective + weighted
        except Exception as exc:  # whatever the user's head or loss raise at the first step
            if not check:
                raise
            error = _head_error(self.head, self.rank, inputs, targets, outputs, exc)
        if check:
            error = self._exchange.first_error(error)
            if error is not None:
                self._samples = None  # as on the conv workers
                raise ValueError(error)
        if objective is not None:
            objective.backward()
        gradient = inputs.grad if inputs.grad is not None else torch.zeros_like(inputs)
        return gradient.detach().to("cpu").contiguous(), losses

    def _check_samples(self, samples: "Samples") -> None:
        if samples != self._samples:
            # Alone: the FC worker cannot learn of it without a collective per step.
            raise ValueError(f"Stanza.step: rank {self.rank}'s batch gives "
                             f"{samples.describe()}, but the first step agreed on "
                             f"{self._samples.describe()}")

    def _host_activations(self, activations, count: int) -> torch.Tensor:
        """The activations as a host, contiguous tensor (an empty micro-batch: none)."""
        if activations is None:
            return torch.empty((count,) + self._samples.activation_shape,
                               dtype=_dtype(self._samples.activation_dtype))
        return activations.detach().to("cpu").contiguous()

    def _forward_features(self, x, y):
        if not torch.is_tensor(x) or not torch.is_tensor(y):
            raise ValueError(f"Stanza.step: rank {self.rank} is a conv worker and needs a "
                             f"batch and its labels, got x={_what(x)}, y={_what(y)}")
        activations = self.features(x)
        if not torch.is_tensor(activations) or activations.dim() < 1:
            raise ValueError(f"Stanza.step: rank {self.rank}'s features returned "
                             f"{_what(activations)}, not a batch of activations")
        if y.dim() < 1 or y.shape[0] != activations.shape[0]:
            raise ValueError(f"Stanza.step: rank {self.rank} has {activations.shape[0]} "
                             f"samples of activations but labels of shape {tuple(y.shape)}")
        samples = Samples(tuple(activations.shape[1:]), str(activations.dtype),
                           tuple(y.shape[1:]), str(y.dtype))
        if _sample_bytes(samples.activation_shape, samples.activation_dtype) == 0:
            raise ValueError(f"Stanza.step: rank {self.rank}'s features give "
                             f"{samples.describe()}: no bytes per sample")
        return activations, samples

    def _agree(self, samples: Optional[Samples], error: Optional[Exception]) -> None:
        """The first step's check of the data, on every rank (collective): the same
        ``ValueError`` everywhere, or ``self._samples`` set alike everywhere."""
        message = None
        if error is not None:
            message = str(error) if str(error).startswith("Stanza.step") else \
                f"Stanza.step: rank {self.rank}: features(x) raised {type(error).__name__}: {error}"
        everyone = self._exchange.gather_all((samples, message))
        message = next((m for _, m in everyone if m is not None), None)
        if message is None:
            conv = [(r, s) for r, (s, _) in enumerate(everyone) if s is not None]
            first_rank, agreed = conv[0]
            for r, s in conv[1:]:
                if s != agreed:
                    message = (f"Stanza.step: the conv workers' batches differ: rank "
                               f"{first_rank}'s gives {agreed.describe()}, rank {r}'s gives "
                               f"{s.describe()}")
                    break
        if message is not None:
            raise ValueError(message) from error
        self._samples = agreed

    def _sum_gradients(self, module: nn.Module, kind: str) -> None:
        """Step 5: sum this role's gradients over its ranks, in one host buffer per
        dtype family (reused):

        1. a parameter without a gradient on this rank is packed as zeros, and its
           presence flag (one element per parameter at the end of the first family's
           buffer, :class:`~hvdx.core.fused_layout.FusedLayout`) is 0, else 1;
        2. the allreduce sums gradients and flags alike: each flag then counts the
           role's ranks that had a gradient for the parameter, the same on every rank;
        3. a parameter that some rank had a gradient for gets the sum on every rank of
           the role (missing ones count as zeros, as in Horovod's allreduce); one that
           no rank had keeps ``grad = None`` everywhere, so that the optimizer skips it
           (momentum and weight decay leave it as it is), as single-process training
           does.
        """
        if self._exchange.role_comm.Get_size() == 1:
            return  # grad None stays None: nothing to agree on
        params = _trainable(module)
        with torch.no_grad():
            present = [p.grad is not None for p in params]
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            grads = [p.grad for p in params]
            layout, buffers = self._gradient_buffers(grads)
            views = {family: buffer.numpy() for family, buffer in buffers.items()}
            layout.set_flags(views, present)
            for family, slots in layout.slots.items():
                buffer = buffers[family]
                pack([grads[s.index] for s in slots], buffer[:layout.ends[family]])
                self._exchange.allreduce_sum(views[family], kind)
                unpack(buffer, grads, slots)
            counts = layout.flag_counts(views)
            for p, count in zip(params, counts):
                if count == 0:
                    p.grad = None

    def _gradient_buffers(self, grads: List[torch.Tensor]):
        """``(layout, {family: host buffer})`` (built once; rebuilt if the tensors
        change); the layout carries a presence flag per tensor."""
        key = tuple((str(g.dtype), g.numel()) for g in grads)
        if self._layout is None or key != self._layout.key:
            self._layout = FusedLayout(key, flags=True)
            self._buffers = {family: torch.empty(count, dtype=family_dtype(family))
                             for family, count in self._layout.families.items()}
        return self._layout, self._buffers

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
        ex = self._exchange
        integer = isinstance(rank, (int, np.integer)) and not isinstance(rank, bool)
        targets = ex.gather_all(int(rank) if integer else repr(rank))
        if len(set(targets)) != 1:
            raise ValueError(f"Stanza.full_model: the ranks asked for different ranks: "
                             f"{targets}")
        if not integer or not 0 <= rank < self.roles.size:
            raise ValueError(f"Stanza.full_model: rank={rank!r} is not a rank of this job of "
                             f"{self.roles.size} ranks")
        target = int(rank)
        conv_root, fc_root = self.roles.conv_ranks[0], self.roles.fc_ranks[0]
        target_role = self.roles.role(target)
        parts = {"features": (self.features, CONV, conv_root),
                 "head": (self.head, FC, fc_root)}
        copies = {}
        for name, (module, role, root) in parts.items():
            if target_role == role:
                if self.rank == target:
                    copies[name] = copy.deepcopy(module)  # its own part is current
                continue
            if self.rank == root:
                ex.send(_state_bytes(module), target)
            elif self.rank == target:
                received = copy.deepcopy(module)
                buffer = np.empty(_state_size(received), np.uint8)
                ex.recv(buffer, root)
                _load_state_bytes(received, buffer)
                copies[name] = received
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
        error = None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            error = (f"Stanza.load_state_dict: rank {self.rank} got {_what(state)}, not a "
                     "Stanza.state_dict()")
        elif state.get("layout") != expected:
            saved = state.get("layout") or {}
            error = (f"Stanza.load_state_dict: rank {self.rank}'s state was saved as "
                     f"{describe_layout(saved)}; this trainer runs it as {describe_layout(expected)}: resume "
                     "with the same number of ranks and fc_workers")
        else:
            error = _module_mismatch(module, state.get("module"), self.rank)
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


def _check_micro_batches(micro_batches) -> None:
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, (int, np.integer)) \
            or micro_batches < 1:
        raise ValueError(f"micro_batches={micro_batches!r} must be an integer of at least 1 "
                         "(1: the whole batch at once)")


def _micro_batches(x, y, count: int) -> List[Tuple[Any, Any]]:
    """``count`` consecutive parts of a conv worker's batch, sizes differing by at most
    one, the larger first (``torch.tensor_split``; some are empty if the batch has fewer
    samples). Anything but two tensors stays whole, for the first step's check."""
    if count == 1 or not torch.is_tensor(x) or not torch.is_tensor(y) or x.dim() < 1 \
            or y.dim() < 1 or len(x) != len(y):
        return [(x, y)]
    return list(zip(torch.tensor_split(x, count), torch.tensor_split(y, count)))


def _check_example(example, size: int) -> None:
    if not torch.is_tensor(example) or example.dim() < 1 or len(example) < 1:
        raise ValueError(f"fc_workers='auto' times both sides on a batch before training: "
                         f"pass example= (a batch of the features' input, e.g. the first "
                         f"batch of your loader), got example={_what(example)}")
    if size < 2:
        stanza_roles(size, 1)  # raises: Stanza needs two ranks


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


def _probe(features: nn.Module, head: nn.Module, example: torch.Tensor,
           comm) -> Dict[str, object]:
    """fc_workers="auto" (collective): time features and head forward + backward on
    copies (the model's parameters, gradients and BatchNorm statistics stay as they
    are), agree on the median over ranks, choose ``F``
    (:func:`hvdx.core.stanza_roles.auto_fc_workers`). The same ``ValueError`` on every
    rank if the example does not go through the model."""
    size, batch = comm.Get_size(), len(example)
    figures, error = None, None
    try:
        features, head = copy.deepcopy(features), copy.deepcopy(head)
        with torch.no_grad():
            activations = features(example)
        activations = activations.detach()

        def conv():
            features(example).sum().backward()

        def fc(count):
            index = torch.arange(count, device=activations.device) % batch
            inputs = activations[index].requires_grad_(True)
            return lambda: head(inputs).sum().backward()

        figures = (timed(conv), {count: timed(fc(count)) for count in probe_counts(size, batch)})
    except Exception as exc:  # whatever the user's model raises on the example
        error = (f"Stanza fc_workers='auto': rank {comm.Get_rank()}'s example "
                 f"({_what(example)}) does not go through features and head: "
                 f"{type(exc).__name__}: {exc}")
    return agree_on_probe(comm, batch, figures, error)


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


def _sample_bytes(shape: Sequence[int], dtype: str) -> int:
    return int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=_dtype(dtype)).element_size()


def _bytes(tensor: torch.Tensor) -> np.ndarray:
    """A host, C-contiguous tensor's bytes as a numpy view (any dtype, bfloat16 too)."""
    return tensor.reshape(-1).view(torch.uint8).numpy()


def _slices(tensor: torch.Tensor, bounds: np.ndarray) -> List[np.ndarray]:
    """The byte views of ``tensor[lo:hi]`` for consecutive ``bounds`` (host, contiguous)."""
    return [_bytes(tensor[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])]


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
    """The first step's message for a head (or loss) that cannot take the activations."""
    if outputs is not None:
        shape = tuple(outputs.shape) if torch.is_tensor(outputs) else _what(outputs)
        return (f"Stanza.step: on FC rank {rank}, loss_fn cannot take the head's output of "
                f"shape {shape} and labels of shape {tuple(targets.shape)} "
                f"({targets.dtype}): {type(exc).__name__}: {exc}")
    first = next((m for m in head.modules()
                  if hasattr(m, "in_features") or hasattr(m, "in_channels")), None)
    takes = ""
    if first is not None:
        attribute = "in_features" if hasattr(first, "in_features") else "in_channels"
        takes = (f"; the head's first layer, {type(first).__name__}, takes "
                 f"{attribute}={getattr(first, attribute)}")
    if targets is None:  # the construction's check on example=
        where, labels = f"Stanza: on rank {rank}'s example, the head", ""
    else:
        where = f"Stanza.step: the head on FC rank {rank}"
        labels = f" and labels of shape {tuple(targets.shape)}"
    return (f"{where} cannot take the features' output: "
            f"activations of shape {tuple(inputs.shape)} ({inputs.dtype}, per sample "
            f"{list(inputs.shape[1:])}){labels}{takes}: "
            f"{type(exc).__name__}: {exc}")


def _what(value) -> str:
    if torch.is_tensor(value):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return "None" if value is None else type(value).__name__
