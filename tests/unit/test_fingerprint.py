"""Fingerprints find the first thing ranks disagree on, identically on every rank."""

import pytest

from hvdx.core.fingerprint import Fingerprint, first_difference, first_error

pytestmark = [pytest.mark.dssync]


def fp(params, settings=(("op", "Average"),), labels=()):
    return Fingerprint.build(params, settings, labels)


MODEL = [("conv.weight", "float32", (16, 1, 3, 3)), ("fc.weight", "float32", (10, 64))]


def test_identical_fingerprints_agree_and_share_a_digest():
    a, b = fp(MODEL), fp(list(MODEL))
    assert first_difference([a, b, a]) is None
    assert a.digest() == b.digest()


def test_a_different_shape_names_the_parameter_and_both_values():
    other = [MODEL[0], ("fc.weight", "float32", (10, 32))]
    msg = first_difference([fp(MODEL), fp(MODEL), fp(other)])
    assert "'fc.weight'" in msg and "float32[10, 64]" in msg and "float32[10, 32]" in msg
    assert "rank 2" in msg


def test_a_different_dtype_is_a_difference():
    other = [MODEL[0], ("fc.weight", "float16", (10, 64))]
    assert "float16" in first_difference([fp(MODEL), fp(other)])


def test_a_missing_parameter_is_named_with_the_rank_that_lacks_it():
    msg = first_difference([fp(MODEL), fp(MODEL[:1])])
    assert "fc.weight" in msg and "not on rank 1" in msg


def test_a_different_setting_is_named():
    msg = first_difference([fp(MODEL), fp(MODEL, (("op", "Sum"),))])
    assert "setting 'op'" in msg and "'Average'" in msg and "'Sum'" in msg


def test_order_matters_because_collectives_are_matched_in_order():
    a, b = fp(MODEL), fp(MODEL[::-1])
    assert a.digest() != b.digest()
    assert first_difference([a, b]) is not None


def test_labels_name_positional_entries_but_are_not_compared():
    a = fp([("variable[0]", "float32", (3,))], labels=["dense/kernel:0"])
    b = fp([("variable[0]", "float32", (3,))], labels=["dense_7/kernel:0"])
    assert a == b and a.digest() == b.digest()
    c = fp([("variable[0]", "float32", (4,))], labels=["dense_7/kernel:0"])
    assert "variable[0] (dense/kernel:0)" in first_difference([a, c])


def test_every_rank_computes_the_same_message():
    views = [fp(MODEL), fp(MODEL[:1]), fp(MODEL)]
    assert len({first_difference(list(views)) for _ in range(4)}) == 1


def test_the_first_rank_that_could_not_build_its_settings_is_reported_first():
    ok = Fingerprint.build(settings=[("sync", "dssync")])
    bad = Fingerprint.build(settings=[("sync", "dssync"),
                                      ("dssync.error", "schedule='x' must be 'rotation'")])
    assert first_error([ok, ok]) is None
    assert first_error([ok, bad, bad]) == \
        "rank 1 cannot use its dssync: schedule='x' must be 'rotation'"
