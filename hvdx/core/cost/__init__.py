"""The alpha-beta cost model's parts; its API is :mod:`hvdx.core.cost_model`.

1. :mod:`~hvdx.core.cost.types`: the cluster, the workload, flows and what the model
   returns;
2. :mod:`~hvdx.core.cost.collectives`: how an allreduce (ring, MPICH's recursive
   halving, Horovod's negotiation) lays out its flows;
3. :mod:`~hvdx.core.cost.layouts`: each strategy's traffic per step: Horovod's here,
   each strategy's in its folder (``hvdx/strategies/<name>/core_cost.py``), found
   through the strategy catalogue;
4. :mod:`~hvdx.core.cost.pricing`: the price of a phase, from the links it loads;
5. :mod:`~hvdx.core.cost.predict`: a strategy's step, and several compared.
"""
