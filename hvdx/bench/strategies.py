"""The strategies ``hvdx bench`` compares, each a way to build the distributed optimizer.

A strategy turns a local optimizer into a distributed one and says how many bytes a
rank sends per step. Horovod's own collectives are not visible to hvdx, so for the
Horovod baseline the bytes are the standard cost of the algorithm MPI runs for a large
allreduce (reduce-scatter + allgather, Thakur, Rabenseifner & Gropp 2005): each rank
sends ``2 (n - 1) / n`` times the gradient bytes. The benchmark checks every such
figure against the interface byte counters of the emulated hosts.

The table (:data:`STRATEGIES`) is a view of the strategy catalogue
(:mod:`hvdx.strategies.catalogue`): Horovod's baseline, then each built-in strategy's
rows (its descriptor's ``bench``: a name, the lazy path of the function that makes the
row, its arguments), then the floor. The functions that make the rows of the built-in
strategies are here (:func:`topk_strategy`, ...); a new strategy's can live in its own
module.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional

from hvdx.strategies.topk import presets as topk_presets
from hvdx.bench.run_environment import bench_topology
from hvdx.strategies import catalogue
from hvdx.strategies.descriptor import load

__all__ = ["ALIASES", "DEFAULT_STRATEGIES", "FULL_STRATEGIES", "Strategy", "STRATEGIES",
           "allreduce_bytes_per_rank", "decentralized_bytes", "decentralized_strategy",
           "dssync_strategy", "stanza_strategy", "strategy_names", "topk_strategy"]


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
    #: Run by ``hvdx bench --full`` too, where not :attr:`default`.
    full: bool = False
    #: Other names ``--strategies`` accepts for it (:data:`ALIASES`).
    aliases: tuple = ()
    #: ``hvdx bench --script``: the variables (``HVDX_COMPRESSION`` or ``HVDX_SYNC``)
    #: that switch an unchanged script to it, as :mod:`hvdx.environment` spells them
    #: (``{}``: Horovod's own); ``None`` where no variable can (:attr:`needs_code`).
    script_env: Optional[Dict[str, str]] = None
    #: Why a script cannot run it unchanged, where :attr:`script_env` is ``None``.
    needs_code: Optional[str] = None
    #: The catalogue's name of the strategy it is a row of (``None``: the baseline and
    #: the floor).
    strategy: Optional[str] = None
    #: (workload) -> the settings the row runs with on that workload, compared with
    #: ``==``; ``None``: not compared. Two rows whose settings are equal on a workload
    #: are one run there, measured once (:func:`hvdx.bench.run_list.same_settings`).
    settings_on: Optional[Callable] = None


def _call(name: str, options: Dict) -> str:
    """``name(k=v, ...)``: a constructor's call as the variables spell it."""
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in options.items())})"


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
#: ``topk_method`` of the presets (:mod:`hvdx.strategies.topk.presets`).
TOPK_RATIO = topk_presets.RATIO
TOPK_METHOD = topk_presets.TOPK_METHOD
#: The tuned TopKs are the presets ``Compression.topk(preset="fast")`` (row ``fast``,
#: once ``topk_dgc``: global selection, DGC momentum correction without masking) and
#: ``preset="safe"`` (row ``safe``, once ``topk_masked``: with masking, the downlink
#: twice as dense); the measurements behind
#: them are in :mod:`hvdx.strategies.topk.presets`. Their arguments, for the labels and the cost
#: model:
TOPK_DGC_OPTIONS: Dict = topk_presets.preset_options("fast")
TOPK_MASKED_OPTIONS: Dict = topk_presets.preset_options("safe")
#: Every run of the bench, Horovod's included, keeps Horovod's defaults: no strategy
#: gets a tuning the baseline does not. (The tuned TopKs, decentralized SGD and Stanza
#: leave Horovod idle during a step, so a user may launch them with
#: ``HOROVOD_CYCLE_TIME=50``, :data:`hvdx.strategies.topk.presets.HOROVOD_CYCLE_ENV`, for a few more
#: percent: docs/benchmarks.md, "TopK: Horovod's cycle".)


def _topk_preset(preset: str):
    """The builder of a tuned TopK strategy: ``Compression.topk(preset=preset)``."""
    def build(optimizer, model):
        import hvdx.torch as hvd

        return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                        compression=hvd.Compression.topk(preset=preset))
    return build


