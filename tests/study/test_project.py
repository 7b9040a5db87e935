"""The spaCy project: the `smoke` workflow end to end, as `spacy project run smoke`;
project.yml's commands and variables."""

import json
import os
import sys
from pathlib import Path

import pytest

from ..conftest import ROOT
from .conftest import run_workflow


@pytest.mark.slow  # the whole smoke workflow, 6 processes: make test-slow (and make smoke)
def test_smoke_workflow_produces_every_output(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = run_workflow(tmp_path, "smoke", env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for output in (
        "corpus/smoke/train.spacy",
        "corpus/smoke/dev.spacy",
        "corpus/smoke/pretrain.txt",
        "training/smoke/bilm/model-best/weights.safetensors",
        "training/smoke/bilm/perplexity.png",
        "training/smoke/textcat/model-best/meta.json",
        "training/smoke/textcat/train_time.json",
        "metrics/smoke/textcat_dev_confusion.png",
        "metrics/smoke/textcat_layers.png",
        "metrics/smoke/comparison.md",
    ):
        assert (tmp_path / output).is_file(), output
    log = json.loads((tmp_path / "training/smoke/bilm/pretrain_log.json").read_text())
    assert all(e["dev_perplexity"]["mean"] > 1 for e in log["epochs"])
    assert log["bilm"]["encoder"] == "word" and log["words_from_init_vectors"] > 100
    metrics = json.loads((tmp_path / "metrics/smoke/textcat.json").read_text())
    dev = metrics["splits"]["dev"]
    assert dev["n_docs"] == 24 and 0.0 <= dev["accuracy"] <= 1.0
    assert sum(map(sum, dev["confusion_matrix"])) == 24
    assert abs(sum(metrics["mix"]["layer_weights"]) - 1.0) < 1e-5
    assert dev["inference"]["words_per_second"] > 0
    table = (tmp_path / "metrics/smoke/comparison.md").read_text()
    assert "120-row subset" in table and "| smoke |" in table
    # The textcat learned its training docs (chance is 25%).
    import spacy
    from spacy.tokens import DocBin

    nlp = spacy.load(tmp_path / "training/smoke/textcat/model-best")
    gold = list(DocBin().from_disk(tmp_path / "corpus/smoke/train.spacy").get_docs(nlp.vocab))
    predicted = nlp.pipe(doc.text for doc in gold)
    right = [
        max(p.cats, key=p.cats.get) == max(g.cats, key=g.cats.get) for p, g in zip(predicted, gold)
    ]
    assert sum(right) / len(right) > 0.8


def test_every_project_command_names_only_options_its_command_takes():
    """A renamed option breaks a workflow only when its step runs (`--doc`
    broke `compare`, the last step of `make all`, 52 minutes in): every
    `elmo-spacy` and `python -m scripts` line of project.yml, its variables
    filled in, names only options of its command (dotted ones are config
    overrides)."""
    import re
    import shlex

    import srsly
    import typer

    from elmo_spacy.cli import app as plugin_app
    from scripts.commands import app as study_app

    clis = {
        ("elmo-spacy",): typer.main.get_command(plugin_app),
        ("python", "-m", "scripts"): typer.main.get_command(study_app),
    }
    project = srsly.read_yaml(ROOT / "project.yml")
    variables = project["vars"]
    checked = 0
    for step in project["commands"]:
        for line in step.get("script", []):
            line = re.sub(r"\$\{vars\.(\w+)\}", lambda m: str(variables[m.group(1)]), line)
            words = shlex.split(line)
            for prefix, group in clis.items():
                if tuple(words[: len(prefix)]) != prefix:
                    continue
                name, args = words[len(prefix)], words[len(prefix) + 1 :]
                command = group.commands[name]
                known = {
                    opt for param in command.params for opt in param.opts + param.secondary_opts
                }
                options = [a.split("=")[0] for a in args if a.startswith("--") and "." not in a]
                unknown = [option for option in options if option not in known]
                assert not unknown, f"project.yml, {step['name']}: {name} takes no {unknown}"
                checked += 1
    assert checked >= 20


def test_every_project_variable_can_be_set_from_the_command_line():
    """`spacy project run ... --vars.NAME VALUE` gives each variable its
    value back (a value that holds `--` is read as options: it cannot be)."""
    import srsly
    from weasel.util import parse_config_overrides

    variables = srsly.read_yaml(ROOT / "project.yml")["vars"]
    for name, value in variables.items():
        parsed = parse_config_overrides([f"--vars.{name}", str(value)])
        assert parsed == {f"vars.{name}": value}, name


def test_the_workflow_limits_pretraining_to_its_hours():
    """`all` passes `bilm_hours` to pretraining as its time budget (the
    workflow's hour where the CPU multiplies in float32 only), a limit
    that `--vars.bilm_hours 0` lifts."""
    import shlex

    import srsly

    project = srsly.read_yaml(ROOT / "project.yml")
    assert project["vars"]["bilm_hours"] > 0
    (step,) = [step for step in project["commands"] if step["name"] == "pretrain"]
    assert "pretrain" in project["workflows"]["all"]
    (line,) = step["script"]
    words = shlex.split(line)
    assert words[words.index("--training.max_hours") + 1] == "${vars.bilm_hours}"
