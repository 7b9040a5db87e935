"""Pretraining: checkpoints, resume, the log."""

import json
import os
import warnings
from dataclasses import replace

import numpy
import pytest
import torch

import elmo_spacy.pretrain.loop as loop_module
from elmo_spacy.bilm import BiLMConfig, WordVocab, load_bilm
from elmo_spacy.errors import ElmoSpacyError
from elmo_spacy.pretrain import PretrainConfig, pretrain
from elmo_spacy.pretrain.checkpoint import load_checkpoint
from elmo_spacy.pretrain.run_folder import LATEST, RunFolder
from elmo_spacy.pretrain.texts import read_texts
from elmo_spacy.pretrain.train import NotEnoughText

from .conftest import DATA, TINY_BILM, cli, corpus_of, tokenize

DOCS = tokenize((DATA / "unlabeled.txt").read_text(encoding="utf-8").splitlines()[:40])
BILM = BiLMConfig(**{**TINY_BILM.to_dict(), "dropout": 0.2})  # dropout draws random numbers
SETTINGS = PretrainConfig(
    max_epochs=3, batch_tokens=600, learning_rate=0.005, patience=0, checkpoint_every=2
)


class Crash(Exception):
    pass


def test_resume_after_a_crash_ends_with_the_uninterrupted_weights(tmp_path, monkeypatch):
    uninterrupted = pretrain(corpus_of(DOCS), BILM, SETTINGS, tmp_path / "a", show_progress=False)
    real_save = loop_module.save_checkpoint

    def save_then_crash(output_dir, bilm, optimizer, state):
        path = real_save(output_dir, bilm, optimizer, state)
        if state.step == 6:  # mid-epoch 2
            raise Crash
        return path

    monkeypatch.setattr(loop_module, "save_checkpoint", save_then_crash)
    with pytest.raises(Crash):
        pretrain(corpus_of(DOCS), BILM, SETTINGS, tmp_path / "b", show_progress=False)
    assert (tmp_path / "b" / LATEST).read_text().strip() == "checkpoint-6"
    monkeypatch.setattr(loop_module, "save_checkpoint", real_save)
    resumed = pretrain(
        corpus_of(DOCS), BILM, SETTINGS, tmp_path / "b", show_progress=False, resume=True
    )
    assert resumed["resumed_from"].endswith("checkpoint-6")
    assert resumed["steps"] == uninterrupted["steps"]
    a = load_bilm(tmp_path / "a" / "model-last").state_dict()
    b = load_bilm(tmp_path / "b" / "model-last").state_dict()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6, msg=key)
    assert [e["dev_perplexity"]["mean"] for e in resumed["epochs"]] == pytest.approx(
        [e["dev_perplexity"]["mean"] for e in uninterrupted["epochs"]], rel=1e-5
    )


def test_a_finished_run_goes_on_when_resumed_with_more_epochs_and_says_when_it_cannot(
    tmp_path, capsys
):
    """A run that finished its epochs, resumed with the same ones, trains
    nothing and says so; resumed with more, it trains them and ends with the
    weights of a run that planned them from the start."""
    one_epoch = replace(SETTINGS, max_epochs=1)
    two_epochs = replace(SETTINGS, max_epochs=2)
    first = pretrain(corpus_of(DOCS), BILM, one_epoch, tmp_path / "b", show_progress=False)
    capsys.readouterr()
    again = pretrain(corpus_of(DOCS), BILM, one_epoch, tmp_path / "b", resume=True)
    assert again["steps"] == first["steps"] and len(again["epochs"]) == 1
    assert "(max_epochs = 1, 1 epochs done): nothing to train" in capsys.readouterr().out
    uninterrupted = pretrain(corpus_of(DOCS), BILM, two_epochs, tmp_path / "a", show_progress=False)
    assert len(uninterrupted["epochs"]) == 2
    resumed = pretrain(corpus_of(DOCS), BILM, two_epochs, tmp_path / "b", resume=True)
    assert "now allows more, so it goes on" in capsys.readouterr().out
    assert resumed["steps"] == uninterrupted["steps"]
    a = load_bilm(tmp_path / "a" / "model-last").state_dict()
    b = load_bilm(tmp_path / "b" / "model-last").state_dict()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6, msg=key)


