"""Stanza: layer separation, conv workers train the features and FC workers the head.

One strategy, one folder (the shared machinery stays in hvdx.core, hvdx.mpi, hvdx.torch
and hvdx.tensorflow):

- ``core_roles.py``: the roles (which ranks are conv workers, which FC workers, who
  serves whom) and the loss scaling, numpy and the standard library only; the cost
  model prices the same layout;
- ``core_checks.py``: what every rank checks before the first step, numpy and the
  standard library only;
- ``core_checkpoint.py``: a checkpoint as one byte string (TensorFlow's), numpy and the
  standard library only;
- ``core_cost.py``: its traffic per step for the cost model (``hvdx plan``);
- ``mpi_exchange.py``, ``mpi_gradients.py``, ``mpi_setup.py``, ``mpi_step.py``: its
  messages over mpi4py, shared by both frameworks;
- ``mpi_trainer.py``: the trainer written once (construction, step, whole model,
  checkpoint agreement), whose hooks each framework fills;
- ``torch/trainer.py``, ``tensorflow/trainer.py``: the trainers (``hvdx.torch.Stanza``,
  ``hvdx.tensorflow.Stanza``; each subpackage imports hvdx's package for its framework
  first), the framework's hooks only; ``torch/passes.py``, ``tensorflow/passes.py``:
  the passes on tensors that a step runs; ``tensorflow/keras_parts.py``: the Keras parts
  and their variables;
- ``descriptor.py``: its entry in the catalogue (:mod:`hvdx.strategies.catalogue`).

Importing this package imports nothing else.
"""
