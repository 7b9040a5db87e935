"""The shipped spaCy configs are complete: spaCy's own `spacy debug config`
(and so `spacy debug data`) accepts each of them as it is."""

import pytest
from spacy.cli.debug_config import debug_config

import scripts.components  # noqa: F401  (the study's textcat_every_doc, which its configs use)

from .conftest import CONFIGS

# minilm.cfg is for `spacy assemble`; textcat_minilm.cfg sources its transformer
# from the pipeline that builds, which a fresh clone does not have.
NEEDS_A_BUILT_PIPELINE = {"minilm.cfg", "textcat_minilm.cfg"}
SPACY_CONFIGS = sorted(
    p.name
    for p in CONFIGS.glob("*.cfg")
    if not p.name.startswith("bilm") and p.name not in NEEDS_A_BUILT_PIPELINE
)


@pytest.mark.parametrize("name", SPACY_CONFIGS)
def test_spacy_debug_config_accepts_each_shipped_config(name, bilm_dir, capsys):
    overrides = {"paths.bilm": str(bilm_dir)} if "elmo" in (CONFIGS / name).read_text() else {}
    try:
        debug_config(CONFIGS / name, overrides=overrides)
    except SystemExit:
        pytest.fail(f"spacy debug config refused {name}:\n{capsys.readouterr().out}")
    assert "Config is valid" in capsys.readouterr().out
