"""Decentralized SGD: neighbour averaging over a mixing graph.

One strategy, one folder (the shared machinery stays in hvdx.core, hvdx.mpi, hvdx.torch
and hvdx.tensorflow: among it the mixing drivers, the graphs (``hvdx/core/mixing_graphs.py``)
and the fused neighbour exchange over mpi4py (``hvdx/mpi/neighbor_exchange.py``), both
of which the registered mixers use too):

- ``spec.py``: the spec :class:`Decentralized` (framework-neutral; ``hvdx.Decentralized``);
- ``core_reference.py``: the numpy reference of the algorithm;
- ``core_cost.py``: its traffic per step for the cost model (``hvdx plan``);
- ``mixer.py``: its mixer (:class:`hvdx.core.mixer_protocol.Mixer`), which the shared
  mixing drivers of torch and TensorFlow run; ``tape_fit.py``: the order a tape runs
  for an ``HVDX_SYNC`` value;
- ``descriptor.py``: its entry in the catalogue (:mod:`hvdx.strategies.catalogue`).

Importing this package imports nothing else.
"""
