"""The strategies ``hvdx bench`` compares, each a way to build the distributed optimizer.

A strategy turns a local optimizer into a distributed one and says how many bytes a
rank sends per step. Horovod's own collectives are not visible to hvdx, so for the
Horovod baseline the bytes are the standard cost of the algorithm MPI runs for a large
allreduce (reduce-scatter + allgather, Thakur, Rabenseifner & Gropp 2005): each rank
sends ``2 (n - 1) / n`` times the gradient bytes. The benchmark checks every such
figure against the interface byte counters of the emulated hosts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional

from hvdx import topk_presets
from hvdx.bench.run_environment import bench_topology
from hvdx.optimizer_surface import dssync_groups, mixing_strategy

__all__ = ["ALIASES", "DEFAULT_STRATEGIES", "FULL_STRATEGIES", "Strategy", "STRATEGIES",
           "allreduce_bytes_per_rank", "decentralized_bytes", "strategy_names"]


def allreduce_bytes_per_rank(nbytes: int, size: int) -> float:
    """Bytes one rank sends in a bandwidth-optimal allreduce of ``nbytes`` over ``size``."""
    return 0.0 if size <= 1 else 2.0 * (size - 1) / size * nbytes


@dataclass(frozen=True)
class Strategy:
    """How to build the optimizer, and the bytes a rank sends per step."""

    name: str
    label: str
    build: Callable  # (optimizer, model) -> distributed optimizer
    #: (distributed optimizer, model, size, steps) -> (sent, received) bytes per rank per
    #: step, read after training.
    bytes_per_step: Callable
    cost_model: Optional[str] = None  # its name in hvdx.core.cost_model, if priced there
    cost_options: Dict = field(default_factory=dict)
    #: (distributed optimizer) -> cost options read off the run (override cost_options).
    cost_options_of: Optional[Callable] = None
    #: (distributed optimizer) -> the steps after which the strategy's communication
    #: repeats (a DS-Sync rotation, a one-peer graph), or ``None``: every step alike,
    #: or no period (a shuffle). The bench's mean step covers whole periods.
    period_of: Optional[Callable] = None
    init_kwargs: Dict = field(default_factory=dict)  # for hvd.init
    #: Environment variables of the strategy's MPI job (every rank), e.g. Horovod's.
    env: Dict[str, str] = field(default_factory=dict)
    #: Run by a plain ``hvdx bench`` (others only when named in ``--strategies``).
    default: bool = True
    #: (distributed optimizer, steps) -> dict of figures read once after training, on
    #: every rank (a collective may run here), after the interface counters are read;
    #: rank 0 records them as the run's ``final_stats``.
    final_stats: Optional[Callable] = None
    #: (distributed optimizer) -> None, run inside the step's clock when an evaluation
    #: follows the step: completes communication a strategy leaves in flight past
    #: ``step()``, which the evaluation's forward pass would otherwise wait for off the
    #: clock (decentralized SGD's exchange).
    before_eval: Optional[Callable] = None
    #: A strategy whose ranks have roles (Stanza): ``build`` is then
    #: ``(optimizer, model, example) -> trainer`` and the runner drives
    #: ``trainer.step(x, y)`` on the conv workers and ``trainer.step()`` on the others
    #: (:mod:`hvdx.bench.runner`); ``bytes_per_step`` and the other callables get the
    #: trainer in place of the optimizer.
    roles: bool = False


def _horovod(optimizer, model):
    import horovod.torch as hvd

    return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())


def _gradient_bytes(optimizer, model, size, steps):
    """Horovod's traffic is not visible to hvdx: the allreduce's standard cost."""
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    each_way = allreduce_bytes_per_rank(nbytes, size)
    return each_way, each_way


def _topk_with(**options):
    """The builder of a TopK strategy: ``Compression.topk(ratio=TOPK_RATIO,
    topk_method=TOPK_METHOD, **options)``."""
    def build(optimizer, model):
        import hvdx.torch as hvd

        return hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(),
            compression=hvd.Compression.topk(ratio=TOPK_RATIO, topk_method=TOPK_METHOD,
                                             **options))
    return build


def _counted_bytes(optimizer, model, size, steps):
    """hvdx's own traffic: the byte counters of the optimizer, per step."""
    stats = optimizer.hvdx_stats
    return stats.total_sent / steps, stats.total_received / steps


