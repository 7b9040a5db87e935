"""Write docs/reference.md from the code: every command's --help, every setting
of the pretraining config and of the `elmo` pipe, every registered
architecture, and the formats on disk.

    python docs/make_reference.py          # rewrite docs/reference.md
    python docs/make_reference.py --check  # exit 1 if it is not what the code gives

tests/test_docs.py fails when docs/reference.md is stale.
"""

import argparse
import dataclasses
import inspect
import re
import sys
from pathlib import Path

REFERENCE = Path(__file__).parent / "reference.md"
COMMANDS = [  # in the order a user meets them; every other command follows
    "prepare",
    "pretrain",
    "init-config",
    "sample-text",
    "embed",
    "convert-elmo",
    "convert-efml",
    "export-elmo",
    "export",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="Compare, do not write")
    args = parser.parse_args()
    text = reference()
    if args.check:
        if REFERENCE.read_text(encoding="utf-8") != text:
            sys.exit(f"{REFERENCE} is stale: run python docs/make_reference.py")
        return
    REFERENCE.write_text(text, encoding="utf-8")


def reference() -> str:
    parts = [
        "# Reference\n\n"
        "Generated from the code by `python docs/make_reference.py`; do not edit by hand.\n"
        "The guides: [pipes](pipes.md), [pretraining](pretraining.md), "
        "[published models](models.md), [embedding](embedding.md), "
        "[precision and GPUs](precision-and-gpus.md).\n",
        commands(),
        pretraining_config(),
        pipe_settings(),
        architectures(),
        formats(),
    ]
    return "\n".join(parts)


