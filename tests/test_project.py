"""The spaCy project: the `smoke` workflow end to end, as `spacy project run smoke`."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


@pytest.mark.slow  # the whole smoke workflow, 6 processes: make test-slow (and make smoke)
def test_smoke_workflow_produces_every_output(tmp_path):
    for name in ("project.yml", "configs", "scripts", "tests/data"):
        source = ROOT / name
        copy = shutil.copytree if source.is_dir() else shutil.copy
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        copy(source, tmp_path / name)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [sys.executable, "-m", "spacy", "project", "run", "smoke", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=tmp_path,
    )
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


def test_shipped_textcat_configs_build_and_differ_only_in_the_mix():
    import spacy

    import scripts  # noqa: F401  (the study's pipe and head, as `python -m scripts train` has them)

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
    assert recipe["optimizer"]["learn_rate"]["num_steps"] == finetune["training"]["max_steps"]
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


def test_the_default_pytest_output_says_why_tests_were_skipped(tmp_path):
    """`make test` (pytest -q) showed `sssssss` and no reason: addopts has -rs."""
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\n\n"
        "@pytest.mark.skip(reason='the AllenNLP fixtures are not here')\n"
        "def test_skipped():\n"
        "    pass\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
         str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SKIPPED [1] test_skips.py:4: the AllenNLP fixtures are not here" in result.stdout


def test_the_studys_help_lists_its_commands():
    from typer.testing import CliRunner

    from scripts.commands import app

    from .conftest import command_names

    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert sorted(command_names(result.output)) == [
        "compare",
        "compare-tokens",
        "contexts",
        "corpus",
        "evaluate",
        "evaluate-tokens",
        "ner-corpus",
        "tag-corpus",
        "tfidf",
        "train",
        "vectors",
    ]


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
