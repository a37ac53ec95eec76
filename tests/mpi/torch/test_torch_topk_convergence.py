"""Convergence of bidirectional TopK on real data (the bar: "Digits CNN, 4 ranks, ratio
0.01 both ways: final test accuracy within 1 point of dense Horovod after the same number
of epochs; without residuals it is worse").

The digits CNN trained on 4 ranks three times, alike but for the synchronization
(:mod:`digits_training`): Horovod's dense allreduce, TopK 0.01/0.01 with error feedback,
and the same TopK with no residuals. Both methods apply the same update on every rank,
so the ranks hold the same weights; the accuracy is their mean all the same.
"""

import pathlib
import sys

import pytest

import hvdx.torch as hvd

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from digits_training import EPOCHS, train  # noqa: E402

pytestmark = [pytest.mark.topk]

RATIO = 0.01


def with_compression(compression):
    def distributed(local, model):
        kwargs = {} if compression is None else {"compression": compression}
        return hvd.DistributedOptimizer(local, named_parameters=model.named_parameters(),
                                        **kwargs)
    return distributed


@pytest.fixture(scope="module")
def accuracies():
    return {
        "dense": train(hvd, with_compression(None)),
        "topk": train(hvd, with_compression(hvd.Compression.topk(ratio=RATIO,
                                                                 downlink_ratio=RATIO))),
        "no_residuals": train(hvd, with_compression(hvd.Compression.topk(
            ratio=RATIO, downlink_ratio=RATIO, error_feedback=False))),
    }


@pytest.mark.mpi(min_size=4)
def test_topk_with_error_feedback_is_within_one_point_of_dense_horovod(accuracies):
    print(f"digits CNN, {hvd.size()} ranks, {EPOCHS} epochs: {accuracies}")
    assert accuracies["dense"] > 0.9, accuracies
    assert accuracies["topk"] >= accuracies["dense"] - 0.01, accuracies


@pytest.mark.mpi(min_size=4)
def test_topk_without_residuals_is_worse(accuracies):
    assert accuracies["no_residuals"] < accuracies["topk"] - 0.01, accuracies
