"""DS-Sync: group averaging through Horovod process sets.

One strategy, one folder (the shared machinery, the mixing drivers among it, stays in
hvdx.core, hvdx.mpi, hvdx.torch and hvdx.tensorflow):

- ``spec.py``: the spec :class:`DSSync` (framework-neutral; ``hvdx.DSSync``);
- ``core_schedule.py``, ``core_link_rates.py``: the group schedule and the link rates,
  numpy and the standard library only;
- ``core_cost.py``: its traffic per step for the cost model (``hvdx plan``);
- ``mpi_groups.py``, ``mpi_adapt.py``: the groups and process sets shared by both
  frameworks, and the bandwidth adaptation;
- ``mixer.py``: its mixer (:class:`hvdx.core.mixer_protocol.Mixer`), which the shared
  mixing drivers of torch and TensorFlow run, and ``dssync_process_sets``;
- ``descriptor.py``: its entry in the catalogue (:mod:`hvdx.strategies.catalogue`).

Importing this package imports nothing else.
"""
