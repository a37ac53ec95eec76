"""pyproject.toml pins exactly what requirements/constraints.txt (set-up) installs."""

import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def constraints():
    pins = {}
    for line in (ROOT / "requirements/constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower()] = version
    return pins


def test_every_pyproject_requirement_is_pinned_like_the_constraints():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    pins = constraints()
    for requirement in requirements:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9][^;\s]*)", requirement)
        assert match, f"{requirement!r} is not an exact pin"
        name, version = match.group(1).lower(), match.group(2)
        assert pins.get(name) == version, f"{requirement} but constraints say {pins.get(name)}"


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
