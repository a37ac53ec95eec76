"""Cluster specs: units, validation messages, files and flags. No root needed."""

import argparse
import json
import re
import subprocess
import sys

import pytest

from hvdx.cluster import (
    ClusterSpec,
    ClusterUnavailable,
    ContentionEvent,
    EmulatedCluster,
    add_cluster_arguments,
    format_rate,
    parse_contention,
    parse_rate,
    parse_time,
)
from hvdx.cluster import iproute
from hvdx.cluster.netns_exec import build_argv, split_args

from cluster_helpers import child_env


@pytest.mark.parametrize("text, bits", [
    ("1gbit", 10**9), ("100mbit", 10**8), ("500kbit", 500_000), ("1.5gbit", 1_500_000_000),
    ("200MBIT", 2 * 10**8), (" 50mbit ", 5 * 10**7), (64_000, 64_000)])
def test_rates_use_tc_si_units(text, bits):
    assert parse_rate(text) == bits


@pytest.mark.parametrize("text", ["100mbps", "100", "mbit", "-1mbit", "1e3mbit", "1 gbit",
                                  True, None, "0mbit", "1kbit", "500gbit"])
def test_a_bad_rate_names_the_argument_and_the_value(text):
    pattern = rf"^uplink={re.escape(repr(text))} is (not a rate|out of range)"
    with pytest.raises(ValueError, match=pattern):
        parse_rate(text, "uplink")


def test_the_bytes_per_second_unit_is_refused_with_a_hint():
    with pytest.raises(ValueError) as error:
        ClusterSpec(uplink="100mbps")
    assert str(error.value) == ("uplink='100mbps' is not a rate: use a number with kbit, "
                                "mbit or gbit, e.g. 100mbit")


@pytest.mark.parametrize("text, seconds", [
    ("1ms", 0.001), ("250us", 0.00025), ("2s", 2.0), ("1.5", 1.5), (3, 3.0), ("0", 0.0)])
def test_times_parse_to_seconds(text, seconds):
    assert parse_time(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["1 sec", "1min", "-1ms", "ms", None, "2d"])
def test_a_bad_time_names_the_argument(text):
    with pytest.raises(ValueError, match=r"^latency="):
        parse_time(text, "latency")


def test_format_rate_round_trips():
    for text in ("1gbit", "50mbit", "500kbit", "1500mbit"):
        assert format_rate(parse_rate(text)) == text


def test_a_spec_normalizes_rates_and_times():
    spec = ClusterSpec(racks=3, hosts_per_rack=4, nic="1gbit", uplink="100mbit",
                       latency="1ms", contention=["uplink=10mbit@5-15"])
    assert (spec.nic, spec.uplink, spec.latency) == (10**9, 10**8, 0.001)
    assert spec.num_hosts == 12 and spec.rack_of(4) == 1 and spec.rack_of(3) == 0
    assert spec.contention == (ContentionEvent("uplink", 10**7, 5.0, 15.0),)
    assert ClusterSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


@pytest.mark.parametrize("kwargs, message", [
    (dict(racks=0), r"^racks=0 must be an integer from 1 to 250$"),
    (dict(racks="2"), r"^racks='2' must be an integer"),
    (dict(hosts_per_rack=True), r"^hosts_per_rack=True must be an integer"),
    (dict(racks=20, hosts_per_rack=20), r"more than 250 hosts"),
    (dict(nic="fast"), r"^nic='fast' is not a rate"),
    (dict(latency="1 sec"), r"^latency='1 sec' is not a time"),
    (dict(uplink_latency=-1), r"^uplink_latency=-1 is out of range"),
    (dict(contention=["h4=1mbit@1"]), r"target='h4' names no host: hosts are h0 to h3"),
    (dict(contention=["uplink2=1mbit@1"]), r"target='uplink2' names no rack"),
    (dict(contention=["eth0=1mbit@1"]), r"target='eth0' is not a link"),
    (dict(contention=["uplink=1mbit@5-2"]), r"until='2' must come after"),
    (dict(contention=["uplink@5"]), r"^--contention='uplink@5' is not a contention event"),
    (dict(contention=[{"target": "h1"}]), r"needs keys target, rate"),
    (dict(contention="uplink=1mbit@1"), r"must be a list"),
])
def test_invalid_specs_raise_value_errors_naming_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ClusterSpec(**kwargs)


