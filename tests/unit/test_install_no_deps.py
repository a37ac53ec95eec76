"""`pip install --no-deps .` into an existing Horovod environment (docs/install.md).

hvdx must build from pyproject.toml with that environment's setuptools alone, with no
index reachable, and the installed copy must run: the package, every subpackage, and the
`hvdx` console script. A copy of the sources is built, so the work tree gets no build/.
The LICENSE file ships in the wheel and in the sdist.
"""

import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = pathlib.Path(__file__).resolve().parents[2]


def pip(*args, cwd):
    # No index (nothing is fetched); --no-build-isolation: the build uses this
    # environment's setuptools, as in an existing Horovod environment.
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    proc = subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(source copy, wheel path, --target folder the wheel was installed into)."""
    tmp = tmp_path_factory.mktemp("install-no-deps")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "hvdx", src / "hvdx",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), ".", cwd=src)
    (wheel,) = (tmp / "dist").glob("hvdx-*.whl")
    target = tmp / "site"
    pip("install", "--no-deps", "--target", str(target), str(wheel), cwd=tmp)
    return src, wheel, target


def test_the_wheel_holds_every_module_and_the_console_script(built):
    src, wheel, _ = built
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(src).as_posix() for p in (src / "hvdx").rglob("*.py")}
    assert modules - names == set(), "modules missing from the wheel"
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[console_scripts]" in text and "hvdx = hvdx.cli:main" in text, text


def test_the_license_ships_in_the_wheel_and_the_sdist(built, tmp_path):
    src, wheel, _ = built
    license_text = (ROOT / "LICENSE").read_bytes()
    assert b"Apache License" in license_text and b"Version 2.0, January 2004" in license_text
    # setuptools < 77 writes .dist-info/LICENSE, later ones .dist-info/licenses/LICENSE.
    (name,) = [n for n in zipfile.ZipFile(wheel).namelist()
               if n.endswith((".dist-info/LICENSE", ".dist-info/licenses/LICENSE"))]
    assert zipfile.ZipFile(wheel).read(name) == license_text
    # The sdist as `python -m build --sdist` makes it (build_meta is what it calls).
    build = subprocess.run(
        [sys.executable, "-c", "import sys; from setuptools import build_meta; "
         "print(build_meta.build_sdist(sys.argv[1]))", str(tmp_path)],
        cwd=src, capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stdout + build.stderr
    sdist = tmp_path / build.stdout.strip().splitlines()[-1]
    with tarfile.open(sdist) as archive:
        member = archive.extractfile(f"{sdist.name[:-len('.tar.gz')]}/LICENSE")
        assert member is not None and member.read() == license_text


def test_the_wheel_metadata_carries_pyprojects_ranges(built):
    _, wheel, _ = built
    (meta,) = [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA")]
    lines = zipfile.ZipFile(wheel).read(meta).decode().splitlines()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (python,) = [line.split(":", 1)[1] for line in lines if line.startswith("Requires-Python:")]
    assert SpecifierSet(python) == SpecifierSet(project["requires-python"])
    required = {(r.name.lower(), r.specifier) for r in
                (Requirement(line.split(":", 1)[1]) for line in lines
                 if line.startswith("Requires-Dist:")) if r.marker is None}
    assert required == {(r.name.lower(), r.specifier) for r in
                        map(Requirement, project["dependencies"])}


def test_the_installed_copy_runs_its_console_script(built):
    _, _, target = built
    # PYTHONPATH goes ahead of this venv's editable hvdx; cwd away from the work tree.
    env = dict(os.environ, PYTHONPATH=str(target))
    where = subprocess.run([sys.executable, "-c", "import hvdx.cli; print(hvdx.__file__)"],
                           env=env, cwd=target, capture_output=True, text=True, timeout=60,
                           check=True)
    assert pathlib.Path(where.stdout.strip()).is_relative_to(target), where.stdout
    version = subprocess.run([str(target / "bin" / "hvdx"), "--version"], env=env,
                             cwd=target, capture_output=True, text=True, timeout=60)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == project_version()


def project_version():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
