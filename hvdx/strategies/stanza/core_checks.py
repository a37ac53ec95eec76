"""What both Stanza trainers check and say, framework-neutral.

Stanza (Wu, Xu, Li, Xiong, arXiv 1812.10624) runs the same checks in PyTorch
(:mod:`hvdx.strategies.stanza.torch.trainer`) and TensorFlow
(:mod:`hvdx.strategies.stanza.tensorflow.trainer`):

1. at the first step the conv workers agree on the per-sample shapes and dtypes of
   their activations and labels (:class:`Samples`); from then on a batch must match;
2. a checkpoint records the role layout it was saved in, and a trainer of another
   layout refuses it, naming both (:func:`describe_layout`);
3. ``fc_workers="auto"`` times both parts (:func:`timed`) before the ranks agree on
   the figures (:func:`hvdx.strategies.stanza.core_roles.median_probe`);
4. the settings at construction (:func:`check_settings`): ``micro_batches`` is an
   integer of at least 1 (:func:`check_micro_batches`), ``fc_workers`` gives roles
   (:func:`hvdx.strategies.stanza.core_roles.stanza_roles`) or is ``"auto"`` with an example; a
   conv worker's batch splits into that many consecutive parts
   (:func:`micro_batch_bounds`);
5. the first step's agreement: from every rank's ``(samples, error, extra)`` the same
   verdict on every rank (:func:`agreed_samples`); afterwards a conv worker's batch
   must give the agreed samples (:func:`samples_error`);
6. the first step's message for a head (or loss) that cannot take the activations,
   naming the shapes (:func:`head_error`);
7. a checkpoint saved in another layout is refused, naming both
   (:func:`layout_error`); ``full_model(rank)`` needs one rank of the job,
   the same on every rank (:func:`target_error`);
8. the arguments' form: one ``Sequential`` with ``split=`` or two parts
   (:func:`check_parts`); a conv worker's batch, its activations and labels, and the
   loss (:func:`batch_error`, :func:`activations_error`, :func:`labels_error`,
   :func:`loss_error`), and its split into micro-batches (:func:`split_batch`).

Every function is pure: given the same gathered values, every rank says the same, so
that an error raised after an agreement is raised on every rank.
"""

from __future__ import annotations

import time
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

from hvdx.strategies.stanza.core_roles import AUTO, StanzaRoles, stanza_roles

import numpy as np

__all__ = ["Samples", "activations_error", "agreed_samples", "batch_error",
           "check_micro_batches", "check_parts", "check_settings", "describe_layout",
           "head_error", "labels_error", "layout_error", "loss_error", "micro_batch_bounds",
           "samples_error", "samples_in", "split_batch", "star", "target_error", "timed"]


class Samples(NamedTuple):
    """Per-sample shapes and dtypes of the activations and labels (agreed at step 1)."""

    activation_shape: Tuple[int, ...]
    activation_dtype: str
    label_shape: Tuple[int, ...]
    label_dtype: str

    def describe(self) -> str:
        return (f"activations {star(self.activation_shape)} {self.activation_dtype}, "
                f"labels {star(self.label_shape)} {self.label_dtype}")


def star(shape: Sequence[int]) -> str:
    """A per-sample shape with the batch dimension as ``*``: ``[*, 3, 8]``."""
    return "[" + ", ".join(["*"] + [str(d) for d in shape]) + "]"


def describe_layout(layout: dict) -> str:
    """A checkpoint's or a trainer's layout (``role``, ``rank``, ``size``,
    ``fc_workers``) in words."""
    return (f"a {layout.get('role')} worker (rank {layout.get('rank')}) of {layout.get('size')} "
            f"ranks with fc_workers={layout.get('fc_workers')}")