def test_contention_flag_form():
    assert parse_contention("h1=50mbit@2") == ContentionEvent("h1", "50mbit", 2)
    event = parse_contention("uplink0=1.5mbit@0.5-1s")
    assert (event.target, event.rate, event.at, event.until) == ("uplink0", 1_500_000, 0.5, 1.0)


def test_spec_files(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"racks": 2, "hosts_per_rack": 3, "nic": "200mbit",
                                "uplink": "50mbit",
                                "contention": [{"target": "uplink", "rate": "10mbit",
                                                "at": 1, "until": 2}]}))
    spec = ClusterSpec.from_file(str(path))
    assert spec.num_hosts == 6 and spec.uplink == 50 * 10**6
    assert spec.contention[0].until == 2.0
    path.write_text('{"racks": 2, "nics": "1gbit"}')
    with pytest.raises(ValueError, match=r"unknown key\(s\) nics"):
        ClusterSpec.from_file(str(path))
    path.write_text("{racks: 2")
    with pytest.raises(ValueError, match=r"cannot be read"):
        ClusterSpec.from_file(str(path))
    with pytest.raises(ValueError, match=r"cannot be read"):
        ClusterSpec.from_file(str(tmp_path / "missing.json"))


def test_flags_override_a_spec_file(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"racks": 3, "nic": "1gbit", "uplink": "100mbit"}))
    spec = ClusterSpec.from_flags(["--cluster-spec", str(path), "--uplink", "20mbit",
                                   "--contention", "uplink1=5mbit@1-2",
                                   "--contention", "h0=1mbit@3"])
    assert (spec.racks, spec.nic, spec.uplink) == (3, 10**9, 20 * 10**6)
    assert [e.target for e in spec.contention] == ["uplink1", "h0"]
    with pytest.raises(ValueError, match=r"^uplink='100mbps' is not a rate"):
        ClusterSpec.from_flags(["--uplink", "100mbps"])
    with pytest.raises(ValueError, match=r"unknown argument"):
        ClusterSpec.from_flags(["--uplinks", "1gbit"])


def test_cluster_flags_join_a_programs_parser():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int)
    add_cluster_arguments(parser)
    args = parser.parse_args(["--epochs", "3", "--racks", "2", "--nic", "500mbit"])
    assert ClusterSpec.from_args(args).nic == 500 * 10**6


def test_without_root_the_error_says_so(monkeypatch):
    # The check that needs root is iproute.require_support's.
    monkeypatch.setattr(iproute.os, "geteuid", lambda: 1000)
    with pytest.raises(ClusterUnavailable, match=r"needs root .* localhost"):
        EmulatedCluster(ClusterSpec()).start()


def test_a_cluster_takes_only_a_spec():
    with pytest.raises(TypeError, match=r"must be a ClusterSpec"):
        EmulatedCluster({"racks": 2})
    with pytest.raises(ValueError, match=r"prefix='hv-dx'"):
        EmulatedCluster(ClusterSpec(), prefix="hv-dx")


def test_hydra_launcher_arguments_are_parsed_like_ssh():
    # Hydra 4.0 passes the proxy command as several words; other versions as one.
    assert split_args(["--hosts", "f.json", "-x", "10.78.0.1", '"/usr/bin/proxy"',
                       "--proxy-id", "0"]) == ("f.json", "10.78.0.1",
                                               '"/usr/bin/proxy" --proxy-id 0')
    assert split_args(["--hosts", "f.json", "-x", "-p", "22", "h1", "echo hi"]) \
        == ("f.json", "h1", "echo hi")
    with pytest.raises(ValueError):
        split_args(["-x", "h1", "echo"])
    hosts = {"10.78.0.1": {"netns": "hvdx1c0-h0", "env": {"HVDX_CLUSTER_HOST": "h0"}}}
    argv, env = build_argv(hosts, "10.78.0.1", "echo hi")
    assert argv == ["ip", "netns", "exec", "hvdx1c0-h0", "bash", "-c", "echo hi"]
    assert env == {"HVDX_CLUSTER_HOST": "h0"}
    with pytest.raises(KeyError, match="no emulated host"):
        build_argv(hosts, "10.78.0.9", "echo hi")


def test_the_cluster_package_imports_no_framework_or_mpi():
    code = ("import sys, hvdx.cluster\n"
            "bad = sorted(n for n in sys.modules if n.split('.')[0] in "
            "('torch', 'tensorflow', 'horovod', 'mpi4py', 'keras'))\n"
            "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=child_env()).stdout.strip()
    assert out == ""