def test_checkpoint_minutes_checkpoint_within_an_epoch_and_the_run_resumes_from_one(
    tmp_path, monkeypatch
):
    """With no checkpoints by steps (checkpoint_every = 0, as the tiny preset),
    checkpoint_minutes writes one mid-epoch at the first point where the
    ranks sync (every log_every steps) after that much time; a run killed after it resumes to
    the uninterrupted weights. 0 writes none but at the epochs' ends."""
    by_time = PretrainConfig(
        max_epochs=1, batch_tokens=300, patience=0, checkpoint_every=0, log_every=2
    )
    real_save = loop_module.save_checkpoint
    saved = []

    def save_then_crash(output_dir, bilm, optimizer, state):
        saved.append((state.step, state.batch))
        path = real_save(output_dir, bilm, optimizer, state)
        if crash and state.batch:
            raise Crash
        return path

    monkeypatch.setattr(loop_module, "save_checkpoint", save_then_crash)
    crash = False
    off = pretrain(
        corpus_of(DOCS), BILM, replace(by_time, checkpoint_minutes=0), tmp_path / "off",
        show_progress=False,
    )  # fmt: skip
    assert saved == [(off["steps"], 0)] and off["steps"] > 4  # the epoch's end only
    saved.clear()
    crash = True
    often = replace(by_time, checkpoint_minutes=1e-9)  # past at every sync
    with pytest.raises(Crash):
        pretrain(corpus_of(DOCS), BILM, often, tmp_path / "killed", show_progress=False)
    assert saved == [(2, 2)]  # the first sync, mid-epoch
    assert (tmp_path / "killed" / LATEST).read_text().strip() == "checkpoint-2"
    crash = False
    resumed = pretrain(
        corpus_of(DOCS), BILM, often, tmp_path / "killed", show_progress=False, resume=True
    )
    assert resumed["resumed_from"].endswith("checkpoint-2")
    mid_epoch = [step for step, batch in saved[1:] if batch]
    assert mid_epoch == list(range(4, off["steps"] + 1, 2))  # at every sync
    assert saved[-1] == (off["steps"], 0)  # and at the epoch's end
    a = load_bilm(tmp_path / "off" / "model-last").state_dict()
    b = load_bilm(tmp_path / "killed" / "model-last").state_dict()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6, msg=key)


def test_pretraining_and_its_resumption_step_with_the_fused_adam(tmp_path, monkeypatch):
    fused = []
    real_save = loop_module.save_checkpoint

    def record(output_dir, bilm, optimizer, state):
        fused.append(optimizer.param_groups[0]["fused"])
        return real_save(output_dir, bilm, optimizer, state)

    monkeypatch.setattr(loop_module, "save_checkpoint", record)
    pretrain(corpus_of(DOCS), BILM, SETTINGS, tmp_path, show_progress=False)
    assert fused and all(fused)
    _, optimizer, _ = load_checkpoint(RunFolder(tmp_path).latest_checkpoint(), BILM, SETTINGS)
    assert optimizer.param_groups[0]["fused"]


def test_only_the_latest_checkpoint_is_kept_and_the_log_is_written(tmp_path):
    log = pretrain(corpus_of(DOCS), BILM, SETTINGS, tmp_path, show_progress=False)
    checkpoints = sorted(p.name for p in tmp_path.glob("checkpoint-*"))
    assert checkpoints == [f"checkpoint-{log['steps']}"]
    assert not list(tmp_path.glob(".*"))  # no temporary directories left
    saved = json.loads((tmp_path / "pretrain_log.json").read_text())
    assert [e["epoch"] for e in saved["epochs"]] == [1, 2, 3]
    assert all(
        e["dev_perplexity"]["mean"] > 1 and e["tokens_per_second"] > 0 for e in saved["epochs"]
    )


