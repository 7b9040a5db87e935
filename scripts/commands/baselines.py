"""`python -m scripts vectors` and `python -m scripts tfidf`: train the baselines' representations and models."""

import json
import time
from pathlib import Path

import typer

from . import app


@app.command("vectors")
def vectors_command(
    method: str = typer.Argument(..., help="svd (of PPMI), skipgram or cbow"),
    text_path: Path = typer.Argument(
        ..., exists=True, dir_okay=False, help="Text: .txt (a doc per line) or .jsonl"
    ),
    output_dir: Path = typer.Argument(..., help="A vectors-only spaCy pipeline"),
    dim: int = typer.Option(256, help="Vector width"),
    window: int = typer.Option(5, help="Context words on each side"),
    min_count: int = typer.Option(2, help="Leave out rarer words"),
    max_vocab_size: int = typer.Option(40_000, help="Keep at most this many words"),
    epochs: int = typer.Option(5, help="Passes over the text (skipgram, cbow)"),
    workers: int = typer.Option(
        1, help="Threads (skipgram, cbow); more are faster but not deterministic"
    ),
    seed: int = typer.Option(0),
    lang: str = typer.Option("en", help="Language of the spaCy tokenizer"),
) -> None:
    """Static word vectors on the same tokens as the biLM, written as a spaCy
    pipeline with vectors (like `spacy init vectors`), for a config's initialize.vectors."""
    import spacy

    from elmo_spacy.pretrain.texts import read_texts

    from ..baselines import train_static_vectors

    started = time.perf_counter()
    tokenizer = spacy.blank(lang).tokenizer  # the tokens `elmo-spacy prepare --lang` gives
    docs = [[t.text for t in doc] for doc in tokenizer.pipe(read_texts(text_path), batch_size=1000)]
    try:
        if not any(docs):
            raise ValueError(f"{text_path} has no words to train vectors on: is it the right file?")
        vectors = train_static_vectors(
            docs, method, dim, window, min_count, max_vocab_size, epochs, seed, workers
        )
    except ValueError as err:
        typer.secho(str(err), fg="red", err=True)
        raise typer.Exit(1) from err
    vectors.to_spacy(output_dir, lang)
    seconds = time.perf_counter() - started
    log = {"method": method, "words": len(vectors.words), "dim": dim, "window": window}
    (output_dir / "train_time.json").write_text(json.dumps({**log, "seconds": seconds}, indent=2))
    typer.echo(
        f"{len(vectors.words):,} {method} vectors of width {dim} in {seconds:.0f} s -> {output_dir}"
    )


@app.command("tfidf")
def tfidf_command(
    corpus_dir: Path = typer.Argument(..., exists=True, file_okay=False, help="Holds train.spacy"),
    output_dir: Path = typer.Argument(..., help="Writes model/ and train_time.json"),
    ngram_max: int = typer.Option(2, help="Word n-grams from 1 to this"),
    c: float = typer.Option(0.5, "--C", help="SVM penalty (0.5 chosen on dev)"),
) -> None:
    """TF-IDF + linear SVM on the training docs' texts; `python -m scripts evaluate` scores it."""
    import spacy
    from spacy.tokens import DocBin

    from ..baselines.tfidf import TfidfClassifier

    docs = list(DocBin().from_disk(corpus_dir / "train.spacy").get_docs(spacy.blank("en").vocab))
    started = time.perf_counter()
    model = TfidfClassifier(ngram_max=ngram_max, C=c).fit(
        [doc.text for doc in docs], [max(doc.cats, key=doc.cats.get) for doc in docs]
    )
    model.to_disk(output_dir / "model")
    seconds = time.perf_counter() - started
    (output_dir / "train_time.json").write_text(json.dumps({"seconds": seconds}, indent=2) + "\n")
    typer.echo(f"Trained in {seconds:.0f} s -> {output_dir / 'model'}")
