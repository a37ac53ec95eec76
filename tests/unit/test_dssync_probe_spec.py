"""DSSync(probe_every=...) is checked when built, and every rank's fingerprint carries it
(ranks that probe at different steps would hang in the probe's transfers)."""

import pytest

import hvdx
from hvdx.core.topology import Topology

pytestmark = [pytest.mark.dssync]


@pytest.mark.parametrize("kwargs, message", [
    (dict(probe_every=-1), "probe_every=-1 must be an integer"),
    (dict(probe_every=2.5), "probe_every=2.5 must be an integer"),
    (dict(schedule="shuffle", group_size=2, probe_every=5),
     "probe_every=5 applies to schedule='rotation' only"),
    (dict(probe_every=5, probe_bytes=0), "probe_bytes=0 must be an integer"),
    (dict(probe_every=5, probe="fast"), "probe='fast' must be None"),
])
def test_bad_probe_arguments_name_themselves(kwargs, message):
    with pytest.raises(ValueError, match=message):
        hvdx.DSSync(**kwargs)


def test_the_fingerprint_carries_the_probe_settings():
    settings = dict(hvdx.DSSync(probe_every=10, probe_bytes=2**20).settings(
        4, Topology.from_counts(2, 2)))
    assert settings["dssync.probe_every"] == 10
    assert settings["dssync.probe_bytes"] == 2**20
    assert settings["dssync.probe"] is None
    assert dict(hvdx.DSSync().settings(4, Topology.from_counts(2, 2)))["dssync.probe_every"] == 0
