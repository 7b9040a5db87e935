"""The classical reference: TF-IDF of word uni- and bigrams and a linear SVM (scikit-learn)."""

import json
from collections.abc import Sequence
from pathlib import Path

import numpy


class TfidfClassifier:
    """Lower-cased word n-grams (1 to `ngram_max`), sublinear TF-IDF, L2-normalised,
    and a one-vs-rest linear SVM with penalty `C`.

    Saved as JSON (settings, vocabulary, classes) and .npy arrays (idf, weights):
    no pickles."""

    def __init__(
        self, ngram_max: int = 2, C: float = 0.5, min_df: int = 1, vocabulary: dict | None = None
    ) -> None:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.svm import LinearSVC

        self.settings = {"ngram_max": ngram_max, "C": C, "min_df": min_df}
        self.vectorizer = TfidfVectorizer(
            ngram_range=(1, ngram_max),
            min_df=min_df,
            vocabulary=vocabulary,
            sublinear_tf=True,
            dtype=numpy.float32,
        )
        self.svm = LinearSVC(C=C)

    def fit(self, texts: Sequence[str], labels: Sequence[str]) -> "TfidfClassifier":
        self.svm.fit(self.vectorizer.fit_transform(texts), labels)
        return self

    def predict(self, texts: Sequence[str]) -> list[str]:
        return [str(label) for label in self.svm.predict(self.vectorizer.transform(texts))]

    @property
    def labels(self) -> list[str]:
        return [str(label) for label in self.svm.classes_]

    @staticmethod
    def is_saved_in(path: Path) -> bool:
        return (path / "settings.json").is_file() and (path / "coef.npy").is_file()

    def to_disk(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        vocabulary = {term: int(i) for term, i in self.vectorizer.vocabulary_.items()}
        meta = {**self.settings, "classes": self.labels}
        (path / "settings.json").write_text(json.dumps(meta, indent=2) + "\n")
        (path / "vocabulary.json").write_text(json.dumps(vocabulary))
        numpy.save(path / "idf.npy", self.vectorizer.idf_.astype(numpy.float32))
        numpy.save(path / "coef.npy", self.svm.coef_.astype(numpy.float32))
        numpy.save(path / "intercept.npy", self.svm.intercept_.astype(numpy.float32))

    @classmethod
    def from_disk(cls, path: Path) -> "TfidfClassifier":
        meta = json.loads((path / "settings.json").read_text())
        vocabulary = json.loads((path / "vocabulary.json").read_text())
        model = cls(meta["ngram_max"], meta["C"], meta["min_df"], vocabulary=vocabulary)
        model.vectorizer.idf_ = numpy.load(path / "idf.npy", allow_pickle=False)
        model.svm.coef_ = numpy.load(path / "coef.npy", allow_pickle=False)
        model.svm.intercept_ = numpy.load(path / "intercept.npy", allow_pickle=False)
        model.svm.classes_ = numpy.array(meta["classes"])
        return model
