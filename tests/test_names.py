"""Every dotted `elmo_spacy.…` name that the docs and the package's own
docstrings and comments give resolves to a module or an object: a name that
moved is caught here, not by a reader."""

import importlib
import re
from pathlib import Path

import pytest

from .conftest import ROOT

NAME = re.compile(r"(?<![\"'])\belmo_spacy(?:\.[A-Za-z_][A-Za-z0-9_]*)+")  # not a string's start
# Registered names (architectures, schedules, loggers...), not Python objects.
REGISTERED = re.compile(r"elmo_spacy\.[A-Za-z_][A-Za-z0-9_]*\.v\d+")
SOURCES = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "elmo_spacy").rglob("*.py")),
]


def resolves(name: str) -> bool:
    """Whether `name` is a module, or an attribute (of an attribute...) of one."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for attribute in parts[split:]:
                target = getattr(target, attribute)
        except AttributeError:
            return False
        return True
    return False


def registered(name: str) -> bool:
    """Whether `name` is in one of spaCy's and thinc's registries."""
    import spacy

    import elmo_spacy  # noqa: F401  (registers the package's functions)

    return any(spacy.registry.has(r, name) for r in spacy.registry.get_registry_names())


def dotted_names(path: Path) -> set[str]:
    text = REGISTERED.sub("", path.read_text(encoding="utf-8"))
    return {name.rstrip(".") for name in NAME.findall(text)}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_dotted_name_resolves(path):
    stale = sorted(name for name in dotted_names(path) if not resolves(name))
    assert not stale, f"{path.relative_to(ROOT)} names what does not exist: {stale}"


@pytest.mark.parametrize(
    "path",
    [path for path in SOURCES if path.name != "CHANGELOG.md"],  # it keeps names renamed since
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_every_registered_name_is_registered(path):
    text = path.read_text(encoding="utf-8")
    unknown = sorted({name for name in REGISTERED.findall(text) if not registered(name)})
    assert not unknown, f"{path.relative_to(ROOT)} names unregistered functions: {unknown}"
