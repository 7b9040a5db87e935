"""Installs on a fresh machine, in a new virtual environment (slow: `make test-slow`).

- `pip install ".[project]"` brings all that the `smoke` workflow needs;
- a pipeline made with the project's `package` step installs from the two
  wheels it writes (the plugin's and the pipeline's), and runs.
"""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .conftest import CONFIGS, ROOT

pytestmark = pytest.mark.slow


def sh(*args, cwd=None, env=None) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=env, timeout=3000)
    assert result.returncode == 0, (
        " ".join(map(str, args)) + "\n" + (result.stdout + result.stderr)[-4000:]
    )
    return result


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> Path:
    """A virtual environment with torch's CPU build and nothing else."""
    venv = tmp_path_factory.mktemp("venv")
    sh(sys.executable, "-m", "venv", str(venv))
    sh(str(venv / "bin" / "pip"), "install", "--quiet", "torch==2.13.0")
    return venv


def copy_of_the_repository(folder: Path) -> Path:
    """The repository without its outputs, so that builds leave the checkout alone."""
    ignore = (".venv", ".git", "corpus", "training", "metrics", "packages", "build")
    shutil.copytree(ROOT, folder, ignore=shutil.ignore_patterns(*ignore, "__pycache__"))
    return folder


def test_the_project_extra_runs_the_smoke_workflow(fresh_venv, tmp_path):
    source = copy_of_the_repository(tmp_path / "source")
    sh(str(fresh_venv / "bin" / "pip"), "install", "--quiet", f"{source}[project]")
    env = {"PATH": f"{fresh_venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    sh(
        str(fresh_venv / "bin" / "python"),
        "-m",
        "spacy",
        "project",
        "run",
        "smoke",
        cwd=source,
        env=env,
    )
    assert (source / "metrics" / "smoke" / "comparison.md").is_file()


def test_a_packaged_pipeline_installs_from_its_two_wheels(
    fresh_venv, tmp_path, corpus_dir, bilm_dir
):
    python = [sys.executable, "-m"]
    sh(
        *python,
        "spacy",
        "train",
        str(CONFIGS / "textcat_tiny.cfg"),
        "--output",
        str(tmp_path / "trained"),
        "--paths.train",
        str(corpus_dir / "train.spacy"),
        "--paths.dev",
        str(corpus_dir / "dev.spacy"),
        "--paths.bilm",
        str(bilm_dir),
    )
    packages = tmp_path / "packages"
    source = copy_of_the_repository(tmp_path / "source")
    sh(*python, "pip", "wheel", str(source), "--no-deps", "--quiet", "--wheel-dir", str(packages))
    (plugin,) = packages.glob("elmo_spacy-*.whl")
    with zipfile.ZipFile(plugin) as wheel:  # the plugin alone: no study, tests or configs
        tops = {name.split("/")[0] for name in wheel.namelist()}
    assert tops == {"elmo_spacy", "-".join(plugin.name.split("-")[:2]) + ".dist-info"}
    sh(
        *python,
        "spacy",
        "package",
        str(tmp_path / "trained" / "model-best"),
        str(packages),
        "--name",
        "elmo_test",
        "--version",
        "0.0.1",
        "--build",
        "wheel",
    )
    wheels = [*packages.glob("elmo_spacy-*.whl"), *packages.glob("en_elmo_test-*/dist/*.whl")]
    assert len(wheels) == 2, wheels
    sh(str(fresh_venv / "bin" / "pip"), "install", "--quiet", *map(str, wheels))
    code = "import spacy; nlp = spacy.load('en_elmo_test'); doc = nlp('Oil prices rose.'); print(doc._.elmo.shape, round(sum(doc.cats.values()), 3))"
    result = sh(str(fresh_venv / "bin" / "python"), "-c", code, cwd=tmp_path)
    assert result.stdout.strip() == "(3, 4, 32) 1.0"
