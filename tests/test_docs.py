"""The manual stays true: the reference is what the code gives, every link
between the documents leads somewhere, and the README stays short."""

import re
import runpy

import pytest

from .conftest import ROOT

DOCUMENTS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_reference_is_what_the_code_gives():
    reference = runpy.run_path(str(ROOT / "docs" / "make_reference.py"))["reference"]
    assert (ROOT / "docs" / "reference.md").read_text(encoding="utf-8") == reference(), (
        "docs/reference.md is stale: run python docs/make_reference.py"
    )


def anchors(text: str) -> set[str]:
    """GitHub's anchors of a markdown text's headings."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        anchor = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(anchor)
    return found


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_every_link_leads_to_a_file_and_heading_that_exist(document):
    text = re.sub(r"```.*?```", "", document.read_text(encoding="utf-8"), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        linked = (document.parent / path).resolve() if path else document
        assert linked.exists(), f"{document.name}: {target}"
        if anchor and linked.suffix == ".md":
            assert anchor in anchors(linked.read_text(encoding="utf-8")), (
                f"{document.name}: {target}"
            )


def test_the_readme_is_a_first_page():
    """It says what the package is (a paragraph under the title), then the
    two commands for a fresh machine, then how to install it."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300
    assert lines[:2] == ["# elmo_spacy", ""]
    commands = [
        "make all    # fresh machine: create .venv, install, run the AG News workflow (spacy project run all)",
        "make test   # fresh machine: create .venv, install, run the test suite",
    ]
    first = lines.index(commands[0])
    assert lines[first : first + 2] == commands
    assert lines[first - 2 : first] == ["", "```bash"]
    paragraph = lines[2 : first - 2]
    assert paragraph and all(
        line and not line.startswith(("#", "`", "-", "|")) for line in paragraph
    )
    assert first < lines.index("## Install") < lines.index("## Quick start")
