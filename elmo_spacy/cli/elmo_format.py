"""`elmo-spacy convert-elmo` and `export-elmo` (bilm-tf's options.json +
weights.hdf5, in and out) and `convert-efml` (ELMoForManyLangs' models, in)."""

from pathlib import Path

import typer

from . import app, errors_to_exit


@app.command("convert-elmo")
def convert_elmo_command(
    inputs: list[Path] = typer.Argument(
        ...,
        metavar="MODEL_PATH|OPTIONS_JSON WEIGHTS_HDF5",
        help="A bilm-tf model: its folder (published, AllenNLP or NLPL layout) or NLPL .zip "
        "archive, or its two files, options and weights",
        show_default=False,
    ),
    output_dir: Path = typer.Argument(
        ..., metavar="OUTPUT_DIR", help="The biLM directory to write", show_default=False
    ),
) -> None:
    """Convert a bilm-tf model (the published ELMo models) into a biLM
    directory, which loads faster (docs/models.md)."""
    from functools import partial

    from tqdm import tqdm

    from ..bilm import load_bilm, save_bilm
    from ..bilm.formats.locate import BILM_DIR, BiLMLoadError, find_bilm

    if len(inputs) > 2:
        raise typer.BadParameter(
            f"got {len(inputs) + 1} paths; give MODEL_PATH OUTPUT_DIR, or OPTIONS_JSON "
            "WEIGHTS_HDF5 OUTPUT_DIR",
            param_hint="MODEL_PATH",
        )
    source = inputs[0] if len(inputs) == 1 else tuple(inputs)
    with errors_to_exit():
        if find_bilm(source)[0] == BILM_DIR:
            raise BiLMLoadError(
                f"{inputs[0]} is already a biLM directory: the elmo pipe (bilm_path) and "
                "load_bilm read it as it is, with nothing to convert."
            )
        progress = partial(tqdm, desc=f"reading {inputs[-1].name}", unit="dataset", leave=False)
        bilm = load_bilm(source, with_softmax=False, progress=progress)
        save_bilm(bilm, output_dir)
    config = bilm.config
    typer.echo(
        f"{' + '.join(map(str, inputs))}: {config.n_layers} x {config.lstm_dim} LSTM layers "
        f"projected to {config.projection_dim}, {sum(n for _, n in config.filters)} char "
        f"filters -> {output_dir}"
    )


@app.command("convert-efml")
def convert_efml_command(
    model_dir: Path = typer.Argument(
        ...,
        metavar="MODEL_DIR",
        help="An ELMoForManyLangs model folder, as unpacked from its archive",
        show_default=False,
    ),
    output_dir: Path = typer.Argument(
        ..., metavar="OUTPUT_DIR", help="The biLM directory to write", show_default=False
    ),
) -> None:
    """Convert an ELMoForManyLangs model (HIT-SCIR's, 44 languages) into a
    biLM directory (the model folder loads as it is, too)."""
    from ..bilm import load_bilm, save_bilm
    from ..bilm.formats.efml import EfmlFormatError
    from ..bilm.formats.locate import EFML, FORMATS, find_bilm

    with errors_to_exit():
        kind, _ = find_bilm(model_dir)  # says what is there if nothing is
        if kind != EFML:
            raise EfmlFormatError(
                f"{model_dir} is {FORMATS[kind].name}, not an ELMoForManyLangs model: "
                "elmo-spacy convert-elmo converts bilm-tf models; biLM directories need no "
                "conversion."
            )
        bilm = load_bilm(model_dir)
        save_bilm(bilm, output_dir)
    config = bilm.config
    reads = {"word_char": "words and characters", "char_cnn": "characters", "word": "words"}
    typer.echo(
        f"{model_dir}: {config.n_layers} x {config.lstm_dim} LSTM layers projected to "
        f"{config.projection_dim}, token encoder of {reads[config.encoder]} -> {output_dir}"
    )


@app.command("export-elmo")
def export_elmo_command(
    bilm_dir: Path = typer.Argument(..., exists=True, file_okay=False, help="A biLM directory"),
    output_dir: Path = typer.Argument(..., help="Writes options.json and weights.hdf5"),
) -> None:
    """Write a char-CNN biLM (e.g. pretrained with configs/bilm_elmo.cfg) in
    bilm-tf's format, for the runtimes that read the published ELMo models."""
    from ..bilm import load_bilm
    from ..bilm.formats.bilm_tf import write_bilm_tf

    with errors_to_exit():
        options, weights = write_bilm_tf(load_bilm(bilm_dir, with_softmax=False), output_dir)
    typer.echo(f"{options}\n{weights}")
