"""A misspelt keyword of ``hvd.Compression.topk``, ``hvdx.DSSync`` or
``hvdx.Decentralized``, in code or in ``HVDX_COMPRESSION`` / ``HVDX_SYNC``: one error,
without a chain, naming the keyword and the closest one the constructor takes."""

import inspect

import pytest

import hvdx
from hvdx import environment
from hvdx.environment_variables import VariableError
from hvdx.keywords import bind, unexpected_keyword
from hvdx.strategies.topk.spec import topk

pytestmark = [pytest.mark.topk, pytest.mark.dssync, pytest.mark.decentralized]

MISSPELT = [
    (lambda: topk(ration=0.1),
     "topk() got an unexpected keyword argument 'ration'; did you mean 'ratio'?"),
    (lambda: topk(0.1, presett="fast"),
     "topk() got an unexpected keyword argument 'presett'; did you mean 'preset'?"),
    (lambda: hvdx.DSSync(group_sise=2),
     "DSSync() got an unexpected keyword argument 'group_sise'; did you mean "
     "'group_size'?"),
    (lambda: hvdx.Decentralized(topolgy="ring"),
     "Decentralized() got an unexpected keyword argument 'topolgy'; did you mean "
     "'topology'?"),
]


def unchained(error):
    return error.__cause__ is None and \
        (error.__context__ is None or error.__suppress_context__)


@pytest.mark.parametrize("build, message", MISSPELT)
def test_a_misspelt_keyword_in_code_is_a_type_error_naming_the_closest(build, message):
    with pytest.raises(TypeError) as info:
        build()
    assert str(info.value) == message
    assert unchained(info.value)


@pytest.mark.parametrize("variable, raw, reason", [
    ("HVDX_COMPRESSION", "topk(ration=0.1)",
     "topk() got an unexpected keyword argument 'ration'; did you mean 'ratio'?"),
    ("HVDX_COMPRESSION", "topk(preset='fast', ratoi=0.1)",
     "topk() got an unexpected keyword argument 'ratoi'; did you mean 'ratio'?"),
    ("HVDX_SYNC", "DSSync('shuffle', group_sise=2)",
     "DSSync() got an unexpected keyword argument 'group_sise'; did you mean "
     "'group_size'?"),
    ("HVDX_SYNC", "Decentralized(topolgy='ring')",
     "Decentralized() got an unexpected keyword argument 'topolgy'; did you mean "
     "'topology'?"),
    ("HVDX_COMPRESSION", "tpok(0.1)", "unknown name 'tpok'; did you mean 'topk'?"),
    ("HVDX_COMPRESSION", "fats", "unknown name 'fats'; did you mean 'fast'?"),
    ("HVDX_SYNC", "dssync", "unknown name 'dssync'; did you mean 'DSSync'?"),
])
def test_a_misspelt_keyword_or_name_in_a_variable_is_its_error_naming_the_closest(
        variable, raw, reason):
    with pytest.raises(VariableError) as info:  # a ValueError, as every refused value
        environment.parse(variable, raw)
    assert str(info.value).startswith(f"{variable}={raw!r}: {reason} {variable} accepts ")
    assert unchained(info.value)


def test_a_keyword_nothing_is_close_to_is_answered_with_every_keyword_taken():
    def build(ratio=0.1, *, seed=0):
        pass

    error = unexpected_keyword("build", inspect.signature(build), {"zzz": 1})
    assert str(error) == ("build() got an unexpected keyword argument 'zzz'; it takes "
                          "ratio, seed")


def test_a_function_taking_any_keyword_refuses_none():
    def build(**options):
        pass

    assert unexpected_keyword("build", inspect.signature(build), {"zzz": 1}) is None


@pytest.mark.parametrize("args, kwargs, message", [
    ((0.1, 0.1, 0.1), {}, "topk(): too many positional arguments"),
    ((0.1,), {"ratio": 0.2}, "topk(): multiple values for argument 'ratio'"),
])
def test_other_binding_errors_name_the_function(args, kwargs, message):
    with pytest.raises(TypeError) as info:
        topk(*args, **kwargs)
    assert str(info.value) == message and unchained(info.value)


def test_bind_binds_what_the_signature_takes():
    def build(ratio, downlink_ratio=None, *, seed=0):
        pass

    bound = bind("build", inspect.signature(build), (0.1,), {"seed": 3})
    assert bound.arguments == {"ratio": 0.1, "seed": 3}
