"""`hvdx plan` prints a prediction per strategy and names a winner, for any cluster."""

import argparse
import json
import re
import subprocess
import sys

import pytest

from hvdx import plan
from hvdx.planning import flags
from hvdx.planning.run_lines import MODEL_ONLY
from hvdx.core.cost_model import STRATEGIES

pytestmark = [pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized, pytest.mark.stanza]


def run(capsys, *argv):
    code = plan.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def parse(*argv):
    parser = argparse.ArgumentParser()
    plan.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("preset", sorted(flags.PRESETS))
def test_every_preset_prints_every_strategy_and_a_winner(capsys, preset):
    code, out, _ = run(capsys, "--preset", preset)
    assert code == 0
    for name in STRATEGIES:
        assert any(line.startswith(name) for line in out.splitlines()), out
    verdicts = [line for line in out.splitlines() if line.startswith("verdict: ")]
    assert len(verdicts) == 1 and "wins" in verdicts[0]
    for column in ("step ms", "comm ms", "MB/rank/step", "bottleneck", "vs horovod"):
        assert column in out


def test_presets_are_the_documented_clusters():
    emulated = flags.build_cluster(parse("--preset", "emulated"))
    assert (emulated.racks, emulated.hosts_per_rack, emulated.nic_bps, emulated.uplink_bps) \
        == (2, 2, 1e9, 1e8)
    datacenter = flags.build_cluster(parse("--preset", "datacenter"))
    assert (datacenter.racks, datacenter.hosts_per_rack, datacenter.nic_bps) == (8, 32, 25e9)
    assert datacenter.oversubscription == pytest.approx(4)


def test_flags_override_the_preset():
    c = flags.build_cluster(parse("--preset", "datacenter", "--racks", "4", "--uplink", "10gbit"))
    assert (c.racks, c.hosts_per_rack, c.uplink_bps) == (4, 32, 10e9)
    c = flags.build_cluster(parse("--preset", "emulated", "--oversubscription", "4"))
    assert c.uplink_bps == pytest.approx(2 * 1e9 / 4)


def test_the_workload_flags_build_the_workload():
    w = flags.build_workload(parse("--params", "138e6", "--fc-fraction", "0.9",
                                  "--compute-ms", "100"))
    assert w.params == 138_000_000 and w.fc_params == 124_200_000 and w.compute_s == 0.1


def test_the_verdict_names_the_fastest_strategy(capsys):
    _, out, _ = run(capsys, "--preset", "emulated", "--ratio", "0.01")
    first_row = out.splitlines()[3]
    verdict = out.splitlines()[-1]
    assert verdict.startswith(f"verdict: {first_row.split('  ')[0].strip()} wins")


def test_sweep_names_a_winner_at_every_point(capsys):
    code, out, _ = run(capsys, "--preset", "emulated", "--sweep", "10mbit,100mbit,1gbit")
    assert code == 0
    winners = [line for line in out.splitlines() if line.startswith("winner at uplink")]
    assert [w.split()[3] for w in winners] == ["10mbit", "100mbit", "1gbit"]


def test_a_bare_sweep_varies_the_oversubscription(capsys):
    code, out, _ = run(capsys, "--preset", "datacenter", "--sweep")
    assert code == 0
    assert "(1:1)" in out and "(64:1)" in out


@pytest.mark.parametrize("argv, named", [
    (["--nic", "25gbps"], "--nic='25gbps'"),
    (["--uplink", "fast"], "--uplink='fast'"),
    (["--latency", "soon"], "--latency='soon'"),
    (["--uplink", "1gbit", "--oversubscription", "4"], "--oversubscription=4"),
    (["--sweep", "10mbit,0"], "--sweep='0'"),
    (["--racks", "0"], "--racks=0"),
    (["--ratio", "2"], "--ratio=2"),
    (["--fc-workers", "256"], "--fc-workers=256"),
    (["--compute-ms", "-1"], "--compute-ms=-1")])
def test_bad_values_exit_2_naming_the_argument(capsys, argv, named):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("hvdx plan: error: ") and named in err


@pytest.mark.parametrize("flag, value, least", [
    ("--racks", "0", 1), ("--hosts-per-rack", "0", 1), ("--ranks-per-host", "0", 1),
    ("--bytes-per-element", "0", 1), ("--batch-size", "0", 1),
    ("--activation-size", "-1", 0), ("--intra-phases", "-1", 0),
    ("--cross-ranks", "0", 1), ("--mix-every", "0", 1), ("--fc-workers", "0", 1),
    ("--local-cores", "0", 1)])
