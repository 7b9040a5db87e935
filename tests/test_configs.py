"""The shipped spaCy configs are complete: spaCy's own `spacy debug config`
(and so `spacy debug data`) accepts each of them as it is. Here those of the
plugin alone; the ones that name a part of the study's are checked by
tests/study/test_textcat_configs.py."""

import re

import pytest
from spacy.cli.debug_config import debug_config

from .conftest import CONFIGS

# minilm.cfg is for `spacy assemble`; textcat_minilm.cfg sources its transformer
# from the pipeline that builds, which a fresh clone does not have.
NEEDS_A_BUILT_PIPELINE = {"minilm.cfg", "textcat_minilm.cfg"}
SPACY_CONFIGS = sorted(
    p.name
    for p in CONFIGS.glob("*.cfg")
    if not p.name.startswith("bilm") and p.name not in NEEDS_A_BUILT_PIPELINE
)
# A setting whose value the study registers (scripts/components.py): its
# `textcat_every_doc` pipe or a `scripts.` function.
STUDY_PART = re.compile(r'^\s*[@\w.]+\s*=\s*"(scripts\.|textcat_every_doc")', re.M)


def names_the_study(name: str) -> bool:
    """Whether configs/NAME names a part that only the study registers."""
    return STUDY_PART.search((CONFIGS / name).read_text(encoding="utf-8")) is not None


def check_spacy_debug_config(name: str, bilm_dir, capsys) -> None:
    overrides = {"paths.bilm": str(bilm_dir)} if "elmo" in (CONFIGS / name).read_text() else {}
    try:
        debug_config(CONFIGS / name, overrides=overrides)
    except SystemExit:
        pytest.fail(f"spacy debug config refused {name}:\n{capsys.readouterr().out}")
    assert "Config is valid" in capsys.readouterr().out


@pytest.mark.parametrize("name", [name for name in SPACY_CONFIGS if not names_the_study(name)])
def test_spacy_debug_config_accepts_each_shipped_config(name, bilm_dir, capsys):
    check_spacy_debug_config(name, bilm_dir, capsys)
