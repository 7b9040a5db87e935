"""`elmo-spacy convert-elmo` and `export-elmo`: bilm-tf's options.json + weights.hdf5, in and out."""

from pathlib import Path

import typer

from . import app, errors_to_exit


@app.command("convert-elmo")
def convert_elmo_command(
    options_json: Path = typer.Argument(..., exists=True, dir_okay=False, help="bilm-tf options"),
    weights_hdf5: Path = typer.Argument(..., exists=True, dir_okay=False, help="bilm-tf weights"),
    output_dir: Path = typer.Argument(..., help="The biLM directory to write"),
) -> None:
    """Convert a bilm-tf ELMo model (the published ELMo models' format) into a
    biLM directory for the `elmo` pipe (bilm_path) and `load_bilm`."""
    from tqdm import tqdm

    from ..bilm import save_bilm
    from ..bilm.bilm_tf import read_bilm_tf

    def progress(names):
        return tqdm(list(names), desc=f"reading {weights_hdf5.name}", unit="dataset", leave=False)

    with errors_to_exit():
        bilm = read_bilm_tf(options_json, weights_hdf5, progress)
        save_bilm(bilm, output_dir)
    config = bilm.config
    typer.echo(
        f"{config.n_layers} x {config.lstm_dim} LSTM layers projected to "
        f"{config.projection_dim}, {sum(n for _, n in config.filters)} char filters -> {output_dir}"
    )


@app.command("export-elmo")
def export_elmo_command(
    bilm_dir: Path = typer.Argument(..., exists=True, file_okay=False, help="A biLM directory"),
    output_dir: Path = typer.Argument(..., help="Writes options.json and weights.hdf5"),
) -> None:
    """Write a char-CNN biLM (e.g. pretrained with configs/bilm_elmo.cfg) in
    bilm-tf's format, for the runtimes that read the published ELMo models."""
    from ..bilm import load_bilm
    from ..bilm.bilm_tf import write_bilm_tf

    with errors_to_exit():
        options, weights = write_bilm_tf(load_bilm(bilm_dir, with_softmax=False), output_dir)
    typer.echo(f"{options}\n{weights}")