def commands() -> str:
    from typer.testing import CliRunner

    from elmo_spacy.cli import app

    out = ["## Commands\n"]
    registered = [command.name for command in app.registered_commands if not command.hidden]
    for command in COMMANDS + [name for name in registered if name not in COMMANDS]:
        result = CliRunner().invoke(
            app, [command, "--help"], env={"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}
        )
        text = "\n".join(line.rstrip() for line in result.output.strip("\n").splitlines())
        out.append(f"### `elmo-spacy {command}`\n\n```text\n{text}\n```\n")
    return "\n".join(out)


def pretraining_config() -> str:
    from elmo_spacy.bilm import BiLMConfig
    from elmo_spacy.pretrain import PretrainConfig

    out = [
        "## Pretraining config\n",
        "A `.cfg` file of two sections (`elmo-spacy init-config` writes the shipped ones); "
        "`elmo-spacy pretrain` overrides any setting as `--section.setting VALUE`.\n",
    ]
    for section, cls in (("bilm", BiLMConfig), ("training", PretrainConfig)):
        out.append(f"### `[{section}]`\n")
        out.append(settings_table(cls, documented_fields(cls)))
    return "\n".join(out)


def documented_fields(cls) -> dict[str, str]:
    """Field name -> its description, from the class docstring's "name: ..."
    paragraphs (several names may share one: "a, b: ...")."""
    doc = inspect.getdoc(cls) or ""
    names = {f.name for f in dataclasses.fields(cls)}
    described: dict[str, str] = {}
    current: list[str] = []
    for line in doc.splitlines():
        match = re.match(r"^([a-z_][a-z_0-9, ]*):\s*(.*)$", line)
        if match and all(n.strip() in names for n in match[1].split(",")):
            current = [n.strip() for n in match[1].split(",")]
            for name in current:
                described[name] = match[2]
        elif current and line.startswith("    "):
            for name in current:
                described[name] += " " + line.strip()
        else:
            current = []
    return described


def settings_table(cls, described: dict[str, str]) -> str:
    rows = ["| setting | default | what |", "| --- | --- | --- |"]
    defaults = cls()
    for spec in dataclasses.fields(cls):
        default = getattr(defaults, spec.name)
        rows.append(f"| `{spec.name}` | `{default!r}` | {described.get(spec.name, '')} |")
    return "\n".join(rows) + "\n"


def pipe_settings() -> str:
    from spacy.language import Language

    import elmo_spacy  # noqa: F401  (registers the factory)
    from elmo_spacy.pipeline import Elmo

    meta = Language.get_factory_meta("elmo")
    doc = inspect.getdoc(Elmo) or ""
    described: dict[str, str] = {}
    current = None
    for line in doc.splitlines():
        match = re.match(r"^([a-z_]+): (.*)$", line)
        if match and match[1] in meta.default_config:
            current = match[1]
            described[current] = match[2]
        elif current and line.startswith("    "):
            described[current] += " " + line.strip()
        else:
            current = None
    rows = ["| setting | default | what |", "| --- | --- | --- |"]
    for name, default in meta.default_config.items():
        if name == "model":
            continue
        rows.append(f"| `{name}` | `{default!r}` | {described.get(name, '')} |")
    return (
        "## The `elmo` pipe\n\n"
        '`[components.elmo]` with `factory = "elmo"`; its model is '
        "`elmo_spacy.ElmoBiLM.v1` (below), which says how the biLM runs. Sets `"
        + "`, `".join(meta.assigns)
        + "`.\n\n"
        + "\n".join(rows)
        + "\n\n`[initialize.components.elmo]`: `bilm_path` (a biLM: see "
        "[published models](models.md#what-a-path-may-be)), or `untrained = true` for "
        "one of random weights.\n"
    )


def architectures() -> str:
    import spacy

    import elmo_spacy  # noqa: F401  (registers the architectures)

    out = ["## Architectures\n"]
    names = sorted(n for n in spacy.registry.architectures.get_all() if n.startswith("elmo_spacy."))
    for name in names:
        out.append(_registered(name, spacy.registry.architectures.get(name)))
    for kind, registry, name in (
        ("a config block", spacy.registry.misc, "elmo_spacy.RunSettings.v1"),
        ("a config block", spacy.registry.misc, "elmo_spacy.FineTuning.v1"),
        ("a biLM loader", spacy.registry.misc, "elmo_spacy.BiLMFolder.v1"),
        ("a biLM loader", spacy.registry.misc, "elmo_spacy.BilmTf.v1"),
        ("a biLM loader", spacy.registry.misc, "elmo_spacy.BilmTfFolder.v1"),
        ("a biLM loader", spacy.registry.misc, "elmo_spacy.ELMoForManyLangs.v1"),
        ("a schedule", spacy.registry.schedules, "elmo_spacy.slanted_triangular.v1"),
        ("a schedule", spacy.registry.schedules, "elmo_spacy.gradual_unfreezing.v1"),
    ):
        out.append(_registered(name, registry.get(name), f" ({kind})"))
    from elmo_spacy.loggers import release_training_caches
    from elmo_spacy.tokenizer import SurrogateSafeTokenizer, create_tokenizer

    doc = inspect.getdoc(release_training_caches) or ""
    out.append(f"### `elmo_spacy.ReleaseTrainingCaches.v1` (a logger)\n\n{doc}\n")
    doc = f"{inspect.getdoc(create_tokenizer)} {inspect.getdoc(SurrogateSafeTokenizer)}"
    out.append(f"### `elmo_spacy.Tokenizer.v1` (a tokenizer)\n\n{doc}\n")
    return "\n".join(out)


def _registered(name: str, function, kind: str = "") -> str:
    """A registered function's heading, arguments and docstring."""
    params = ", ".join(
        p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
        for p in inspect.signature(function).parameters.values()
    )
    return f"### `{name}`{kind}\n\n`{params}`\n\n{inspect.getdoc(function) or ''}\n"


def formats() -> str:
    from elmo_spacy.bilm.formats import directory
    from elmo_spacy.pretrain import corpus

    return (
        "## Formats on disk\n\n### A biLM directory\n\n"
        + (inspect.getdoc(directory) or "")
        + "\n\n### A prepared corpus\n\n"
        + (inspect.getdoc(corpus) or "").replace("\n    ", "\n    ")
        + "\n"
    )


if __name__ == "__main__":
    main()
