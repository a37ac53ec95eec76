"""Keras' side of a Stanza trainer: the two parts as layers, their variables and bytes.

Stanza (Wu, Xu, Li, Xiong, arXiv 1812.10624) trains the features on the conv workers
and the head on the FC workers; :mod:`hvdx.strategies.stanza.tensorflow.trainer` holds
each as a :class:`KerasPart` (a model or layer, or a slice of a ``Sequential``'s
layers). This module holds what touches Keras layers and variables:

1. the parts from the two forms of the arguments (:func:`parts_of`, the form checked by
   :func:`hvdx.strategies.stanza.core_checks.check_parts`), built on ``example=`` if
   their variables do not exist yet (:func:`build_parts`), and checked with the
   optimizer and the loss (:func:`check_training`);
2. the fingerprint's entries (:func:`entries`), ``fc_workers="auto"``'s timed runs
   (:func:`probe_runs`);
3. a part's variables as host bytes and back (:func:`weights_bytes`,
   :func:`weights_size`, :func:`load_weights`), a new copy of a model for
   ``full_model`` (:func:`clone`, :func:`output_shape`);
4. words for messages: :func:`what`, :func:`takes` (what the head's first layer
   takes), and dtype names (:func:`dtype_name`, :func:`np_dtype`).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from hvdx.strategies.stanza.core_checkpoint import arrays_from_bytes, concat_bytes
from hvdx.strategies.stanza.core_checks import check_parts

__all__ = ["KerasPart", "build_parts", "check_training", "clone", "dtype_name", "entries",
           "is_batch", "load_weights", "np_dtype", "output_shape", "parts_of",
           "per_sample", "probe_runs", "takes", "weights_bytes", "weights_size", "what"]


class KerasPart:
    """One role's Keras layers, applied in order: ``[model]`` or a slice of a
    ``Sequential``'s layers (``split=``). Variables in layer order, each once."""

    def __init__(self, layers: Sequence[tf.keras.layers.Layer], name: str):
        self.layers = tuple(layers)
        self.name = name

    def __call__(self, x, training: bool):
        for layer in self.layers:
            x = layer(x, training=training)
        return x

    @property
    def built(self) -> bool:
        return all(layer.built for layer in self.layers)

    @property
    def weights(self) -> List[tf.Variable]:
        return _unique(w for layer in self.layers for w in layer.weights)

    @property
    def trainable_variables(self) -> List[tf.Variable]:
        return _unique(v for layer in self.layers for v in layer.trainable_variables)


def parts_of(features, head, split) -> Tuple[KerasPart, KerasPart]:
    """``(features, head)`` from the two forms of the arguments (step 1)."""
    layer = tf.keras.layers.Layer
    layers = len(features.layers) if isinstance(features, tf.keras.Sequential) else None
    split = check_parts(split, layers, isinstance(features, layer) and isinstance(head, layer),
                        ("Keras models or layers", "tf.keras.Sequential"),
                        what(features), what(head))
    if split is None:
        return KerasPart([features], "features"), KerasPart([head], "head")
    layers = list(features.layers)
    return KerasPart(layers[:split], "features"), KerasPart(layers[split:], "head")


def build_parts(features: KerasPart, head: KerasPart, example) -> None:
    """Create the variables of a model not built yet, with ``example``; with
    ``example`` also check that the head takes the features' output (``training=False``:
    no BatchNorm statistic changes), so that a misfit fails at construction."""
    if features.built and head.built and example is None:
        return
    unbuilt = " and ".join(f"{p.name} ({', '.join(type(l).__name__ for l in p.layers)})"
                           for p in (features, head) if not p.built)
    if example is None:
        raise ValueError(f"Stanza: the {unbuilt} not built: Keras creates variables at "
                         "the first call, and the ranks must agree on them and take rank "
                         "0's before training. Build the model first (call it once on a "
                         "batch, or give its first layer input_shape=), or pass example= "
                         "(a batch of the features' input)")
    try:
        activations = features(example, training=False)
    except Exception as exc:  # whatever Keras raises on an example that does not fit
        raise ValueError(f"Stanza: example= ({what(example)}) does not go through "
                         f"the features: {type(exc).__name__}: {exc}") from exc
    try:
        head(activations, training=False)
    except Exception as exc:
        shape = tuple(activations.shape) if tf.is_tensor(activations) else what(activations)
        raise ValueError(f"Stanza: on example= ({what(example)}), the head cannot take "
                         f"the features' output: activations of shape {shape}"
                         f"{takes(head)}: {type(exc).__name__}: {exc}") from exc


def check_training(features: KerasPart, head: KerasPart, optimizer, loss_fn) -> None:
    optimizers = (tf.keras.optimizers.Optimizer, tf.keras.optimizers.legacy.Optimizer)
    if not isinstance(optimizer, optimizers):
        raise TypeError(f"Stanza: optimizer must be a Keras optimizer "
                        f"(tf.keras.optimizers.Optimizer), got {what(optimizer)}")
    if not callable(loss_fn):
        raise TypeError(f"Stanza: loss_fn must be callable, got {what(loss_fn)}")
    if not head.trainable_variables:
        kinds = ", ".join(type(layer).__name__ for layer in head.layers)
        raise ValueError(f"Stanza: the head ({kinds}) has no trainable variables: the FC "
                         "workers would have nothing to do; move the layers with weights "
                         "that take the features' output into the head")
    shared = {v.ref() for v in features.weights} & {v.ref() for v in head.weights}
    if shared:
        raise ValueError("Stanza: features and head share variables; the two roles train "
                         "them apart, so they cannot be tied")


