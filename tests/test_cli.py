"""Command lines as a user runs them: `elmo-spacy`, `spacy train`, entry points."""

import errno
import json
import re
import sys
import warnings
from pathlib import Path

import numpy
import pytest
import spacy
import torch
from spacy.cli.train import train as spacy_train

from elmo_spacy.bilm import BiLMConfig, load_bilm
from elmo_spacy.layers.scalar_mix import scalar_mix_node

from .conftest import CONFIGS, DATA, TINY_BILM, cli, command_names, run, tokenize


def test_help_lists_the_commands():
    from typer.testing import CliRunner

    from elmo_spacy.cli import app

    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert command_names(result.output) == [
        "convert-elmo",
        "convert-efml",
        "export-elmo",
        "embed",
        "export",
        "prepare",
        "pretrain",
        "init-config",
        "sample-text",
    ]


def test_the_installed_package_holds_the_plugin_and_not_the_study():
    import elmo_spacy

    package = Path(elmo_spacy.__file__).parent
    modules = {p.relative_to(package).as_posix() for p in package.rglob("*.py")}
    assert not {m for m in modules if m.startswith(("data/", "baselines/"))}
    for study in ("evaluate.py", "compare.py", "plots.py", "contexts.py"):
        assert study not in modules
    for path in package.rglob("*.py"):
        assert not re.search(r"^\s*(from|import) scripts\b", path.read_text(), re.M), path


def test_entry_points_work_in_a_fresh_process():
    code = (
        "import sys, spacy\n"
        "assert 'elmo_spacy' not in sys.modules\n"
        "spacy.registry.architectures.get('elmo_spacy.ScalarMix.v1')\n"
        "spacy.registry.architectures.get('elmo_spacy.ElmoTok2Vec.v1')\n"
        "nlp = spacy.blank('en'); nlp.add_pipe('elmo')\n"
        "print(nlp.pipe_names)\n"
    )
    result = run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert "['elmo']" in result.stdout


def test_pretrain_command_writes_a_loadable_bilm(tmp_path, corpus_dir):
    out = tmp_path / "bilm"
    result = run(
        "elmo-spacy",
        "pretrain",
        str(CONFIGS / "bilm_tiny.cfg"),
        str(corpus_dir / "pretrain.txt"),
        str(out),
        "--training.max_epochs",
        "1",
    )
    assert result.returncode == 0, result.stderr
    log = json.loads((out / "pretrain_log.json").read_text())
    assert len(log["epochs"]) == 1
    assert log["epochs"][0]["dev_perplexity"]["mean"] > 1
    assert load_bilm(out / "model-best").config.projection_dim == 32


def test_pretrain_starts_the_word_embeddings_from_static_vectors(tmp_path, corpus_dir):
    from spacy.vectors import Vectors

    from elmo_spacy.pretrain.texts import read_texts

    vectors = tmp_path / "vectors"  # a spaCy pipeline with vectors, as `spacy init vectors` writes
    text = str(corpus_dir / "pretrain.txt")
    words = sorted({token for doc in tokenize(read_texts(text)) for token in doc})
    table = numpy.random.default_rng(0).normal(size=(len(words), 16)).astype("f")
    with_vectors = spacy.blank("en")
    keys = [with_vectors.vocab.strings.add(word) for word in words]
    with_vectors.vocab.vectors = Vectors(data=table, keys=keys)
    with_vectors.to_disk(vectors)
    word_encoder = ["--bilm.encoder", "word", "--bilm.word_dim", "16", "--training.max_epochs", "1"]
    args = ("pretrain", str(CONFIGS / "bilm_tiny.cfg"), text)
    result = cli(*args, str(tmp_path / "bilm"), *word_encoder, "--init-vectors", str(vectors))
    assert result.returncode == 0, result.stderr[-2000:]
    log = json.loads((tmp_path / "bilm" / "pretrain_log.json").read_text())
    assert log["words_from_init_vectors"] > 100
    result = cli(*args, str(tmp_path / "bad"), "--init-vectors", str(vectors))  # char CNN
    assert result.returncode == 1 and "need a word embedding (encoder 'word'" in result.stderr


