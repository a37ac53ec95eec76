"""Decentralized SGD: neighbour averaging over a mixing graph.

One strategy, one folder (the shared machinery, the mixing bases and the graphs
(``hvdx/core/mixing_graphs.py``, which the cost model prices) among it, stays in
hvdx.core, hvdx.mpi, hvdx.torch and hvdx.tensorflow):

- ``spec.py``: the spec :class:`Decentralized` (framework-neutral; ``hvdx.Decentralized``);
- ``core_reference.py``: the numpy reference of the algorithm;
- ``core_cost.py``: its traffic per step for the cost model (``hvdx plan``);
- ``mpi_neighbor_exchange.py``: the fused neighbour exchange over mpi4py;
- ``torch/optimizer.py``, ``tensorflow/adapters.py``: the framework adapters, mixers of
  the parameter-mixing bases (each subpackage imports hvdx's package for its framework
  first);
- ``descriptor.py``: its entry in the catalogue (:mod:`hvdx.strategies.catalogue`).

Importing this package imports nothing else.
"""
