"""elmo_spacy.allennlp, AllenNLP's ELMo API: the published outputs with the
state carried, every argument's meaning, gradients, the word cache, and
ElmoEmbedder's arrays and HDF5 files."""

import contextlib
import copy
import json
import pickle
import subprocess
import sys
import threading

import h5py
import numpy
import pytest
import torch

from elmo_spacy import Embedder
from elmo_spacy.allennlp import (
    ConfigurationError,
    Elmo,
    ElmoBiLm,
    ElmoEmbedder,
    ScalarMix,
    _ElmoBiLm,
    _ElmoCharacterEncoder,
    batch_to_ids,
    remove_sentence_boundaries,
)
from elmo_spacy.bilm.formats.bilm_tf import write_bilm_tf
from elmo_spacy.errors import ElmoSpacyError

from .kernels import forced_kernel
from .test_elmo_format import FIXTURES, needs_fixtures, reference_batches, tiny_elmo

SENTENCES = [
    ["The", "bank", "raised", "rates", "."],
    ["She", "sat", "on", "the", "bank", "of", "the", "river", "."],
    [],
    ["Hi", "!"],
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny bilm-tf model's options.json and weights.hdf5 (random weights,
    large enough to reach the clips)."""
    return write_bilm_tf(tiny_elmo(scale=3.0), tmp_path_factory.mktemp("tiny") / "model")


def fixture_pair():
    return FIXTURES / "options.json", FIXTURES / "lm_weights.hdf5"


# -- batch_to_ids ------------------------------------------------------------------


def test_batch_to_ids_gives_allennlp_ids():
    ids = batch_to_ids([["a", "<S>", "</S>"], ["é" * 30], []])
    assert ids.shape == (3, 3, 50) and ids.dtype == torch.int64
    padding = [261] * 47
    assert ids[0, 0].tolist() == [259, 98, 260] + padding  # b"a" = 97, marks, each + 1
    assert ids[0, 1].tolist() == [259, 257, 260] + padding  # <S>: the sentence mark
    assert ids[0, 2].tolist() == [259, 258, 260] + padding
    # 60 bytes cut to 48, with the marks 50 ids
    assert ids[1, 0].tolist() == [259] + [b + 1 for b in ("é" * 30).encode()[:48]] + [260]
    assert ids[1, 1:].eq(0).all() and ids[2].eq(0).all()  # padding tokens are all 0
    assert batch_to_ids([["x\ud800y"]])[0, 0, :4].tolist() == [
        259,
        121,
        122,
        260,
    ]  # invalid dropped


def test_batch_to_ids_refuses_a_string():
    with pytest.raises(ConfigurationError, match="list of tokens"):
        batch_to_ids(["a sentence"])


# -- the published outputs ---------------------------------------------------------


@needs_fixtures
@pytest.mark.parametrize("given", ["ids", "tokens"])
def test_bilm_reproduces_the_published_outputs_with_the_state_carried(given):
    expected = [h5py.File(FIXTURES / f"lm_embeddings_{k}.hdf5", "r") for k in (0, 1)]
    bilm = _ElmoBiLm(*fixture_pair())
    for i, batch in enumerate(reference_batches()):
        output = bilm(batch_to_ids(batch) if given == "ids" else batch)
        assert len(output["activations"]) == 3 and output["mask"].dtype == torch.bool
        top, _ = remove_sentence_boundaries(output["activations"][2], output["mask"])
        for k in (0, 1):
            reference = expected[k][str(i)][...]  # (2, T, 16): forward, backward
            ours = top[k, : len(batch[k])].detach().numpy()
            numpy.testing.assert_allclose(ours[:, :16], reference[0], atol=1e-6)
            numpy.testing.assert_allclose(ours[:, 16:], reference[1], atol=1e-6)


@needs_fixtures
def test_elmo_reproduces_the_published_top_layer():
    expected = h5py.File(FIXTURES / "lm_embeddings_0.hdf5", "r")
    top_only = [-1e4, -1e4, 0.0]  # fixed weights: the top layer alone
    elmo = Elmo(*fixture_pair(), 1, dropout=0.0, scalar_mix_parameters=top_only)
    for i, batch in enumerate(reference_batches()):
        output = elmo(batch_to_ids(batch))
        ours = output["elmo_representations"][0][0, : len(batch[0])].detach().numpy()
        assert output["mask"][0].sum() == len(batch[0])
        reference = numpy.concatenate(expected[str(i)][...], axis=-1)
        numpy.testing.assert_allclose(ours, reference, atol=1e-6)


# -- the biLM module ---------------------------------------------------------------


def test_bilm_activations_mask_and_sizes(pair):
    bilm = ElmoBiLm(*pair)
    output = bilm(batch_to_ids(SENTENCES))
    mask = output["mask"]
    assert bilm.num_layers == 3 and bilm.get_output_dim() == 16
    assert mask.tolist()[2] == [True, True] + [False] * 9  # an empty sentence: <S> </S>
    assert mask.sum(1).tolist() == [len(s) + 2 for s in SENTENCES]
    for layer in output["activations"]:
        assert layer.shape == (4, 11, 16)
        assert layer[~mask].abs().max() == 0  # zero where the mask is False
        assert layer[mask].abs().min() > 0
    encoded = output["activations"][0]
    assert torch.equal(encoded[..., :8], encoded[..., 8:])  # layer 0 is [x; x]
    encoder = _ElmoCharacterEncoder(*pair)(batch_to_ids(SENTENCES))
    assert encoder["token_embedding"].shape == (4, 11, 8)
    assert torch.equal(encoder["mask"], mask)
    torch.testing.assert_close(encoder["token_embedding"], encoded[..., :8])


def test_bilm_state_is_carried_by_row_and_reset(pair):
    """Row b starts from the state the previous batch left in row b; a
    smaller batch leaves the rows beyond it as they were."""
    first, second, third = SENTENCES[:3], SENTENCES[3:], SENTENCES[:3]
    carried = ElmoBiLm(*pair)
    carried(first)
    carried(second)
    after = carried(third)["activations"]
    reference = tiny_bilm_of(pair)
    _, states = reference.forward_with_states(reference.batch(first))
    _, short = reference.forward_with_states(reference.batch(second), _rows(states, 1))
    states = {d: [(torch.cat([s[0], t[0][1:]]), torch.cat([s[1], t[1][1:]])) for s, t in
                  zip(short[d], states[d])] for d in states}  # fmt: skip
    expected = reference(reference.batch(third), states, boundaries=True)
    torch.testing.assert_close(torch.stack(after), expected)
    carried.reset_states()
    carried._elmo_lstm.reset_states()  # AllenNLP's path to it
    fresh = ElmoBiLm(*pair)
    torch.testing.assert_close(torch.stack(carried(first)["activations"]),
                               torch.stack(fresh(first)["activations"]))  # fmt: skip


def tiny_bilm_of(pair):
    from elmo_spacy.bilm import load_bilm

    return load_bilm(pair)


def _rows(states, n):
    return {d: [(h[:n], c[:n]) for h, c in layers] for d, layers in states.items()}


@pytest.mark.parametrize("state", ["zero", "primed"])
def test_zero_and_primed_states_give_embedders_vectors(pair, state):
    elmo_bilm = ElmoBiLm(*pair, state=state)
    elmo_bilm(SENTENCES[1:])  # what ran before does not matter
    output = elmo_bilm(SENTENCES)
    embedder = Embedder(pair, state=state)
    for b, vectors in enumerate(embedder.embed(SENTENCES)):
        ours = torch.stack(output["activations"])[:, b, 1 : len(SENTENCES[b]) + 1]
        numpy.testing.assert_allclose(ours.detach().numpy(), vectors, atol=1e-6)


def test_state_must_be_known(pair):
    with pytest.raises(ConfigurationError, match="carried, zero, primed"):
        ElmoBiLm(*pair, state="kept")


def test_character_ids_and_tokens_agree_and_bad_ids_are_refused(pair):
    by_ids = ElmoBiLm(*pair, state="zero")(batch_to_ids(SENTENCES))
    by_tokens = ElmoBiLm(*pair, state="zero")(SENTENCES)
    for a, b in zip(by_ids["activations"], by_tokens["activations"]):
        torch.testing.assert_close(a, b)
    holes = batch_to_ids([["a", "b"]])
    holes[0, 0] = 0
    with pytest.raises(ConfigurationError, match="padding token"):
        ElmoBiLm(*pair)(holes)
    with pytest.raises(ConfigurationError, match="batch, tokens, 50"):
        ElmoBiLm(*pair)(batch_to_ids([["a"]])[0])


def test_a_plain_biLM_names_the_way_in_for_character_ids(pair):
    with pytest.raises(ElmoSpacyError, match="elmo_spacy.allennlp.Elmo"):
        tiny_bilm_of(pair)(batch_to_ids([["a"]]))


def test_the_biLM_folder_and_a_BiLM_run_as_the_pair(pair, tmp_path):
    from elmo_spacy.bilm import save_bilm

    bilm = tiny_bilm_of(pair)
    save_bilm(bilm, tmp_path / "folder")
    expected = ElmoBiLm(*pair)(SENTENCES)["activations"]
    for model in (tmp_path / "folder", bilm):
        got = ElmoBiLm(model)(batch_to_ids(SENTENCES))["activations"]
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b)
    with pytest.raises(ConfigurationError, match="URL"):
        ElmoBiLm("https://example.org/options.json", "weights.hdf5")


def test_a_biLM_of_its_own_character_scheme_takes_ids_and_tokens(bilm_dir):
    """A biLM of this package's masked ids reads tokens: batch_to_ids' ids are
    decoded back to them."""
    sentences = [s for s in SENTENCES if s] + [["<S>", "x"]]
    by_ids = ElmoBiLm(bilm_dir, state="zero")(batch_to_ids(sentences))
    vectors = Embedder(bilm_dir).embed(sentences)
    for b, expected in enumerate(vectors):
        ours = torch.stack(by_ids["activations"])[:, b, 1 : len(sentences[b]) + 1]
        numpy.testing.assert_allclose(ours.detach().numpy(), expected, atol=1e-6)
    odd = batch_to_ids([["a"]])
    odd[0, 0, 5] = 7  # an id after the end-of-word mark: no token's
    with pytest.raises(ConfigurationError, match="token lists themselves"):
        ElmoBiLm(bilm_dir)(odd)


# -- gradients ---------------------------------------------------------------------


def test_requires_grad_false_trains_the_mixes_only(pair):
    elmo = Elmo(*pair, 2, dropout=0.0)
    for name, parameter in elmo.named_parameters():
        assert parameter.requires_grad == ("scalar_mix" in name), name
    output = elmo(batch_to_ids(SENTENCES))
    sum(r.sum() for r in output["elmo_representations"]).backward()
    assert all(
        p.grad is not None and p.grad.abs().sum() > 0 for p in elmo.scalar_mix_0.parameters()
    )
    assert all(p.grad is None for p in elmo._elmo_lstm.parameters())


def test_requires_grad_true_trains_every_weight_and_no_constant(pair):
    elmo = Elmo(*pair, 1, requires_grad=True, dropout=0.0, state="zero")
    names = dict(elmo.named_parameters())
    assert all(p.requires_grad for p in names.values())
    assert not [n for n in names if "bias_hh" in n]  # bilm-tf's forget bias is a constant
    elmo.requires_grad_(True)  # how a user unfreezes a module: the constant stays one
    assert not [n for n, _ in elmo.named_parameters() if "bias_hh" in n]
    ids = batch_to_ids(SENTENCES)
    before = elmo(ids)["elmo_representations"][0].detach()
    elmo(ids)["elmo_representations"][0].pow(2).sum().backward()
    for name, parameter in elmo.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
    torch.optim.SGD(elmo.parameters(), lr=0.1).step()
    elmo.zero_grad()
    assert not torch.allclose(elmo(ids)["elmo_representations"][0], before)


@pytest.mark.parametrize("state", ["carried", "primed"])
def test_fine_tuning_with_a_state_coming_in(pair, state):
    elmo = Elmo(*pair, 1, requires_grad=True, dropout=0.0, state=state)
    with torch.inference_mode():  # a dev pass in inference mode leaves a carried state
        elmo(SENTENCES)
    elmo(SENTENCES)["elmo_representations"][0].sum().backward()
    assert elmo._elmo_lstm.bilm.forward_lstm.layers[0].weight_hh_l0.grad.abs().sum() > 0


# -- the mixes ---------------------------------------------------------------------


def test_scalar_mix_is_allennlps():
    torch.manual_seed(0)
    tensors = [torch.randn(2, 4, 3) for _ in range(3)]
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    mix = ScalarMix(3, do_layer_norm=False, initial_scalar_parameters=[0.1, 0.2, 0.3])
    mix.gamma.data[0] = 0.5
    weights = numpy.exp([0.1, 0.2, 0.3]) / numpy.exp([0.1, 0.2, 0.3]).sum()
    expected = 0.5 * sum(w * t.numpy() for w, t in zip(weights, tensors))
    numpy.testing.assert_allclose(mix(tensors).detach().numpy(), expected, rtol=1e-6)
    normed = ScalarMix(3, do_layer_norm=True, initial_scalar_parameters=[0.1, 0.2, 0.3])
    expected = 0
    for w, t in zip(weights, tensors):
        real = t.numpy()[mask.numpy()]  # the mean and variance of the batch's real positions
        expected = expected + w * (t.numpy() - real.mean()) / numpy.sqrt(real.var() + 1e-13)
    numpy.testing.assert_allclose(normed(tensors, mask).detach().numpy(), expected, rtol=1e-5)
    assert len(normed.scalar_parameters) == 3 and normed.gamma.shape == (1,)


def test_scalar_mix_checks_and_fixed_weights():
    with pytest.raises(ConfigurationError, match="one per layer"):
        ScalarMix(3, initial_scalar_parameters=[0.0, 1.0])
    with pytest.raises(ConfigurationError, match="one per layer"):
        ScalarMix(3)([torch.zeros(1, 1, 1)] * 2)
    fixed = ScalarMix(2, initial_scalar_parameters=[1.0, 2.0], trainable=False)
    assert not any(p.requires_grad for p in fixed.parameters())


def test_elmo_mixes_layers_dropout_and_boundaries(pair):
    ids = batch_to_ids(SENTENCES)
    layers = torch.stack(ElmoBiLm(*pair)(ids)["activations"])
    elmo = Elmo(*pair, 2, dropout=0.5, do_layer_norm=False)
    elmo.eval()  # dropout off
    output = elmo(ids)
    assert len(output["elmo_representations"]) == 2 and output["mask"].shape == (4, 9)
    mixed = layers.mean(0)  # equal weights, gamma 1
    expected, mask = remove_sentence_boundaries(mixed, ElmoBiLm(*pair)(ids)["mask"])
    for representation in output["elmo_representations"]:
        torch.testing.assert_close(representation, expected)
    assert torch.equal(output["mask"], mask)
    elmo.train()
    dropped = Elmo(*pair, 1, dropout=0.5)(ids)["elmo_representations"][0]
    real = expected[mask]
    share = (dropped[mask] == 0).float().mean()
    assert 0.3 < share < 0.7  # about half the values dropped, the rest scaled by 2
    kept = dropped[mask] != 0
    torch.testing.assert_close(dropped[mask][kept], 2 * real[kept])
    kept_boundaries = Elmo(*pair, 1, dropout=0.0, keep_sentence_boundaries=True)(ids)
    assert kept_boundaries["elmo_representations"][0].shape == (4, 11, 16)
    assert kept_boundaries["mask"].shape == (4, 11)


def test_elmo_takes_more_leading_dimensions(pair):
    """AllenNLP's 4-D test: (2, 3, T, 50) equals each (2, T, 50) slice alone."""
    sentences = [[["The", "sentence", "."], ["ELMo", "helps", "disambiguate", "ELMo", "."]],
                 [["1", "2"], ["1", "2", "3", "4", "5", "6", "7"]],
                 [["1", "2", "3", "4", "50", "60", "70"], ["The"]]]  # fmt: skip
    elmo = Elmo(*pair, 2, dropout=0.0)
    ids = [batch_to_ids(batch) for batch in sentences]
    steps = max(i.shape[1] for i in ids)
    ids = [torch.nn.functional.pad(i, (0, 0, 0, steps - i.shape[1])) for i in ids]
    four = elmo(torch.stack(ids, dim=1))
    assert four["mask"].shape == (2, 3, steps)
    for k in range(3):
        elmo._elmo_lstm._elmo_lstm.reset_states()
        three = elmo(ids[k])
        torch.testing.assert_close(
            four["elmo_representations"][0][:, k], three["elmo_representations"][0]
        )


