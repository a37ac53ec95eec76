"""TopK: bidirectional TopK sparsification with error feedback.

One strategy, one folder (the shared machinery stays in hvdx.core, hvdx.mpi,
hvdx.torch and hvdx.tensorflow):

- ``spec.py``: the spec ``topk(...)`` / :class:`TopKCompression` (framework-neutral);
- ``presets.py``: the named settings ``fast`` and ``safe``, and where DGC's momentum
  correction applies;
- ``core_selection.py``, ``core_bidirectional.py``, ``core_global.py``,
  ``core_error_feedback.py``, ``core_sparsity_warmup.py``: the algorithms, numpy and
  the standard library only;
- ``core_cost.py``: its traffic per step for the cost model (``hvdx plan``);
- ``mpi_sync.py``: the step's exchange over mpi4py, shared by both frameworks;
- ``torch/optimizer.py``, ``tensorflow/adapters.py``: the framework adapters (each
  subpackage imports hvdx's package for its framework first);
- ``descriptor.py``: its entry in the catalogue (:mod:`hvdx.strategies.catalogue`).

Importing this package imports nothing else.
"""
