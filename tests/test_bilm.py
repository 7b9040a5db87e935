"""The biLM alone: plain PyTorch, no spaCy pipeline."""

import bisect
import warnings

import numpy
import pytest
import torch

from elmo_spacy.bilm import BiLM, BiLMConfig, WordVocab, load_bilm, save_bilm
from elmo_spacy.bilm.formats.directory import BiLMLoadError
from elmo_spacy.bilm.inputs.batch import length_runs
from elmo_spacy.pretrain import PretrainConfig, evaluate_perplexity, pretrain

from .conftest import TINY_BILM, corpus_of, tokenize

SENTENCES = tokenize(
    [
        "The bank raised interest rates on Monday .",
        "She sat on the bank of the river and watched the boats .",
        "Stocks fell sharply after the report on jobs .",
        "The team won the final game of the season .",
        "Apple released a new phone and a new laptop .",
        "He ate an apple and a pear for lunch .",
        "Rain is expected in the north on Tuesday .",
        "The minister resigned after the vote .",
    ]
)


def build(encoder: str = "char_cnn", seed: int = 0) -> BiLM:
    torch.manual_seed(seed)
    vocab = WordVocab.build(SENTENCES, max_size=1000, min_count=1)
    config = BiLMConfig(**{**TINY_BILM.to_dict(), "encoder": encoder})
    return BiLM(config, vocab).eval()


def layers(bilm: BiLM, docs):
    with torch.inference_mode():
        return bilm(bilm.batch(docs))


def test_held_in_perplexity_halves(tmp_path):
    docs = SENTENCES * 2
    torch.manual_seed(0)
    bilm = BiLM(TINY_BILM, WordVocab.build(docs, max_size=1000, min_count=1))
    before = evaluate_perplexity(bilm, [bilm.batch(docs)])["mean"]
    settings = PretrainConfig(
        dev_fraction=0.0,
        max_epochs=60,
        max_steps=60,
        batch_tokens=400,
        learning_rate=0.03,
        patience=0,
    )
    log = pretrain(corpus_of(docs), TINY_BILM, settings, tmp_path, show_progress=False)
    after = log["epochs"][-1]["dev_perplexity"]["mean"]
    assert log["epochs"][-1]["step"] == 60
    assert after <= before / 2, (before, after)


@pytest.mark.parametrize("encoder", ["char_cnn", "word"])
def test_output_shape_and_alignment(encoder):
    bilm = build(encoder)
    docs = [SENTENCES[0], [], ["one"], SENTENCES[1] * 5, [" ", "\n", "x" * 300]]
    out = layers(bilm, docs)
    n_layers, width = TINY_BILM.n_layers + 1, TINY_BILM.width
    assert out.shape == (n_layers, len(docs), max(map(len, docs)), width)
    for i, doc in enumerate(docs):
        alone = layers(bilm, [doc])
        assert alone.shape == (n_layers, 1, len(doc), width)
        # Same doc, same vectors, whatever it is batched with.
        torch.testing.assert_close(alone[:, 0], out[:, i, : len(doc)], atol=1e-5, rtol=1e-4)


def test_layer_zero_is_context_free_and_lstm_layers_are_not():
    bilm = build()
    river = SENTENCES[1]  # "... the bank of the river ..."
    money = SENTENCES[0]  # "The bank raised ..."
    out_river = layers(bilm, [river])[:, 0, river.index("bank")]
    out_money = layers(bilm, [money])[:, 0, money.index("bank")]
    torch.testing.assert_close(out_river[0], out_money[0])
    for layer in (1, 2):
        assert not torch.allclose(out_river[layer], out_money[layer], atol=1e-4)
    again = layers(bilm, [river])[:, 0, river.index("bank")]
    assert torch.equal(out_river, again)


def test_layer_zero_repeats_the_token_encoding_in_both_halves():
    bilm = build()
    out = layers(bilm, [SENTENCES[2]])
    half = TINY_BILM.projection_dim
    assert torch.equal(out[0, ..., :half], out[0, ..., half:])


def test_backward_direction_reads_right_to_left():
    """The forward half of layer 1 ignores what follows a token; the backward half
    ignores what precedes it."""
    bilm = build()
    half = TINY_BILM.projection_dim
    a = layers(bilm, [["the", "bank", "raised", "rates"]])[1, 0]
    b = layers(bilm, [["the", "bank", "of", "rivers"]])[1, 0]
    torch.testing.assert_close(a[:2, :half], b[:2, :half])
    assert not torch.allclose(a[:2, half:], b[:2, half:])
    c = layers(bilm, [["my", "bank", "raised", "rates"]])[1, 0]
    torch.testing.assert_close(a[1:, half:], c[1:, half:])