def test_elmo_with_a_module_given():
    with pytest.raises(ConfigurationError, match="with module"):
        Elmo("options.json", None, 1, module=object())


def test_elmo_is_copied_and_pickled(pair):
    elmo = Elmo(*pair, 1, dropout=0.0, state="zero")
    ids = batch_to_ids(SENTENCES)
    expected = elmo(ids)["elmo_representations"][0]
    for twin in (copy.deepcopy(elmo), pickle.loads(pickle.dumps(elmo))):
        torch.testing.assert_close(twin(ids)["elmo_representations"][0], expected)


# -- the word cache ----------------------------------------------------------------


def test_vocab_to_cache_gives_the_char_cnns_numbers_and_falls_back(pair):
    vocab = ["@@PADDING@@", "@@UNKNOWN@@", "The", "bank", "raised", "rates", "."]
    sentences = [["The", "bank", "raised", "rates", "."], ["rates", "."]]
    word_ids = torch.tensor([[2, 3, 4, 5, 6], [5, 6, 0, 0, 0]])
    ids = batch_to_ids(sentences)
    uncached = ElmoBiLm(*pair)(ids)
    cached_bilm = ElmoBiLm(*pair, vocab_to_cache=vocab)
    cached = cached_bilm(ids, word_ids)
    assert torch.equal(cached["mask"], uncached["mask"])
    for a, b in zip(cached["activations"], uncached["activations"]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)  # the char CNN in another batch
    # ids outside the list: the char CNN runs, as AllenNLP's does
    fallback = ElmoBiLm(*pair, vocab_to_cache=vocab[:3])(ids, word_ids)
    for a, b in zip(fallback["activations"], uncached["activations"]):
        torch.testing.assert_close(a, b)
    # more leading dimensions, through Elmo
    elmo = Elmo(*pair, 1, dropout=0.0, vocab_to_cache=vocab, state="zero")
    single = elmo(ids, word_ids)["elmo_representations"][0]
    expanded = elmo(torch.stack([ids] * 3, 1), torch.stack([word_ids] * 3, 1))
    for k in range(3):
        torch.testing.assert_close(expanded["elmo_representations"][0][:, k], single)


