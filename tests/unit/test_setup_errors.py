"""scripts/setup stops with a message saying what is missing and how to get it."""

import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOLS = ["bash", "cat", "sha256sum", "cut", "dirname", "id", "mpicc", "g++", "cmake",
         "make", "ip", "python3"]


def fake_path(tmp_path, without):
    """A PATH holding the tools setup looks for, less the ones named in ``without``."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in TOOLS:
        real = shutil.which(tool)
        if tool not in without and real:
            (bindir / tool).symlink_to(real)
    return str(bindir)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None,
                    reason="needs root to run the step as an unprivileged user")
@pytest.mark.parametrize("missing,package", [("mpicc", "mpich libmpich-dev"), ("g++", "g++")])
def test_without_root_a_missing_tool_names_the_package_to_install(missing, package):
    # pytest's tmp_path is private to root; the unprivileged user must read this one.
    home = pathlib.Path(tempfile.mkdtemp(prefix="hvdx-setup-test-"))
    try:
        home.chmod(0o755)
        env = {"PATH": fake_path(home, {missing}), "HOME": str(home)}
        proc = subprocess.run([shutil.which("runuser"), "-u", "nobody", "--", "/bin/bash",
                               str(ROOT / "scripts/setup")], env=env, capture_output=True,
                              text=True, timeout=60)
    finally:
        shutil.rmtree(home)
    assert proc.returncode != 0
    assert f"apt-get install -y {package}" in proc.stderr, proc.stderr
