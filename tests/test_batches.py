"""Pretraining's batches over a prepared corpus: each epoch's plan, the dev
sample, and the batches built from token ids."""

import numpy
import pytest
import torch

from elmo_spacy.bilm import BiLM, BiLMConfig, WordVocab
from elmo_spacy.pretrain.batches import (
    BatchBuilder,
    Prefetcher,
    Spans,
    corpus_vocabulary,
    dev_sample,
    epoch_batches,
    ordered_batches,
)
from elmo_spacy.pretrain.distributed import ProcessGroup

from .batches import per_token
from .conftest import DATA, TINY_BILM, corpus_of, tokenize

DOCS = tokenize((DATA / "unlabeled.txt").read_text(encoding="utf-8").splitlines())
# Long docs, cut into pieces of max_length.
LONG = [doc * 7 for doc in DOCS[:5]] + DOCS[5:]


def tokens_of(corpus, pieces: Spans) -> list[tuple[str, ...]]:
    return [
        tuple(corpus.types.strings_of(corpus.tokens(s, b, n)))
        for s, b, n in zip(pieces.shard, pieces.start, pieces.length)
    ]


def plan(corpus, epoch=1, seed=0, exclude=numpy.zeros(0, "int64"), batch_tokens=700):
    return list(
        epoch_batches(
            corpus,
            seed=seed,
            epoch=epoch,
            max_length=60,
            batch_tokens=batch_tokens,
            exclude=exclude,
        )
    )


def test_an_epoch_holds_every_piece_of_every_doc_once_in_batches_within_the_budget():
    corpus = corpus_of(LONG)
    batches = plan(corpus)
    pieces = [p for batch in batches for p in tokens_of(corpus, batch)]
    assert all(len(p) <= 60 for p in pieces)
    expected = [tuple(doc[i : i + 60]) for doc in LONG for i in range(0, len(doc), 60)]
    assert sorted(pieces) == sorted(expected)
    assert all(len(b) * b.length.max() <= 700 for b in batches)
    # like lengths together: a batch's pieces differ less than the corpus's do
    spread = numpy.mean([b.length.max() - b.length.min() for b in batches])
    assert spread < 0.25 * (max(map(len, expected)) - min(map(len, expected)))


def test_each_epochs_order_follows_from_the_seed_and_the_epoch_alone():
    corpus = corpus_of(LONG)

    def order(**settings):
        return [tokens_of(corpus, b) for b in plan(corpus, **settings)]

    assert order(epoch=2) == order(epoch=2)
    assert order(epoch=2) != order(epoch=3)
    assert order(epoch=2, seed=1) != order(epoch=2)


def test_the_dev_sample_is_seeded_capped_and_left_out_of_training():
    corpus = corpus_of(DOCS)
    sample = dev_sample(corpus, 0.25, max_tokens=10**6, seed=0)
    assert len(sample.docs) == round(0.25 * len(DOCS))
    assert numpy.array_equal(sample.docs, dev_sample(corpus, 0.25, 10**6, seed=0).docs)
    assert not numpy.array_equal(sample.docs, dev_sample(corpus, 0.25, 10**6, seed=1).docs)
    capped = dev_sample(corpus, 0.25, max_tokens=100, seed=0)
    assert capped.spans(200).tokens <= 100 + max(map(len, DOCS))  # stops once it holds 100
    assert 1 <= len(capped.docs) < len(sample.docs)
    dev = set(tokens_of(corpus, sample.spans(60)))
    trained = {
        p for b in plan(corpus, exclude=sample.excluded_from(corpus)) for p in tokens_of(corpus, b)
    }
    assert not dev & trained
    assert dev | trained == {tuple(d[i : i + 60]) for d in DOCS for i in range(0, len(d), 60)}
    held_in = dev_sample(corpus, 0.0, 10**6, seed=0, held_out=False)
    assert len(held_in.excluded_from(corpus)) == 0