def test_cached_embeddings_train_with_requires_grad(pair):
    vocab = ["@@PADDING@@", "@@UNKNOWN@@", "rates", "."]
    elmo = Elmo(*pair, 1, requires_grad=True, dropout=0.0, vocab_to_cache=vocab)
    table = elmo._elmo_lstm._word_embedding.weight
    assert table.requires_grad
    elmo(batch_to_ids([["rates", "."]]), torch.tensor([[2, 3]]))["elmo_representations"][
        0
    ].sum().backward()
    assert table.grad[2:].abs().sum() > 0
    frozen = Elmo(*pair, 1, vocab_to_cache=vocab)._elmo_lstm._word_embedding.weight
    assert not frozen.requires_grad


# -- ElmoEmbedder ------------------------------------------------------------------


def test_embedder_arrays(pair):
    embedder = ElmoEmbedder(*pair, state="zero")
    vectors = embedder.embed_batch(SENTENCES)
    assert [v.shape for v in vectors] == [(3, len(s), 16) for s in SENTENCES]
    assert all(v.dtype == numpy.float32 for v in vectors)
    numpy.testing.assert_allclose(embedder.embed_sentence(SENTENCES[1]), vectors[1], atol=1e-6)
    streamed = list(embedder.embed_sentences(iter(SENTENCES), batch_size=3))
    for a, b in zip(streamed, vectors):
        numpy.testing.assert_allclose(a, b, atol=1e-6)
    layers, mask = embedder.batch_to_embeddings(SENTENCES)
    assert layers.shape == (4, 3, 9, 16) and mask.sum(1).tolist() == [5, 9, 0, 2]
    assert embedder.embed_batch([]) == []


