"""Training batches padded to a few shapes (`[training] shape_buckets`): the
ladder of sizes, the padding exact, an epoch's few shapes, and a step that
depends on a batch's shape alone (what a captured step needs)."""

import collections
import itertools
import random

import numpy
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from elmo_spacy.bilm import BiLM, BiLMConfig, WordVocab
from elmo_spacy.bilm.inputs.buckets import ShapeBuckets, ladder_size, ladder_sizes, step_shape
from elmo_spacy.bilm.model import softmax as softmax_module
from elmo_spacy.pretrain.batches import BatchBuilder, corpus_vocabulary, epoch_batches
from elmo_spacy.pretrain.config import PretrainConfig
from elmo_spacy.pretrain.train import ShareLoss, pretrain

from .conftest import DATA, TINY_BILM, corpus_of, tokenize

DOCS = tokenize((DATA / "unlabeled.txt").read_text(encoding="utf-8").splitlines())


@pytest.mark.parametrize("per_octave", [1, 2, 4, 8])
def test_the_ladder_rounds_up_by_less_than_one_step_to_a_few_sizes_an_octave(per_octave):
    sizes = [ladder_size(n, per_octave) for n in range(1, 5000)]
    assert all(s >= n for n, s in zip(range(1, 5000), sizes))
    assert sizes == sorted(sizes)
    assert all(s - n < max(1, n / per_octave) for n, s in zip(range(1, 5000), sizes))
    for low in (64, 128, 1024):  # sizes in (low, 2 low]
        assert len({s for s in sizes if low < s <= 2 * low}) == per_octave
    assert ladder_size(0, per_octave) == 0
    lengths = numpy.arange(0, 5000)
    assert ladder_sizes(lengths, per_octave).tolist() == [0, *sizes]


def bilm_for(docs, **settings) -> BiLM:
    vocab = WordVocab.build(docs, max_size=60, min_count=1)
    torch.manual_seed(0)
    config = BiLMConfig(**{**TINY_BILM.to_dict(), "cutoffs": [10, 30], **settings})
    return BiLM(config, vocab).train()


def loss_and_gradients(bilm: BiLM, batch):
    bilm.zero_grad()
    loss = bilm.lm_loss(batch)
    (loss.forward_nll + loss.backward_nll).backward()
    grads = {n: p.grad.clone() for n, p in bilm.named_parameters() if p.grad is not None}
    return loss, grads


def random_docs(seed: int, n_docs: int = 9, words: int = 50) -> list[list[str]]:
    rng = random.Random(seed)
    vocabulary = [f"w{i}" * rng.randint(1, 4) for i in range(words)]
    return [rng.choices(vocabulary, k=rng.randint(1, 17)) for _ in range(n_docs)]


@pytest.mark.parametrize(
    "settings",
    [
        {},  # char CNN, adaptive softmax
        {"encoder": "word", "word_dim": 12},
        {"encoder": "word_char", "word_dim": 12},
        {"char_ids": "bilm_tf"},  # padding that the char CNN pools over
        {"softmax": "full"},
        {"cutoffs": [10, 30, 55]},  # a tail cluster without predictions
    ],
)
def test_a_padded_batch_gives_the_loss_and_gradients_of_the_batch(settings):
    docs = random_docs(0)
    bilm = bilm_for(docs, **settings)
    batch = bilm.batch(docs)
    clusters = bilm.softmax.cluster_starts
    padded = ShapeBuckets(per_octave=4, batch_tokens=500).pad(batch, bilm.chars, clusters)
    plain = batch.with_targets(clusters)
    # every size padded: docs, steps, types, chars, and the clusters' predictions
    assert padded.index.shape[0] > plain.index.shape[0]
    assert len(padded.targets.forward_rows) > len(plain.targets.forward_rows)
    assert padded.type_inputs.shape[0] > plain.type_inputs.shape[0]
    expected, expected_grads = loss_and_gradients(bilm, plain)
    got, grads = loss_and_gradients(bilm, padded)
    assert got.n_tokens == expected.n_tokens == sum(map(len, docs)) + len(docs)
    torch.testing.assert_close(got.forward_nll, expected.forward_nll, rtol=1e-6, atol=0)
    torch.testing.assert_close(got.backward_nll, expected.backward_nll, rtol=1e-6, atol=0)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=0, atol=1e-6, msg=name)


def test_padding_is_exact_through_the_chunked_softmax_of_a_large_cluster(monkeypatch):
    monkeypatch.setattr(softmax_module, "CLUSTER_CHUNK", 7)  # the last cluster in chunks
    monkeypatch.setattr(softmax_module, "WHOLE_CLUSTER_LOGITS", 0)
    test_a_padded_batch_gives_the_loss_and_gradients_of_the_batch({})


def plans(corpus, buckets):
    """The first epoch's batches of pieces of at most 30 tokens, 300 a batch."""
    exclude = numpy.zeros(0, "int64")
    return epoch_batches(
        corpus, seed=0, epoch=1, max_length=30, batch_tokens=300, exclude=exclude, buckets=buckets
    )


def epoch_shapes(corpus, bilm, buckets):
    build = BatchBuilder(corpus, bilm, buckets)
    return [(build(pieces), pieces) for pieces in plans(corpus, buckets)]


