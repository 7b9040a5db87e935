"""The study's commands (`python -m scripts ...`): the help lists them, and on
bad input each stops before any work, naming the file and what to do. Run in
this process."""

import hashlib
import json
import shutil

import pytest
from typer.testing import CliRunner

from ..conftest import CONFIGS, DATA


def study(*args) -> tuple[int, str, str]:
    """`python -m scripts ARGS` in this process: exit code, stdout and stderr,
    each with words joined by single spaces."""
    from scripts.commands import app

    result = CliRunner().invoke(app, [str(arg) for arg in args])
    # An error ends in the command's own exit, never an uncaught exception (a traceback).
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, " ".join(result.stdout.split()), " ".join(result.stderr.split())


def test_corpus_command_stops_at_a_bad_row_and_can_skip_it(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    good = (DATA / "train.csv").read_text(encoding="utf-8").splitlines()[:8]
    bad = good[:3] + ['"9","Unknown class","text"'] + good[3:]
    (source / "train.csv").write_text("\n".join(bad) + "\n", encoding="utf-8")
    command = ["corpus", source, tmp_path / "out", "--no-verify", "--dev-fraction", "0.25"]
    code, _, stderr = study(*command)
    assert code == 1
    assert "train.csv:4: unknown class '9'" in stderr
    code, stdout, stderr = study(*command, "--skip-bad-rows")
    assert code == 0, stderr
    assert "Skipped 1 bad row(s)" in stdout
    assert "No test split" in stdout
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["docs"]["train"] + stats["docs"]["dev"] == 8


def test_corpus_command_names_a_missing_or_altered_file(tmp_path):
    source = tmp_path / "ag_news"
    source.mkdir()
    code, _, stderr = study("corpus", source, tmp_path / "out")
    assert code == 1
    assert f"{source / 'train.csv'} is missing" in stderr
    assert "spacy project assets" in stderr
    shutil.copy(DATA / "train.csv", source / "train.csv")
    code, _, stderr = study("corpus", source, tmp_path / "out")
    assert code == 1
    actual = hashlib.md5((DATA / "train.csv").read_bytes()).hexdigest()
    assert f"train.csv: md5 is {actual}, expected b1a00f826fdfbd249f79597b59e1dc12" in stderr
    assert "--no-verify" in stderr
    assert not (tmp_path / "out").exists()


def test_corpus_of_an_empty_train_csv_stops(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.csv").write_text("\n\n", encoding="utf-8")
    code, _, stderr = study("corpus", tmp_path / "src", tmp_path / "out", "--no-verify")
    assert code == 1
    assert "train.csv" in stderr and "no rows" in stderr
    assert not (tmp_path / "out").exists()


def test_vectors_of_an_empty_text_stop(tmp_path):
    (tmp_path / "empty.txt").write_text("\n \n", encoding="utf-8")
    code, _, stderr = study("vectors", "svd", tmp_path / "empty.txt", tmp_path / "out")
    assert code == 1
    assert "empty.txt" in stderr and "no words" in stderr


@pytest.mark.parametrize("content", ["", "{not json", '{"name": "x"}'])
def test_compare_names_a_broken_metrics_file(tmp_path, content):
    (tmp_path / "broken.json").write_text(content, encoding="utf-8")
    code, _, stderr = study("compare", tmp_path / "broken.json", "--output", tmp_path / "t.md")
    assert code == 1
    assert "broken.json" in stderr and "evaluate" in stderr


def test_train_refuses_a_misspelt_override(tmp_path, corpus_dir, bilm_dir):
    code, _, stderr = study(
        "train",
        CONFIGS / "textcat_tiny.cfg",
        tmp_path / "out",
        "--paths.train",
        corpus_dir / "train.spacy",
        "--paths.dev",
        corpus_dir / "dev.spacy",
        "--paths.bilmm",
        bilm_dir,
    )
    assert code != 0
    assert "--paths.bilmm is not a setting of" in stderr
    assert "did you mean --paths.bilm?" in stderr
    assert not (tmp_path / "out" / "model-last").exists()


def test_train_names_a_config_that_is_not_utf8(tmp_path):
    text = (CONFIGS / "bilm_tiny.cfg").read_text(encoding="utf-8")
    (tmp_path / "utf16.cfg").write_text(text, encoding="utf-16")
    code, _, stderr = study("train", tmp_path / "utf16.cfg", tmp_path / "out")
    assert code == 1 and "utf16.cfg" in stderr and "UTF-8" in stderr


def test_the_studys_help_lists_its_commands():
    from typer.testing import CliRunner

    from scripts.commands import app

    from ..conftest import command_names

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
