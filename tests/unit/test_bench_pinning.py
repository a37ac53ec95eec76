"""The benchmark's ranks each on one core: rank r on the (r mod cores)-th of the cores
the harness may use, and nothing pinned unless the harness asks."""

import pytest

from hvdx.bench.pinning import PIN_ENV, pin_rank


def pinned(environ):
    calls = []
    core = pin_rank(environ, lambda pid, cores: calls.append((pid, cores)))
    return core, calls


@pytest.mark.parametrize("rank, core", [(0, 4), (1, 6), (2, 4), (3, 6), (5, 6)])
def test_rank_r_runs_on_the_r_mod_cores_th_core(rank, core):
    assert pinned({PIN_ENV: "4,6", "PMI_RANK": str(rank)}) == (core, [(0, {core})])


@pytest.mark.parametrize("variable", ["PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"])
def test_the_rank_comes_from_any_of_the_launchers_variables(variable):
    assert pinned({PIN_ENV: "0,1", variable: "3"}) == (1, [(0, {1})])


@pytest.mark.parametrize("environ", [{}, {"PMI_RANK": "1"}, {PIN_ENV: "", "PMI_RANK": "1"},
                                     {PIN_ENV: "0,1"}, {PIN_ENV: "0,1", "PMI_RANK": "x"}])
def test_nothing_is_pinned_unless_asked_with_a_known_rank(environ):
    assert pinned(environ) == (None, [])


@pytest.mark.parametrize("value", ["0;1", "a", "0,-1", "0,"])
def test_a_bad_core_list_is_refused_naming_the_variable(value):
    with pytest.raises(ValueError, match=PIN_ENV):
        pinned({PIN_ENV: value, "PMI_RANK": "0"})