#: The benchmark's TopK setting: 1% both ways, with the sampled-threshold
#: ``topk_method`` of the presets (:mod:`hvdx.topk_presets`).
TOPK_RATIO = topk_presets.RATIO
TOPK_METHOD = topk_presets.TOPK_METHOD
#: The tuned TopKs are the presets ``Compression.topk(preset="fast")`` (``topk_dgc``:
#: global selection, DGC momentum correction without masking) and ``preset="safe"``
#: (``topk_masked``: with masking, the downlink twice as dense); the measurements behind
#: them are in :mod:`hvdx.topk_presets`. Their arguments, for the labels and the cost
#: model:
TOPK_DGC_OPTIONS: Dict = topk_presets.preset_options("fast")
TOPK_MASKED_OPTIONS: Dict = topk_presets.preset_options("safe")
#: Every run of the bench, Horovod's included, keeps Horovod's defaults: no strategy
#: gets a tuning the baseline does not. (The tuned TopKs, decentralized SGD and Stanza
#: leave Horovod idle during a step, so a user may launch them with
#: ``HOROVOD_CYCLE_TIME=50``, :data:`hvdx.topk_presets.HOROVOD_CYCLE_ENV`, for a few more
#: percent: docs/benchmarks.md, "TopK: Horovod's cycle".)


def _topk_preset(preset: str):
    """The builder of a tuned TopK strategy: ``Compression.topk(preset=preset)``."""
    def build(optimizer, model):
        import hvdx.torch as hvd

        return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                        compression=hvd.Compression.topk(preset=preset))
    return build


#: The benchmark's DS-Sync: the rotation with its default parameters, which the cost of
#: crossing sets from the link rates the emulated cluster exports
#: (``HVDX_CLUSTER_LINK_RATES``): with 1 Gbit NICs and a 100 Mbit uplink on 2 racks x 2
#: hosts, 10 intra-rack phases per cross phase, one rank per rack crossing.
DSSYNC_OPTIONS: Dict = {}


def _dssync_with(options: Dict):
    def build(optimizer, model):
        import hvdx
        import hvdx.torch as hvd

        sync = hvdx.DSSync(**dict(options, topology=bench_topology()))
        return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                        sync=sync)
    return build


_dssync = _dssync_with(DSSYNC_OPTIONS)


#: The adaptive variant: the same rotation, re-planned from the bandwidth probe every
#: ``probe_every`` steps (1 MiB per transfer: about 1 s per probe over a 100mbit
#: uplink on 2 x 2 hosts, counted in the step times).
DSSYNC_ADAPTIVE_OPTIONS = dict(DSSYNC_OPTIONS, probe_every=10, probe_bytes=2**20)


_dssync_adaptive = _dssync_with(DSSYNC_ADAPTIVE_OPTIONS)


def _rotation_options(optimizer) -> Dict:
    """The cost model's options for the rotation the run actually used."""
    schedule = dssync_groups(optimizer).schedule
    return {"intra_phases": schedule.intra_phases, "cross_ranks": schedule.cross_ranks}


def _rotation_period(optimizer) -> int:
    """The rotation's period: ``intra_phases`` intra-rack steps and one crossing step
    (:class:`hvdx.core.dssync_schedule.RotationSchedule`)."""
    return dssync_groups(optimizer).schedule.period


def _dssync_bytes(optimizer, model, size, steps):
    """The ring model inside each step's group (hvdx hands the groups to Horovod)."""
    each_way = optimizer.hvdx_stats.total_bytes / steps
    return each_way, each_way


#: The benchmark's decentralized SGD (``hvdx.Decentralized``): the one-peer exponential
#: graph, one model sent and one received per rank per step (against Horovod's
#: ``2 (n - 1) / n`` models each way), adapt-then-combine. The static exponential graph
#: sends ``tau = ceil(log2 n)`` models each way per step; combine-then-adapt sends the
#: same bytes as adapt-then-combine, during the forward and backward pass.
DECENTRALIZED_OPTIONS: Dict = {"topology": "one-peer-exp", "order": "adapt_then_combine"}
DECENTRALIZED_STATIC_OPTIONS: Dict = dict(DECENTRALIZED_OPTIONS, topology="static-exp")
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
    sync = mixing_strategy(optimizer)
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
    return optimizer.hvdx_graph.period * mixing_strategy(optimizer).mix_every


