"""`elmo-spacy export`: a biLM as an ONNX model and a torch.export program,
to serve outside Python and spaCy."""

from pathlib import Path

import typer

from ..bilm.formats.locate import layouts_help
from ..bilm.runner import RunSettings
from . import app, errors_to_exit


@app.command("export")
def export_command(
    bilm_path: Path = typer.Argument(
        ...,
        exists=True,
        metavar="MODEL",
        help="A biLM: "
        + layouts_help()
        + ": then MODEL is its options .json, and --weight-file its weights",
    ),
    output_dir: Path = typer.Argument(..., metavar="OUTPUT_DIR", help="The folder to write"),
    weight_file: Path = typer.Option(
        None,
        "--weight-file",
        help="The weights .hdf5 of the bilm-tf model whose options .json is MODEL (any names, "
        "any folders)",
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace an earlier export in OUTPUT_DIR"
    ),
    formats: list[str] = typer.Option(
        ["onnx", "torch-export"],
        "--format",
        help="onnx (bilm.onnx) and/or torch-export (bilm.pt2); repeat for both (the default)",
    ),
    state: str = typer.Option(
        RunSettings.state,
        help="LSTM state every sentence starts from: zero, or primed by a warm-up text",
    ),
    warmup_file: Path = typer.Option(
        None,
        exists=True,
        dir_okay=False,
        help="Warm-up sentences of --state primed, tokens separated by spaces, one a line "
        "(default: shipped sentences)",
    ),
    with_states: bool = typer.Option(
        False,
        "--with-states",
        help="LSTM states as inputs and outputs, to carry from batch to batch (docs/embedding.md)",
    ),
    quantize: str = typer.Option(
        None, help="int8: bilm.onnx's matrix products in int8 (faster; docs/embedding.md)"
    ),
) -> None:
    """Write a biLM for serving (docs/embedding.md): bilm.onnx and bilm.pt2,
    which take per-token ids and give the layers, and inputs.json, which says
    how to make the ids from tokens."""
    from ..bilm import load_bilm
    from ..bilm.formats.exported import EXPORT_FILES, check_export, export_bilm
    from ..bilm.runner import Runner
    from ..errors import ElmoSpacyError
    from ..files import write_directory
    from .embed import read_lines

    with errors_to_exit():
        check_export(formats, quantize)
        if with_states and state != RunSettings.state:
            raise ElmoSpacyError("--with-states takes the states as inputs: leave --state zero")
        earlier = sorted(p.name for p in output_dir.glob("*") if p.name in EXPORT_FILES)
        if earlier and not overwrite:  # other files: refused, and kept, by write_directory
            raise FileExistsError(
                f"{output_dir} holds an earlier export ({', '.join(earlier)}): pass --overwrite "
                "to replace it, or name another folder"
            )
        warmup = None if warmup_file is None else list(read_lines(warmup_file))
        settings = RunSettings(state=state, warmup=warmup or None)
        bilm = load_bilm(
            bilm_path if weight_file is None else (bilm_path, weight_file), with_softmax=False
        )
        initial_states = Runner(bilm, settings).initial_states()
        written: list[Path] = []

        def write(folder: Path) -> None:
            written.extend(
                export_bilm(
                    bilm,
                    folder,
                    formats=formats,
                    initial_states=initial_states,
                    with_states=with_states,
                    quantize=quantize,
                )
            )

        write_directory(output_dir, write, owned=EXPORT_FILES)
    for path in written:
        typer.echo(str(output_dir / path.name))