def test_embedder_is_stateful_by_default(pair):
    carried = ElmoEmbedder(*pair)
    first = carried.embed_sentence(SENTENCES[0])
    again = carried.embed_sentence(SENTENCES[0])  # starts from the state the first left
    assert not numpy.allclose(first, again)
    assert numpy.allclose(ElmoEmbedder(*pair).embed_sentence(SENTENCES[0]), first)


def test_embedder_threads_get_what_one_thread_gets(pair):
    embedder = ElmoEmbedder(*pair, state="zero")
    expected = [embedder.embed_sentence(s) for s in SENTENCES]
    results = {}

    def run(k):
        for _ in range(5):
            results[k] = [embedder.embed_sentence(s) for s in SENTENCES]

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for got in results.values():
        for a, b in zip(got, expected):
            numpy.testing.assert_array_equal(a, b)


def test_embed_file_writes_allennlps_layout(pair, tmp_path):
    lines = ["The bank raised rates .", "Hi !", "Hi !"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    embedder = ElmoEmbedder(*pair, state="zero")
    expected = [embedder.embed_sentence(line.split()) for line in lines]
    embedder.embed_file(str(tmp_path / "in.txt"), tmp_path / "all.hdf5", batch_size=2)
    with h5py.File(tmp_path / "all.hdf5", "r") as file:
        assert sorted(file) == ["0", "1", "2", "sentence_to_index"]
        index = json.loads(file["sentence_to_index"][0])
        assert index == {"The bank raised rates .": "0", "Hi !": "2"}
        for i, vectors in enumerate(expected):
            numpy.testing.assert_allclose(file[str(i)][...], vectors, atol=1e-6)
    with open(tmp_path / "in.txt") as handle:  # an open file, as AllenNLP took it
        embedder.embed_file(handle, tmp_path / "top.hdf5", "top", forget_sentences=True)
        assert handle.closed
    embedder.embed_file(tmp_path / "in.txt", tmp_path / "average.hdf5", "average")
    with (
        h5py.File(tmp_path / "top.hdf5", "r") as top,
        h5py.File(tmp_path / "average.hdf5", "r") as average,
    ):
        assert "sentence_to_index" not in top
        numpy.testing.assert_allclose(top["1"][...], expected[1][-1], atol=1e-6)
        numpy.testing.assert_allclose(average["0"][...], expected[0].mean(0), atol=1e-6)


def test_embed_file_with_sentence_keys_and_refusals(pair, tmp_path):
    embedder = ElmoEmbedder(*pair, state="zero")
    (tmp_path / "in.txt").write_text("a b\nc\n")
    embedder.embed_file(tmp_path / "in.txt", tmp_path / "keys.hdf5", use_sentence_keys=True)
    with h5py.File(tmp_path / "keys.hdf5", "r") as file:
        assert sorted(file) == ["a b", "c"]
    (tmp_path / "blank.txt").write_text("a b\n\nc\n  \n")
    with pytest.raises(ConfigurationError, match=r"lines 2, 4"):
        embedder.embed_file(tmp_path / "blank.txt", tmp_path / "blank.hdf5")
    (tmp_path / "twice.txt").write_text("a b\na b\n")
    with pytest.raises(ElmoSpacyError, match="same sentence"):
        embedder.embed_file(tmp_path / "twice.txt", tmp_path / "twice.hdf5", use_sentence_keys=True)
    with pytest.raises(ConfigurationError, match="output_format"):
        embedder.embed_file(tmp_path / "in.txt", tmp_path / "x.hdf5", "mean")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "blank.txt",
        "in.txt",
        "keys.hdf5",
        "twice.txt",
    ]