def timed(run: Callable[[], object], repeats: int = 3) -> float:
    """Median seconds of ``run()`` after one untimed call (which pays for allocation)."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def check_micro_batches(micro_batches) -> None:
    """Step 4: raises ``ValueError`` naming the value unless it is an integer >= 1."""
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, (int, np.integer)) \
            or micro_batches < 1:
        raise ValueError(f"micro_batches={micro_batches!r} must be an integer of at least 1 "
                         "(1: the whole batch at once)")


def check_settings(size: int, fc_workers, micro_batches, example_ok: bool, example: str,
                   source: str) -> Optional[StanzaRoles]:
    """Step 4: the roles of ``fc_workers`` ranks in a world of ``size``, or ``None``
    for ``fc_workers="auto"`` (chosen later, from a probe on the example).

    Args:
        example_ok: whether ``example=`` is a batch of at least one sample;
        example: it in words; ``source``: where a user finds one ("loader").

    Raises:
        ValueError: naming the bad value.
    """
    check_micro_batches(micro_batches)
    if not (isinstance(fc_workers, str) and fc_workers == AUTO):
        return stanza_roles(size, fc_workers)
    if not example_ok:
        raise ValueError(f"fc_workers='auto' times both sides on a batch before training: "
                         f"pass example= (a batch of the features' input, e.g. the first "
                         f"batch of your {source}), got example={example}")
    if size < 2:
        stanza_roles(size, 1)  # raises: Stanza needs two ranks
    return None


def head_error(rank: int, exc: Exception, activations: Tuple[Sequence[int], object],
               labels: Optional[Tuple[Sequence[int], object]] = None,
               outputs: object = None, takes: str = "") -> str:
    """Step 6: the message for a head that cannot take the features' output, or, with
    ``outputs`` (the head's output shape), for a loss that cannot take the head's.

    ``activations`` and ``labels``: ``(shape, dtype)`` as the framework names them;
    ``labels=None``: the construction's check on ``example=``; ``takes``: what the
    head's first layer takes, in words (or ``""``).
    """
    error = f"{type(exc).__name__}: {exc}"
    if outputs is not None:
        return (f"Stanza.step: on FC rank {rank}, loss_fn cannot take the head's output of "
                f"shape {outputs} and labels of shape {tuple(labels[0])} ({labels[1]}): "
                f"{error}")
    if labels is None:
        where, shown = f"Stanza: on rank {rank}'s example, the head", ""
    else:
        where = f"Stanza.step: the head on FC rank {rank}"
        shown = f" and labels of shape {tuple(labels[0])}"
    shape, dtype = tuple(activations[0]), activations[1]
    return (f"{where} cannot take the features' output: activations of shape {shape} "
            f"({dtype}, per sample {list(shape[1:])}){shown}{takes}: {error}")


def micro_batch_bounds(samples: int, count: int) -> List[Tuple[int, int]]:
    """``count`` consecutive ``(lo, hi)`` parts of ``samples``, sizes differing by at
    most one, the larger first (some are empty if there are fewer samples than parts):
    the split ``torch.tensor_split`` and ``numpy.array_split`` make."""
    size, extra = divmod(int(samples), int(count))
    bounds, lo = [], 0
    for k in range(int(count)):
        hi = lo + size + (1 if k < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def samples_in(batch) -> int:
    """The samples of a batch: its first dimension (a tensor or array), else its length."""
    return int(batch.shape[0]) if hasattr(batch, "shape") else len(batch)


def split_batch(x, y, count: int,
                lengths: Callable[[object, object], Optional[Tuple[int, object, object]]]
                ) -> List[Tuple[object, object]]:
    """``count`` consecutive parts ``(x[lo:hi], y[lo:hi])`` of a conv worker's batch
    (:func:`micro_batch_bounds`). ``lengths(x, y)``: ``(samples, x, y)`` for two
    batches of the same length (``y`` as the framework slices it), else ``None``:
    anything else stays whole, for the first step's check."""
    if count == 1:
        return [(x, y)]
    found = lengths(x, y)
    if found is None:
        return [(x, y)]
    samples, x, y = found
    return [(x[lo:hi], y[lo:hi]) for lo, hi in micro_batch_bounds(samples, count)]


def check_parts(split, layers: Optional[int], parts_ok: bool, kinds: Tuple[str, str],
                features: str, head: str) -> Optional[int]:
    """Step 8: ``split`` as an ``int`` (``None`` without one) if the arguments have one
    of the two forms: two parts (``parts_ok``), or one ``Sequential`` of ``layers``
    layers (``None``: not a ``Sequential``) with ``head=None`` (``head == "None"``).

    Args:
        kinds: the framework's names of a part and of a ``Sequential``
            (``("torch.nn.Module", "nn.Sequential")``), for the messages;
        features, head: the arguments in words.

    Raises:
        TypeError: for arguments of neither form; ``ValueError`` for a ``split`` that
            is not an integer from 1 to ``layers - 1``.
    """
    part, sequential = kinds
    if split is None:
        if not parts_ok:
            raise TypeError(f"Stanza: features and head must be {part}, got "
                            f"features={features}, head={head} (or pass one "
                            f"{sequential} and split=)")
        return None
    if layers is None or head != "None":
        raise TypeError(f"Stanza: split={split!r} takes one {sequential} and head=None, "
                        f"got {features} and head={head}")
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)) or \
            not 1 <= split < layers:
        raise ValueError(f"split={split!r} must be an integer from 1 to {layers - 1} "
                         f"for a Sequential of {layers} layers")
    return int(split)