def _decentralized_strategy(name: str, label: str, options: Dict, default: bool) -> Strategy:
    return Strategy(name, label, _decentralized_with(options), decentralized_bytes,
                    cost_model="decentralized", cost_options=dict(options),
                    period_of=_graph_period,
                    default=default,
                    final_stats=_decentralized_final_stats, before_eval=_complete_exchange)


def _stanza_with(fc_workers, micro_batches=1):
    """The builder of a Stanza trainer over the workload's ``stanza_parts()``."""
    def build(optimizer, model, example):
        import hvdx.torch as hvd

        features, head = model.stanza_parts()
        return hvd.Stanza(features, head, optimizer, fc_workers=fc_workers,
                          example=example if fc_workers == "auto" else None,
                          micro_batches=micro_batches)
    return build


def stanza_bytes(trainer, model, size, steps):
    """hvdx's own count of what Stanza's steps put on the network: the point-to-point
    messages as sent (activations, their gradients, losses and batch sizes), and each
    role allreduce at its standard cost, ``2 (m - 1) / m`` times the buffer over the
    role's ``m`` ranks (:func:`allreduce_bytes_per_rank`; the trainer counts the buffer
    it hands to MPI); not the one-off ``setup`` transfers (the initial broadcast,
    ``full_model`` for the evaluations)."""
    stats, roles = trainer.stats, trainer.roles
    ranks = {"conv_allreduce": len(roles.conv_ranks), "fc_allreduce": len(roles.fc_ranks)}

    def total(counts):
        return sum(allreduce_bytes_per_rank(v, ranks[k]) if k in ranks else v
                   for k, v in counts.items() if k != "setup")
    return total(stats.sent) / steps, total(stats.received) / steps


def _stanza_options(trainer) -> Dict:
    """The cost model's options for the layout the run used (``"auto"`` decides at
    start-up)."""
    return {"fc_workers": trainer.roles.fc_workers}


def _stanza_final_stats(trainer, steps) -> Dict:
    figures = {"fc_workers": trainer.roles.fc_workers, "conv_ranks": list(trainer.roles.conv_ranks),
               "fc_ranks": list(trainer.roles.fc_ranks)}
    if trainer.probe is not None:
        figures["probe"] = {"conv_s": trainer.probe["conv_s"],
                            "head_s": {str(k): v for k, v in trainer.probe["head_s"].items()}}
    return figures


def _stanza_strategy(name: str, label: str, fc_workers, default: bool,
                     micro_batches: int = 1) -> Strategy:
    return Strategy(name, label, _stanza_with(fc_workers, micro_batches), stanza_bytes,
                    cost_model="stanza",
                    cost_options={"fc_workers": 1 if fc_workers == "auto" else fc_workers},
                    cost_options_of=_stanza_options, default=default,
                    final_stats=_stanza_final_stats, roles=True)


