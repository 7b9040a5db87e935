"""`elmo-spacy pretrain`: pretrain a biLM on a prepared corpus (or on text, prepared first)."""

import difflib
from dataclasses import fields
from pathlib import Path
from typing import Any

import typer
from spacy.cli._util import parse_config_overrides

from ..errors import ElmoSpacyError
from . import app, errors_to_exit


@app.command(
    "pretrain", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
def pretrain_command(
    ctx: typer.Context,
    config_path: Path = typer.Argument(
        ..., exists=True, dir_okay=False, metavar="CONFIG_PATH", help="Pretraining config (.cfg)"
    ),
    paths: list[str] = typer.Argument(
        ...,
        metavar="CORPUS... OUTPUT_DIR",
        help="CORPUS: prepared corpus folders (`elmo-spacy prepare`; the N parts of one, or "
        "several), or text files (.txt, .jsonl, .gz; folders, globs), prepared into "
        "OUTPUT_DIR/corpus. OUTPUT_DIR: where model-best/, model-last/, the checkpoints "
        "and pretrain_log.json go",
        show_default=False,
    ),
    dev: list[str] = typer.Option(
        None,
        help="A held-out corpus of its own for dev perplexity (prepared folder or text), "
        "instead of a share of CORPUS; repeat for several",
    ),
    lang: str = typer.Option(None, help="Language of spaCy's tokenizer, for text (default en)"),
    pretokenized: bool = typer.Option(False, "--pretokenized", help="Split text on white space"),
    resume: bool = typer.Option(False, "--resume", help="Go on from OUTPUT_DIR's last checkpoint"),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Replace an earlier run in OUTPUT_DIR (its models, checkpoints and log)",
    ),
    init_vectors: Path = typer.Option(
        None,
        exists=True,
        file_okay=False,
        help="Start the word embeddings from these vectors (a spaCy pipeline with vectors, "
        "e.g. from `spacy init vectors`); encoders word and word_char",
    ),
    init_bilm: Path = typer.Option(
        None,
        exists=True,
        file_okay=False,
        help="Train this biLM further (a model-best/ of `elmo-spacy pretrain`) on CORPUS, "
        "keeping its vocabulary and \\[bilm] settings (the config's are not used): adapts it to "
        "a task's or domain's text",
    ),
    gpu_id: int = typer.Option(
        -1, help="GPU to train on (-1: CPU). Under torchrun, >= 0 puts rank r on GPU LOCAL_RANK"
    ),
) -> None:
    """Pretrain a biLM on a prepared corpus, streamed from disk. Extra options
    override the config, e.g. --training.max_epochs 1. Data-parallel on N
    processes: torchrun --nproc_per_node N --no-python elmo-spacy pretrain ..."""
    from ..pretrain import join_process_group, leave_process_group, load_pretrain_config, pretrain
    from ..pretrain.run_folder import RunFolder

    with errors_to_exit():
        (*corpus, output_dir), overrides = _paths_and_overrides(ctx, paths)
        if not corpus:
            ctx.fail(
                "Missing CORPUS or OUTPUT_DIR: give CONFIG_PATH CORPUS... OUTPUT_DIR, then any "
                "config settings as --section.setting VALUE."
            )
        folder = RunFolder(output_dir)
        bilm_config, training = load_pretrain_config(config_path, overrides)
        if init_bilm is not None:
            changed = sorted(name for name in overrides if name.startswith("bilm."))
            if changed:
                raise ElmoSpacyError(
                    f"--{changed[0]}: a biLM trained further (--init-bilm) keeps its own [bilm] "
                    f"settings ({init_bilm / 'config.json'}); leave out the --bilm.* options."
                )
            bilm_config = None
        folder.check(resume=resume, overwrite=overwrite)  # before joining the process group
        group = join_process_group(gpu_id)
        try:
            log = pretrain(
                corpus,
                bilm_config,
                training,
                folder.path,
                dev=dev or None,
                lang=lang,
                pretokenized=pretokenized,
                resume=resume,
                overwrite=overwrite,
                init_vectors=init_vectors,
                init_bilm=init_bilm,
                group=group,
            )
        except KeyboardInterrupt as interrupt:
            if group.is_main:
                typer.secho(_how_to_resume(folder, overwrite), fg="yellow", err=True)
            raise typer.Exit(130) from interrupt
        finally:  # after an error or Ctrl-C too: no process group left behind
            leave_process_group(group)
    if not group.is_main:
        return
    try:
        from ..pretrain.plots import plot_perplexity

        plot_perplexity(log, folder.plot)
    except ImportError as err:
        typer.secho(f"No perplexity plot: {err}", fg="yellow")
    typer.echo(
        f"Best dev perplexity {log['best_dev_perplexity']:.2f} after {log['steps']} steps "
        f"({len(log['epochs'])} epoch(s)), {log['wall_seconds']:.0f} s. "
        f"biLM: {folder.model_best}"
    )