# -- precision and devices ---------------------------------------------------------


def test_bfloat16_where_asked(pair):
    float32 = ElmoBiLm(*pair, state="zero")(SENTENCES)["activations"][2]
    reduced = ElmoBiLm(*pair, state="zero", precision="bfloat16")
    assert reduced.bilm.precision in ("bfloat16", "float32")  # float32 where it cannot pay
    output = reduced(SENTENCES)["activations"][2]
    assert output.dtype == torch.float32
    torch.testing.assert_close(output, float32, atol=0.1, rtol=0.1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_elmo_on_cuda(pair):
    cpu = Elmo(*pair, 1, dropout=0.0, state="zero")
    gpu = Elmo(*pair, 1, dropout=0.0, state="zero").cuda()
    ids = batch_to_ids(SENTENCES)
    output = gpu(ids.cuda())
    torch.testing.assert_close(
        output["elmo_representations"][0].cpu(),
        cpu(ids)["elmo_representations"][0],
        atol=1e-5,
        rtol=1e-4,
    )
    output["elmo_representations"][0].sum().backward()
    embedder = ElmoEmbedder(*pair, cuda_device=0, state="zero")
    numpy.testing.assert_allclose(
        embedder.embed_sentence(SENTENCES[0]),
        ElmoEmbedder(*pair, state="zero").embed_sentence(SENTENCES[0]),
        atol=1e-5,
    )


def test_code_that_imports_allennlp_runs_after_as_allennlp_modules(pair, tmp_path):
    """What Flair's ELMoEmbeddings and bio_embeddings do: import AllenNLP's
    modules by their names, in a process that has no AllenNLP."""
    script = f"""
import elmo_spacy.allennlp
elmo_spacy.allennlp.as_allennlp_modules()
import allennlp.commands.elmo
from allennlp.modules.elmo import Elmo, _ElmoBiLm, batch_to_ids
from allennlp.modules.scalar_mix import ScalarMix
from allennlp.nn.util import remove_sentence_boundaries
embedder = allennlp.commands.elmo.ElmoEmbedder({str(pair[0])!r}, {str(pair[1])!r}, -1)
print(embedder.embed_sentence(["a", "b"]).shape)
print(Elmo({str(pair[0])!r}, {str(pair[1])!r}, 1)(batch_to_ids([["a"]]))["mask"].shape)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["(3, 2, 16)", "torch.Size([1, 1])"]


@needs_fixtures
def test_fine_tuning_with_the_state_carried_runs_the_training_kernel(monkeypatch):
    """requires_grad with AllenNLP's carried state trains on the training
    kernel (states in and out), with the loop's numbers: the published
    outputs, and the same gradients."""
    import elmo_spacy.bilm.runtime.kernels as kernels

    calls = []
    kernel = kernels.lstm_layer_for_training
    monkeypatch.setattr(
        kernels, "lstm_layer_for_training", lambda *a: calls.append(1) or kernel(*a)
    )
    expected = h5py.File(FIXTURES / "lm_embeddings_0.hdf5", "r")
    runs = {}
    for name in ("training", "loop"):
        elmo = Elmo(*fixture_pair(), 1, requires_grad=True, dropout=0.0,
                    scalar_mix_parameters=[-1e4, -1e4, 0.0])  # fmt: skip
        with forced_kernel("loop") if name == "loop" else contextlib.nullcontext():
            for i, batch in enumerate(reference_batches()[:3]):
                output = elmo(batch_to_ids(batch))["elmo_representations"][0]
                reference = numpy.concatenate(expected[str(i)][...], axis=-1)
                ours = output[0, : len(batch[0])].detach().numpy()
                numpy.testing.assert_allclose(ours, reference, atol=1e-6)
        output.pow(2).sum().backward()
        runs[name] = [p.grad for p in elmo._elmo_lstm.bilm.forward_lstm.parameters()]
        if name == "training":
            assert calls, "the training kernel did not run"
    for a, b in zip(runs["training"], runs["loop"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # summed in another order
