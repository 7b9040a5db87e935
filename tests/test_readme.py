"""The README's code runs as written: the quick start from nothing (its
commands, then its Python), and the config example."""

import os
import re

import numpy
import spacy
from spacy.training import Example

from .conftest import ROOT, run

README = (ROOT / "README.md").read_text(encoding="utf-8")


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def quick_start() -> str:
    return README.split("## Quick start")[1].split("\n## ")[0]


def test_the_quick_start_runs_from_nothing(tmp_path, monkeypatch):
    commands = re.findall(r"```bash\n(.*?)```", quick_start(), flags=re.S)[0]
    for line in commands.splitlines():
        command = line.split("#")[0].split()
        assert command[0] == "elmo-spacy"
        done = run(*command, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
    code = re.findall(r"```python\n(.*?)```", quick_start(), flags=re.S)[0]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(code, namespace)
    doc = namespace["doc"]
    assert doc._.elmo.shape == (3, len(doc), 64)  # as the README says
    assert numpy.allclose(doc[4].vector, doc._.elmo[:, 4].mean(axis=0), atol=1e-6)
    assert os.path.isfile(tmp_path / "bilm" / "model-best" / "tokenization.json")


def test_the_config_example_trains_a_ner_pipe(bilm_dir):
    block = code_blocks("ini")[0]
    config = spacy.util.load_config_from_str(
        # what the example leaves to spaCy's defaults (`spacy init fill-config`)
        '[nlp]\nlang = "en"\npipeline = ["elmo", "ner"]\n\n[components]\n\n[training]\n\n'
        "[initialize]\n\n[initialize.components]\n\n" + block,
        overrides={"initialize.components.elmo.bilm_path": str(bilm_dir)},
    )
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    doc = nlp.make_doc("Anna Smith flew to Paris on Monday.")
    example = Example.from_dict(doc, {"entities": [(0, 10, "PER"), (19, 24, "LOC")]})
    optimizer = nlp.initialize(lambda: [example])
    losses = [nlp.update([example], sgd=optimizer)["ner"] for _ in range(40)]
    assert losses[-1] < 0.8 * losses[0]  # (the tiny biLM's layers tell tokens apart poorly)
    assert nlp.get_pipe("ner").labels == ("LOC", "PER")
    assert nlp(doc.text)._.elmo.shape[:2] == (3, len(doc))
