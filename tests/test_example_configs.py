"""The configs the docs call complete examples run with the plugin alone: no
`--code`, nothing of the study's (`scripts/`) registered."""

import sys

import pytest

from .conftest import CONFIGS, run

EXAMPLES = ["textcat_elmo.cfg", "ner_elmo.cfg", "tag_elmo.cfg"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_docs_name_each_example(name):
    from .conftest import ROOT

    assert f"configs/{name}" in (ROOT / "docs" / "pipes.md").read_text(encoding="utf-8")


def test_the_examples_build_and_the_textcat_one_trains_in_a_process_without_the_study(
    bilm_dir, corpus_dir, tmp_path
):
    code = (
        "import sys, spacy\n"
        "from spacy.cli.train import train\n"
        "configs, train_path, dev_path, bilm, output = sys.argv[1:4], *sys.argv[4:]\n"
        "for path in configs:\n"
        "    config = spacy.util.load_config(path)\n"
        "    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)\n"
        "    print(path, nlp.pipe_names)\n"
        "overrides = {'paths.train': train_path, 'paths.dev': dev_path, 'paths.bilm': bilm,\n"
        "             'training.max_steps': 2, 'training.eval_frequency': 1}\n"
        "train(configs[0], output, overrides=overrides)\n"
        "assert not any(name.startswith('scripts') for name in sys.modules)\n"
    )
    paths = [str(CONFIGS / name) for name in EXAMPLES]
    data = [corpus_dir / "train.spacy", corpus_dir / "dev.spacy", bilm_dir, tmp_path / "out"]
    result = run(sys.executable, "-c", code, *paths, *map(str, data))
    assert result.returncode == 0, result.stderr[-3000:]
    assert all(f"{path} ['elmo', " in result.stdout for path in paths)
    assert (tmp_path / "out" / "model-last" / "textcat").is_dir()