STRATEGIES: Dict[str, Strategy] = {
    "horovod": Strategy("horovod", "Horovod ring allreduce (baseline)", _horovod,
                        _gradient_bytes, cost_model="horovod"),
    "topk": Strategy("topk", f"bidirectional TopK {TOPK_RATIO:g}/{TOPK_RATIO:g} with error "
                     f"feedback, {TOPK_METHOD} selector", _topk_with(downlink_ratio=TOPK_RATIO),
                     _counted_bytes, cost_model="topk",
                     cost_options={"ratio": TOPK_RATIO, "downlink_ratio": TOPK_RATIO,
                                   "mode": "sharded"}, default=False),
    "topk_dgc": Strategy("topk_dgc", f"bidirectional TopK {TOPK_DGC_OPTIONS['ratio']:g}/"
                         f"{TOPK_DGC_OPTIONS['downlink_ratio']:g}, "
                         "global selection, DGC momentum correction without masking, "
                         "small tensors averaged by hvdx",
                         _topk_preset("fast"),
                         _counted_bytes, cost_model="topk",
                         cost_options={"ratio": TOPK_DGC_OPTIONS["ratio"],
                                       "downlink_ratio": TOPK_DGC_OPTIONS["downlink_ratio"],
                                       "mode": "sharded"}),
    "topk_masked": Strategy("topk_masked", f"bidirectional TopK "
                            f"{TOPK_MASKED_OPTIONS['ratio']:g} up, "
                            f"{TOPK_MASKED_OPTIONS['downlink_ratio']:g} down, global "
                            "selection, DGC momentum correction with masking, small "
                            "tensors averaged by hvdx",
                            _topk_preset("safe"), _counted_bytes,
                            cost_model="topk",
                            cost_options={"ratio": TOPK_MASKED_OPTIONS["ratio"],
                                          "downlink_ratio": TOPK_MASKED_OPTIONS["downlink_ratio"],
                                          "mode": "sharded"}),
    "dssync": Strategy("dssync", "DS-Sync rotation, parameters from the cost of crossing",
                       _dssync, _dssync_bytes, cost_model="dssync",
                       cost_options_of=_rotation_options, period_of=_rotation_period,
                       init_kwargs={"process_sets": "dynamic"}),
    "dssync_adaptive": Strategy(
        "dssync_adaptive", "DS-Sync rotation, re-planned from a bandwidth probe every "
        f"{DSSYNC_ADAPTIVE_OPTIONS['probe_every']} steps", _dssync_adaptive, _dssync_bytes,
        cost_model="dssync", cost_options_of=_rotation_options, period_of=_rotation_period,
        init_kwargs={"process_sets": "dynamic"}, default=False),
    "decentralized": _decentralized_strategy(
        "decentralized", "decentralized SGD, one-peer exponential graph, adapt-then-combine",
        DECENTRALIZED_OPTIONS, default=True),
    "decentralized_static": _decentralized_strategy(
        "decentralized_static", "decentralized SGD, static exponential graph (log2 n peers), "
        "adapt-then-combine", DECENTRALIZED_STATIC_OPTIONS,
        default=False),
    "decentralized_cta": _decentralized_strategy(
        "decentralized_cta", "decentralized SGD, one-peer exponential graph, "
        "combine-then-adapt (exchange during forward and backward)",
        DECENTRALIZED_CTA_OPTIONS, default=False),
    "stanza": _stanza_strategy(
        "stanza", "Stanza layer separation, 1 FC worker (the last rank)",
        1, default=True),
    "stanza_f2": _stanza_strategy(
        "stanza_f2", "Stanza layer separation, 2 FC workers", 2,
        default=False),
    "stanza_auto": _stanza_strategy(
        "stanza_auto", "Stanza layer separation, FC workers chosen by a probe "
        "(fc_workers='auto')", "auto", default=False),
    "stanza_micro": _stanza_strategy(
        "stanza_micro", "Stanza layer separation, 1 FC worker, each batch in 4 micro-batches "
        "(the head on one while the features compute the next)", 1,
        default=False, micro_batches=4),
    # Not a way to train together: the limit of every strategy on these cores.
    "floor": Strategy("floor", "the floor: every rank trains alone, no communication at all "
                      "(Horovod idle)", lambda optimizer, model: optimizer,
                      lambda optimizer, model, size, steps: (0.0, 0.0),
                      default=False),
}

#: What a plain ``hvdx bench`` runs (every method, TopK as its two presets): the adaptive DS-Sync pays off under contention
#: only, so it runs when asked for (``--strategies ...,dssync_adaptive``); so do the
#: static exponential graph and combine-then-adapt, variants of ``decentralized``, and
#: Stanza with two FC workers or a probed number, variants of ``stanza``.
DEFAULT_STRATEGIES = tuple(name for name, s in STRATEGIES.items() if s.default)
#: What ``hvdx bench --full`` runs: the defaults and TopK without the presets' tuning
#: (the paper's method as it stands; the presets are what a user is told to run, so
#: the quick run has those alone).
FULL_STRATEGIES = tuple(name for name, s in STRATEGIES.items()
                        if s.default or name == "topk")

#: Other names ``--strategies`` accepts: the presets' own, ``fast`` and ``safe``
#: (``HVDX_COMPRESSION=fast``, ``Compression.topk(preset="fast")``), for the tuned TopKs
#: the benchmark runs them as.
ALIASES: Dict[str, str] = {"fast": "topk_dgc", "safe": "topk_masked"}


def strategy_names(names: Iterable[str]) -> List[str]:
    """``--strategies``' names (stripped) with each of :data:`ALIASES` replaced by the
    strategy it names; an unknown name is kept, for the run to refuse with the list."""
    return [ALIASES.get(name.strip(), name.strip()) for name in names]