def test_pretrain_trains_a_bilm_further_on_other_text(tmp_path, bilm_dir):
    text = tmp_path / "domain.txt"  # texts the biLM has not seen
    lines = (DATA / "unlabeled.txt").read_text(encoding="utf-8").splitlines()
    text.write_text("\n".join(line.upper() for line in lines[:60]) + "\n", encoding="utf-8")
    args = ("pretrain", str(CONFIGS / "bilm_tiny.cfg"), str(text))
    further = ("--init-bilm", str(bilm_dir), "--training.max_epochs", "2")
    result = cli(*args, str(tmp_path / "adapted"), *further, "--training.learning_rate", "0.01")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "dev perplexity before training" in result.stdout
    log = json.loads((tmp_path / "adapted" / "pretrain_log.json").read_text())
    assert BiLMConfig.from_dict(log["bilm"]) == load_bilm(bilm_dir).config
    assert log["epochs"][-1]["dev_perplexity"]["mean"] < log["init_dev_perplexity"]["mean"]
    assert load_bilm(tmp_path / "adapted" / "model-best").vocab == load_bilm(bilm_dir).vocab
    result = cli(*args, str(tmp_path / "wider"), *further, "--bilm.lstm_dim", "64")
    assert result.returncode == 1 and "--bilm.lstm_dim: a biLM trained further" in result.stderr
    result = cli(*args, str(tmp_path / "both"), *further, "--init-vectors", str(bilm_dir))
    assert result.returncode == 1 and "not both" in result.stderr
    assert not (tmp_path / "wider").exists() and not (tmp_path / "both").exists()


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory, corpus_dir, bilm_dir):
    out = tmp_path_factory.mktemp("textcat")
    result = run(
        sys.executable,
        "-m",
        "spacy",
        "train",
        str(CONFIGS / "textcat_tiny.cfg"),
        "--output",
        str(out),
        "--paths.train",
        str(corpus_dir / "train.spacy"),
        "--paths.dev",
        str(corpus_dir / "dev.spacy"),
        "--paths.bilm",
        str(bilm_dir),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out / "model-best"


def test_spacy_train_end_to_end(trained_dir):
    nlp = spacy.load(trained_dir)
    assert nlp.pipe_names == ["elmo", "textcat"]
    doc = nlp("Stocks rallied after the central bank cut rates.")
    assert doc._.elmo.shape == (3, len(doc), TINY_BILM.width)
    assert sum(doc.cats.values()) == pytest.approx(1.0, abs=1e-5)
    assert set(doc.cats) == {"World", "Sports", "Business", "Sci/Tech"}


def test_spacy_package_builds_a_loadable_package(tmp_path, trained_dir):
    result = run(
        sys.executable,
        "-m",
        "spacy",
        "package",
        str(trained_dir),
        str(tmp_path),
        "--name",
        "elmo_agnews",
        "--version",
        "0.0.1",
        "--build",
        "none",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data_dir = tmp_path / "en_elmo_agnews-0.0.1" / "en_elmo_agnews" / "en_elmo_agnews-0.0.1"
    packaged, original = spacy.load(data_dir), spacy.load(trained_dir)
    text = "The bank of the river flooded."
    assert numpy.array_equal(packaged(text)._.elmo, original(text)._.elmo)
    assert packaged(text).cats == original(text).cats


def test_frozen_annotating_elmo_is_read_from_docs_and_never_changes(tmp_path, corpus_dir, bilm_dir):
    """The spaCy way to freeze a sourced pipe: frozen_components + annotating_components."""
    base = spacy.blank("en")
    base.add_pipe("elmo").initialize(lambda: [], bilm_path=bilm_dir)
    base.to_disk(tmp_path / "base")
    config = spacy.util.load_config(CONFIGS / "textcat_tiny.cfg")
    config["components"]["elmo"] = {"source": str(tmp_path / "base")}
    config["components"]["textcat"]["model"]["tok2vec"]["grad_factor"] = 1.0
    config["training"]["frozen_components"] = ["elmo"]
    config["training"]["annotating_components"] = ["elmo"]
    config["initialize"]["components"] = {}
    config.to_disk(tmp_path / "frozen.cfg")
    overrides = {
        "paths.train": str(corpus_dir / "train.spacy"),
        "paths.dev": str(corpus_dir / "dev.spacy"),
        "paths.bilm": None,
    }
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=r".*\[W086\]")
        spacy_train(tmp_path / "frozen.cfg", tmp_path / "out", overrides=overrides)
    before = load_bilm(bilm_dir, with_softmax=False).state_dict()
    after = load_bilm(
        tmp_path / "out" / "model-last" / "elmo" / "bilm", with_softmax=False
    ).state_dict()
    assert before.keys() == after.keys()
    for key in before:
        assert torch.equal(before[key], after[key]), key
    nlp = spacy.load(tmp_path / "out" / "model-last")
    mix = scalar_mix_node(nlp.get_pipe("textcat").model.get_ref("tok2vec").get_ref("mix"))
    assert not numpy.array_equal(mix.get_param("lambdas"), numpy.zeros(3, dtype="f"))


def elmo_spacy(*args) -> tuple[int, str]:
    """`elmo-spacy ARGS` in this process: exit code and output (stdout and
    stderr), words joined by single spaces, without the boxes rich draws."""
    from typer.testing import CliRunner

    from elmo_spacy.cli import app

    result = CliRunner().invoke(app, [str(arg) for arg in args])
    output = result.output
    for box in "│╭╮╰╯─":
        output = output.replace(box, " ")
    return result.exit_code, " ".join(output.split())


@pytest.mark.parametrize(
    "paths, extra, message",
    [
        (
            ["text.txt", "out"],
            ["--epochs", "2"],
            "No such option: --epochs. Did you mean --training.max_epochs?",
        ),
        (["text.txt", "out"], ["--resum"], "No such option: --resum. Did you mean --resume?"),
        (["out"], ["--training.max_epochs", "1"], "Missing CORPUS or OUTPUT_DIR"),
    ],
)
def test_pretrain_usage_errors_are_short_and_show_the_usage(tmp_path, paths, extra, message):
    (tmp_path / "text.txt").write_text("Some text to pretrain on.\n", encoding="utf-8")
    code, output = elmo_spacy(
        "pretrain", CONFIGS / "bilm_tiny.cfg", *(tmp_path / p for p in paths), *extra
    )
    assert code == 2, output
    assert message in output
    assert "Usage: elmo-spacy pretrain" in output and "--section.setting VALUE" in output
    assert "Traceback" not in output and "NoSuchOption" not in output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content", ["", "\n  \n\t\n"])
def test_pretrain_on_an_empty_text_names_it_and_leaves_no_folder(tmp_path, content):
    (tmp_path / "empty.txt").write_text(content, encoding="utf-8")
    code, output = elmo_spacy(
        "pretrain", CONFIGS / "bilm_tiny.cfg", tmp_path / "empty.txt", tmp_path / "out"
    )
    assert code == 1, output
    assert (
        f"{tmp_path / 'empty.txt'}: no text: the file is empty or holds only blank lines" in output
    )
    assert not (tmp_path / "out").exists()


def test_pretrain_on_a_text_too_short_to_split_says_how_much_is_needed(tmp_path):
    (tmp_path / "one.txt").write_text("\nJust one line of text.\n\n", encoding="utf-8")
    code, output = elmo_spacy(
        "pretrain", CONFIGS / "bilm_tiny.cfg", tmp_path / "one.txt", tmp_path / "out"
    )
    assert code == 1, output
    assert f"{tmp_path / 'one.txt'}: 1 doc(s) (non-blank lines) are too few" in output
    assert "Give at least 2 docs, or set dev_fraction = 0" in output
    assert "Best dev perplexity" not in output
    assert not (tmp_path / "out").exists()


def test_pretrain_into_an_earlier_run_needs_resume_or_overwrite(tmp_path):
    (tmp_path / "text.txt").write_text("Some text.\nMore text.\n", encoding="utf-8")
    (tmp_path / "out" / "model-best").mkdir(parents=True)
    (tmp_path / "out" / "pretrain_log.json").write_text("{}", encoding="utf-8")
    args = ("pretrain", CONFIGS / "bilm_tiny.cfg", tmp_path / "text.txt", tmp_path / "out")
    code, output = elmo_spacy(*args)
    assert code == 1, output
    assert f"{tmp_path / 'out'} holds an earlier pretraining run (model-best, " in output
    assert "--resume" in output and "--overwrite" in output
    code, output = elmo_spacy(*args, "--resume", "--overwrite")
    assert code == 1 and "choose one" in output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "model-best",
        "pretrain_log.json",
    ]


