"""One rank of one benchmark run: train a workload under a strategy, record everything.

Launched by :mod:`hvdx.bench.strategy_run` under ``mpirun`` (on the emulated hosts or on
localhost)::

    python -m hvdx.bench.runner --workload digits_vgg --strategy horovod --steps 100 \
        --eval-every 10 --out result.json

Steps:
1. ``hvd.init()``; every rank takes its shard of the workload's training set;
2. rank 0's initial weights are broadcast; the strategy builds the optimizer;
3. after a barrier, each rank reads its data interface's byte counters, then trains;
   the clock runs during training steps only (evaluation is excluded; communication a
   strategy leaves in flight past ``step()`` is completed on the clock before an
   evaluation, :attr:`~hvdx.bench.strategy_row.BenchRow.before_eval`), and so does
   each rank's time in hvdx's own MPI waits (:func:`hvdx.mpi.sparse.waited_s`);
4. every ``--eval-every`` steps all ranks evaluate on the test set, the mean of the
   workload's quality (test accuracy; validation bits per byte for ``lm``) is recorded
   against training time, and rank 0 prints a progress line (JSON);
5. rank 0 writes step times, the accuracy curve, hvdx's byte count and the interface
   counters of every rank to ``--out``, with the strategy's closing figures (decentralized
   SGD: the consensus distance of the ranks' models, read after the counters).

Quality is each rank's own model on the test set, averaged over ranks: for the
strategies that average parameters (DS-Sync, decentralized SGD) that is the mean of the
local models, not the quality of their average (no ``synchronize_parameters()``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

# What the harness sets for every rank; importable from here as they always were.
from hvdx.bench.run_environment import IFACE_ENV, PLACEMENT_ENV, TOPOLOGY_ENV  # noqa: F401


def interface_bytes(iface):
    """``(tx, rx)`` bytes of ``iface`` in this process's network namespace, or None."""
    if not iface:
        return None
    base = f"/sys/class/net/{iface}/statistics"
    try:
        with open(f"{base}/tx_bytes") as tx, open(f"{base}/rx_bytes") as rx:
            return int(tx.read()), int(rx.read())
    except OSError:
        return None


def _compute_time(model, x, y, batch, loss, repeats=5):
    """Median seconds of one forward + backward pass without communication.

    Measured on a copy, before the strategy hooks the model, as the compute input of
    the cost model (``hvdx plan``) that the benchmark checks against measured steps.
    """
    import copy

    local = copy.deepcopy(model)
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        loss(local(x[i * batch:(i + 1) * batch]), y[i * batch:(i + 1) * batch]).backward()
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:]))  # the first pass pays for allocation


def _stanza_figures(model, x, batch, repeats=5):
    """What the cost model needs to price Stanza: elements per sample at the split, and
    the head's share of a forward + backward pass (median over ``repeats``, on copies)."""
    import copy

    features, head = copy.deepcopy(model).stanza_parts()
    inputs = x[:batch]
    times = {"features": [], "head": []}
    for i in range(repeats + 1):
        start = time.perf_counter()
        activations = features(inputs)
        activations.sum().backward()
        middle = time.perf_counter()
        head(activations.detach().requires_grad_(True)).sum().backward()
        end = time.perf_counter()
        if i:  # the first pass pays for allocation
            times["features"].append(middle - start)
            times["head"].append(end - middle)
    conv_s, head_s = (float(np.median(times[k])) for k in ("features", "head"))
    return {"activation_size": int(activations[0].numel()),
            "fc_compute_fraction": head_s / (conv_s + head_s)}


