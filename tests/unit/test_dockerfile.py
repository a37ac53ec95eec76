"""docker/Dockerfile uses the set-up step instead of copying the recipe, and lints clean."""

import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def test_the_image_runs_the_projects_setup_step():
    text = DOCKERFILE.read_text()
    assert "scripts/setup" in text
    # The recipe lives in scripts/ only: no second copy of the Horovod build or pins.
    for recipe in ("CMAKE_CXX_STANDARD", "HOROVOD_WITH", "==", "pip install", "apt-get"):
        assert recipe not in text


def test_hadolint_finds_nothing():
    proc = subprocess.run(["hadolint", str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
