"""A user's own mixer (``hvdx.register_mixer``): registration, its errors, the spec it
builds (in code and from ``HVDX_SYNC``), and the schedule the shared wrappers follow.

The MPI tests (tests/mpi/torch_mixing/test_torch_user_mixer.py,
tests/mpi/tensorflow_mixing/test_tf_user_mixer.py) train with it at 1, 2 and 4 ranks.
"""

import numpy as np
import pytest

import hvdx
from hvdx import environment, mixer_registry
from hvdx.mixer_registry import MIXING_OPTIONS, Mixer, UserMixing, register_mixer
from hvdx.core.mixer_protocol import check_matrix, mixed_arrays
from hvdx.strategies import catalogue
from hvdx.strategy_contract import Job, resolve, strategy_of

pytestmark = [pytest.mark.topk, pytest.mark.user_compression, pytest.mark.dssync,
              pytest.mark.decentralized, pytest.mark.user_mixer, pytest.mark.stanza]


class Half(Mixer):
    def __init__(self, a=0.5):
        if not 0 <= a <= 1:
            raise ValueError(f"a={a!r} must lie in [0, 1]")
        self.a = a

    def settings(self):
        return {"a": self.a}

    def matrix(self, step, size):
        return (1 - self.a) * np.eye(size) + self.a * np.full((size, size), 1 / size)


class FreeForm(Mixer):
    def mix(self, step, arrays, peers):
        return arrays


@pytest.fixture
def registered():
    saved = dict(mixer_registry._REGISTRY)
    register_mixer("half", Half)
    yield
    mixer_registry._REGISTRY.clear()
    mixer_registry._REGISTRY.update(saved)


class _Horovod:
    global_process_set = "all"


def job(size=2):
    return Job(size=size, rank=0, horovod=_Horovod, compression="none",
               no_compression="none", process_set="all", framework="torch")


@pytest.mark.parametrize("name", ["dssync", "DSSync", "decentralized", "Decentralized",
                                  "topk", "fast", "none", "stanza", "user_compression"])
def test_a_taken_or_built_in_name_is_refused_naming_it(name):
    with pytest.raises(ValueError, match=f"name={name!r}"):
        register_mixer(name, Half)


@pytest.mark.parametrize("name", ["", "two words", "_private", "class", 3, None])
def test_a_name_that_is_no_identifier_is_refused(name):
    with pytest.raises(ValueError, match="name="):
        register_mixer(name, Half)


@pytest.mark.parametrize("cls", [Half(), 3, "Half", object, dict])
def test_a_class_that_is_no_mixer_is_refused_naming_it(cls):
    with pytest.raises(TypeError, match="mixer_class="):
        register_mixer("some_mixer", cls)


def test_a_mixer_with_neither_matrix_nor_mix_is_refused():
    class Nothing(Mixer):
        pass

    with pytest.raises(TypeError, match="neither matrix"):
        register_mixer("nothing", Nothing)


@pytest.mark.parametrize("attributes, named", [
    ({"combines_first": True}, "declares combines_first but does not implement exchange"),
    ({"state_entry": 3}, "state_entry=3 must be a key"),
    ({"views": {"hvdx_graph": 1}}, "views="),
])
def test_a_mixer_declaring_a_capability_it_does_not_implement_is_refused(attributes, named):
    cls = type("Capable", (Half,), attributes)
    with pytest.raises(TypeError, match=named):
        register_mixer("capable", cls)
    assert "capable" not in mixer_registry.registered_mixers()


def test_a_constructor_taking_a_mixing_option_is_refused():
    class Clash(Half):
        def __init__(self, global_every=2):
            super().__init__()

    with pytest.raises(TypeError, match="global_every"):
        register_mixer("clash", Clash)


def test_a_name_takes_one_class(registered):
    register_mixer("half", Half)  # the same class again: nothing
    with pytest.raises(ValueError, match="already registered"):
        register_mixer("half", FreeForm)


def test_a_compressors_name_is_refused(registered):
    from hvdx.compression_registry import _REGISTRY as compressors
    from hvdx.core.user_compression import Compressor

    class C(Compressor):
        def compress(self, x, step, name):
            return [x]

        def decompress(self, payloads, shape, dtype, step, name):
            return payloads[0]

    saved = dict(compressors)
    try:
        hvdx.register_compressor("shared_name", C)
        with pytest.raises(ValueError, match="shared_name"):
            register_mixer("shared_name", Half)
    finally:
        compressors.clear()
        compressors.update(saved)