def _how_to_resume(folder, overwrite: bool) -> str:
    """What a user who stopped a run with Ctrl-C can do next."""
    try:
        checkpoint = folder.latest_checkpoint()
    except ElmoSpacyError as err:  # a pointer to a checkpoint that is gone
        return f"\nInterrupted. {err}"
    if checkpoint is None:
        again = " with --overwrite" if folder.earlier_run() else ""
        return (
            f"\nInterrupted before the first checkpoint in {folder.path}: nothing to resume. "
            f"Run the command again{again} to start over ([training] checkpoint_minutes and "
            "checkpoint_every set how soon one is written)."
        )
    instead = " instead of --overwrite" if overwrite else ""
    return (
        f"\nInterrupted. Run the same command with --resume{instead} to go on from the last "
        f"checkpoint, {checkpoint} ([training] checkpoint_every and checkpoint_minutes set how "
        "often one is written)."
    )


def _paths_and_overrides(
    ctx: typer.Context, arguments: list[str]
) -> tuple[list[str], dict[str, Any]]:
    """The paths and the config overrides (--section.setting VALUE or =VALUE)
    among a command's free arguments; any other option is a usage error (not
    spaCy's parser, whose click exception typer shows as a traceback)."""
    paths: list[str] = []
    overrides: list[str] = []
    takes_value = False  # the last argument was a setting without =VALUE
    for arg in [*arguments, *ctx.args]:
        if not arg.startswith("--"):
            (overrides if takes_value else paths).append(arg)
            takes_value = False
            continue
        if "." not in arg.split("=", 1)[0]:
            ctx.fail(
                f"No such option: {arg}.{_close_option(ctx, arg)} Config settings are "
                "overridden as --section.setting VALUE, e.g. --training.max_epochs 2."
            )
        overrides.append(arg)
        takes_value = "=" not in arg
    return paths, parse_config_overrides(overrides)


def _close_option(ctx: typer.Context, arg: str) -> str:
    """' Did you mean --x?' for the command's option or config setting closest to `arg`."""
    from ..bilm import BiLMConfig
    from ..pretrain import PretrainConfig

    name = arg[2:].split("=", 1)[0]
    candidates = {f.name: f"bilm.{f.name}" for f in fields(BiLMConfig)}
    candidates |= {f.name: f"training.{f.name}" for f in fields(PretrainConfig)}
    options = [o[2:] for p in ctx.command.params for o in p.opts if o.startswith("--")]
    candidates |= {o: o for o in options if o != "help"}
    close = difflib.get_close_matches(name, candidates, n=1)
    close = close or difflib.get_close_matches(name.replace("-", "_"), candidates, n=1)
    return f" Did you mean --{candidates[close[0]]}?" if close else ""


PRESETS = {
    "default": "bilm.cfg",  # a word biLM sized for two CPU cores
    "elmo": "bilm_elmo.cfg",  # bilm-tf's char-CNN architecture, exportable with export-elmo
    "tiny": "bilm_tiny.cfg",  # seconds per epoch: for trying the pipeline out
    "lm1b": "bilm_lm1b.cfg",  # ELMo's recipe: the original shape, its vocabulary, 10 epochs
}


@app.command("init-config")
def init_config_command(
    output_file: Path = typer.Argument(
        ..., metavar="OUTPUT_FILE", help="Where to write the config (- for standard output)"
    ),
    preset: str = typer.Option(
        "default",
        help="default (word biLM for two CPU cores), elmo (bilm-tf's char CNN), lm1b (ELMo's "
        "recipe: the original shape and vocabulary) or tiny",
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing file"),
) -> None:
    """Write a shipped pretraining config, comments included, to edit and pass
    to `elmo-spacy pretrain`."""
    from importlib.resources import files

    with errors_to_exit():
        if preset not in PRESETS:
            raise ElmoSpacyError(f"--preset {preset!r}: use one of {', '.join(PRESETS)}")
        text = (files("elmo_spacy.pretrain") / "configs" / PRESETS[preset]).read_text("utf-8")
        if str(output_file) == "-":
            typer.echo(text, nl=False)
            return
        _write_new(output_file, text, overwrite)
    typer.echo(
        f"{output_file}: the {preset} pretraining config. Next: elmo-spacy pretrain "
        f"{output_file} CORPUS OUTPUT_DIR"
    )


@app.command("sample-text")
def sample_text_command(
    output_file: Path = typer.Argument(..., metavar="OUTPUT_FILE", help="Where to write the text"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing file"),
) -> None:
    """Write the sample text the package ships (159 made-up English sentences,
    a doc per line) to try pretraining on with `init-config --preset tiny`."""
    from importlib.resources import files

    with errors_to_exit():
        text = (files("elmo_spacy") / "data" / "sample.txt").read_text("utf-8")
        _write_new(output_file, text, overwrite)
    typer.echo(
        f"{output_file}: the sample text. Next: elmo-spacy pretrain CONFIG {output_file} OUTPUT_DIR"
    )


def _write_new(output_file: Path, text: str, overwrite: bool) -> None:
    if output_file.exists() and not overwrite:
        raise ElmoSpacyError(
            f"{output_file} exists: pass --overwrite to replace it, or name another file"
        )
    output_file.write_text(text, encoding="utf-8")
