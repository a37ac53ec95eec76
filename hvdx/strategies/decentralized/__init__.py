"""Decentralized SGD: neighbour averaging over a mixing graph.

One strategy, one folder (the shared machinery stays in hvdx.core, hvdx.mpi, hvdx.torch
and hvdx.tensorflow: among it the mixing bases, the graphs (``hvdx/core/mixing_graphs.py``)
and the fused neighbour exchange over mpi4py (``hvdx/mpi/neighbor_exchange.py``), both
of which the registered mixers use too):

- ``spec.py``: the spec :class:`Decentralized` (framework-neutral; ``hvdx.Decentralized``);
- ``core_reference.py``: the numpy reference of the algorithm;
- ``core_cost.py``: its traffic per step for the cost model (``hvdx plan``);
- ``torch/optimizer.py``, ``tensorflow/adapters.py``: the framework adapters, mixers of
  the parameter-mixing bases (each subpackage imports hvdx's package for its framework
  first);
- ``descriptor.py``: its entry in the catalogue (:mod:`hvdx.strategies.catalogue`).

Importing this package imports nothing else.
"""