def topk_strategy(name: str, preset: Optional[str] = None) -> Strategy:
    """A TopK row: the bench's own setting (:data:`TOPK_RATIO` both ways,
    :data:`TOPK_METHOD`), or a preset's (``HVDX_COMPRESSION=<preset>``)."""
    sharded = {"mode": "sharded"}
    if preset is None:
        return Strategy(
            name, f"bidirectional TopK {TOPK_RATIO:g}/{TOPK_RATIO:g} with error feedback, "
            f"{TOPK_METHOD} selector", _topk_with(downlink_ratio=TOPK_RATIO), _counted_bytes,
            cost_model="topk",
            cost_options=dict(ratio=TOPK_RATIO, downlink_ratio=TOPK_RATIO, **sharded),
            script_env={"HVDX_COMPRESSION": _call("topk", {"ratio": TOPK_RATIO,
                                                           "topk_method": TOPK_METHOD,
                                                           "downlink_ratio": TOPK_RATIO})})
    options = topk_presets.preset_options(preset)
    up, down = options["ratio"], options["downlink_ratio"]
    ratios = f"{up:g}/{down:g}," if up == down else f"{up:g} up, {down:g} down,"
    masking = "with" if options["momentum_masking"] else "without"
    adaptive = topk_presets.ADAPTIVE_RATIO
    return Strategy(name, f"bidirectional TopK {ratios} global selection, DGC momentum "
                    f"correction {masking} masking, small tensors averaged by hvdx "
                    f"({adaptive:g} both ways under Adam's family)",
                    _topk_preset(preset), _counted_bytes, cost_model="topk",
                    cost_options=dict(ratio=up, downlink_ratio=down, **sharded),
                    cost_options_of=_preset_options, script_env={"HVDX_COMPRESSION": preset},
                    settings_on=_preset_settings(preset))


def _preset_settings(preset: str) -> Callable:
    """(workload) -> the TopK spec ``preset`` runs with under the workload's optimizer
    (:func:`hvdx.strategies.topk.presets.for_optimizer`): under Adam's family both
    presets send :data:`~hvdx.strategies.topk.presets.ADAPTIVE_RATIO` both ways, one
    setting."""
    def settings(workload):
        import torch
        from hvdx.strategies.topk.spec import topk

        optimizer = workload.make_optimizer([torch.nn.Parameter(torch.zeros(1))], 1)
        fitted, _ = topk_presets.for_optimizer(topk(preset=preset), type(optimizer).__name__,
                                               optimizer.param_groups)
        return fitted
    return settings


def _preset_options(optimizer) -> Dict:
    """The cost model's options for the ratios the preset ran with: its own, or those it
    took for the workload's optimizer (:func:`hvdx.strategies.topk.presets.for_optimizer`)."""
    spec = optimizer.hvdx_strategy  # the spec as fitted to the optimizer
    return {"ratio": spec.ratio, "downlink_ratio": spec.downlink_ratio, "mode": "sharded"}


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
    schedule = optimizer.hvdx_groups.schedule
    return {"intra_phases": schedule.intra_phases, "cross_ranks": schedule.cross_ranks}


def _rotation_period(optimizer) -> int:
    """The rotation's period: ``intra_phases`` intra-rack steps and one crossing step
    (:class:`hvdx.strategies.dssync.core_schedule.RotationSchedule`)."""
    return optimizer.hvdx_groups.schedule.period


def _dssync_bytes(optimizer, model, size, steps):
    """The ring model inside each step's group (hvdx hands the groups to Horovod)."""
    each_way = optimizer.hvdx_stats.total_bytes / steps
    return each_way, each_way


def dssync_strategy(name: str, adaptive: bool = False) -> Strategy:
    """A DS-Sync row: the rotation with :data:`DSSYNC_OPTIONS`, or re-planned from the
    probe (:data:`DSSYNC_ADAPTIVE_OPTIONS`)."""
    options = DSSYNC_ADAPTIVE_OPTIONS if adaptive else DSSYNC_OPTIONS
    label = (f"DS-Sync rotation, re-planned from a bandwidth probe every "
             f"{options['probe_every']} steps" if adaptive else
             "DS-Sync rotation, parameters from the cost of crossing")
    return Strategy(name, label, _dssync_adaptive if adaptive else _dssync, _dssync_bytes,
                    cost_model="dssync", cost_options_of=_rotation_options,
                    period_of=_rotation_period, init_kwargs={"process_sets": "dynamic"},
                    script_env={"HVDX_SYNC": _call("DSSync", options)})


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


