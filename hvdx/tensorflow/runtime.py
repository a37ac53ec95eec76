"""``hvd.init`` for hvdx on TensorFlow (and ``shutdown``, ``start_timeline``,
``stop_timeline``: Horovod's, plus hvdx's exchanges in the timeline), and the
once-per-object consistency check."""

import functools

import horovod.tensorflow as _hvd
import tensorflow as tf

from hvdx import environment
from hvdx.core.fingerprint import Fingerprint
from hvdx.mpi import check_consistent, communicator_for, timeline, wrap_init

__all__ = ["init", "shutdown", "start_timeline", "stop_timeline", "check_variables_once"]


init = wrap_init(_hvd.init, environment.check_at_init)
# Horovod's, then hvdx's exchanges added to the timeline file (hvdx.mpi.timeline).
shutdown = timeline.wrap_shutdown(_hvd.shutdown)
start_timeline = timeline.wrap_start_timeline(_hvd.start_timeline, _hvd.rank)
stop_timeline = timeline.wrap_stop_timeline(_hvd.stop_timeline)


def check_variables_once(owner, method_name: str, variables_of, settings, what: str,
                         error=None):
    """Check consistency on the first call of ``owner.<method_name>``, then step aside.

    TensorFlow only tells which variables are trained when gradients are first taken,
    often while a ``tf.function`` is being traced. The check is plain Python (mpi4py),
    so it runs at trace time, and it runs once: every rank takes its first step, so
    every rank joins it, whereas a later retrace (a smaller last batch) may happen on
    some ranks only.

    Args:
        owner: Horovod's tape or optimizer object; the bound method is shadowed by an
            attribute of this instance only (Horovod's classes are left untouched).
        method_name: the method whose first call carries the variables.
        variables_of: ``(args, kwargs) -> list of tf.Variable``.
        settings: fingerprint settings (from :func:`hvdx.settings.horovod_settings`).
        what: the object's name for error messages.
        error: a ``ValueError`` this rank kept for the check
            (a compression strategy's refusal, :mod:`hvdx.tensorflow.registry`): added to the
            fingerprint, and raised after the check if every rank kept the same.
    """
    if error is not None and not any(k.endswith(".error") for k, _ in settings):
        settings = list(settings) + [(f"{what}.error", str(error))]
    original = getattr(owner, method_name)
    # A method this instance already shadows (hvdx's step log) is put back afterwards.
    shadowed = owner.__dict__.get(method_name)
    process_set = owner.process_set if hasattr(owner, "process_set") else None

    # Plain trace-time Python (mpi4py, hashing): AutoGraph has nothing to convert here,
    # and converting it (and Horovod's method it calls) cost 10-30 s per process.
    @tf.autograph.experimental.do_not_convert
    @functools.wraps(original)
    def first_call(*args, **kwargs):
        variables = list(variables_of(args, kwargs))
        fingerprint = Fingerprint.build(
            parameters=[(f"variable[{i}]", v.dtype.name, tuple(v.shape))
                        for i, v in enumerate(variables)],
            settings=settings,
            labels=[v.name for v in variables])
        ps = process_set or _hvd.global_process_set
        if ps.included():
            comm = communicator_for(ps, _hvd.global_process_set, _hvd.size())
            check_consistent(fingerprint, comm, what)
        if error is not None:
            raise error
        # From now on the instance resolves the method on its class again (or on what
        # shadowed it before).
        if shadowed is not None:
            object.__setattr__(owner, method_name, shadowed)
        elif method_name in owner.__dict__:
            object.__delattr__(owner, method_name)
        return original(*args, **kwargs)

    object.__setattr__(owner, method_name, first_call)
    return owner


def flat_variables(structure):
    """The variables of a (possibly nested) structure, in ``tf.nest`` order."""
    return tf.nest.flatten(structure)