def test_an_epochs_batches_fit_their_budget_and_come_in_fewer_shapes():
    corpus = corpus_of(DOCS * 4)
    bilm = BiLM(TINY_BILM, corpus_vocabulary(corpus.types, 300, 1))
    plain = epoch_shapes(corpus, bilm, None)
    padded = epoch_shapes(corpus, bilm, ShapeBuckets(per_octave=2, batch_tokens=300))
    for batch, pieces in padded:
        assert batch.index.shape[0] * (batch.index.shape[1] - 2) <= 300 or len(pieces) == 1
        assert batch.targets.n_tokens == pieces.predictions
    assert sum(b.targets.n_tokens for b, _ in padded) == sum(p.predictions for _, p in plain)
    shapes = collections.Counter(step_shape(b) for b, _ in padded)
    assert len(shapes) < len({step_shape(b) for b, _ in plain}) / 2


def test_each_ranks_share_of_a_batch_fits_the_rows_of_its_share():
    """Under torchrun rank r trains docs r, r + 2, ... of each batch: with
    `shares` = 2 each share pads to half the rows of a batch of its width,
    and its docs always fit them."""
    corpus = corpus_of(DOCS * 4)
    bilm = BiLM(TINY_BILM, corpus_vocabulary(corpus.types, 300, 1))
    buckets = ShapeBuckets(per_octave=4, batch_tokens=300, shares=2)
    build = BatchBuilder(corpus, bilm, buckets)
    shares = 0
    for pieces in itertools.islice(plans(corpus, buckets), 12):
        for rank in (0, 1):
            share = pieces.take(slice(rank, None, 2))
            if len(share):
                rows, framed = build(share).index.shape
                assert rows == -(-(300 // (framed - 2)) // 2) >= len(share)
                shares += 1
    assert shares > 12


class OpTrace(TorchDispatchMode):
    """Every operator the dispatcher runs: its name, and its arguments and
    results with each tensor as its shape and dtype (numbers as they are)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append((str(func), *(tree_map(_described, x) for x in (args, kwargs, out))))
        return out


def _described(x):
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.shape), x.dtype)
    return x if isinstance(x, (int, float, bool, str, type(None), torch.dtype)) else repr(x)


# Operators that read a device tensor's values on the host: a wait per step,
# and a shape or branch that a captured step cannot replay.
HOST_READS = ("_local_scalar_dense", "nonzero", "unique", "masked_select", "is_nonzero", "equal")


def traced_step(bilm: BiLM, batch, batch_tokens: int) -> list[tuple]:
    loss = ShareLoss(bilm, world_size=1)
    bilm.zero_grad()
    torch.manual_seed(0)
    with OpTrace() as trace:
        scaled, _ = loss(batch, batch_tokens, 1.0)
        scaled.backward()
    return trace.ops


def test_steps_on_batches_of_one_shape_run_the_same_operators_on_the_same_arguments():
    """What replaying a captured step needs: given the batch's `step_shape`,
    the step's operators, their shapes and their numbers are fixed, and none
    reads a value back to the host. The second batch differs in its words,
    its lengths and its number of predictions."""
    first = random_docs(1)
    second = [doc[::-1] for doc in random_docs(1)[1:]] + [first[0][:-1]]
    bilm = bilm_for(first + second, dropout=0.1)
    buckets = ShapeBuckets(per_octave=4, batch_tokens=400)
    clusters = bilm.softmax.cluster_starts
    a, b = (buckets.pad(bilm.batch(docs), bilm.chars, clusters) for docs in (first, second))
    assert step_shape(a) == step_shape(b) and a.targets.n_tokens != b.targets.n_tokens
    assert not torch.equal(a.type_word_ids, b.type_word_ids)
    trace_a = traced_step(bilm, a, a.targets.n_tokens)
    trace_b = traced_step(bilm, b, b.targets.n_tokens)
    assert trace_a == trace_b
    assert not [op for op, *_ in trace_a if any(name in op for name in HOST_READS)]
    # the trace sees shapes: unpadded, the two batches' steps differ
    plain_a, plain_b = (bilm.batch(docs).with_targets(clusters) for docs in (first, second))
    assert traced_step(bilm, plain_a, 1) != traced_step(bilm, plain_b, 1)


def test_pretraining_with_shape_buckets_learns_on_padded_batches_of_every_doc(tmp_path):
    config = PretrainConfig(
        max_epochs=3, batch_tokens=400, max_length=40, shape_buckets=4, dev_fraction=0.1
    )
    log = pretrain(corpus_of(DOCS), TINY_BILM, config, tmp_path, show_progress=False)
    plain = PretrainConfig(**{**config.to_dict(), "shape_buckets": 0, "max_epochs": 1})
    plain_log = pretrain(corpus_of(DOCS), TINY_BILM, plain, tmp_path / "plain", show_progress=False)
    assert log["training"]["shape_buckets"] == 4
    trained = [e["train_perplexity"] for e in log["epochs"]]
    assert trained[-1] < trained[0] / 2
    # each epoch predicts every token of the training docs once, padding aside
    assert [e["train_tokens"] for e in log["epochs"]] == [
        plain_log["epochs"][0]["train_tokens"]
    ] * 3