def test_the_spec_holds_the_class_settings_and_options(registered):
    spec = hvdx.mixer("half", 0.25, global_every=4, swa_start=2)
    assert isinstance(spec, UserMixing) and spec.error is None
    assert (spec.name, spec.settings, spec.global_every, spec.swa_start) == \
        ("half", [("a", 0.25)], 4, 2)
    assert strategy_of(None, spec) is spec
    resolved = resolve(spec, job())
    assert resolved.error is None
    settings = dict(resolved.settings)
    assert settings["sync.settings"] == "[('a', 0.25)]"
    assert settings["sync.class"].endswith("Half")
    assert {f"sync.{k}" for k in MIXING_OPTIONS} <= set(settings)
    assert catalogue.descriptor("half").kind == "sync"
    assert not catalogue.descriptor("half").built_in


def test_wrong_keywords_and_values_name_the_argument(registered):
    with pytest.raises(TypeError, match="'b'"):
        hvdx.mixer("half", b=1)
    with pytest.raises(TypeError, match="half"):
        hvdx.mixer("half", 0.1, 0.2)
    with pytest.raises(ValueError, match="a=2"):
        hvdx.mixer("half", a=2)
    with pytest.raises(ValueError, match="global_every=-1"):
        hvdx.mixer("half", global_every=-1)
    with pytest.raises(ValueError, match="name='nope'"):
        hvdx.mixer("nope")


def test_a_matrix_of_the_wrong_size_fails_when_prepared(registered):
    class Fixed(Mixer):
        def matrix(self, step, size):
            return np.full((2, 2), 0.5)

    register_mixer("fixed", Fixed)
    assert resolve(hvdx.mixer("fixed"), job(2)).error is None
    error = resolve(hvdx.mixer("fixed"), job(3)).error
    assert isinstance(error, ValueError) and "3x3" in str(error)


@pytest.mark.parametrize("w, text", [
    ([[0.5, 0.5], [0.5, 0.6]], "row 1"),
    ([[1.5, -0.5], [0, 1]], "non-negative"),
    ([[1.0]], "shape"),
    ("x", "not a matrix"),
])
def test_a_bad_matrix_is_refused_saying_why(w, text):
    with pytest.raises(ValueError, match=text):
        check_matrix(w, 2, "M.matrix")


def test_the_environment_builds_the_registered_mixer(registered):
    spec = environment.parse("HVDX_SYNC", "half(a=0.25, global_every=3)")
    assert isinstance(spec, UserMixing)
    assert (spec.settings, spec.global_every) == ([("a", 0.25)], 3)
    assert spec.environment == ("HVDX_SYNC", "half(a=0.25, global_every=3)")
    assert "half" in environment.accepted_names("HVDX_SYNC")
    with pytest.raises(ValueError, match="HVDX_SYNC.*'aa'"):
        environment.parse("HVDX_SYNC", "half(aa=0.25)")


def test_an_unregistered_mixer_is_unknown_to_the_environment():
    with pytest.raises(ValueError, match="unknown name 'not_registered'"):
        environment.parse("HVDX_SYNC", "not_registered()")


def test_the_schedule_is_decided_by_the_spec():
    class Free(Mixer):
        def mix(self, step, arrays, peers):
            return arrays

    spec = UserMixing("free", Free, global_every=3, swa_start=2, swa_every=2)
    assert [spec.global_due(t) for t in range(6)] == [False, False, True] * 2
    assert [spec.swa_due(t) for t in range(6)] == [False, False, True, False, True, False]
    d = hvdx.Decentralized(global_every=2)
    assert [d.global_due(t) for t in range(4)] == [False, True, False, True]


def test_register_mixer_is_public():
    assert hvdx.register_mixer is register_mixer
    assert hvdx.Mixer is Mixer
    assert {"register_mixer", "Mixer", "mixer"} <= set(hvdx.__all__)


class Returns(Mixer):
    def __init__(self, what="same"):
        self.what = what

    def mix(self, step, arrays, peers):
        if self.what == "one_short":
            return arrays[:-1]
        if self.what == "flat":
            return [a.ravel() for a in arrays]
        return [a * 2 for a in arrays]


@pytest.mark.parametrize("what, text", [
    ("one_short", "Returns.mix(step=3) returned list; return a list of 2 arrays"),
    ("flat", r"Returns.mix\(step=3\) returned shape \(4,\) for an array of shape \(2, 2\)")])
def test_a_mix_that_returns_the_wrong_arrays_is_refused_naming_the_mixer(what, text):
    arrays = [np.ones((2, 2)), np.ones(3)]
    with pytest.raises(ValueError, match=text.replace("(", r"\(").replace(")", r"\)")
                       if what == "one_short" else text):
        mixed_arrays(UserMixing("returns", Returns, (what,)).mixer, 3, arrays, peers=None)


def test_a_mix_gives_its_arrays_back_as_numpy_arrays():
    got = mixed_arrays(UserMixing("returns", Returns).mixer, 0, [np.ones(2), np.array([3.0])],
                       peers=None)
    assert [g.tolist() for g in got] == [[2.0, 2.0], [6.0]]
