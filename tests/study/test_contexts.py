"""The contextual-vs-static demonstration: one word in two contexts."""

import pytest
import spacy

from scripts.contexts import compare_senses

from .conftest import run

SENSES = [("bank", "The bank raised its rates.", "They sat on the bank of the river.")]


@pytest.fixture(scope="module")
def nlp(bilm_dir):
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo").initialize(lambda: [], bilm_path=str(bilm_dir))
    return nlp


def test_layer_0_is_static_and_the_top_layer_is_not(nlp):
    reference = list(nlp.pipe(["The bank said rates rose.", "Shares of the river company fell."]))
    ((_, static_a, static_b),) = compare_senses(nlp, reference, layer=0, senses=SENSES)
    ((_, top_a, top_b),) = compare_senses(nlp, reference, layer=2, senses=SENSES)
    assert static_a.similarity_to_other == pytest.approx(1.0)
    assert static_a.neighbours == static_b.neighbours
    assert static_a.neighbours[0] == (pytest.approx(1.0), "The [bank] said rates")
    # The tiny test biLM's top layer varies little, but it does vary with context.
    assert top_a.similarity_to_other < 1 - 1e-5
    assert top_a.neighbours != top_b.neighbours
    assert [s for s, _ in top_a.neighbours] == sorted(
        (s for s, _ in top_a.neighbours), reverse=True
    )


def test_contexts_command_prints_both_layers(tmp_path, nlp, corpus_dir):
    nlp.to_disk(tmp_path / "pipeline")
    result = run("scripts", "contexts", str(tmp_path / "pipeline"), str(corpus_dir / "dev.spacy"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert (
        "## ELMo layer 2 (contextual)" in result.stdout and "## layer 0 (static)" in result.stdout
    )
    assert "'bank': cosine between the two contexts = 1.000" in result.stdout