def test_lm_loss_counts_words_and_one_boundary_per_direction():
    bilm = build()
    loss = bilm.lm_loss(bilm.batch([SENTENCES[0], SENTENCES[3], []]))
    assert loss.n_tokens == len(SENTENCES[0]) + 1 + len(SENTENCES[3]) + 1 + 1
    assert torch.isfinite(loss.mean)


def test_full_and_adaptive_softmax_give_normalised_probabilities():
    for softmax in ("full", "adaptive"):
        config = BiLMConfig(**{**TINY_BILM.to_dict(), "softmax": softmax, "cutoffs": [10]})
        vocab = WordVocab.build(SENTENCES, max_size=1000, min_count=1)
        bilm = BiLM(config, vocab).eval()
        hidden = torch.randn(3, config.projection_dim)
        head = bilm.softmax
        total = torch.zeros(3)
        for word in range(len(vocab)):
            cluster = bisect.bisect_right(head.cluster_starts, word)
            splits = [0] + [int(cluster <= i) for i in range(len(head.cluster_starts) + 1)]
            rows = [head(hidden[i : i + 1], torch.tensor([word]), splits) for i in range(3)]
            total += torch.exp(-torch.stack(rows))
        torch.testing.assert_close(total, torch.ones(3), atol=1e-4, rtol=1e-4)


def test_length_runs_fill_each_batch_to_the_token_budget_and_keep_every_item():
    lengths = numpy.sort(numpy.random.default_rng(0).integers(1, 60, 500))
    lengths[-1] = 700  # longer than the budget: a batch of its own
    bounds = length_runs(lengths, 600)
    assert bounds[0] == 0 and bounds[-1] == len(lengths)
    for start, stop in zip(bounds[:-1], bounds[1:]):
        assert stop > start
        assert (stop - start) * lengths[stop - 1] <= 600 or stop - start == 1
        if stop < len(lengths):  # greedy: one more item would not fit
            assert (stop - start + 1) * lengths[stop] > 600


def test_save_and_load_round_trip(tmp_path):
    bilm = build()
    save_bilm(bilm, tmp_path / "bilm")
    loaded = load_bilm(tmp_path / "bilm")
    assert loaded.vocab == bilm.vocab and loaded.config == bilm.config
    assert torch.equal(layers(bilm, SENTENCES), layers(loaded, SENTENCES))
    without_softmax = load_bilm(tmp_path / "bilm", with_softmax=False)
    assert without_softmax.softmax is None
    assert torch.equal(layers(bilm, SENTENCES), layers(without_softmax, SENTENCES))