def test_pretrain_resume_with_no_checkpoint_says_to_run_without_it(tmp_path):
    (tmp_path / "text.txt").write_text("Some text.\nMore text.\n", encoding="utf-8")
    (tmp_path / "out").mkdir()
    args = ("pretrain", CONFIGS / "bilm_tiny.cfg", tmp_path / "text.txt", tmp_path / "out")
    code, output = elmo_spacy(*args, "--resume")
    assert code == 1, output
    assert f"Nothing to resume in {tmp_path / 'out'}: it holds no latest-checkpoint" in output
    assert "Run the same command without --resume to start a new run" in output
    assert list((tmp_path / "out").iterdir()) == []


def tiny_bilm():
    from elmo_spacy.bilm import BiLM, WordVocab

    return BiLM(TINY_BILM, WordVocab.build([["a", "b"]], max_size=10, min_count=1))


def test_an_output_path_through_a_file_says_which_path_is_wrong(tmp_path):
    """Not the OS's "[Errno 20] Not a directory: 'afile/.sub.tmp'" (a temporary name)."""
    from elmo_spacy.bilm import save_bilm

    (tmp_path / "afile").write_text("mine")
    (tmp_path / "text.txt").write_text("Some text.\nMore text.\n", encoding="utf-8")
    for out in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        code, output = elmo_spacy("pretrain", CONFIGS / "bilm_tiny.cfg", tmp_path / "text.txt", out)
        assert code == 1, output
        assert "Errno" not in output and ".tmp" not in output
        if out.name == "afile":
            assert f"{out} is a file, not a folder: choose another output folder" in output
        else:
            assert f"Cannot make the folder {out}: {tmp_path / 'afile'} is a file" in output
    with pytest.raises(NotADirectoryError) as refused:
        save_bilm(tiny_bilm(), tmp_path / "afile" / "sub")
    assert "Errno" not in str(refused.value) and ".sub.tmp" not in str(refused.value)
    assert (tmp_path / "afile").read_text() == "mine"


