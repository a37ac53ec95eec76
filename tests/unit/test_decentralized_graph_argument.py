"""hvdx.Decentralized's mixing graph is ``graph=``; ``topology``, its old name (the word
now means the racks of the cluster only), still builds the same spec with a
``DeprecationWarning``, in code and in ``HVDX_SYNC``, and giving both is refused."""

import warnings

import numpy as np
import pytest

import hvdx
from hvdx import environment
from hvdx.core import mixing_graphs
from hvdx.core.cost_model import Cluster, Workload, predict
from hvdx.strategies.decentralized.spec import MixingGraph
from hvdx.strategies.decentralized.tape_fit import tape_fit

pytestmark = [pytest.mark.decentralized]

HALVES = np.array([[0.5, 0.5], [0.5, 0.5]])


def built_without_warning(build):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return build()


@pytest.mark.parametrize("value", ["static-exp", HALVES])
def test_topology_is_graph_s_old_name_with_a_deprecation_warning(value):
    new = built_without_warning(lambda: hvdx.Decentralized(graph=value, mix_every=2))
    with pytest.warns(DeprecationWarning, match=r"use graph="):
        old = hvdx.Decentralized(topology=value, mix_every=2)
    assert old.error is None and repr(old) == repr(new)
    np.testing.assert_array_equal(old.graph, new.graph)
    with pytest.warns(DeprecationWarning, match=r"use \.graph"):
        np.testing.assert_array_equal(old.topology, new.graph)
    graph = MixingGraph(value, 2, 0)
    with pytest.warns(DeprecationWarning, match=r"use \.graph"):
        np.testing.assert_array_equal(graph.topology, graph.graph)


@pytest.mark.parametrize("graph, topology, named", [
    ("ring", "ring", "graph='ring' and topology='ring'"),
    (HALVES, "ring", "graph=<2x2 matrix> and topology='ring'"),
])
def test_graph_and_topology_together_are_refused_naming_both(graph, topology, named):
    with pytest.raises(ValueError, match="give graph only") as error:
        hvdx.Decentralized(graph=graph, topology=topology)
    assert named in str(error.value)


def test_hvdx_sync_takes_graph_and_the_old_spelling_with_the_warning():
    new = built_without_warning(
        lambda: environment.parse("HVDX_SYNC", "Decentralized(graph='static-exp')"))
    with pytest.warns(DeprecationWarning, match=r"use graph="):
        old = environment.parse("HVDX_SYNC", "Decentralized(topology='static-exp')")
    assert repr(old) == repr(new) == repr(hvdx.Decentralized(graph="static-exp"))
    # A tape runs the old spelling as the new one, combine-then-adapt, warning no more.
    fitted = built_without_warning(lambda: tape_fit(old))
    assert fitted.graph == "static-exp" and fitted.order == "combine_then_adapt"


def test_the_mixing_graphs_old_names_are_the_new_ones_with_a_warning():
    with pytest.warns(DeprecationWarning, match="use GRAPHS"):
        assert mixing_graphs.TOPOLOGIES is mixing_graphs.GRAPHS
    with pytest.warns(DeprecationWarning, match="use graph_name"):
        assert mixing_graphs.topology_name is mixing_graphs.graph_name


def test_bench_results_saved_with_topology_still_price_as_graph():
    cluster = Cluster(racks=2, hosts_per_rack=2, nic_bps="1gbit", uplink_bps="100mbit")
    workload = Workload(conv_params=1000, fc_params=10000, compute_s=0.01)
    old = predict("decentralized", cluster, workload, topology="static-exp")
    assert old == predict("decentralized", cluster, workload, graph="static-exp")
    assert old != predict("decentralized", cluster, workload)
    with pytest.raises(ValueError, match="graph='ring' and topology='ring'"):
        predict("decentralized", cluster, workload, graph="ring", topology="ring")