def test_load_refuses_truncated_weights_and_mismatched_vocab(tmp_path):
    bilm = build("word")
    path = save_bilm(bilm, tmp_path / "bilm")
    weights = (path / "weights.safetensors").read_bytes()
    (path / "weights.safetensors").write_bytes(weights[: len(weights) // 2])
    with pytest.raises(BiLMLoadError, match="truncated or corrupt"):
        load_bilm(path)
    save_bilm(bilm, path)
    (path / "vocab.json").write_text('["<PAD>", "<UNK>", "<S>", "</S>", "only"]')
    with pytest.raises(BiLMLoadError, match="does not match"):
        load_bilm(path)
    with pytest.raises(BiLMLoadError, match="config.json is missing"):
        load_bilm(tmp_path)
    bilm.softmax = None  # as the elmo pipe saves it
    save_bilm(bilm, path)
    with pytest.raises(BiLMLoadError, match="without its softmax head"):
        load_bilm(path, with_softmax=True)
    assert load_bilm(path).softmax is None


def test_config_rejects_unknown_keys_and_values():
    with pytest.raises(ValueError, match="Unknown biLM config keys"):
        BiLMConfig.from_dict({"lstm_size": 3})
    with pytest.raises(ValueError, match="encoder"):
        BiLMConfig(encoder="transformer")


def test_vocab_orders_by_frequency():
    vocab = WordVocab.build([["b", "a", "a", "c"], ["a", "b"]], max_size=6, min_count=2)
    assert vocab.words[4:] == ["a", "b"]
    assert numpy.array_equal(vocab.word_ids(["a", "zzz"]).numpy(), [2, 3, 4, 1])


def test_initial_word_vectors_set_the_rows_of_known_words_at_one_scale():
    bilm = build("word")
    table = bilm.encoder.embed.weight
    width = table.shape[1]
    vectors = {
        "bank": numpy.full(width, 2.0),
        "river": numpy.full(width, 4.0),
        "zebra": numpy.ones(width),
    }
    before = table.detach().clone()
    assert bilm.init_word_vectors(vectors) == 2  # "zebra" is not in the vocab
    bank, river = bilm.vocab.index["bank"], bilm.vocab.index["river"]
    torch.testing.assert_close(table[river], 2 * table[bank])  # relative sizes kept
    mean_norm = (before[bank].norm() + before[river].norm()) / 2
    torch.testing.assert_close((table[bank].norm() + table[river].norm()) / 2, mean_norm)
    others = [i for i in range(len(bilm.vocab)) if i not in (bank, river)]
    torch.testing.assert_close(table[others], before[others])


def test_initial_word_vectors_of_the_wrong_width_or_for_chars_are_refused():
    bilm = build("word")
    width = bilm.encoder.embed.weight.shape[1]
    with pytest.raises(ValueError, match=f"word_dim is {width}"):
        bilm.init_word_vectors({"bank": numpy.ones(width + 1)})
    with pytest.raises(ValueError, match="need a word embedding"):
        build("char_cnn").init_word_vectors({"bank": numpy.ones(width)})


def test_char_cnn_encodings_are_kept_across_batches_until_the_weights_change():
    bilm = build("char_cnn")
    uncached = BiLM(bilm.config, bilm.vocab, type_cache_size=0).eval()
    uncached.load_state_dict(bilm.state_dict())

    def cached_types():
        cache = bilm.cache_slot.cache
        return set(cache.types) if cache is not None else set()

    first = layers(bilm, SENTENCES[:4])
    assert cached_types() == {t for doc in SENTENCES[:4] for t in doc}
    # Later batches reuse the kept encodings and give what the uncached biLM gives.
    for docs in (SENTENCES[2:6], SENTENCES):
        torch.testing.assert_close(layers(bilm, docs), layers(uncached, docs), atol=1e-5, rtol=0)
    torch.testing.assert_close(layers(bilm, SENTENCES[:4]), first, atol=1e-6, rtol=0)

    def same_as_uncached():
        torch.testing.assert_close(
            layers(bilm, SENTENCES[:4]), layers(uncached, SENTENCES[:4]), atol=1e-5, rtol=0
        )

    # An in-place update of the encoder (as a torch optimiser step does) empties the cache.
    with torch.no_grad():
        for bilm_ in (bilm, uncached):
            bilm_.encoder.projection.weight.mul_(2.0)
    same_as_uncached()
    assert not torch.allclose(layers(bilm, SENTENCES[:4]), first, atol=1e-3)
    # So does new storage swapped in, and a switch to training.
    for bilm_ in (bilm, uncached):
        bilm_.encoder.projection.weight.data = bilm_.encoder.projection.weight.data * 0.5
    same_as_uncached()
    assert cached_types() and bilm.train().cache_slot.cache is None
    # A write through numpy (as thinc's optimiser does) is announced with weights_changed().
    bilm.eval()
    layers(bilm, SENTENCES[:4])
    for bilm_ in (bilm, uncached):
        bilm_.encoder.projection.weight.detach().numpy()[:] *= 3.0
        bilm_.forward_lstm.layers[0].weight_hh_l0.detach().numpy()[:] *= 0.5
        bilm_.weights_changed()
    same_as_uncached()
    # Nothing is kept while training or with gradients, and the bound holds.
    bilm.train()
    bilm(bilm.batch(SENTENCES))
    assert not cached_types()
    bilm.eval().type_cache_size = 5
    layers(bilm, SENTENCES)
    assert len(cached_types()) == 5


@pytest.mark.parametrize("whole_cluster_logits", [0, 1 << 24], ids=["in chunks", "whole"])
def test_the_tail_clusters_give_torchs_loss_and_gradients(monkeypatch, whole_cluster_logits):
    """A tail cluster, its logits kept whole or (wider than CLUSTER_CHUNK
    words, the rare words of a vocabulary of hundreds of thousands, with
    more than WHOLE_CLUSTER_LOGITS logits) normalised a chunk at a time:
    the loss and every gradient of torch's adaptive softmax."""
    import elmo_spacy.bilm.model.softmax as softmax_module

    monkeypatch.setattr(softmax_module, "CLUSTER_CHUNK", 64)  # the last cluster: 200 words
    monkeypatch.setattr(softmax_module, "WHOLE_CLUSTER_LOGITS", whole_cluster_logits)
    torch.manual_seed(0)
    softmax = torch.nn.AdaptiveLogSoftmaxWithLoss(16, 300, [20, 100], div_value=4.0)
    hidden, targets = torch.randn(64, 16), torch.randint(0, 300, (64,))
    cluster = torch.bucketize(targets, torch.tensor([20, 100]), right=True)
    order = torch.argsort(cluster, stable=True)
    hidden, targets = hidden[order], targets[order]
    splits = [0, *torch.cumsum(torch.bincount(cluster, minlength=3), 0).tolist()]

    def loss_and_grads(compute):
        softmax.zero_grad(set_to_none=True)
        x = hidden.clone().requires_grad_()
        loss = compute(x)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in softmax.named_parameters()}
        return float(loss.detach()), x.grad, grads

    loss, d_hidden, grads = loss_and_grads(
        lambda x: softmax_module.adaptive_nll(softmax, x, targets, splits)
    )
    expected, d_expected, grads_expected = loss_and_grads(
        lambda x: softmax(x, targets).loss * len(targets)
    )
    assert loss == pytest.approx(expected, rel=1e-6)
    torch.testing.assert_close(d_hidden, d_expected, rtol=1e-5, atol=1e-6)
    for name in grads:
        torch.testing.assert_close(grads[name], grads_expected[name], rtol=1e-5, atol=1e-6)


def test_a_wide_cluster_is_chunked_only_where_its_logits_would_not_fit(monkeypatch):
    import elmo_spacy.bilm.model.softmax as softmax_module

    monkeypatch.setattr(softmax_module, "CLUSTER_CHUNK", 64)
    monkeypatch.setattr(softmax_module, "WHOLE_CLUSTER_LOGITS", 10 * 200)  # 10 rows of 200 words
    chunks = []
    apply = softmax_module._ClusterNll.apply
    monkeypatch.setattr(
        softmax_module._ClusterNll, "apply", lambda *a: chunks.append(a[-1]) or apply(*a)
    )
    torch.manual_seed(0)
    weight = torch.randn(200, 8)
    for rows in (10, 11):
        projected, targets = torch.randn(rows, 8), torch.randint(0, 200, (rows,))
        got = softmax_module.cluster_nll(projected, weight, targets)
        expected = torch.nn.functional.cross_entropy(
            projected @ weight.t(), targets, reduction="sum"
        )
        assert float(got) == pytest.approx(float(expected), rel=1e-6)
    assert chunks == [200, 64]  # 10 rows whole, 11 in chunks


def test_cutoffs_that_would_leave_a_cluster_no_width_are_refused():
    from elmo_spacy.bilm.model.softmax import SoftmaxHead

    with pytest.raises(ValueError, match=r"projection_dim / div_value\^3 = 0.25 dimensions"):
        SoftmaxHead(16, 400, "adaptive", [50, 100, 200])
    assert SoftmaxHead(16, 400, "adaptive", [50, 100, 200], div_value=2.0).adaptive
    assert SoftmaxHead(16, 120, "adaptive", [50, 100, 200]).head.n_clusters == 2  # 200: no word


def test_auto_cutoffs_follow_the_vocabulary_size():
    """Clusters of at most 100,000 words past the first 100,000, each with at
    least one dimension: a million-word vocabulary must not leave its rare
    words in one cluster of 990,000 (each of their predictions normalised
    over all of them)."""
    from elmo_spacy.bilm.model.softmax import MAX_CLUSTER_WORDS, SoftmaxHead, fitted_cutoffs

    assert fitted_cutoffs(40_000, 128, 4.0) == ([2000, 10000], 4.0)  # as the configs had it
    assert fitted_cutoffs(1_500, 128, 4.0) == ([], 4.0)  # a full softmax
    cutoffs, div_value = fitted_cutoffs(945_000, 64, 4.0)
    assert cutoffs[:4] == [2000, 10000, 50000, 100000] and cutoffs[-1] == 900_000
    clusters = [b - a for a, b in zip(cutoffs, [*cutoffs[1:], 945_000])]
    assert max(clusters) <= MAX_CLUSTER_WORDS
    assert 64 / div_value ** len(cutoffs) >= 1 > 64 / (div_value + 0.01) ** len(cutoffs)
    head = SoftmaxHead(64, 945_000, "adaptive", "auto")
    assert head.cluster_starts == cutoffs and head.div_value == div_value


def test_cutoffs_are_auto_or_a_list_of_whole_numbers():
    assert BiLMConfig().cutoffs == "auto"
    assert BiLMConfig(cutoffs=[10, 20.0]).cutoffs == [10, 20]
    with pytest.raises(ValueError, match='cutoffs = .fitted.: a list of whole numbers, or "auto"'):
        BiLMConfig(cutoffs="fitted")


def test_pretraining_warns_of_given_cutoffs_that_leave_a_huge_cluster():
    from elmo_spacy.pretrain.train import _warn_of_oversized_clusters

    words = [f"w{i}" for i in range(100_100)]
    config = BiLMConfig(**{**TINY_BILM.to_dict(), "cutoffs": [50]})
    bilm = BiLM(config, WordVocab([*WordVocab.specials_only().words, *words]))
    with pytest.warns(UserWarning, match=r"leave a tail cluster of 100,054 words .*\"auto\" gives"):
        _warn_of_oversized_clusters(config, bilm)
    fitted = BiLMConfig(**{**TINY_BILM.to_dict(), "cutoffs": "auto"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_of_oversized_clusters(fitted, BiLM(fitted, bilm.vocab))
