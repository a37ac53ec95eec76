"""Convergence of the parameter-mixing strategies (DS-Sync, decentralized SGD) on real data (the bar: "Digits CNN, 4 ranks: final test accuracy
within 1 point of dense Horovod after the same number of epochs").

The digits CNN trained on 4 ranks, alike but for the synchronization
(:mod:`digits_training`): Horovod's dense allreduce, then DS-Sync's rotation on 2 racks x
2 hosts with the parameters the cost of crossing picks for a 10:1 oversubscribed uplink
(10 intra-rack phases per cross phase, one rank per rack crossing: the racks mix once
every 11 steps), the paper's random shuffle into groups of 2, and decentralized SGD over
the one-peer exponential graph (Ying et al., arXiv 2110.13363; one peer per step). A final global average
(``synchronize_parameters``) precedes the evaluation, as before any evaluation.

Ten epochs, half of the TopK test's twenty: dense Horovod is past 0.9 by then (measured
on 4 ranks: dense 0.9465, rotation 0.9488, shuffle 0.9555; at twenty epochs all three
are higher still), and the three trainings were the slowest part of the test suite.
"""

import pathlib
import sys

import pytest

import hvdx
import hvdx.torch as hvd
from hvdx.core.topology import Topology

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from digits_training import train  # noqa: E402

pytestmark = [pytest.mark.dssync, pytest.mark.decentralized]

EPOCHS = 10


def horovod(local, model):
    return hvd.DistributedOptimizer(local, named_parameters=model.named_parameters())


def with_sync(sync):
    def distributed(local, model):
        return hvd.DistributedOptimizer(local, named_parameters=model.named_parameters(),
                                        sync=sync)
    return distributed


def average_everywhere(opt):
    """The evaluation reads the parameters after the last step: average them first."""
    opt.synchronize_parameters()


@pytest.fixture(scope="module")
def accuracies():
    topology = Topology.from_counts(racks=2, hosts_per_rack=2)
    rotation = hvdx.DSSync(topology=topology, link_rates=("1gbit", "100mbit"))
    shuffle = hvdx.DSSync("shuffle", group_size=2, seed=3)
    one_peer = hvdx.Decentralized("one-peer-exp")
    return {"dense": train(hvd, horovod, epochs=EPOCHS),
            "one_peer": train(hvd, with_sync(one_peer), epochs=EPOCHS,
                              before_evaluation=average_everywhere),
            "rotation": train(hvd, with_sync(rotation), epochs=EPOCHS,
                              before_evaluation=average_everywhere),
            "shuffle": train(hvd, with_sync(shuffle), epochs=EPOCHS,
                             before_evaluation=average_everywhere)}


@pytest.mark.mpi(min_size=4)
def test_dssync_is_within_one_point_of_dense_horovod(accuracies):
    print(f"digits CNN, {hvd.size()} ranks, {EPOCHS} epochs: {accuracies}")
    assert accuracies["dense"] > 0.9, accuracies
    assert accuracies["rotation"] >= accuracies["dense"] - 0.01, accuracies
    assert accuracies["shuffle"] >= accuracies["dense"] - 0.01, accuracies


@pytest.mark.mpi(min_size=4)
def test_one_peer_exponential_graph_is_within_one_point_of_dense_horovod(accuracies):
    assert accuracies["one_peer"] >= accuracies["dense"] - 0.01, accuracies