def test_an_integer_flag_below_its_least_value_is_refused_by_the_flags_name(
        capsys, flag, value, least):
    waits = ["--local-steps", "topk=2ms", "--local-waits", "topk=1ms"] \
        if flag == "--local-cores" else []
    code, _, err = run(capsys, "--preset", "emulated", flag, value, *waits)
    assert code == 2 and f"hvdx plan: error: {flag}={value} must be " in err, err
    assert f"at least {least}" in err or f"from {least} to" in err
    assert "Cluster." not in err and "Workload." not in err


@pytest.mark.parametrize("text, seconds, shown", [
    ("5ms", 5e-3, "latency 5ms"), ("50us", 50e-6, "latency 50us"),
    ("0.005s", 5e-3, "latency 5ms"), ("2e-5", 2e-5, "latency 20us")])
def test_the_latency_takes_a_unit_a_bare_number_is_seconds_and_the_plan_shows_it(
        capsys, text, seconds, shown):
    assert flags.build_cluster(parse("--latency", text)).latency_s == pytest.approx(seconds)
    code, out, _ = run(capsys, "--preset", "emulated", "--latency", text)
    assert code == 0 and f", {shown}, " in out.splitlines()[0]


@pytest.mark.parametrize("text", ["5", "1", "25"])
def test_a_bare_latency_of_a_second_or_more_is_refused_as_a_forgotten_unit(capsys, text):
    code, out, err = run(capsys, "--latency", text)
    assert code == 2 and out == ""
    assert f"--latency={text!r} has no unit" in err
    assert f"--latency {text}ms or --latency {text}us" in err


@pytest.mark.parametrize("text, params", [
    ("100M", 100_000_000), ("1.37e6", 1_370_000), ("1.5G", 1_500_000_000),
    ("25k", 25_000), ("138e6", 138_000_000)])
def test_params_take_k_m_g_suffixes_as_rates_take_prefixes(text, params):
    assert flags.build_workload(parse("--params", text)).params == params


@pytest.mark.parametrize("text, said", [
    ("100X", "argument --params: '100X' is not a count: write a number, optionally "
             "with K, M or G"),
    ("0.4", "argument --params: '0.4' must be at least 1")])
def test_params_that_are_no_count_are_refused_by_the_flags_name(capsys, text, said):
    with pytest.raises(SystemExit) as exit:
        plan.main(["--params", text])
    assert exit.value.code == 2 and said in capsys.readouterr().err


def test_it_plugs_into_a_subcommand_parser(capsys):
    parser = argparse.ArgumentParser(prog="hvdx")
    sub = parser.add_subparsers(dest="command", required=True)
    plan.add_arguments(sub.add_parser("plan"))
    args = parser.parse_args(["plan", "--preset", "emulated"])
    assert plan.run_plan(args) == 0
    assert "verdict: " in capsys.readouterr().out