def batch_error(rank: int, x: str, y: str) -> str:
    """Step 8: a conv worker called without a batch and its labels (in words)."""
    return (f"Stanza.step: rank {rank} is a conv worker and needs a batch and its labels, "
            f"got x={x}, y={y}")


def activations_error(rank: int, activations: str) -> str:
    """Step 8: the features returned no batch (``activations`` in words)."""
    return (f"Stanza.step: rank {rank}'s features returned {activations}, not a batch of "
            "activations")


def labels_error(rank: int, samples: int, labels_shape: Tuple[int, ...]) -> str:
    """Step 8: labels of another number of samples than the activations."""
    return (f"Stanza.step: rank {rank} has {samples} samples of activations but labels "
            f"of shape {labels_shape}")


def loss_error(loss: str) -> str:
    """Step 8: ``loss_fn`` returned no scalar (``loss`` in words)."""
    return f"loss_fn returned {loss}, not a scalar tensor (the mean over the samples)"


def agreed_samples(everyone: Sequence[Tuple[Optional[Samples], Optional[str], object]]
                   ) -> Tuple[Optional[Samples], Optional[str], object]:
    """Step 5, the first step's verdict from every rank's ``(samples, error, extra)``
    (rank order; FC workers give ``samples=None``): ``(agreed samples, None, the first
    conv worker's extra)``, or ``(None, message, None)`` for the first error in rank
    order, or for conv workers whose batches differ (naming both)."""
    message = next((m for _, m, _ in everyone if m is not None), None)
    if message is not None:
        return None, message, None
    conv = [(r, s, e) for r, (s, _, e) in enumerate(everyone) if s is not None]
    first_rank, agreed, extra = conv[0]
    for r, s, _ in conv[1:]:
        if s != agreed:
            return None, (f"Stanza.step: the conv workers' batches differ: rank "
                          f"{first_rank}'s gives {agreed.describe()}, rank {r}'s gives "
                          f"{s.describe()}"), None
    return agreed, None, extra


def samples_error(rank: int, samples: Samples, agreed: Samples) -> Optional[str]:
    """Step 5 after the first step: why this conv worker's batch is refused, or ``None``."""
    if samples == agreed:
        return None
    return (f"Stanza.step: rank {rank}'s batch gives {samples.describe()}, but the first "
            f"step agreed on {agreed.describe()}")


def layout_error(where: str, rank: int, saved_layout: object,
                 expected_layout: dict) -> Optional[str]:
    """Step 6: why a checkpoint saved in ``saved_layout`` does not fit this trainer's
    ``expected_layout`` (naming both), or ``None``; ``where`` names the method."""
    if saved_layout == expected_layout:
        return None
    saved = saved_layout or {}
    return (f"{where}: rank {rank}'s state was saved as {describe_layout(saved)}; this "
            f"trainer runs it as {describe_layout(expected_layout)}: resume with the same "
            "number of ranks and fc_workers")


def target_error(targets: Sequence[object], size: int) -> Optional[str]:
    """Step 6: every rank's ``full_model(rank=...)`` argument (an ``int``, else its
    ``repr``) -> why it cannot be served, or ``None``."""
    if len(set(targets)) != 1:
        return f"Stanza.full_model: the ranks asked for different ranks: {list(targets)}"
    target = targets[0]
    if not isinstance(target, int) or not 0 <= target < size:
        shown = target if isinstance(target, str) else repr(target)
        return (f"Stanza.full_model: rank={shown} is not a rank of this job of {size} "
                "ranks")
    return None
