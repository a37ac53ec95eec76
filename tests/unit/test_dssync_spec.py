"""hvdx.DSSync: the framework-neutral DS-Sync spec validates its arguments (ValueErrors
naming them), builds the core schedules, and lists fingerprint settings that differ
whenever the ranks would compute different partitions."""

import subprocess
import sys

import pytest

import hvdx
from hvdx.core.dssync_schedule import ListSchedule, RotationSchedule, ShuffleSchedule
from hvdx.core.topology import Topology
from hvdx.dssync import DSSync
from hvdx.settings import validate_sync


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