def test_an_os_error_while_writing_names_the_folder_not_its_temporary_name(tmp_path, monkeypatch):
    from elmo_spacy.bilm import save_bilm

    def denied(self, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", denied)
    with pytest.raises(PermissionError) as refused:
        save_bilm(tiny_bilm(), tmp_path / "bilm")
    message = str(refused.value)
    assert message.startswith(f"Cannot write {tmp_path / 'bilm'}: permission denied: choose")
    assert "Errno" not in message and ".bilm.tmp" not in message


def test_errors_straight_from_the_os_name_the_path_and_what_to_do():
    from elmo_spacy.cli import _message

    message = _message(FileExistsError(errno.EEXIST, "File exists", "afile"))
    assert message == "afile: it exists already: choose another path, or move it away first"
    message = _message(NotADirectoryError(errno.ENOTDIR, "Not a directory", "afile/x"))
    assert message.startswith("afile/x: a part of the path is a file, not a folder")
    assert _message(FileExistsError("a message of our own")) == "a message of our own"


def test_ctrl_c_during_pretraining_says_how_to_resume_and_exits_130(tmp_path, monkeypatch):
    import elmo_spacy.pretrain.loop as loop_module

    real_save = loop_module.save_checkpoint

    def save_then_ctrl_c(output_dir, bilm, optimizer, state):
        path = real_save(output_dir, bilm, optimizer, state)
        if state.step == 2:
            raise KeyboardInterrupt
        return path

    monkeypatch.setattr(loop_module, "save_checkpoint", save_then_ctrl_c)
    lines = (DATA / "unlabeled.txt").read_text(encoding="utf-8").splitlines()[:40]
    (tmp_path / "text.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    options = ["--training.checkpoint_every", "1", "--training.batch_tokens", "300"]
    args = ("pretrain", CONFIGS / "bilm_tiny.cfg", tmp_path / "text.txt", tmp_path / "out")
    code, output = elmo_spacy(*args, *options)
    assert code == 130, output
    checkpoint = tmp_path / "out" / "checkpoint-2"
    assert "Interrupted. Run the same command with --resume to go on from the last " in output
    assert f"checkpoint, {checkpoint} " in output
    assert checkpoint.is_dir()
    code, output = elmo_spacy(*args, *options, "--overwrite")
    assert code == 130 and "--resume instead of --overwrite" in output


def test_help_keeps_sentences_whole_and_shows_no_bool_type_for_flags():
    """typer's rich help kept the docstrings' line breaks ("format) into a" / "biLM
    directory"); on a wide terminal each description is one line."""
    from typer.testing import CliRunner

    from elmo_spacy.cli import app

    def help_lines(*command):
        result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "400"})
        assert result.exit_code == 0, result.output
        return [" ".join(line.strip("│ ").split()) for line in result.output.splitlines()]

    lines = help_lines()
    assert (
        "convert-elmo Convert a bilm-tf model (the published ELMo models) into a biLM directory, "
        "which loads faster (docs/models.md)." in lines
    )
    assert any(
        line.startswith("pretrain Pretrain a biLM on a prepared corpus") and "torchrun" in line
        for line in lines
    )
    for command in ((), ("pretrain",), ("convert-elmo",), ("export-elmo",)):
        lines = help_lines(*command)
        assert "--help Show this message and exit." in lines
        assert not [line for line in lines if "<bool>" in line], command


