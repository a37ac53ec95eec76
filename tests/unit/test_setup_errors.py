"""scripts/setup stops with a message saying what is missing and how to get it.

The checks run against fake commands on a PATH of their own (fake `mpicc`, `mpirun`,
`python3`, `nvidia-smi`), so no real apt-get or pip install ever runs: a check that
would install something stops first, for want of root or of apt-get.
"""

import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SETUP = ROOT / "scripts/setup"
TOOLS = ["bash", "cat", "sha256sum", "cut", "dirname", "id", "grep", "head", "mpicc",
         "mpirun", "g++", "cmake", "make", "ip"]

# What the commands print, as observed (Debian 12's MPICH 4.0.2 and Open MPI 4.1.4).
MPICH = {"mpicc": {"-v": "mpicc for MPICH version 4.0.2\nUsing built-in specs.",
                   "-show": "gcc -I/usr/include/x86_64-linux-gnu/mpich -lmpich"},
         "mpirun": {"--version": "HYDRA build details:\n    Version: 4.0.2"}}
OPEN_MPI = {"mpicc": {"-v": "Using built-in specs.\nCOLLECT_GCC=gcc",
                      "-show": "gcc -I/usr/lib/x86_64-linux-gnu/openmpi/include -lmpi"},
            "mpirun": {"--version": "mpirun (Open MPI) 4.1.4\n\nReport bugs to ..."}}
INTEL_MPI = {"mpicc": {"-v": "mpigcc for the Intel(R) MPI Library 2021.10 for Linux*",
                       "-show": "gcc -I/opt/intel/mpi/include -lmpi"},
             "mpirun": {"--version": "Intel(R) MPI Library for Linux* OS, Version 2021.10"}}
# python_facts' line for a complete Debian Python 3.11.
DEBIAN_PYTHON = "3.11 yes yes /usr"


def fake_command(bindir, name, outputs):
    """A command that prints ``outputs[first argument]`` (or ``outputs[None]``)."""
    lines = ["#!/bin/bash", 'case "${1:-}" in']
    for arg, text in outputs.items():
        lines.append(f"  {arg or '*'}) printf '%s\\n' {shlex.quote(text)} ;;")
    lines.append("esac")
    path = bindir / name
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)


def fake_path(tmp_path, without=(), fakes=None, tools=TOOLS):
    """A PATH holding the tools setup looks for, less the ones named in ``without``; a
    fake python3 (``DEBIAN_PYTHON``) unless ``fakes`` gives another or ``without`` has it."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fakes = {"python3": {None: DEBIAN_PYTHON}, **(fakes or {})}
    for tool in tools:
        real = shutil.which(tool)
        if tool not in without and tool not in fakes and real:
            (bindir / tool).symlink_to(real)
    for name, outputs in fakes.items():
        if name not in without:
            fake_command(bindir, name, outputs)
    return str(bindir)


def call(tmp_path, script, fakes=None, tools=("bash", "grep", "head", "true", "false")):
    """Run ``script`` in bash after sourcing scripts/setup (its functions only)."""
    env = {"PATH": fake_path(tmp_path, fakes=fakes, tools=tools), "PYTHON": "python3"}
    return subprocess.run(["bash", "-c", f'source "$1"; set +e; {script}', "bash", str(SETUP)],
                          env=env, capture_output=True, text=True, timeout=30)


def run_setup(home, path, user=None, extra_env=None):
    command = ["/bin/bash", str(SETUP)]
    if user:
        command = [shutil.which("runuser"), "-u", user, "--"] + command
    env = {"PATH": path, "HOME": str(home), **(extra_env or {})}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def shared_tmp():
    """A folder an unprivileged user can read (pytest's tmp_path is private to root)."""
    home = pathlib.Path(tempfile.mkdtemp(prefix="hvdx-setup-test-"))
    home.chmod(0o755)
    yield home
    shutil.rmtree(home)


needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None,
                                reason="needs root to run the step as an unprivileged user")


@needs_root
@pytest.mark.parametrize("missing,package", [("mpicc", "mpich libmpich-dev"), ("g++", "g++"),
                                             ("mpirun", "mpich")])
def test_without_root_a_missing_tool_names_the_package_to_install(shared_tmp, missing, package):
    fakes = MPICH if missing != "mpicc" else {"mpirun": MPICH["mpirun"]}
    proc = run_setup(shared_tmp, fake_path(shared_tmp, {missing}, fakes), user="nobody")
    assert proc.returncode != 0
    assert f"apt-get install -y {package}\n" in proc.stderr, proc.stderr


# --- MPICH, and nothing else -------------------------------------------------------

@pytest.mark.parametrize("fakes", [MPICH, {"mpicc": MPICH["mpicc"],
                                           "mpirun": {"--version": "HYDRA build details:"}}])
def test_mpich_passes(tmp_path, fakes):
    proc = call(tmp_path, "check_mpich", fakes)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr


