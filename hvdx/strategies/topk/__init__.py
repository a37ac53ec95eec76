"""TopK: bidirectional TopK sparsification with error feedback.

One strategy, one folder (the shared machinery stays in hvdx.core, hvdx.mpi,
hvdx.torch and hvdx.tensorflow):

- ``spec.py``: the spec ``topk(...)`` / :class:`TopKCompression` (framework-neutral);
- ``presets.py``: the named settings ``fast`` and ``safe``, and where DGC's momentum
  correction applies;
- ``core_selection.py``, ``core_bidirectional.py``, ``core_global.py``,
  ``core_error_feedback.py``, ``core_sparsity_warmup.py``: the algorithms, numpy and
  the standard library only;
- the step, in GRACE's parts (Xu et al., ICDCS 2021), shared by both frameworks: the
  compressor ``core_compressor.py`` (TopK selection at this step's ratios), the memory
  ``core_memory.py`` (worker and server residuals), the communicators
  ``mpi_communicators.py`` (gathered, sharded, the small tensors' allreduce), and the
  driver ``mpi_driver.py`` that runs them every step with ``mpi_nonfinite.py`` (the
  NaN/Inf agreement), ``mpi_autotune.py``, ``core_concatenation.py`` (global
  selection), ``core_checkpoint.py`` and ``core_counters.py``; ``mpi_sync.py`` keeps
  the names it held before the split importable;
- ``core_cost.py``: its traffic per step for the cost model (``hvdx plan``);
- ``torch/optimizer.py`` (with ``torch/dense_allreduce.py``, Horovod's allreduce, and
  ``torch/momentum_correction.py``, DGC's), ``tensorflow/adapters.py``: the framework
  adapters (each subpackage imports hvdx's package for its framework first);
- ``descriptor.py``: its entry in the catalogue (:mod:`hvdx.strategies.catalogue`).

Importing this package imports nothing else.
"""
