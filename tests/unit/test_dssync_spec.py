"""hvdx.DSSync: the framework-neutral DS-Sync spec validates its arguments (ValueErrors
naming them), builds the core schedules, and lists fingerprint settings that differ
whenever the ranks would compute different partitions."""

import subprocess
import sys

import pytest

import hvdx
from hvdx.core.topology import Topology
from hvdx.settings import validate_sync
from hvdx.strategies.dssync.core_schedule import ListSchedule, RotationSchedule, ShuffleSchedule
from hvdx.strategies.dssync.spec import DSSync

pytestmark = [pytest.mark.dssync]


def test_exported_from_hvdx_without_a_framework():
    code = ("import sys, hvdx; hvdx.DSSync('shuffle', group_size=2); "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'tensorflow', 'horovod', 'mpi4py')); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert hvdx.DSSync is DSSync


@pytest.mark.parametrize("kwargs, name", [
    ({"schedule": "gossip"}, "schedule='gossip'"),
    ({"schedule": 3}, "schedule=3"),
    ({"schedule": "shuffle"}, "group_size=None"),
    ({"schedule": "shuffle", "group_size": 0}, "group_size=0"),
    ({"schedule": "shuffle", "group_size": 2.0}, "group_size=2.0"),
    ({"schedule": "rotation", "group_size": 2}, "group_size=2"),
    ({"schedule": "shuffle", "group_size": 2, "seed": -1}, "seed=-1"),
    ({"intra_phases": 0}, "intra_phases=0"),
    ({"cross_ranks": 0}, "cross_ranks=0"),
    ({"schedule": "shuffle", "group_size": 2, "cross_ranks": 1}, "cross_ranks=1"),
    ({"topology": "2x2"}, "topology='2x2'"),
    ({"average_optimizer_state": 1}, "average_optimizer_state=1"),
    ({"global_every": -1}, "global_every=-1"),
    ({"global_every": True}, "global_every=True"),
])
def test_bad_arguments_are_value_errors_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name.replace("(", r"\(").replace(".", r"\.")):
        DSSync(**kwargs)


def test_overlapping_or_incomplete_partitions_are_rejected_at_construction():
    with pytest.raises(ValueError, match="overlapping rank 1"):
        DSSync([[(0, 1), (1, 2)]])
    with pytest.raises(ValueError, match="missing rank"):
        DSSync([[(0, 1), (2, 3)], [(0, 1)]])


def test_build_checks_the_job_size():
    with pytest.raises(ValueError, match="group_size=5"):
        DSSync("shuffle", group_size=5).build(4)
    with pytest.raises(ValueError, match="cover 4 ranks but the job has 2"):
        DSSync([[(0, 1), (2, 3)]]).build(2)
    with pytest.raises(ValueError, match="topology has 4 ranks but the job has 8"):
        DSSync(topology=Topology.from_counts(2, 2)).build(8)
    with pytest.raises(ValueError, match="topology=None"):
        DSSync().build(4)


def test_build_returns_the_core_schedules():
    t = Topology.from_counts(2, 2)
    rotation = DSSync(topology=t, intra_phases=2, cross_ranks=1).build(4)
    assert isinstance(rotation, RotationSchedule)
    assert (rotation.intra_phases, rotation.cross_ranks) == (2, 1)
    assert isinstance(DSSync().build(4, t), RotationSchedule)
    shuffle = DSSync("shuffle", group_size=2, seed=9).build(6)
    assert isinstance(shuffle, ShuffleSchedule)
    assert shuffle.partition(3) == ShuffleSchedule(6, 2, 9).partition(3)
    listed = DSSync([[(0, 1), (2, 3)], [(0, 2), (1, 3)]]).build(4)
    assert isinstance(listed, ListSchedule) and listed.period == 2


