"""``hvd.join()`` under hvdx's TensorFlow strategies: refused, with what to do instead.

Horovod's ``join`` lets a rank that ran out of data stop early: until every rank has
joined, Horovod answers the other ranks' allreduces for it with zeros. hvdx's
strategies exchange through collectives of their own (TopK's sparse exchange, the
graphs' point-to-point mixing) or average parameters (DS-Sync), which Horovod cannot
answer for a joined rank: the others would wait for it forever, or average its zeros.
(hvdx's PyTorch ``join`` takes part in TopK's exchanges for a joined rank,
:mod:`hvdx.torch.join`; TensorFlow's TopK runs inside traced functions, where a rank
that left the loop cannot be stepped for.)

So:

1. every tape or Keras optimizer built with an hvdx strategy records the strategy's
   name here (:func:`track`, called by :mod:`hvdx.tensorflow.registry`); a tape is made
   anew each step and its state outlives it, so the record is kept for the process;
2. :func:`join` refuses, on the rank that calls it, while any was built, naming the
   strategies and what to do instead; that rank's uncaught error ends the job
   (:mod:`hvdx.mpi.abort`) rather than leaving the other ranks waiting in an exchange;
3. with none built, it is Horovod's ``join``.
"""

from __future__ import annotations

from typing import Set

import horovod.tensorflow as _hvd

__all__ = ["join", "track"]

#: Names of the hvdx strategies a tape or Keras optimizer of this process was built with.
_built: Set[str] = set()


def track(strategy) -> None:
    """Record that a tape or Keras optimizer running ``strategy`` was built (step 1)."""
    _built.add(strategy.name)


def join():
    """Horovod's ``join()``, refused while an hvdx strategy trains (module
    docstring). Returns what Horovod's returns: a scalar tensor, the rank that joined
    last.

    Raises:
        ValueError: a tape or Keras optimizer was built with an hvdx strategy.
    """
    if _built:
        raise ValueError(
            f"hvd.join(): not supported with hvdx's {', '.join(sorted(_built))} strategy "
            "in TensorFlow: its exchanges are not Horovod's allreduces, so the other ranks "
            "would wait for this one (or average its zeros). Give every rank the same "
            "number of steps instead: shard the dataset with dataset.shard(hvd.size(), "
            "hvd.rank()) and take the fewest batches any rank has "
            "(hvd.allreduce(tf.constant(batches), op=hvd.Min)), or drop the remainder.")
    return _hvd.join()
