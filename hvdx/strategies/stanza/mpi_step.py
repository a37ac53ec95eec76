"""One Stanza step's protocol, the same for every framework: what goes where, in which order.

Stanza (Wu, Xu, Li, Xiong, arXiv 1812.10624): conv workers train the feature
extractor, FC workers the head (roles: :mod:`hvdx.strategies.stanza.core_roles`; messages:
:mod:`hvdx.strategies.stanza.mpi_exchange`). :class:`StanzaStep` runs steps 1-5 of
:mod:`hvdx.strategies.stanza.torch.trainer`'s module docstring for the framework-neutral
trainer (:mod:`hvdx.strategies.stanza.mpi_trainer`); a framework adapter (an object with
the methods named below: :class:`hvdx.strategies.stanza.torch.passes.TorchPasses`,
:class:`hvdx.strategies.stanza.tensorflow.passes.TapePasses`) runs the framework's parts:
the forward and backward passes, the head and the loss, and the role's gradient sum. A
micro-batch's samples are its labels' first dimension
(:func:`hvdx.strategies.stanza.core_checks.samples_in`).

Conv worker (:meth:`StanzaStep.conv`), its batch split into ``m`` micro-batches:

1. the first micro-batch's forward pass (``adapter.forward(x, y) -> (handle,
   samples)``; activations of no bytes per sample, by ``adapter.itemsize(dtype)``,
   are refused); at the first step every rank then agrees on the per-sample shapes
   and dtypes, or raises the same ``ValueError`` (:meth:`StanzaStep.agree`); later a
   batch of other shapes raises on this rank alone (the FC workers cannot learn of
   it without a collective per step);
2. with ``m > 1`` the batch size goes first (8 bytes), so that the FC workers know the
   global batch before they weigh any loss;
3. for each micro-batch: its forward pass, then its activations and labels in host
   memory (``adapter.host(handle, y, count) -> (activation bytes, label bytes,
   gradient bytes, gradient)``) are sent at once, non-blocking, with the receive of
   its activation gradient posted first: the FC worker runs the head on part ``k``
   while this rank computes part ``k + 1``. At the first step the head runs on the
   first part before it answers, so that a head that does not fit fails every rank
   there (:meth:`StanzaExchange.first_error`);
4. each part's backward pass as its activation gradient arrives
   (``adapter.backward(handle, gradient)``), while the FC worker works on the later
   parts; then the role's sum (``adapter.sum_gradients()``). The loss returned is the
   mean over the batch (with ``m = 1``, the FC worker's figure as it came).

FC worker (:meth:`StanzaStep.fc`):

1. with ``m > 1`` the conv workers' batch sizes, summed over the FC workers into the
   global batch ``B``; with ``m = 1`` the sum of the counts the probe found;
2. for each micro-batch: the activations' sizes from the messages themselves
   (``MPI_Improbe``); host buffers (``adapter.empty(shape, dtype) -> (buffer,
   bytes)``); the head forward and the weighted loss (``adapter.run_head(...) ->
   (objective, losses)``); its backward pass (``adapter.head_backward(objective)``:
   the activation gradient's host bytes); each conv worker's slice sent back with its
   mean loss. At the first step an error of the head or the loss
   (``adapter.head_error(exc)``: the message) is raised on every rank;
3. the role's sum (``adapter.sum_gradients()``) while the conv workers run their
   backward passes. The loss returned is the mean over the samples it received.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from hvdx.strategies.stanza.core_roles import mean_loss
from hvdx.strategies.stanza.core_checks import Samples, agreed_samples, samples_error, samples_in
from hvdx.strategies.stanza.mpi_exchange import StanzaExchange

__all__ = ["StanzaStep", "byte_slices"]


def byte_slices(view: np.ndarray, bounds: Sequence[int], total: int) -> List[np.ndarray]:
    """The byte views of samples ``bounds[k]:bounds[k + 1]`` of a host buffer of
    ``total`` samples, given as one flat byte view."""
    per_sample = view.nbytes // total if total else 0
    return [view[lo * per_sample:hi * per_sample] for lo, hi in zip(bounds[:-1], bounds[1:])]


class StanzaStep:
    """The step protocol of one rank (module docstring).

    Args:
        exchange: this rank's :class:`~hvdx.strategies.stanza.mpi_exchange.StanzaExchange`.
        rank: this rank.
        micro_batches: ``m``, validated by the adapter.

    Attributes:
        samples: the per-sample shapes and dtypes the first step agreed on, ``None``
            until it succeeds (a first step that failed everywhere leaves it ``None``,
            so that the next step checks again, everywhere).
        extra: what the first conv worker passed to :meth:`agree` with its samples.
    """

    def __init__(self, exchange: StanzaExchange, rank: int, micro_batches: int):
        self.exchange = exchange
        self.rank = rank
        self.micro_batches = int(micro_batches)
        self.samples: Optional[Samples] = None
        self.extra = None

    # --- conv worker ------------------------------------------------------------------

    def conv(self, chunks: Sequence[Tuple[object, object]], adapter, extra=None) -> float:
        """A conv worker's step on its batch split into ``chunks`` (``(x, y)`` each);
        ``extra`` goes with its samples to the first step's agreement."""
        first = self.samples is None
        try:
            handle, samples = self._forward(adapter, *chunks[0])
            if len(chunks) != self.micro_batches:
                raise ValueError(f"Stanza.step: rank {self.rank} cannot split its batch "
                                 f"into micro_batches={self.micro_batches} parts")
        except Exception as exc:  # whatever the user's features raise at the first step
            if not first:
                raise
            self.agree(None, exc)  # raises, on every rank
        if first:
            self.agree(samples, None, extra)
        else:
            self._check(samples)
        ex = self.exchange
        counts = [samples_in(y) for _, y in chunks]
        if self.micro_batches > 1:
            ex.send_batch_size(sum(counts))
        # Every forward pass and send first, so that the FC workers run the head on
        # micro-batch k while this rank computes k + 1; then each backward pass as its
        # activation gradient comes back.
        pending = []
        for k, ((xk, yk), count) in enumerate(zip(chunks, counts)):
            if k:
                handle = None
                if count:
                    handle, samples = self._forward(adapter, xk, yk)
                    self._check(samples)
            activations, labels, received, gradient = adapter.host(handle, yk, count)
            loss = np.zeros(1)
            check_head = first and k == 0
            requests = None if check_head else ex.post_gradient_receive(received, loss)
            ex.send_activations(activations, labels)
            if check_head:
                # The FC workers run the head on these activations before answering: a
                # head that does not fit fails every rank here (they have received them).
                error = ex.first_error(None)
                if error is not None:
                    ex.wait()
                    self.samples = None  # the next step checks the data again, everywhere
                    raise ValueError(error)
                requests = ex.post_gradient_receive(received, loss)
            # The host buffers stay referenced until the sends complete.
            pending.append((handle, gradient, loss, requests, count, activations, labels))
        total = 0.0
        for handle, gradient, loss, requests, count, _, _ in pending:
            ex.wait_for(requests)
            adapter.backward(handle, gradient)
            total += count * float(loss[0])
        ex.wait()
        adapter.sum_gradients()
        if self.micro_batches == 1:
            return float(pending[0][2][0])
        return total / max(1, sum(counts))

    def _forward(self, adapter, x, y):
        handle, samples = adapter.forward(x, y)
        if self._sample_bytes(adapter, samples) == 0:
            raise ValueError(f"Stanza.step: rank {self.rank}'s features give "
                             f"{samples.describe()}: no bytes per sample")
        return handle, samples

    @staticmethod
    def _sample_bytes(adapter, samples: Samples) -> int:
        return int(np.prod(samples.activation_shape, dtype=np.int64)) * \
            adapter.itemsize(samples.activation_dtype)

    def _check(self, samples: Samples) -> None:
        error = samples_error(self.rank, samples, self.samples)
        if error is not None:
            raise ValueError(error)

    # --- FC worker --------------------------------------------------------------------

    def fc(self, adapter) -> float:
        """An FC worker's step (module docstring)."""
        first = self.samples is None
        if first:
            self.agree(None, None)
        samples, ex = self.samples, self.exchange
        sample_bytes = self._sample_bytes(adapter, samples)
        global_batch = None
        if self.micro_batches > 1:
            # The conv workers' batch sizes come first: every micro-batch's loss is
            # weighed by the global batch.
            global_batch = ex.global_batch(sum(ex.receive_batch_sizes()))
        received, loss_sum, kept = 0, 0.0, []
        for k in range(self.micro_batches):
            sizes = ex.probe_batches(sample_bytes)
            total = sum(sizes)
            activations, activation_bytes = adapter.empty(
                (total,) + samples.activation_shape, samples.activation_dtype)
            labels, label_bytes = adapter.empty((total,) + samples.label_shape,
                                                samples.label_dtype)
            bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
            ex.receive_activations(byte_slices(activation_bytes, bounds, total),
                                   byte_slices(label_bytes, bounds, total))
            if global_batch is None:
                global_batch = ex.global_batch(total)
            gradient, losses = self._head(adapter, activations, labels, sizes, bounds,
                                          global_batch, first and k == 0)
            ex.send_gradients(byte_slices(gradient, bounds, total), losses)
            kept.append(gradient)  # alive until the sends complete
            part_sum, count = mean_loss(sizes, losses)
            received += count
            loss_sum += part_sum
        # The conv workers run their backward passes while the FC workers sum.
        adapter.sum_gradients()
        ex.wait()
        return loss_sum / received if received else float("nan")

    def _head(self, adapter, activations, labels, sizes, bounds, global_batch,
              check: bool):
        """Step 3 on one (micro-)batch: ``(activation gradient bytes, losses)``. At the
        first step an error of the head or the loss is raised on every rank."""
        error: Optional[str] = None
        objective, losses = None, None
        try:
            objective, losses = adapter.run_head(activations, labels, sizes, bounds,
                                             global_batch)
        except Exception as exc:  # whatever the user's head or loss raise at the first step
            if not check:
                raise
            error = adapter.head_error(exc)
        if check:
            error = self.exchange.first_error(error)
            if error is not None:
                self.samples = None  # as on the conv workers
                raise ValueError(error)
        return adapter.head_backward(objective), losses

    # --- both roles -------------------------------------------------------------------

    def agree(self, samples: Optional[Samples], error: Optional[Exception],
              extra=None) -> None:
        """The first step's check of the data, on every rank (collective): the same
        ``ValueError`` everywhere, or :attr:`samples` (and :attr:`extra`) set alike
        everywhere."""
        message = None
        if error is not None:
            message = str(error) if str(error).startswith("Stanza.step") else \
                f"Stanza.step: rank {self.rank}: features(x) raised {type(error).__name__}: {error}"
        agreed, message, extra = agreed_samples(
            self.exchange.gather_all((samples, message, extra)))
        if message is not None:
            raise ValueError(message) from error
        self.samples, self.extra = agreed, extra