def test_it_runs_as_a_program_without_mpi():
    out = subprocess.run([sys.executable, "-m", "hvdx.plan", "--preset", "emulated"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    assert "verdict: " in out


def test_decentralized_graphs_are_listed_and_priced(capsys):
    code, out, _ = run(capsys, "--preset", "emulated")
    assert code == 0
    rows = [line for line in out.splitlines() if line.startswith("decentralized")]
    assert sorted(row.split("  ")[0].strip() for row in rows) == [
        "decentralized one-peer-exp", "decentralized one-peer-exp cta",
        "decentralized static-exp"]
    for row in rows:
        assert row.split()[-1].endswith("x")  # priced against Horovod, like every row
    # One model per rank per step for one-peer (VGG-16: 552 MB).
    one_peer = next(r for r in rows if r.startswith("decentralized one-peer-exp "))
    assert "552.00" in one_peer


def test_the_placement_reaches_the_cluster_and_the_description(capsys):
    args = parse("--preset", "emulated", "--racks", "2", "--hosts-per-rack", "4",
                 "--placement", "interleaved")
    assert flags.build_cluster(args).placement == "interleaved"
    code, out, _ = run(capsys, "--preset", "emulated", "--hosts-per-rack", "4",
                       "--placement", "interleaved")
    assert code == 0 and "interleaved placement" in out.splitlines()[0]


def test_mix_every_is_handed_to_the_graphs_only(capsys):
    code, out, err = run(capsys, "--preset", "emulated", "--mix-every", "2")
    assert code == 0 and "decentralized one-peer-exp every 2" in out
    code, out, err = run(capsys, "--preset", "emulated", "--mix-every", "0")
    assert code == 2 and "--mix-every=0" in err


def test_hierarchical_is_the_only_strategy_marked_model_only():
    # Every other key of the cost model names what hvdx's bench runs (Horovod included).
    from hvdx.bench.strategies import STRATEGIES as RUNNABLE

    assert MODEL_ONLY == {"hierarchical"}
    for name in STRATEGIES:
        runs = any(r == name or r.startswith(name + "_") for r in RUNNABLE)
        assert runs != (name in MODEL_ONLY), name


def test_the_table_and_the_sweep_mark_the_model_only_strategy(capsys):
    note = "(model only: priced by the cost model for comparison; not an hvdx strategy)"
    for argv in (["--preset", "emulated"], ["--preset", "emulated", "--sweep", "1,4"]):
        code, out, _ = run(capsys, *argv)
        assert code == 0 and note in out.splitlines()
        rows = [line for line in out.splitlines() if line.startswith("hierarchical")]
        assert rows and all(r.startswith("hierarchical (model only)") for r in rows)
        assert "(model only)" not in out.replace("hierarchical (model only)", "")


def test_a_faster_model_only_strategy_never_wins_the_verdict(capsys):
    argv = ["--preset", "emulated", "--ranks-per-host", "8", "--ratio", "0.5",
            "--fc-fraction", "0.01"]
    code, out, _ = run(capsys, *argv)
    assert code == 0 and out.splitlines()[3].startswith("hierarchical (model only)")
    assert out.splitlines()[-1] == ("verdict: horovod wins; no hvdx strategy is predicted "
                                    "to pay here; within the plan's 20% error of it: "
                                    "stanza F=1; faster in the model only: hierarchical")
    _, out, _ = run(capsys, *argv, "--json")
    verdict = json.loads(out)["verdict"]
    assert verdict["strategy"] == "horovod" and verdict["faster_model_only"] == ["hierarchical"]


def table_rows(out):
    """The table's rows, split on the column gaps, without the header."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("strategy "))
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("("):
            break
        rows.append([cell.strip() for cell in re.split(r"\s{2,}", line.strip())])
    return rows


@pytest.mark.parametrize("preset", sorted(flags.PRESETS))
def test_json_holds_the_numbers_of_the_text(capsys, preset):
    _, text, _ = run(capsys, "--preset", preset)
    code, out, _ = run(capsys, "--preset", preset, "--json")
    assert code == 0 and len(out.strip().splitlines()) == 1
    figures = json.loads(out)
    assert [[r["label"] + (" (model only)" if r["model_only"] else ""),
             f"{r['step_ms']:.1f}", f"{r['comm_ms']:.1f}", f"{r['mb_per_rank_per_step']:.2f}",
             r["bottleneck"], f"{r['vs_horovod']:.2f}x"]
            for r in figures["strategies"]] == table_rows(text)
    assert sorted(r["strategy"] for r in figures["strategies"] if r["model_only"]) == \
        ["hierarchical"]
    c, w, v = figures["cluster"], figures["workload"], figures["verdict"]
    assert text.splitlines()[0].startswith(
        f"cluster: {c['racks']} racks x {c['hosts_per_rack']} hosts x "
        f"{c['ranks_per_host']} rank(s) = {c['ranks']} ranks;")
    assert f"compute {w['compute_ms']:g} ms/step, batch {w['batch_size']}" in text
    assert text.splitlines()[-1].startswith(
        f"verdict: {v['label']} wins, {v['vs_horovod']:.2f}x horovod per batch")


def test_sweep_json_holds_the_points_and_winners_of_the_text(capsys):
    argv = ["--preset", "emulated", "--sweep", "10mbit,100mbit,1gbit"]
    _, text, _ = run(capsys, *argv)
    _, out, _ = run(capsys, *argv, "--json")
    points = json.loads(out)["sweep"]
    assert [p["uplink_bps"] for p in points] == [1e7, 1e8, 1e9]
    winners = [line for line in text.splitlines() if line.startswith("winner at uplink")]
    assert winners == [f"winner at uplink {u} ({p['oversubscription']:g}:1): "
                       f"{p['winner']['label']}, {p['winner']['vs_horovod']:.2f}x horovod "
                       f"per batch" for u, p in zip(("10mbit", "100mbit", "1gbit"), points)]
    horovod = next(line for line in text.splitlines() if line.startswith("horovod, step ms"))
    assert horovod.split()[3:] == [f"{p['strategies'][0]['step_ms']:.1f}" for p in points]


# --- what a script writes to run each row ------------------------------------------------

def run_lines(out):
    """``{label: line}`` of the 'to run' block under the table."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("to run ("))
    block = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        block.append(line.strip())
    return {label.strip(): run for label, run in
            (re.split(r"\s{2,}", line, maxsplit=1) for line in block)}


@pytest.mark.parametrize("argv", [["--preset", "emulated"], ["--preset", "datacenter"],
                                  ["--preset", "emulated", "--sweep", "1,4"]])
def test_every_row_names_what_a_script_writes_to_run_it_in_the_text_and_the_json(
        capsys, argv):
    _, text, _ = run(capsys, *argv)
    _, out, _ = run(capsys, *argv, "--json")
    figures = json.loads(out)
    rows = figures["strategies"] if "strategies" in figures else \
        figures["sweep"][0]["strategies"]
    assert run_lines(text) == {r["label"]: r["run"] for r in rows if not r["model_only"]}
    assert [r["run"] for r in rows if r["model_only"]] == [None]


def test_the_line_builds_the_strategy_the_row_prices(capsys):
    """In code, and through HVDX_COMPRESSION / HVDX_SYNC, which take the same call."""
    from types import SimpleNamespace

    import hvdx
    from hvdx import environment
    from hvdx.strategies.topk.spec import topk

    _, text, _ = run(capsys, "--preset", "emulated", "--mix-every", "2")
    lines = run_lines(text)
    names = {"hvd": SimpleNamespace(Compression=SimpleNamespace(topk=topk)), "hvdx": hvdx}
    for label, expected in [
            ("topk sharded 0.01/0.01", topk(0.01, 0.01, mode="sharded")),
            ("topk gathered 0.01", topk(0.01, mode="gathered")),
            ("dssync intra=1 cross=2", hvdx.DSSync(intra_phases=1, cross_ranks=2)),
            ("decentralized one-peer-exp cta every 2",
             hvdx.Decentralized("one-peer-exp", order="combine_then_adapt", mix_every=2))]:
        argument, call = lines[label].split(", or ")[0].split("=", 1)
        built = eval(call, names)  # noqa: S307 (the line hvdx printed)
        variable = "HVDX_COMPRESSION" if argument == "compression" else "HVDX_SYNC"
        value = re.sub(r"^(hvd\.Compression|hvdx)\.", "", call)  # topk(...), DSSync(...)
        from_variable = environment.parse(variable, value, names["hvd"].Compression)
        assert repr(built) == repr(expected) == repr(from_variable), label
    assert lines["stanza F=1"].startswith("hvd.Stanza(features, head, optimizer, "
                                          "fc_workers=1)")
    assert "no hvdx argument" in lines["horovod"]


@pytest.mark.parametrize("argv, label, preset", [
    (["--preset", "emulated"], "topk sharded 0.01/0.01", "fast"),
    (["--preset", "emulated", "--downlink-ratio", "0.02"], "topk sharded 0.01/0.02",
     "safe"),
    # Two ranks: the presets' mode="auto" gathers, and a gathered TopK sends the uplink.
    (["--preset", "emulated", "--racks", "1", "--hosts-per-rack", "2"],
     "topk gathered 0.01", "fast / safe"),
])
def test_a_topk_row_a_preset_sends_the_same_bytes_as_names_the_preset(
        capsys, argv, label, preset):
    _, text, _ = run(capsys, *argv)
    lines = run_lines(text)
    assert lines[label].endswith(f", or HVDX_COMPRESSION={preset} (tuned, the same bytes)")
    assert sum("HVDX_COMPRESSION=" in line for line in lines.values()) == 1


# --- what the verdict may claim -----------------------------------------------------------

def test_a_compute_bound_step_with_strategies_close_together_names_no_winner(capsys):
    """A small model on a fast network: every step is its compute, the plan cannot order
    the strategies within its error, and says so instead of naming one."""
    argv = ["--preset", "emulated", "--params", "40000", "--fc-fraction", "0.1",
            "--compute-ms", "30"]
    code, out, _ = run(capsys, *argv)
    verdict = out.splitlines()[-1]
    assert code == 0 and verdict.startswith("verdict: too close to call between ")
    assert " wins" not in verdict and "hvdx bench --script" in verdict
    _, out, _ = run(capsys, *argv, "--json")
    v = json.loads(out)["verdict"]
    assert v["compute_bound"] and v["tied"] and v["wire_share"] < 0.25
    rows = {r["label"]: r for r in json.loads(out)["strategies"]}
    best = 1 / rows[v["label"]]["vs_horovod"]
    for label in v["tied"]:  # each within 20% of the fastest per batch
        assert 1 / rows[label]["vs_horovod"] <= 1.2 * best
    assert all(name in verdict for name in [v["label"]] + v["tied"])


def test_a_network_bound_step_names_its_winner(capsys):
    code, out, _ = run(capsys, "--preset", "emulated", "--json")
    v = json.loads(out)["verdict"]
    assert code == 0 and not v["compute_bound"] and v["wire_share"] > 0.25
    _, text, _ = run(capsys, "--preset", "emulated")
    assert text.splitlines()[-1].startswith(f"verdict: {v['label']} wins")