def test_the_vocabulary_counts_the_docs_trained_on_and_not_the_held_out_ones():
    corpus = corpus_of(DOCS)
    sample = dev_sample(corpus, 0.25, max_tokens=10**6, seed=0)
    trained = [d for i, d in enumerate(DOCS) if i not in set(sample.docs.tolist())]
    expected = WordVocab.build(trained, max_size=10**6, min_count=2)
    assert corpus_vocabulary(corpus.types, 10**6, 2, held_out=sample) == expected
    only_in_dev = {t for i in sample.docs for t in DOCS[i]} - {t for d in trained for t in d}
    assert only_in_dev and not only_in_dev & set(expected.index)
    held_in = dev_sample(corpus, 0.0, 10**6, seed=0, held_out=False)
    every_doc = WordVocab.build(DOCS, max_size=10**6, min_count=2)
    assert corpus_vocabulary(corpus.types, 10**6, 2, held_out=held_in) == every_doc


@pytest.mark.parametrize("encoder", ["char_cnn", "word", "word_char"])
def test_a_batch_built_from_ids_runs_as_the_batch_of_its_strings(encoder):
    corpus = corpus_of(DOCS)
    config = BiLMConfig(**{**TINY_BILM.to_dict(), "encoder": encoder, "word_dim": 12})
    torch.manual_seed(0)
    bilm = BiLM(config, corpus_vocabulary(corpus.types, 300, 2)).eval()
    build = BatchBuilder(corpus, bilm)
    for pieces in plan(corpus)[:3]:
        from_ids = build(pieces)
        from_strings = bilm.batch([list(p) for p in tokens_of(corpus, pieces)])
        assert from_ids.targets is not None
        with torch.no_grad():
            torch.testing.assert_close(bilm(from_ids), bilm(from_strings), rtol=0, atol=1e-6)
            a, b = bilm.lm_loss(from_ids), bilm.lm_loss(from_strings)
        assert a.n_tokens == b.n_tokens == pieces.predictions
        torch.testing.assert_close(a.forward_nll, b.forward_nll, rtol=1e-5, atol=0)
        torch.testing.assert_close(a.backward_nll, b.backward_nll, rtol=1e-5, atol=0)


def test_the_prefetcher_gives_each_rank_its_share_and_passes_errors_on():
    corpus = corpus_of(DOCS)
    batches = ordered_batches(dev_sample(corpus, 0.5, 10**6, seed=0).spans(200), 300)
    shares = []
    for rank in (0, 1):
        with Prefetcher(iter(batches), lambda p: p, ProcessGroup(rank=rank, world_size=2)) as built:
            shares.append(list(built))
    for (first, whole, w0), (second, _, w1) in zip(*shares):
        assert len(first) + len(second) * w1 == len(whole)
        assert w0 == 1.0 and w1 == float(len(whole) > 1)

    def broken(pieces):
        raise RuntimeError("the builder failed")

    with pytest.raises(RuntimeError, match="the builder failed"):
        with Prefetcher(iter(batches), broken, ProcessGroup()) as built:
            list(built)


@pytest.mark.parametrize("encoder", ["char_cnn", "word_char"])
def test_the_encoder_runs_once_per_distinct_word_and_that_is_exact(encoder):
    """A batch holds each distinct token once (the char CNN runs on those
    rows and the positions gather them): the loss and every gradient are
    those of a batch that encodes each token where it stands."""
    docs = tokenize((DATA / "unlabeled.txt").read_text(encoding="utf-8").splitlines()[:24])
    torch.manual_seed(0)
    config = BiLMConfig(**{**TINY_BILM.to_dict(), "encoder": encoder, "word_dim": 8})
    bilm = BiLM(config, WordVocab.build(docs, max_size=500, min_count=1)).train()
    batch = bilm.batch(docs)
    expanded = per_token(batch)
    n_tokens = sum(map(len, docs))
    assert len(batch.type_inputs) - 2 == len({t for d in docs for t in d}) < n_tokens
    assert len(expanded.type_inputs) - 2 == n_tokens

    def loss_and_grads(token_batch):
        bilm.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # the same dropout masks
        loss = bilm.lm_loss(token_batch).mean
        loss.backward()
        grads = {n: p.grad.clone() for n, p in bilm.named_parameters() if p.grad is not None}
        return float(loss.detach()), grads

    loss, grads = loss_and_grads(batch)
    loss_each, grads_each = loss_and_grads(expanded)
    assert loss == pytest.approx(loss_each, rel=1e-6)
    assert grads.keys() == grads_each.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], grads_each[name], rtol=1e-6, atol=1e-6)