def test_version():
    import spacy

    from elmo_spacy import __version__

    code, output = elmo_spacy("--version")
    assert code == 0
    assert (
        output
        == f"elmo-spacy {__version__} (spaCy {spacy.__version__}, PyTorch {torch.__version__})"
    )


def test_only_user_errors_become_one_line_and_a_bug_keeps_its_traceback(tmp_path, monkeypatch):
    """A ValueError from inside the library (numpy's shape errors are ValueErrors)
    is a bug: the command must not hide it behind a one-line message."""
    from typer.testing import CliRunner

    import elmo_spacy.pretrain as pretrain_package
    from elmo_spacy.cli import app
    from elmo_spacy.errors import ElmoSpacyError

    (tmp_path / "text.txt").write_text("Some text.\nMore text.\n", encoding="utf-8")
    args = ["pretrain", str(CONFIGS / "bilm_tiny.cfg"), str(tmp_path / "text.txt")]
    args.append(str(tmp_path / "out"))

    def fails_with(error):
        def load(*_args, **_kwargs):
            raise error

        monkeypatch.setattr(pretrain_package, "load_pretrain_config", load)
        return CliRunner().invoke(app, args)

    result = fails_with(ValueError("operands could not be broadcast together (shape mismatch)"))
    assert result.exit_code != 0
    assert type(result.exception) is ValueError  # propagated, not turned into an exit
    assert "shape mismatch" not in result.output
    result = fails_with(ElmoSpacyError("bilm_tiny.cfg: [training] lr = -1: give a rate > 0"))
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.output.strip() == "bilm_tiny.cfg: [training] lr = -1: give a rate > 0"


def test_pretrain_leaves_its_process_group_after_an_error_too(tmp_path, monkeypatch):
    import elmo_spacy.pretrain as pretrain_package
    import elmo_spacy.pretrain.prepare as prepare_module
    from elmo_spacy.errors import ElmoSpacyError

    stopped = []
    monkeypatch.setattr(pretrain_package, "leave_process_group", stopped.append)

    def unreadable(paths, *_, **__):
        raise ElmoSpacyError(f"{paths[0]}: not UTF-8")

    monkeypatch.setattr(prepare_module, "prepare_corpus", unreadable)
    (tmp_path / "text.txt").write_text("Some text.\nMore text.\n", encoding="utf-8")
    code, output = elmo_spacy(
        "pretrain", CONFIGS / "bilm_tiny.cfg", tmp_path / "text.txt", tmp_path / "out"
    )
    assert code == 1 and "not UTF-8" in output
    assert len(stopped) == 1 and stopped[0].world_size == 1


def test_the_librarys_user_errors_are_one_type_and_still_value_errors():
    from elmo_spacy.bilm.formats.bilm_tf import BilmTfFormatError
    from elmo_spacy.bilm.formats.locate import BiLMLoadError
    from elmo_spacy.errors import ElmoSpacyError
    from elmo_spacy.pretrain.train import NotEnoughText

    for error in (BilmTfFormatError, BiLMLoadError, NotEnoughText):
        assert issubclass(error, ElmoSpacyError) and issubclass(error, ValueError)
    with pytest.raises(ElmoSpacyError, match="window = 4, window_overlap = 2"):
        from elmo_spacy.bilm.runner import RunSettings

        RunSettings(window=4, window_overlap=2)


@pytest.mark.parametrize("preset", ["default", "elmo", "tiny", "lm1b"])
def test_init_config_writes_a_pretraining_config_that_loads(tmp_path, preset):
    from elmo_spacy.cli.pretrain import PRESETS
    from elmo_spacy.pretrain.config import load_pretrain_config

    output = tmp_path / "bilm.cfg"
    result = cli("init-config", output, "--preset", preset)
    assert result.returncode == 0, result.stderr
    assert output.read_text() == (CONFIGS / PRESETS[preset]).read_text()  # comments kept
    load_pretrain_config(output)
    again = cli("init-config", output)
    assert again.returncode == 1 and "--overwrite" in again.stderr
    bad = cli("init-config", tmp_path / "x.cfg", "--preset", "huge")
    assert bad.returncode == 1 and "default, elmo, tiny" in bad.stderr