def is_batch(example) -> bool:
    return (tf.is_tensor(example) or isinstance(example, np.ndarray)) and \
        len(example.shape) >= 1 and example.shape[0] >= 1


def _finish(tensors) -> None:
    """Wait for ``tensors`` (an accelerator runs eager ops asynchronously)."""
    tf.add_n([tf.reduce_sum(tf.cast(t, tf.float32)) for t in tensors if t is not None]).numpy()


def probe_runs(features: KerasPart, head: KerasPart, example):
    """fc_workers="auto"'s timed runs (:func:`hvdx.strategies.stanza.mpi_setup.probe_roles`):
    features and head forward + backward with ``training=False`` (a tape changes no
    variable, and BatchNorm statistics stay as they are)."""
    batch = int(example.shape[0])
    activations = features(example, training=False)
    conv_vars, head_vars = features.trainable_variables, head.trainable_variables

    def conv():
        with tf.GradientTape() as tape:
            total = tf.reduce_sum(features(example, training=False))
        _finish(tape.gradient(total, conv_vars) + [total])

    def fc(count):
        inputs = tf.gather(activations, tf.range(count) % batch)

        def run():
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                total = tf.reduce_sum(head(inputs, training=False))
            _finish(tape.gradient(total, [inputs] + head_vars))
        return run

    return conv, fc


def entries(features: KerasPart, head: KerasPart):
    """Fingerprint entries ``(key, dtype, shape, label)``: every variable of both parts,
    in order; positional keys (variable names may differ between ranks)."""
    return [(f"{part.name}[{i}]", dtype_name(v.dtype) + ("" if v.trainable else " frozen"),
             tuple(v.shape), v.name)
            for part in (features, head) for i, v in enumerate(part.weights)]


def clone(layer, per_sample: Optional[Sequence[int]]):
    """A new, built copy of a Keras model or layer (weights not copied): built for the
    input shape Keras recorded when the layer was first called, else ``per_sample``."""
    graph = isinstance(layer, tf.keras.Sequential) or getattr(layer, "_is_graph_network", False)
    clone = tf.keras.models.clone_model(layer) if graph else \
        type(layer).from_config(layer.get_config())
    if not clone.built:
        shape = getattr(layer, "_build_input_shape", None)
        if shape is None and per_sample is None:
            raise ValueError(f"{type(layer).__name__} {layer.name!r} was built without an "
                             "input shape on record; take a step first, so that Stanza "
                             "knows the shapes")
        clone.build(shape if shape is not None else (None,) + tuple(per_sample))
    return clone


def output_shape(model) -> Optional[Tuple[int, ...]]:
    """The per-sample output shape of a built model (``None`` if Keras cannot tell)."""
    try:
        return tuple(model.compute_output_shape(model._build_input_shape))[1:]
    except Exception:  # no input shape on record, or a layer that cannot tell
        return None


def per_sample(x) -> Optional[Tuple[Optional[int], ...]]:
    """A batch's per-sample shape (``None`` for inputs without one, e.g. a dict)."""
    shape = getattr(x, "shape", None)
    return None if shape is None else tuple(None if d is None else int(d) for d in shape[1:])


def _unique(variables) -> List[tf.Variable]:
    seen, result = set(), []
    for v in variables:
        if v.ref() not in seen:
            seen.add(v.ref())
            result.append(v)
    return result


def dtype_name(dtype) -> str:
    return tf.as_dtype(dtype).name


def np_dtype(name: str) -> np.dtype:
    """numpy's dtype for a TensorFlow or numpy dtype name (bfloat16 too)."""
    try:
        return np.dtype(tf.as_dtype(name).as_numpy_dtype)
    except TypeError:  # a numpy dtype TensorFlow has no name for
        return np.dtype(name)


def weights_size(part: KerasPart) -> int:
    return sum(int(v.shape.num_elements()) * v.dtype.size for v in part.weights)


def load_weights(variables: Sequence[tf.Variable], buffer: np.ndarray) -> None:
    """Inverse of :func:`weights_bytes`: ``buffer`` into ``variables`` (a part's
    ``weights``, or an optimizer's), on their devices."""
    specs = [(np_dtype(v.dtype.name), tuple(v.shape)) for v in variables]
    values = arrays_from_bytes(buffer, specs)
    for v, value in zip(variables, values):
        with tf.device(v.device):
            v.assign(tf.convert_to_tensor(value))


def weights_bytes(part: KerasPart) -> np.ndarray:
    """Every variable of ``part``, trainable or not, back to back, as host bytes."""
    return concat_bytes([v.numpy() for v in part.weights])


def takes(head: KerasPart) -> str:
    """What the head's first layer takes, for the first step's message, or ``""``."""
    layer = head.layers[0]
    while True:
        try:
            return f"; the head takes inputs of shape {layer.input_shape}"
        except (AttributeError, RuntimeError):
            pass  # called eagerly only: no symbolic input shape
        if isinstance(layer, tf.keras.Model) and layer.layers:
            layer = layer.layers[0]
            continue
        break
    spec = layer.input_spec
    spec = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
    axes = getattr(spec, "axes", None)
    if not axes:
        return ""
    return (f"; the head's first layer, {type(layer).__name__}, takes inputs with " +
            ", ".join(f"axis {axis} of size {size}" for axis, size in sorted(axes.items())))


def what(value) -> str:
    if tf.is_tensor(value):
        return f"a {dtype_name(value.dtype)} tensor of shape {tuple(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"a {value.dtype.name} array of shape {value.shape}"
    return "None" if value is None else type(value).__name__
