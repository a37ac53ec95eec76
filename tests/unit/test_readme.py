"""The README stays a user guide: short, its links resolve, and CI runs its test command."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
        return handle.read()


def test_the_readme_holds_at_most_20000_characters():
    assert len(readme()) <= 20_000


def test_every_relative_link_of_the_readme_names_a_file_of_the_repository():
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme())
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert local, "the README links to its docs"
    missing = [t for t in local if not os.path.exists(os.path.join(ROOT, t))]
    assert missing == []


def test_ci_runs_exactly_the_readmes_test_command():
    assert "bash scripts/test     # set up everything, then run the whole test suite" in readme()
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as handle:
        lines = [l for l in handle.read().splitlines() if l and not l.startswith("#")]
    assert lines[-1] == "exec bash scripts/test"
