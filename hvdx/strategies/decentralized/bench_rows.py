"""Decentralized SGD's rows of ``hvdx bench``'s table (its descriptor's ``bench``): the
one-peer exponential graph adapt-then-combine (row ``decentralized``), the static
exponential graph and combine-then-adapt (run when named), and the bytes a rank sends
and receives (:func:`decentralized_bytes`). torch is imported inside the builders, on
the ranks that train.
"""

from __future__ import annotations

from typing import Dict

from hvdx.bench.strategy_row import BenchRow, call

__all__ = ["DECENTRALIZED_CTA_OPTIONS", "DECENTRALIZED_OPTIONS",
           "DECENTRALIZED_STATIC_OPTIONS", "decentralized_bytes", "decentralized_strategy"]


#: The benchmark's decentralized SGD (``hvdx.Decentralized``): the one-peer exponential
#: graph, one model sent and one received per rank per step (against Horovod's
#: ``2 (n - 1) / n`` models each way), adapt-then-combine. The static exponential graph
#: sends ``tau = ceil(log2 n)`` models each way per step; combine-then-adapt sends the
#: same bytes as adapt-then-combine, during the forward and backward pass.
DECENTRALIZED_OPTIONS: Dict = {"graph": "one-peer-exp", "order": "adapt_then_combine"}
DECENTRALIZED_STATIC_OPTIONS: Dict = dict(DECENTRALIZED_OPTIONS, graph="static-exp")
DECENTRALIZED_CTA_OPTIONS: Dict = dict(DECENTRALIZED_OPTIONS, order="combine_then_adapt")


def _decentralized_with(options: Dict):
    """The builder of a decentralized strategy: ``hvdx.Decentralized(**options)``,
    mixing the parameters and the floating-point buffers (BatchNorm statistics)."""
    def build(optimizer, model):
        import hvdx
        import hvdx.torch as hvd

        return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                        sync=hvdx.Decentralized(**options),
                                        named_buffers=model.named_buffers())
    return build


def decentralized_bytes(optimizer, model, size, steps):
    """hvdx's own count: ``hvdx_stats.total_bytes`` is the payload this rank sent (one
    fused model per out-neighbour and exchange); it received one per in-neighbour.

    The received bytes are the sent ones scaled by in-degree over out-degree, summed
    over the steps that mixed (every graph of ``hvdx.Decentralized`` is regular, so the
    two are equal: one model each way per step for one-peer graphs, ``tau`` for the
    static exponential graph).
    """
    stats = optimizer.hvdx_stats
    sent = stats.total_bytes / steps
    graph = optimizer.hvdx_graph
    sync = optimizer.hvdx_strategy
    out_degree = in_degree = 0
    for t in range(steps):
        if sync.mixes_at(t):
            neighbours = graph.neighbors(t)
            out_degree += len(neighbours.send_to)
            in_degree += len(neighbours.recv_from)
    received = sent * in_degree / out_degree if out_degree else 0.0
    return sent, received


def _complete_exchange(optimizer) -> None:
    """Complete the exchange in flight (adapt-then-combine: apply it; combine-then-adapt:
    receive it, to be combined in the next ``step()``)."""
    optimizer.synchronize()


def _decentralized_final_stats(optimizer, steps) -> Dict:
    """How far apart the ranks' models ended (collective), and the message count."""
    stats = optimizer.hvdx_stats
    # The counts first: consensus_distance() would complete (and count) an exchange
    # still in flight, which the run did not use.
    counts = {"messages_per_step": stats.total_messages / steps, "exchanges": stats.steps,
              "global_steps": stats.global_steps}
    return dict(counts, consensus_distance=optimizer.consensus_distance())


def _graph_period(optimizer) -> int:
    """The graph's period (``ceil(log2 n)`` for a one-peer graph, else 1) times the
    steps between mixes."""
    return optimizer.hvdx_graph.period * optimizer.hvdx_strategy.mix_every


#: How the labels name the graphs and the orders.
_GRAPHS = {"one-peer-exp": "one-peer exponential graph",
           "static-exp": "static exponential graph (log2 n peers)"}
_ORDERS = {"adapt_then_combine": "adapt-then-combine",
           "combine_then_adapt": "combine-then-adapt (exchange during forward and backward)"}


def decentralized_strategy(name: str, **changes) -> BenchRow:
    """A decentralized row: :data:`DECENTRALIZED_OPTIONS` with ``changes``
    (``graph=``, ``order=``)."""
    options = dict(DECENTRALIZED_OPTIONS, **changes)
    label = (f"decentralized SGD, {_GRAPHS[options['graph']]}, "
             f"{_ORDERS[options['order']]}")
    return BenchRow(name, label, _decentralized_with(options), decentralized_bytes,
                    cost_model="decentralized", cost_options=dict(options),
                    period_of=_graph_period,
                    final_stats=_decentralized_final_stats, before_eval=_complete_exchange,
                    script_env={"HVDX_SYNC": call("Decentralized", options)})