def decentralized_strategy(name: str, **changes) -> Strategy:
    """A decentralized row: :data:`DECENTRALIZED_OPTIONS` with ``changes``
    (``topology=``, ``order=``)."""
    options = dict(DECENTRALIZED_OPTIONS, **changes)
    label = (f"decentralized SGD, {_GRAPHS[options['topology']]}, "
             f"{_ORDERS[options['order']]}")
    return Strategy(name, label, _decentralized_with(options), decentralized_bytes,
                    cost_model="decentralized", cost_options=dict(options),
                    period_of=_graph_period,
                    final_stats=_decentralized_final_stats, before_eval=_complete_exchange,
                    script_env={"HVDX_SYNC": _call("Decentralized", options)})


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


#: Why ``hvdx bench --script`` cannot run Stanza.
STANZA_NEEDS_CODE = ("Stanza needs code (hvd.Stanza(features, head, ...) drives the "
                     "training step): no variable switches a script to it")


def stanza_strategy(name: str, fc_workers=1, micro_batches: int = 1) -> Strategy:
    """A Stanza row: ``fc_workers`` FC workers (``"auto"``: a probe decides), each batch
    in ``micro_batches``."""
    if fc_workers == "auto":
        workers = "FC workers chosen by a probe (fc_workers='auto')"
    else:
        workers = f"{fc_workers} FC worker{'s' if fc_workers != 1 else ''}"
    if micro_batches != 1:
        workers += (f", each batch in {micro_batches} micro-batches (the head on one while "
                    "the features compute the next)")
    elif fc_workers == 1:
        workers += " (the last rank)"
    return Strategy(name, f"Stanza layer separation, {workers}",
                    _stanza_with(fc_workers, micro_batches), stanza_bytes,
                    cost_model="stanza",
                    cost_options={"fc_workers": 1 if fc_workers == "auto" else fc_workers},
                    cost_options_of=_stanza_options,
                    final_stats=_stanza_final_stats, roles=True,
                    needs_code=STANZA_NEEDS_CODE)


#: The baseline: Horovod's own optimizer.
HOROVOD = Strategy("horovod", "Horovod ring allreduce (baseline)", _horovod, _gradient_bytes,
                   cost_model="horovod", script_env={})
#: Not a way to train together: the limit of every strategy on these cores.
FLOOR = Strategy("floor", "the floor: every rank trains alone, no communication at all "
                 "(Horovod idle)", lambda optimizer, model: optimizer,
                 lambda optimizer, model, size, steps: (0.0, 0.0), default=False,
                 needs_code="the floor (every rank training alone) cannot be had from a "
                 "script without changing it: its broadcasts and any metric allreduce "
                 "still communicate")


def _rows() -> Dict[str, Strategy]:
    """Horovod, each built-in strategy's rows in catalogue order, the floor."""
    rows = [HOROVOD]
    for entry in catalogue.BUILT_IN:
        for variant in entry.bench:
            row = load(variant.make)(variant.name, **variant.kwargs)
            rows.append(dataclasses.replace(row, default=variant.default, full=variant.full,
                                            aliases=tuple(variant.aliases),
                                            strategy=entry.name))
    rows.append(FLOOR)
    table = {row.name: row for row in rows}
    if len(table) != len(rows):
        raise ValueError(f"hvdx bench: a row's name twice: {[row.name for row in rows]}")
    return table


STRATEGIES: Dict[str, Strategy] = _rows()

#: What a plain ``hvdx bench`` runs (every method, TopK as its two presets): the adaptive DS-Sync pays off under contention
#: only, so it runs when asked for (``--strategies ...,dssync_adaptive``); so do the
#: static exponential graph and combine-then-adapt, variants of ``decentralized``, and
#: Stanza with two FC workers or a probed number, variants of ``stanza``.
DEFAULT_STRATEGIES = tuple(name for name, s in STRATEGIES.items() if s.default)
#: What ``hvdx bench --full`` runs: the defaults and TopK without the presets' tuning
#: (the paper's method as it stands; the presets are what a user is told to run, so
#: the quick run has those alone).
FULL_STRATEGIES = tuple(name for name, s in STRATEGIES.items() if s.default or s.full)

#: Other names ``--strategies`` accepts: the tuned TopKs' names before their rows took
#: the presets' (``topk_dgc`` for ``fast``, ``topk_masked`` for ``safe``).
ALIASES: Dict[str, str] = {alias: name for name, s in STRATEGIES.items()
                           for alias in s.aliases}


def strategy_names(names: Iterable[str]) -> List[str]:
    """``--strategies``' names (stripped) with each of :data:`ALIASES` replaced by the
    strategy it names; an unknown name is kept, for the run to refuse with the list."""
    return [ALIASES.get(name.strip(), name.strip()) for name in names]