def test_resume_refuses_another_bilm_config(tmp_path):
    pretrain(
        corpus_of(DOCS),
        BILM,
        PretrainConfig(max_epochs=1, batch_tokens=600),
        tmp_path,
        show_progress=False,
    )
    other = BiLMConfig(**{**BILM.to_dict(), "lstm_dim": 48})
    with pytest.raises(ValueError, match="another \\[bilm\\] config"):
        pretrain(
            corpus_of(DOCS),
            other,
            PretrainConfig(max_epochs=2),
            tmp_path,
            show_progress=False,
            resume=True,
        )


def test_resume_with_other_batching_settings_says_what_it_changes(tmp_path, monkeypatch):
    """A run stopped in the middle of an epoch and resumed with other batches
    (here max_length) says so; resumed again with the same settings, not."""
    steps = []
    real_step = loop_module.training_step

    def killed_at_the_second_step(*args, **kwargs):
        steps.append(1)
        if len(steps) == 2:
            raise RuntimeError("killed")
        return real_step(*args, **kwargs)

    first = PretrainConfig(max_epochs=1, batch_tokens=300, checkpoint_every=1, patience=0)
    with monkeypatch.context() as patched:
        patched.setattr(loop_module, "training_step", killed_at_the_second_step)
        with pytest.raises(RuntimeError, match="killed"):
            pretrain(corpus_of(DOCS), BILM, first, tmp_path, show_progress=False)
    changed = replace(first, max_length=100)
    with pytest.warns(
        UserWarning, match=r"\(max_length 200 -> 100\): .*epoch 1 .*from its batch 1,"
    ):
        pretrain(corpus_of(DOCS), BILM, changed, tmp_path, show_progress=False, resume=True)
    again = replace(changed, max_epochs=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the same settings, from an epoch's start
        pretrain(corpus_of(DOCS), BILM, again, tmp_path, show_progress=False, resume=True)


@pytest.mark.slow  # over 30 s: make test-slow
def test_sigkill_mid_run_then_resume_matches_an_uninterrupted_run(tmp_path, corpus_dir):
    """`elmo-spacy pretrain` killed with SIGKILL after its first checkpoint, then
    `--resume`d, ends with the weights of a run that was never interrupted."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    program = [
        str(Path(sys.executable).parent / "elmo-spacy"), "pretrain",
        str(DATA.parent.parent / "configs" / "bilm_tiny.cfg"), str(corpus_dir / "pretrain.txt"),
    ]  # fmt: skip
    options = [
        "--training.max_epochs", "4", "--training.checkpoint_every", "3",
        "--training.batch_tokens", "500", "--bilm.dropout", "0.2",
    ]  # fmt: skip

    def command(output, *extra):
        return [*program, str(tmp_path / output), *options, *extra]

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.run(command("a"), capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    process = subprocess.Popen(
        command("b"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    pointer = tmp_path / "b" / LATEST
    deadline = time.monotonic() + 120
    while not pointer.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (tmp_path / "b" / "pretrain_log.json").exists()
    resumed = subprocess.run(command("b", "--resume"), capture_output=True, text=True, env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    log = json.loads((tmp_path / "b" / "pretrain_log.json").read_text())
    assert log["resumed_from"] is not None
    a = load_bilm(tmp_path / "a" / "model-last").state_dict()
    b = load_bilm(tmp_path / "b" / "model-last").state_dict()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6, msg=key)


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
@pytest.mark.parametrize("bad_line", [1, 51, 401])
def test_text_that_is_not_utf8_names_the_line_column_and_offset_of_the_bad_byte(
    tmp_path, newline, bad_line
):
    """Far past the text reader's first chunk too (8 KiB): the position is the file's."""
    lines = [f"line {n} of plain text, ascii only".encode() for n in range(1, 501)]
    lines[bad_line - 1] = "café au lait".encode("latin-1")  # é is 0xe9
    data = newline.join(lines) + newline
    offset = data.index(b"\xe9")
    (tmp_path / "latin.txt").write_bytes(data)
    with pytest.raises(ValueError) as raised:
        list(read_texts(tmp_path / "latin.txt"))
    message = str(raised.value)
    assert f"latin.txt:{bad_line}:4: not valid UTF-8: byte 0xe9 at byte offset {offset} " in message
    assert "Re-encode the file as UTF-8" in message


def test_too_few_docs_for_a_dev_split_are_refused_and_say_how_many_are_needed(tmp_path):
    settings = PretrainConfig(max_epochs=1, dev_fraction=0.9)
    with pytest.raises(NotEnoughText, match="3 doc.* too few.* at least 5 docs"):
        pretrain(corpus_of(DOCS[:3]), BILM, settings, tmp_path / "a", show_progress=False)
    assert not (tmp_path / "a").exists()
    log = pretrain(corpus_of(DOCS[:5]), BILM, settings, tmp_path / "b", show_progress=False)
    assert log["corpus"]["docs"] - log["dev"]["docs"] == 1 and log["steps"] == 1
    held_in = PretrainConfig(max_epochs=1, dev_fraction=0.0)
    log = pretrain(corpus_of(DOCS[:1]), BILM, held_in, tmp_path / "c", show_progress=False)
    assert log["steps"] == 1 and not log["dev"]["held_out"]


def test_a_finished_run_is_replaced_only_when_asked(tmp_path):
    one_epoch = PretrainConfig(max_epochs=1, batch_tokens=600)
    pretrain(corpus_of(DOCS), BILM, one_epoch, tmp_path, show_progress=False)
    (tmp_path / "notes.txt").write_text("mine", encoding="utf-8")
    best = (tmp_path / "model-best" / "weights.safetensors").read_bytes()
    with pytest.raises(FileExistsError, match="holds an earlier pretraining run") as refused:
        pretrain(corpus_of(DOCS), BILM, one_epoch, tmp_path, show_progress=False)
    assert "--resume" in str(refused.value) and "--overwrite" in str(refused.value)
    assert (tmp_path / "model-best" / "weights.safetensors").read_bytes() == best
    with pytest.raises(ValueError, match="choose one"):
        pretrain(
            corpus_of(DOCS),
            BILM,
            one_epoch,
            tmp_path,
            show_progress=False,
            resume=True,
            overwrite=True,
        )
    other_seed = PretrainConfig(max_epochs=1, batch_tokens=600, seed=1)
    log = pretrain(corpus_of(DOCS), BILM, other_seed, tmp_path, show_progress=False, overwrite=True)
    assert log["resumed_from"] is None
    assert (tmp_path / "model-best" / "weights.safetensors").read_bytes() != best
    assert (tmp_path / "notes.txt").read_text(encoding="utf-8") == "mine"  # not the run's
    (tmp_path / LATEST).unlink()
    with pytest.raises(FileExistsError, match=f"no {LATEST} to resume from"):
        pretrain(corpus_of(DOCS), BILM, one_epoch, tmp_path, show_progress=False, resume=True)


def test_resume_with_nothing_to_resume_is_refused_before_any_work(tmp_path, corpus_dir):
    """--resume into a folder with no checkpoint (missing, or empty) does not
    start a new run: it says so and what to run, and leaves nothing behind."""
    (tmp_path / "empty").mkdir()
    text = [str(corpus_dir / "pretrain.txt")]
    for folder in (tmp_path / "missing", tmp_path / "empty"):
        with pytest.raises(ElmoSpacyError) as refused:
            pretrain(text, BILM, SETTINGS, folder, show_progress=False, resume=True)
        assert str(refused.value).startswith(f"Nothing to resume in {folder}: it ")
        assert "Run the same command without --resume to start a new run" in str(refused.value)
    assert not (tmp_path / "missing").exists()
    assert list((tmp_path / "empty").iterdir()) == []  # no text prepared either


def test_two_ranks_with_nothing_to_resume_both_refuse(tmp_path, corpus_dir):
    """Under torchrun rank 0's folder decides, and every rank says why it stops."""
    import subprocess

    from .test_distributed import ENV, pretrain_command, rank_logs

    output = tmp_path / "run"
    command = pretrain_command(output, corpus_dir / "pretrain.txt", 2, "--resume")
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode != 0
    said = [log.read_text() for log in sorted(rank_logs(output).glob("**/stderr.log"))]
    assert len(said) == 2
    assert all(f"Nothing to resume in {output}: it does not exist" in text for text in said)
    assert not output.exists()


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_written_files_have_the_usual_permissions_so_others_can_read_them(tmp_path, umask):
    """As open() makes them (0666 less the umask), weights.safetensors too (safetensors: 0600)."""
    old_umask = os.umask(umask)
    try:
        pretrain(
            corpus_of(DOCS),
            BILM,
            PretrainConfig(max_epochs=1, batch_tokens=600),
            tmp_path,
            show_progress=False,
        )
    finally:
        os.umask(old_umask)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"weights.safetensors", "training_state.safetensors"}
    modes = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in files}
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes


OTHER_DOCS = tokenize((DATA / "unlabeled.txt").read_text(encoding="utf-8").splitlines()[40:80])


def test_a_bilm_trained_further_starts_from_its_weights_and_keeps_its_vocabulary(tmp_path):
    first = PretrainConfig(max_epochs=1, batch_tokens=600)
    pretrain(corpus_of(DOCS), BILM, first, tmp_path / "a", show_progress=False)
    start = load_bilm(tmp_path / "a" / "model-best", with_softmax=True)
    vocab = start.vocab
    assert vocab != WordVocab.build(
        OTHER_DOCS, max_size=BILM.max_vocab_size, min_count=BILM.min_count
    )
    settings = PretrainConfig(max_epochs=2, batch_tokens=600, learning_rate=0.005)
    log = pretrain(
        corpus_of(OTHER_DOCS), BILM, settings, tmp_path / "b", show_progress=False, init_bilm=start
    )
    assert log["epochs"][-1]["dev_perplexity"]["mean"] < log["init_dev_perplexity"]["mean"]
    adapted = load_bilm(tmp_path / "b" / "model-best")
    assert adapted.vocab == vocab
    before = load_bilm(tmp_path / "a" / "model-best").state_dict()
    moved = [(value - before[key]).abs().max() for key, value in adapted.state_dict().items()]
    assert 0 < max(moved) < 0.5  # trained on from the start's weights, not from fresh ones