@pytest.mark.skipif(shutil.which("mpichversion") is None, reason="no MPICH on this machine")
def test_this_machines_mpich_passes():
    proc = subprocess.run(["bash", "-c", 'source "$1"; check_mpich', "bash", str(SETUP)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("fakes", [OPEN_MPI, {"mpicc": MPICH["mpicc"],
                                              "mpirun": OPEN_MPI["mpirun"]}],
                         ids=["open-mpi", "mpich-compiler-open-mpi-launcher"])
def test_open_mpi_is_refused_saying_why(tmp_path, fakes):
    proc = call(tmp_path, "check_mpich", fakes)
    assert proc.returncode == 1
    for words in ("is Open MPI", "needs MPICH", "mpi4py and Horovod are built here against MPICH",
                  "Hydra", "update-alternatives --set mpi /usr/bin/mpicc.mpich"):
        assert words in proc.stdout, proc.stdout


def test_another_mpi_is_refused_naming_what_it_is(tmp_path):
    proc = call(tmp_path, "check_mpich", INTEL_MPI)
    assert proc.returncode == 1
    assert "is not MPICH's mpicc" in proc.stdout and "Intel(R) MPI" in proc.stdout, proc.stdout


def test_a_hydra_less_launcher_is_refused(tmp_path):
    proc = call(tmp_path, "check_mpich", {"mpicc": MPICH["mpicc"],
                                          "mpirun": {"--version": "slurm 23.02"}})
    assert proc.returncode == 1
    assert "not MPICH's Hydra launcher" in proc.stdout and "slurm" in proc.stdout, proc.stdout


def test_setup_refuses_open_mpi_before_installing_anything(shared_tmp):
    """As root too: the refusal comes before apt-get (absent from this PATH anyway)."""
    proc = run_setup(shared_tmp, fake_path(shared_tmp, fakes=OPEN_MPI))
    assert proc.returncode != 0
    assert "is Open MPI" in proc.stderr and "installing" not in proc.stderr, proc.stderr


# --- Python: ensurepip (python3.X-venv) and Python.h (python3.X-dev) -----------------

@pytest.mark.parametrize("facts,packages", [
    ("3.11 yes yes /usr", ""),
    ("3.11 no yes /usr", "python3.11-venv"),
    ("3.11 yes no /usr", "python3.11-dev"),
    ("3.11 no no /usr", "python3.11-venv python3.11-dev"),
])
def test_debian_python_gets_the_packages_it_lacks(tmp_path, facts, packages):
    proc = call(tmp_path, f"python_packages {facts}")
    assert proc.returncode == 0 and proc.stdout == packages + "\n", proc.stdout + proc.stderr


def test_another_python_lacking_pieces_is_refused_since_apt_cannot_help(tmp_path):
    proc = call(tmp_path, "python_packages 3.11 no no /opt/my python")
    assert proc.returncode == 1
    for words in ("installed in /opt/my python", "ensurepip", "Python.h",
                  "not Debian's Python", "HVDX_PYTHON=/usr/bin/python3.11"):
        assert words in proc.stdout, proc.stdout


def test_python_other_than_3_11_is_refused(tmp_path):
    proc = call(tmp_path, "python_packages 3.12 yes yes /usr")
    assert proc.returncode == 1 and "3.11 needed" in proc.stdout, proc.stdout


def test_python_facts_describe_this_interpreter(tmp_path):
    proc = call(tmp_path, f'python_facts "{sys.executable}"')
    version, ensurepip, headers, prefix = proc.stdout.split(maxsplit=3)
    try:
        import ensurepip as _  # noqa: F401
        has_ensurepip = "yes"
    except ImportError:
        has_ensurepip = "no"
    has_headers = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
    assert (version, ensurepip, headers, prefix.strip()) == (
        "%d.%d" % sys.version_info[:2], has_ensurepip, "yes" if has_headers else "no",
        sys.base_prefix), proc.stdout + proc.stderr


@needs_root
@pytest.mark.parametrize("facts,packages", [("3.11 yes no /usr", "python3.11-dev"),
                                            ("3.11 no yes /usr", "python3.11-venv")])
def test_without_root_missing_python_pieces_name_the_packages(shared_tmp, facts, packages):
    path = fake_path(shared_tmp, fakes={**MPICH, "python3": {None: facts}})
    proc = run_setup(shared_tmp, path, user="nobody")
    assert proc.returncode != 0
    assert f"apt-get install -y {packages}\n" in proc.stderr, proc.stderr


@needs_root
def test_without_root_and_without_python_names_debians_python(shared_tmp):
    proc = run_setup(shared_tmp, fake_path(shared_tmp, {"python3"}, MPICH), user="nobody")
    assert proc.returncode != 0
    assert "apt-get install -y python3 python3-venv python3-dev\n" in proc.stderr, proc.stderr


# --- torch: the CPU build where no NVIDIA GPU is present ---------------------------

@pytest.mark.parametrize("gpu,local_torch,index", [
    (False, False, "--index-url https://download.pytorch.org/whl/cpu"),
    (False, True, ""),   # a torch pip finds offline (a local wheel) is kept
    (True, False, ""),   # a GPU: PyPI's torch, the CUDA build
])
def test_torch_index(tmp_path, gpu, local_torch, index):
    fakes = {"nvidia-smi": {None: "GPU 0: NVIDIA H100"}} if gpu else {}
    # The pip command stands in as `true` (it finds a torch offline) or `false`.
    pip = "true" if local_torch else "false"
    proc = call(tmp_path, f"torch_index constraints.txt {pip} -m pip", fakes)
    assert proc.returncode == 0 and proc.stdout.strip() == index, proc.stdout + proc.stderr
