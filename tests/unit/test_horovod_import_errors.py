"""Missing pieces give errors that say what to install or rebuild."""

import types

import pytest

from hvdx import _horovod


def fake_horovod(mpi=True, extension=True):
    module = types.SimpleNamespace(mpi_built=lambda: mpi)
    module._MPI_LIB_AVAILABLE = extension
    return module


def test_horovod_built_without_mpi_says_how_to_rebuild():
    with pytest.raises(ImportError, match="built without MPI.*HOROVOD_WITH_MPI=1"):
        _horovod.check_mpi_built(fake_horovod(mpi=False), "torch")


def test_missing_framework_extension_names_the_build_flag():
    with pytest.raises(ImportError, match="HOROVOD_WITH_TENSORFLOW=1"):
        _horovod.check_mpi_built(fake_horovod(extension=False), "tensorflow")


def test_horovod_with_mpi_passes():
    _horovod.check_mpi_built(fake_horovod(), "torch")


def test_missing_framework_names_the_extra(monkeypatch):
    real = _horovod.importlib.import_module

    def no_torch(name, *args):
        if name == "torch":
            raise ImportError("No module named 'torch'")
        return real(name, *args)

    monkeypatch.setattr(_horovod.importlib, "import_module", no_torch)
    with pytest.raises(ImportError, match=r"pip install 'hvdx\[torch\]'"):
        _horovod.import_framework("torch")