def main(argv=None):
    parser = argparse.ArgumentParser(description="one rank of an hvdx benchmark run")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    import torch

    import hvdx.torch as hvd
    from hvdx.bench.strategies import STRATEGIES
    from hvdx.bench.workloads import WORKLOADS, parameter_split
    from hvdx.mpi.sparse import waited_s

    workload, strategy = WORKLOADS[args.workload], STRATEGIES[args.strategy]
    hvd.init(**strategy.init_kwargs)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rank, size = hvd.rank(), hvd.size()
    full = workload.data()
    x_test, y_test = torch.from_numpy(full.x_test), torch.from_numpy(full.y_test)

    model = workload.make_model()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    batch = workload.batch_size
    local = workload.make_optimizer(model.parameters(), size)
    if strategy.roles:
        # Stanza: only the conv workers read data, each a shard of the conv ranks' share;
        # the learning rate follows the global batch (S batches, not n).
        example = torch.from_numpy(full.shard(0, size).x_train[:batch])
        optimizer = strategy.build(local, model, example)
        readers = list(optimizer.roles.conv_ranks)
        if workload.optimizer == "sgd":
            for group in local.param_groups:
                group["lr"] = workload.lr * len(readers)
    else:
        optimizer, readers = None, list(range(size))
    reads = rank in readers
    data = full.shard(readers.index(rank) if reads else 0, len(readers))
    x_train, y_train = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    compute_s = _compute_time(model, x_train, y_train, batch, workload.loss)
    stanza = _stanza_figures(model, x_train, batch) if strategy.roles else None
    if not strategy.roles:
        optimizer = strategy.build(local, model)

    per_epoch = len(full.x_train) // len(readers) // batch
    rng = np.random.default_rng(args.seed + rank)
    order = rng.permutation(len(x_train))

    # Each rank evaluates its own slice of the test set and the ranks average, weighted
    # by the slices' sizes: the whole set's quality where the ranks hold one model, an
    # unbiased mean over the ranks' models where they differ (parameter mixing), at
    # 1/size of the cost (a transformer's evaluation would otherwise outlast its steps).
    x_slice, y_slice = x_test[rank::size], y_test[rank::size]

    def evaluate():
        """Test quality over the ranks' slices (each rank its own model); for a trainer
        with roles, the quality of the whole model rebuilt on rank 0."""
        if strategy.roles:
            whole = optimizer.full_model(rank=0)
            value = 0.0
            if whole is not None:
                whole.eval()
                value = workload.quality(whole, x_test, y_test)
            return hvd.broadcast_object(value, root_rank=0, name="bench.quality")
        model.eval()
        value = workload.quality(model, x_slice, y_slice)
        model.train()
        weighted = torch.tensor([value * len(y_slice), float(len(y_slice))],
                                dtype=torch.float64)
        total, count = hvd.allreduce(weighted, op=hvd.Sum, name="bench.quality").tolist()
        return total / count

    schedule = workload.make_schedule(local)

    def train_step(idx):
        if strategy.roles:
            loss = optimizer.step(x_train[idx], y_train[idx]) if reads else optimizer.step()
        else:
            optimizer.zero_grad()
            loss = workload.loss(model(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
            loss = float(loss.item())
        if schedule is not None:
            schedule.step()
        return loss

    iface = os.environ.get(IFACE_ENV)
    hvd.barrier()
    counters_start = interface_bytes(iface)
    # The interfaces also carry the evaluations (Stanza's full_model moves the head):
    # their bytes are subtracted, so that the counters hold the training steps only.
    evaluation_bytes = np.zeros(2)
    step_times, step_waits, curve, train_time = [], [], [], 0.0
    for step in range(1, args.steps + 1):
        i = (step - 1) % per_epoch
        if i == 0 and step > 1:
            order = rng.permutation(len(x_train))
        idx = torch.from_numpy(order[i * batch:(i + 1) * batch])
        waited, start = waited_s(), time.perf_counter()
        loss = train_step(idx)
        evaluating = step % args.eval_every == 0 or step == args.steps
        if evaluating and strategy.before_eval is not None:
            strategy.before_eval(optimizer)  # on the clock, not in the evaluation
        elapsed = time.perf_counter() - start
        step_times.append(elapsed)
        step_waits.append(waited_s() - waited)
        train_time += elapsed
        if evaluating:
            before = interface_bytes(iface)
            quality = evaluate()
            after = interface_bytes(iface)
            if before and after:
                evaluation_bytes += np.subtract(after, before)
            curve.append({"step": step, "time": train_time, "quality": quality,
                          "loss": float(loss)})
            if rank == 0:
                print(json.dumps({"event": "progress", "step": step, "steps": args.steps,
                                  "time": train_time, "quality": quality,
                                  "unit": workload.metric.unit}), flush=True)
    hvd.barrier()
    counters_end = interface_bytes(iface)
    sent, received = strategy.bytes_per_step(optimizer, model, size, args.steps)
    # After the counters: a strategy's closing figures may run a collective.
    final_stats = strategy.final_stats(optimizer, args.steps) if strategy.final_stats else None
    interface = None
    if counters_start and counters_end:
        interface = [int(e - s - b) for s, e, b in
                     zip(counters_start, counters_end, evaluation_bytes)]
    everyone = hvd.allgather_object({"rank": rank, "interface_tx_rx": interface,
                                     "median_step": float(np.median(step_times)),
                                     "compute_s": compute_s, "hvdx_sent": sent,
                                     "hvdx_received": received,
                                     # Seconds of each step spent in hvdx's MPI waits.
                                     "step_waits": step_waits})
    # Ranks need not send alike (a DS-Sync rank that sits out a cross phase sends
    # nothing): report the mean, as for the interface counters.
    sent = float(np.mean([r["hvdx_sent"] for r in everyone]))
    received = float(np.mean([r["hvdx_received"] for r in everyone]))
    if rank == 0:
        result = {
            "workload": args.workload, "strategy": args.strategy, "ranks": size,
            "steps": args.steps, "step_times": step_times, "curve": curve,
            "hvdx_bytes_per_rank_per_step": sent,
            "hvdx_received_per_rank_per_step": received,
            "ranks_detail": everyone,
            "parameters": sum(p.numel() for p in model.parameters()),
            "parameter_split": parameter_split(model),
            "compute_s": float(np.median([r["compute_s"] for r in everyone])),
            "cost_options": strategy.cost_options_of(optimizer)
            if strategy.cost_options_of else strategy.cost_options,
            # Steps after which the communication repeats (1: every step alike).
            "schedule_period": strategy.period_of(optimizer) or 1
            if strategy.period_of else 1,
            # Horovod's settings the job ran with (a strategy may set its own cycle).
            "horovod_env": {k: v for k, v in sorted(os.environ.items())
                            if k.startswith("HOROVOD_")},
            "final_stats": final_stats,
            "stanza": stanza,  # the split's figures, for the cost model (Stanza only)
            "placement": os.environ.get(PLACEMENT_ENV),  # None: localhost
        }
        with open(args.out + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(args.out + ".tmp", args.out)
        print(json.dumps({"event": "done"}), flush=True)
    # Horovod first (its background thread communicates until it stops), then MPI
    # through hvdx.mpi.finalize: MPICH's own MPI_Finalize over UCX's TCP transport
    # deadlocks when the ranks reach it apart. os._exit skips the interpreter's slow
    # teardown; nothing is left to do.
    hvd.shutdown()
    from hvdx.mpi.finalize import finalize

    finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
