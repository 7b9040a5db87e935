"""The study's textcat configs (configs/textcat_*.cfg, whose pipe and head
are the study's, scripts/components.py): what sets them apart from each other,
spaCy's `debug config` on each, and training them with a biLM of any width,
and on a CUDA GPU, as tests/test_configs.py, tests/test_any_width.py and
tests/test_gpu.py do the plugin's own configs."""

import pytest

import scripts  # noqa: F401  (the study's pipe and head, as `python -m scripts train` has them)

from .. import test_any_width, test_gpu
from ..conftest import ROOT
from ..test_configs import SPACY_CONFIGS, check_spacy_debug_config, names_the_study

# Trained with spaCy's textcat pipe in place of the study's (the listener is the point).
STUDY_LISTENING_CONFIGS = ["textcat_scalar", "textcat_frozen", "textcat_function"]
SPACY_TEXTCAT = {"components.textcat.factory": "textcat"}
any_bilm = test_any_width.any_bilm  # a fixture: biLMs of three widths
token_corpus = test_any_width.token_corpus  # a fixture: a few sentences, one of two topics each
spacy_on_gpu = test_gpu.spacy_on_gpu  # a fixture: spaCy and thinc on GPU 0
no_tf32 = test_gpu.no_tf32  # the fixture spacy_on_gpu asks for


def test_shipped_textcat_configs_build_and_differ_only_in_the_mix():
    import spacy

    configs = {}
    for path in sorted((ROOT / "configs").glob("textcat_*.cfg")):
        config = spacy.util.load_config(path)
        configs[path.stem] = config
        if any("source" in block for block in config["components"].values()):
            continue  # needs the sourced pipeline: built in test_baselines
        nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
        assert nlp.pipe_names[-1] == "textcat", path
    strategies = [configs[f"textcat_{x}"] for x in ("scalar", "frozen", "function")]
    for config in strategies:
        config["components"]["textcat"]["model"]["tok2vec"].pop("mix")
    assert strategies[0] == strategies[1] == strategies[2]


def test_the_fine_tuning_config_is_the_frozen_one_with_the_recipe():
    """configs/textcat_finetune.cfg against the frozen biLM's config: the
    fine-tuning block, the listener's gradient, the pooling and no bag of
    n-grams, nothing else."""
    import spacy

    frozen, finetune = (
        spacy.util.load_config(ROOT / "configs" / f"textcat_{name}.cfg", interpolate=True)
        for name in ("frozen", "finetune")
    )
    recipe = finetune["components"]["elmo"]["model"].pop("fine_tuning")
    assert recipe["@misc"] == "elmo_spacy.FineTuning.v1"
    assert recipe["optimizer"]["learn_rate"]["num_steps"] == 0  # the run's, however it ends
    assert finetune["initialize"].pop("after_init") == {
        "@callbacks": "elmo_spacy.fine_tuning_steps.v1"  # which works the run's length out
    }
    assert frozen["initialize"].pop("after_init") is None
    heads = [config["components"]["textcat"]["model"] for config in (frozen, finetune)]
    assert [head["tok2vec"].pop("grad_factor") for head in heads] == [0.0, 1.0]
    assert heads[1].pop("pooling") == ["last", "max", "mean"]
    assert heads[1].pop("linear_model") is None
    heads[0].pop("linear_model")
    heads[0].pop("linear_model_dropout")
    assert frozen == finetune


def test_representation_baselines_share_the_elmo_head_and_schedule():
    import spacy

    def head_and_schedule(name):
        config = spacy.util.load_config(ROOT / "configs" / f"textcat_{name}.cfg")
        head = dict(config["components"]["textcat"]["model"])
        head.pop("tok2vec")
        schedule = dict(config["training"])
        schedule.pop("frozen_components")  # MiniLM is a frozen pipe, ELMo a frozen listener input
        schedule.pop("annotating_components")
        schedule.pop("logger", None)  # ELMo's frees its training cache
        return head, schedule

    elmo = head_and_schedule("scalar")
    for name in ("static", "minilm"):
        assert head_and_schedule(name) == elmo, name


@pytest.mark.parametrize("name", [name for name in SPACY_CONFIGS if names_the_study(name)])
def test_spacy_debug_config_accepts_each_study_config(name, bilm_dir, capsys):
    check_spacy_debug_config(name, bilm_dir, capsys)


@pytest.mark.parametrize("name", STUDY_LISTENING_CONFIGS)
def test_the_config_trains_with_a_bilm_of_any_width(name, any_bilm, token_corpus, tmp_path):
    test_any_width.train_with_any_width(name, any_bilm, token_corpus, tmp_path, SPACY_TEXTCAT)


@test_gpu.on_cuda
@pytest.mark.parametrize("name", STUDY_LISTENING_CONFIGS)
@pytest.mark.parametrize("grad_factor", [0.0, 1.0])
def test_spacy_train_on_cuda(spacy_on_gpu, name, grad_factor, bilm_dir, corpus_dir, tmp_path):
    train, dev = corpus_dir / "train.spacy", corpus_dir / "dev.spacy"
    test_gpu.train_on_cuda(name, grad_factor, bilm_dir, train, dev, tmp_path, SPACY_TEXTCAT)