def test_settings_differ_for_every_choice_that_changes_the_partitions():
    t = Topology.from_counts(2, 2)
    variants = [
        DSSync("shuffle", group_size=2).settings(4),
        DSSync("shuffle", group_size=2, seed=1).settings(4),
        DSSync("shuffle", group_size=3).settings(4),
        DSSync(topology=t).settings(4),
        DSSync().settings(4, Topology.from_counts(1, 4)),
        DSSync(topology=t, intra_phases=2).settings(4),
        DSSync(topology=t, average_optimizer_state=True).settings(4),
        DSSync(topology=t, global_every=5).settings(4),
        DSSync([[(0, 1), (2, 3)]]).settings(4),
        DSSync([[(0, 2), (1, 3)]]).settings(4),
    ]
    assert len({repr(v) for v in variants}) == len(variants)
    assert all(name.startswith("dssync.") for v in variants for name, _ in v)
    rotation = dict(DSSync(topology=t).settings(4))
    assert rotation["dssync.topology"] == t.digest()
    assert dict(DSSync("shuffle", group_size=2, seed=3).settings())["dssync.seed"] == 3


def test_validate_sync_accepts_dssync():
    validate_sync(DSSync("shuffle", group_size=1))
    with pytest.raises(TypeError, match="hvdx.DSSync"):
        validate_sync("ring")


def test_rotation_parameters_come_from_the_link_rates_when_not_given():
    """The defaults the link rates give: with a 10:1 oversubscribed uplink on 2 racks x 2 hosts, one
    rank per rack crosses, and ten intra-rack phases run while the uplink carries one
    model; without rates, one intra phase and every rank crosses, as before."""
    topology = Topology.from_counts(2, 2)
    assert DSSync().rotation_parameters(topology) == (1, None)
    assert DSSync().rotation_parameters(topology, (1e9, 1e8)) == (10, 1)
    assert DSSync(link_rates=("1gbit", "500mbit")).rotation_parameters(topology) == (2, 1)
    # Given values win, and half-given ones are not completed by the model.
    assert DSSync(intra_phases=3).rotation_parameters(topology, (1e9, 1e8)) == (3, None)
    assert DSSync(cross_ranks=2).rotation_parameters(topology, (1e9, 1e8)) == (1, 2)
    schedule = DSSync().build(4, topology, (1e9, 1e8))
    assert (schedule.intra_phases, schedule.cross_ranks) == (10, 1)


def test_link_rates_are_in_the_fingerprint_and_read_from_the_environment(monkeypatch):
    from hvdx.strategies.dssync.spec import link_rates_from_environment

    topology = Topology.from_counts(2, 2)
    assert DSSync().settings(4, topology, (1e9, 1e8)) != DSSync().settings(4, topology)
    monkeypatch.delenv("HVDX_LINK_RATES", raising=False)
    monkeypatch.delenv("HVDX_CLUSTER_LINK_RATES", raising=False)
    assert link_rates_from_environment() is None
    monkeypatch.setenv("HVDX_CLUSTER_LINK_RATES", "1000000000bit,100000000bit")
    assert link_rates_from_environment() == (10**9, 10**8)
    monkeypatch.setenv("HVDX_LINK_RATES", "25gbit, 100gbit")  # the user's wins
    assert link_rates_from_environment() == (25 * 10**9, 100 * 10**9)
    monkeypatch.setenv("HVDX_LINK_RATES", "fast,slow")
    with pytest.raises(ValueError, match="HVDX_LINK_RATES"):
        link_rates_from_environment()


@pytest.mark.parametrize("value, message", [
    (("1gbit",), "link_rates=('1gbit',) must be a pair"),
    ("1gbit", "link_rates='1gbit' must be a pair"),
    (("1gbit", "fast"), "link_rates[1] (uplink)='fast'"),
    (("0bit", "1gbit"), "link_rates[0] (nic)"),
])
def test_bad_link_rates_name_the_argument(value, message):
    with pytest.raises(ValueError) as info:
        DSSync(link_rates=value)
    assert message in str(info.value)


def test_link_rates_apply_to_the_rotation_only():
    with pytest.raises(ValueError, match="link_rates=.*rotation"):
        DSSync("shuffle", group_size=2, link_rates=("1gbit", "100mbit"))
