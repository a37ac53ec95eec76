"""Optimizer settings validate and render the same on every rank."""

import pytest

from hvdx.settings import horovod_settings, validate_sync


class NoneCompressor:
    pass


def test_sync_none_is_horovods_allreduce():
    validate_sync(None)


def test_an_unknown_sync_strategy_is_a_type_error_naming_the_argument():
    with pytest.raises(TypeError, match="sync='ring'"):
        validate_sync("ring")


def test_classes_render_by_qualified_name_not_by_address():
    settings = dict(horovod_settings(compression=NoneCompressor))
    assert settings["compression"].endswith("test_settings.NoneCompressor")
    assert "0x" not in settings["compression"]
