"""What a Horovod user expects of a command line: ``hvdx --version``, every option's
default shown once in ``--help``, and ``hvdx info --json`` holding what the text shows."""

import argparse
import json
import re
import subprocess
import sys

import pytest

import hvdx
from hvdx import info
from hvdx.cli import build_parser, main
from hvdx.cli_help import DefaultsHelpFormatter


def subcommands():
    """``{name: subparser}`` of ``hvdx``."""
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def option_helps(parser):
    """``(option, help as printed)`` for every option that takes a value."""
    formatter = parser._get_formatter()
    return [(action.option_strings[-1], " ".join(formatter._expand_help(action).split()))
            for action in parser._actions
            if action.option_strings and action.default is not argparse.SUPPRESS
            and not isinstance(action, argparse._StoreConstAction)]  # flags: off unless given


def test_version_prints_the_package_version_and_exits_0():
    proc = subprocess.run([sys.executable, "-m", "hvdx.cli", "--version"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == hvdx.__version__


def test_version_in_process_is_the_same(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0 and capsys.readouterr().out.strip() == hvdx.__version__


def test_every_subcommand_uses_the_defaults_formatter():
    for name, parser in subcommands().items():
        assert parser.formatter_class is DefaultsHelpFormatter, name


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_option_of_every_subcommand_shows_its_default_once(name):
    for option, text in option_helps(subcommands()[name]):
        assert text.count("(default: ") == 1, (option, text)
        assert text.lower().count("default") == 1, (option, text)  # no hand-written one


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_no_option_writes_its_default_as_a_bare_number_in_parentheses(name):
    for option, text in option_helps(subcommands()[name]):
        assert not re.search(r"\(\d+(\.\d+)?\)", text), (option, text)


def test_a_value_default_is_the_parsers_own(capsys):
    text = " ".join(subcommands()["plan"].format_help().split())
    for shown in ("base cluster (default: datacenter)", "forgotten unit) (default: 25us)",
                  "1e9) (default: 138e6)", "FC workers (default: 1)",
                  "in a cross phase (default: all)"):
        assert shown in text
    assert build_parser().parse_args(["plan"]).params == 138e6


def test_the_programs_of_their_own_show_defaults_too(capsys):
    from hvdx import plan
    from hvdx.bench import cli as bench_cli

    for program in (plan.main, bench_cli.main):
        with pytest.raises(SystemExit):
            program(["--help"])
        assert "(default: " in capsys.readouterr().out


@pytest.fixture
def fake_checks(monkeypatch):
    """The real rows' names with made-up values: `hvdx info` imports every framework."""
    checks = [(name, lambda name=name: f"{name} value ({len(name)})")
              for name, _ in info.CHECKS]
    monkeypatch.setattr(info, "CHECKS", checks)
    return checks


def test_info_json_holds_every_row_of_the_text_in_order(capsys, fake_checks):
    assert main(["info"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert main(["info", "--json"]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1
    rows = json.loads(out)
    assert list(rows) == [name for name, _ in fake_checks]
    width = max(map(len, rows))
    assert text == [f"{name.ljust(width)}  {value}" for name, value in rows.items()]


def test_info_help_names_the_json_keys(capsys):
    text = " ".join(subcommands()["info"].format_help().split())
    for name, _ in info.CHECKS:
        assert f"'{name}'" in text
