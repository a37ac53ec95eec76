"""The unit tests' fixture ``catalogue_entry``: each entry of the strategy catalogue in
turn, built-in or registered by a user (tests/unit/strategy_entries.py), for the tests
that every entry must pass (tests/unit/test_strategy_contract.py, the lazy paths of
tests/unit/test_strategy_catalogue.py, tests/unit/test_strategy_entries.py)."""

from typing import Iterator

import pytest

from hvdx.strategies import catalogue
from hvdx.strategies.descriptor import StrategyDescriptor
from strategy_entries import REGISTERED, entry_ids


@pytest.fixture(params=entry_ids())
def catalogue_entry(request) -> Iterator[StrategyDescriptor]:
    """One catalogue entry; a registered one is registered for the test, and taken out
    of its registry, and so out of the catalogue, after it."""
    if request.param not in REGISTERED:
        yield catalogue.descriptor(request.param)
        return
    _, registry, register, name, cls = REGISTERED[request.param]
    saved = dict(registry._REGISTRY)
    register(name, cls)
    try:
        yield catalogue.descriptor(name)
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(saved)
    assert name not in {entry.name for entry in catalogue.all_descriptors()}
