"""A pretraining run's output folder (docs/pretraining.md, Pretraining): its
layout in one place. What an earlier run left (all but the prepared corpora
corpus/ and dev-corpus/) is what `--overwrite` removes and what makes a new
run refuse the folder without it.
"""

import re
import shutil
from pathlib import Path

from ..errors import ElmoSpacyError
from ..files import check_output_folder, write_file

MODEL_BEST, MODEL_LAST = "model-best", "model-last"
LOG_FILE = "pretrain_log.json"
LATEST = "latest-checkpoint"
PLOT = "perplexity.png"
CORPUS, DEV_CORPUS = "corpus", "dev-corpus"
CHECKPOINT_PREFIX = "checkpoint-"
PROGRESS_FILE = "progress.json"  # what a finished checkpoint holds last (checkpoint.py)


class RunFolder:
    """The output folder of a pretraining run at `path`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.model_best, self.model_last = self.path / MODEL_BEST, self.path / MODEL_LAST
        self.log, self.plot = self.path / LOG_FILE, self.path / PLOT
        self.corpus, self.dev_corpus = self.path / CORPUS, self.path / DEV_CORPUS

    def checkpoint(self, step: int) -> Path:
        return self.path / f"{CHECKPOINT_PREFIX}{step}"

    def point_to(self, checkpoint: Path) -> None:
        """Make `checkpoint` (complete, in place) the one to resume from (the
        pointer replaced atomically), then remove the older ones."""
        write_file(self.path / LATEST, lambda path: path.write_text(checkpoint.name + "\n"))
        for old in self.path.glob(f"{CHECKPOINT_PREFIX}*"):
            if old != checkpoint:
                shutil.rmtree(old, ignore_errors=True)

    def latest_checkpoint(self) -> Path | None:
        pointer = self.path / LATEST
        if not pointer.is_file():
            return None
        path = self.path / pointer.read_text().strip()
        if not (path / PROGRESS_FILE).is_file():
            raise ElmoSpacyError(
                f"{pointer} names {path.name}, which is missing or incomplete. Delete {pointer} "
                "to start over."
            )
        return path

    def earlier_run(self) -> list[str]:
        """The names of what an earlier run left here."""
        if not self.path.is_dir():
            return []
        outputs = (MODEL_BEST, MODEL_LAST, LOG_FILE, LATEST, PLOT)
        checkpoint = re.compile(re.escape(CHECKPOINT_PREFIX) + r"\d+")
        found = (p.name for p in self.path.iterdir())
        return sorted(n for n in found if n in outputs or checkpoint.fullmatch(n))

    def check(self, resume: bool = False, overwrite: bool = False) -> None:
        """Refuse a folder that cannot be made, or that holds an earlier run,
        unless `overwrite`, or with `resume`, a checkpoint to go on from."""
        if resume and overwrite:
            raise ElmoSpacyError("resume goes on from a run and overwrite replaces it: choose one.")
        check_output_folder(self.path)
        found = self.earlier_run()
        if overwrite or not found:
            return
        listed = ", ".join(found[:6]) + (", ..." if len(found) > 6 else "")
        if not resume:
            raise FileExistsError(
                f"{self.path} holds an earlier pretraining run ({listed}). Resume it "
                "(--resume: go on from its latest checkpoint), replace it (--overwrite: its "
                "models, checkpoints and log are deleted), or choose another output folder."
            )
        if self.latest_checkpoint() is None:
            raise FileExistsError(
                f"{self.path} holds an earlier pretraining run ({listed}) but no {LATEST} to "
                "resume from. Replace it (--overwrite: its models, checkpoints and log are "
                "deleted), or choose another output folder."
            )

    def nothing_to_resume(self) -> str | None:
        """Why a run cannot go on from this folder (`--resume`), or None."""
        try:
            if self.latest_checkpoint() is not None:
                return None
        except ElmoSpacyError as err:  # a pointer to a checkpoint that is gone
            return str(err)
        found = "does not exist" if not self.path.is_dir() else f"holds no {LATEST}"
        return (
            f"Nothing to resume in {self.path}: it {found}, so no run there wrote a "
            "checkpoint. Run the same command without --resume to start a new run, or give "
            "the output folder of the run to go on from."
        )

    def make(self, overwrite: bool = False) -> None:
        """Make the folder; `overwrite`: delete what an earlier run left there."""
        for name in self.earlier_run() if overwrite else ():
            path = self.path / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        self.path.mkdir(parents=True, exist_ok=True)
