"""The strategy catalogue's entries as the tests that every entry must pass see them:
each built-in entry, and a compressor and a mixer as a user registers them.

1. the built-in entries come from :data:`hvdx.strategies.catalogue.BUILT_IN` when the
   tests are collected, so a new built-in strategy is checked with no edit here;
2. a user's compressor and a user's mixer (:data:`REGISTERED`) are registered for one
   test (``hvdx.register_compressor``, ``hvdx.register_mixer``) and taken out after it
   (the fixture ``catalogue_entry``, tests/unit/conftest.py), so no other test sees them;
3. a test that applies to some entries only picks them by the catalogue's own data
   (:func:`entry_ids` with a predicate on the entry, ``indirect`` parametrization of
   ``catalogue_entry``), never by a list of names.
"""

from typing import Callable, List

import numpy as np

from hvdx import compression_registry, mixer_registry
from hvdx.core.user_compression import Compressor
from hvdx.mixer_registry import Mixer
from hvdx.strategies import catalogue
from hvdx.strategies.descriptor import StrategyDescriptor


class EntrySign(Compressor):
    """A compressor as a user registers it (the contract never runs its methods)."""

    def __init__(self, scale=0.5):
        self.scale = scale

    def compress(self, x, step, name):
        return [x]

    def decompress(self, payloads, shape, dtype, step, name):
        return payloads[0]

    def settings(self):
        return {"scale": self.scale}


class EntryHalf(Mixer):
    """A mixer as a user registers it: half its own value, half the average."""

    def __init__(self, a=0.5):
        self.a = a

    def settings(self):
        return {"a": self.a}

    def matrix(self, step, size):
        return (1 - self.a) * np.eye(size) + self.a * np.full((size, size), 1 / size)


#: Test id -> (the built-in entry whose adapters it shares, its registry's module, the
#: function that registers it, the name it is registered under, its class).
REGISTERED = {
    "registered_compressor": ("user_compression", compression_registry,
                              compression_registry.register_compressor, "entry_sign",
                              EntrySign),
    "registered_mixer": ("user_mixer", mixer_registry, mixer_registry.register_mixer,
                         "entry_half", EntryHalf),
}


def entry_ids(applies: Callable[[StrategyDescriptor], bool] = lambda entry: True
              ) -> List[str]:
    """The ids of the built-in entries for which ``applies(entry)`` holds, then of the
    registered kinds for which it holds of the built-in entry they share (their kind,
    their adapters)."""
    return [entry.name for entry in catalogue.BUILT_IN if applies(entry)] + \
        [key for key, (shared, *_) in REGISTERED.items()
         if applies(catalogue.descriptor(shared))]
