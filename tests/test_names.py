"""The docs name what exists: every dotted `elmo_spacy.…` name that README,
CHANGELOG and docs/ give resolves to a module or an object, and every
registered name they give (`elmo_spacy.<Name>.v1`) is in spaCy's registries.
A name that moved is caught here, not by a reader."""

import importlib
import re

from .conftest import ROOT

NAME = re.compile(r"(?<![\"'])\belmo_spacy(?:\.[A-Za-z_][A-Za-z0-9_]*)+")  # not a string's start
# Registered names (architectures, schedules, loggers...), not Python objects.
REGISTERED = re.compile(r"elmo_spacy\.[A-Za-z_][A-Za-z0-9_]*\.v\d+")
DOCUMENTS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


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


def test_every_dotted_name_in_the_docs_resolves():
    stale = {}
    for path in DOCUMENTS:
        text = REGISTERED.sub("", path.read_text(encoding="utf-8"))
        names = {name.rstrip(".") for name in NAME.findall(text)}
        if missing := sorted(name for name in names if not resolves(name)):
            stale[path.name] = missing
    assert not stale, f"the docs name what does not exist: {stale}"


def test_every_registered_name_in_the_docs_is_registered():
    import spacy

    import elmo_spacy  # noqa: F401  (registers the package's functions)

    registries = spacy.registry.get_registry_names()
    unknown = {}
    for path in DOCUMENTS:
        if path.name == "CHANGELOG.md":  # it keeps names renamed since
            continue
        names = set(REGISTERED.findall(path.read_text(encoding="utf-8")))
        if missing := sorted(
            n for n in names if not any(spacy.registry.has(r, n) for r in registries)
        ):
            unknown[path.name] = missing
    assert not unknown, f"the docs name unregistered functions: {unknown}"