def test_training_further_refuses_a_bilm_it_cannot_go_on_with(tmp_path):
    first = PretrainConfig(max_epochs=1, batch_tokens=600)
    pretrain(corpus_of(DOCS), BILM, first, tmp_path / "a", show_progress=False)
    settings = PretrainConfig(max_epochs=1, batch_tokens=600)

    def further(bilm, bilm_config=BILM, **extra):
        output = tmp_path / "b"
        pretrain(
            corpus_of(OTHER_DOCS),
            bilm_config,
            settings,
            output,
            show_progress=False,
            init_bilm=bilm,
            **extra,
        )

    with pytest.raises(ValueError, match="no softmax head"):
        further(load_bilm(tmp_path / "a" / "model-best", with_softmax=False))
    start = load_bilm(tmp_path / "a" / "model-best", with_softmax=True)
    with pytest.raises(ValueError, match="another \\[bilm\\] config"):
        further(start, BiLMConfig(**{**BILM.to_dict(), "lstm_dim": 48}))
    with pytest.raises(ValueError, match=r"init_vectors \(--init-vectors\) or init_bilm"):
        further(start, init_vectors={"the": numpy.zeros(16, "f")})
    assert not (tmp_path / "b").exists()


def test_a_resumed_run_keeps_the_perplexity_its_start_had(tmp_path, monkeypatch):
    pretrain(corpus_of(DOCS), BILM, SETTINGS, tmp_path / "a", show_progress=False)
    start = load_bilm(tmp_path / "a" / "model-best", with_softmax=True)
    real_save = loop_module.save_checkpoint

    def save_then_crash(output_dir, bilm, optimizer, state):
        real_save(output_dir, bilm, optimizer, state)
        raise Crash

    monkeypatch.setattr(loop_module, "save_checkpoint", save_then_crash)
    with pytest.raises(Crash):
        pretrain(
            corpus_of(OTHER_DOCS),
            BILM,
            SETTINGS,
            tmp_path / "b",
            show_progress=False,
            init_bilm=start,
        )
    monkeypatch.setattr(loop_module, "save_checkpoint", real_save)
    log = pretrain(  # as `elmo-spacy pretrain --init-bilm ... --resume` calls it
        corpus_of(OTHER_DOCS), None, SETTINGS, tmp_path / "b", show_progress=False, resume=True,
        init_bilm=tmp_path / "a" / "model-best",
    )  # fmt: skip
    assert log["resumed_from"] is not None
    start = load_bilm(tmp_path / "a" / "model-best", with_softmax=True)
    again = pretrain(
        corpus_of(OTHER_DOCS), BILM, SETTINGS, tmp_path / "c", show_progress=False, init_bilm=start
    )
    assert log["init_dev_perplexity"] is not None
    assert log["init_dev_perplexity"] == again["init_dev_perplexity"]


