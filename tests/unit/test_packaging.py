"""pyproject.toml's ranges hold the exact pins that requirements/constraints.txt installs.

pyproject.toml states what hvdx accepts (ranges an existing Horovod environment
satisfies); constraints.txt pins what scripts/setup installs and the suite tests. Every
pin must lie in its range, every name in pyproject.toml must have a pin, and every
range must say why (a comment above it).
"""

import pathlib
import platform
import re
import tomllib

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"

# A pyproject name whose pin is another distribution of the same release line:
# `tensorflow` (GPU-capable, what a Horovod-with-NCCL user has) is tested as
# `tensorflow-cpu`, the build scripts/setup installs.
PINNED_AS = {"tensorflow": "tensorflow-cpu"}


def constraints():
    pins = {}
    for line in (ROOT / "requirements/constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def project():
    return tomllib.loads(PYPROJECT.read_text())["project"]


def requirements():
    """Every requirement of pyproject.toml: the dependencies, then each extra's."""
    reqs = list(project()["dependencies"])
    for extra in project()["optional-dependencies"].values():
        reqs += extra
    return [Requirement(r) for r in reqs]


def test_every_pin_lies_in_its_pyproject_range():
    pins = constraints()
    for req in requirements():
        name = canonicalize_name(req.name)
        pinned = PINNED_AS.get(name, name)
        assert pinned in pins, f"{req} has no pin in requirements/constraints.txt"
        assert req.specifier.contains(pins[pinned], prereleases=True), \
            f"constraints pin {pinned}=={pins[pinned]}, outside pyproject's {req}"


def test_the_tested_python_lies_in_requires_python():
    assert SpecifierSet(project()["requires-python"]).contains(platform.python_version())


def test_requires_python_floor_parses_every_module():
    """Syntax only (ast's feature_version catches most newer syntax, not library calls):
    no hvdx module uses grammar newer than requires-python's floor."""
    import ast

    floor = next(s.version for s in SpecifierSet(project()["requires-python"])
                 if s.operator == ">=")
    major, minor = (int(x) for x in floor.split(".")[:2])
    for path in sorted((ROOT / "hvdx").rglob("*.py")):
        try:
            ast.parse(path.read_text(), str(path), feature_version=(major, minor))
        except SyntaxError as e:
            raise AssertionError(f"{path.relative_to(ROOT)} needs Python > {floor}: {e}")


def test_every_pyproject_range_has_a_reason():
    """Each requirement sits in a run of requirement lines (an extra's `name = ["..."`
    line included) that a comment opens."""
    lines = PYPROJECT.read_text().splitlines()
    in_run = re.compile(r'\s*("|[A-Za-z0-9_-]+\s*=\s*\[\s*")')
    for req in project()["dependencies"] + sum(project()["optional-dependencies"].values(), []):
        index = next(i for i, line in enumerate(lines) if f'"{req}"' in line)
        while index > 0 and in_run.match(lines[index - 1]):
            index -= 1
        assert index > 0 and lines[index - 1].lstrip().startswith("#"), \
            f"{req!r} has no comment above it giving the reason for its range"


def test_every_pin_has_a_reason():
    """Each pin sits in a block (no blank line) that starts with a comment saying why."""
    has_reason = False
    for line in (ROOT / "requirements/constraints.txt").read_text().splitlines():
        if not line.strip():
            has_reason = False
        elif line.startswith("#"):
            has_reason = True
        else:
            assert has_reason, f"pin {line!r} has no comment giving its reason"
