"""Model and checkpoint files never unpickle: planted malicious pickles are refused."""

import pickle

import pytest
import spacy

from elmo_spacy.bilm.formats.directory import BiLMLoadError
from elmo_spacy.pretrain import PretrainConfig, pretrain
from elmo_spacy.pretrain.checkpoint import STATE_FILE
from elmo_spacy.pretrain.run_folder import RunFolder

from .conftest import TINY_BILM, corpus_of, examples, make_nlp, tokenize


class Exploit:
    """Unpickling this runs `touch <marker>`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def plant(path, marker):
    path.write_bytes(pickle.dumps(Exploit(marker)))


@pytest.fixture(scope="module")
def saved_pipeline(tmp_path_factory, bilm_dir, corpus_dir):
    nlp = make_nlp(bilm_dir)
    nlp.initialize(lambda: examples(nlp, corpus_dir / "train.spacy"))
    path = tmp_path_factory.mktemp("pipeline")
    nlp.to_disk(path)
    return path


@pytest.mark.parametrize("victim", ["elmo/bilm/weights.safetensors", "textcat/model"])
def test_a_pickle_in_a_pipeline_directory_is_refused(tmp_path, saved_pipeline, victim):
    import shutil

    pipeline = shutil.copytree(saved_pipeline, tmp_path / "pipeline")
    marker = tmp_path / "pwned"
    plant(pipeline / victim, marker)
    with pytest.raises((BiLMLoadError, ValueError)) as error:
        spacy.load(pipeline)
    assert not marker.exists(), "unpickling ran code"
    if victim.startswith("elmo"):
        assert "truncated or corrupt" in str(error.value)


def test_a_pickle_in_a_checkpoint_is_refused(tmp_path):
    docs = tokenize(["the cat sat on the mat", "a dog ran in the park"] * 5)
    pretrain(
        corpus_of(docs), TINY_BILM, PretrainConfig(max_epochs=1), tmp_path, show_progress=False
    )
    checkpoint = RunFolder(tmp_path).latest_checkpoint()
    marker = tmp_path / "pwned"
    for victim in (STATE_FILE, "weights.safetensors"):
        original = (checkpoint / victim).read_bytes()
        plant(checkpoint / victim, marker)
        with pytest.raises(BiLMLoadError, match="not a readable safetensors file"):
            pretrain(
                corpus_of(docs),
                TINY_BILM,
                PretrainConfig(max_epochs=2),
                tmp_path,
                show_progress=False,
                resume=True,
            )
        assert not marker.exists(), "unpickling ran code"
        (checkpoint / victim).write_bytes(original)


def test_the_planted_pickle_really_runs_code_when_unpickled(tmp_path):
    marker = tmp_path / "pwned"
    plant(tmp_path / "payload", marker)
    pickle.loads((tmp_path / "payload").read_bytes())  # what a pickle-based loader would do
    assert marker.exists()