def test_a_text_file_and_its_prepared_corpus_train_the_same_weights(tmp_path, corpus_dir):
    text = corpus_dir / "pretrain.txt"
    options = ["--training.max_epochs", "2", "--bilm.dropout", "0.2"]
    config = DATA.parent.parent / "configs" / "bilm_tiny.cfg"
    from_text = cli("pretrain", config, text, tmp_path / "a", *options)
    assert from_text.returncode == 0, from_text.stderr
    assert cli("prepare", text, tmp_path / "corpus").returncode == 0
    prepared = cli("pretrain", config, tmp_path / "corpus", tmp_path / "b", *options)
    assert prepared.returncode == 0, prepared.stderr
    a = load_bilm(tmp_path / "a" / "model-last").state_dict()
    b = load_bilm(tmp_path / "b" / "model-last").state_dict()
    for key in a:  # up to the rounding of two threads (bit for bit on one)
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6, msg=key)
    # The text was prepared into the run's folder, where a resumed run finds it.
    assert (tmp_path / "a" / "corpus" / "manifest.json").is_file()


def test_resuming_on_another_corpus_is_refused(tmp_path):
    pretrain(corpus_of(DOCS), BILM, SETTINGS, tmp_path, show_progress=False)
    with pytest.raises(ValueError, match="trained on another corpus than the one given"):
        pretrain(corpus_of(OTHER_DOCS), BILM, SETTINGS, tmp_path, show_progress=False, resume=True)


def test_budgets_of_tokens_and_time_stop_the_run_and_it_is_measured_at_eval_every(tmp_path):
    tokens = PretrainConfig(
        max_epochs=5, batch_tokens=300, max_tokens=1500, eval_every=2, patience=0
    )
    log = pretrain(corpus_of(DOCS), BILM, tokens, tmp_path / "tokens", show_progress=False)
    assert 1500 <= log["tokens"] < 1500 + 300  # stopped at the step that reached it
    steps = [e["step"] for e in log["evaluations"]]
    assert steps == [*range(2, log["steps"], 2), log["steps"]] or steps == [
        *range(2, log["steps"] + 1, 2)
    ]
    assert len(log["epochs"]) == 1 and log["epochs"][0]["step"] == log["steps"]
    assert (tmp_path / "tokens" / "model-best").is_dir()
    hours = PretrainConfig(max_epochs=50, batch_tokens=300, max_hours=1e-9, log_every=3)
    log = pretrain(corpus_of(DOCS), BILM, hours, tmp_path / "hours", show_progress=False)
    assert log["steps"] == 3  # the first point where the ranks compare the time
