"""Metrics, the report and the comparison table, on cases worked out by hand."""

import json

import pytest

from scripts.compare import (
    accuracy_by_name,
    comparison_table,
    data_statement,
    load_runs,
    update_section,
)
from scripts.evaluate import classification_metrics, classification_report


def test_metrics_match_a_hand_computed_case():
    gold = ["a", "a", "a", "b", "b", "c"]
    pred = ["a", "a", "b", "b", "c", "c"]
    m = classification_metrics(gold, pred, ["a", "b", "c"])
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert m["confusion_matrix"] == [[2, 1, 0], [0, 1, 1], [0, 0, 1]]
    assert m["per_class"]["a"] == {"precision": 1.0, "recall": 2 / 3, "f1": 0.8, "support": 3}
    assert m["per_class"]["b"]["precision"] == 0.5 and m["per_class"]["b"]["recall"] == 0.5
    assert m["per_class"]["c"]["f1"] == pytest.approx(2 / 3)
    assert m["macro_f1"] == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)
    report = classification_report(m)
    assert "macro avg" in report and "0.6667" in report


def test_a_class_never_predicted_scores_zero_not_nan():
    m = classification_metrics(["a", "b"], ["a", "a"], ["a", "b"])
    assert m["per_class"]["b"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}


def run(name, accuracy):
    dev = classification_metrics(["x", "y"], ["x", "y"], ["x", "y"])
    dev["accuracy"] = accuracy
    dev["inference"] = {"words_per_second": 12345.6}
    return {
        "name": name,
        "splits": {"dev": dev},
        "train_seconds": 90,
        "data": {
            "train_rows_read": 18192,
            "docs": {"train": 17283, "dev": 909},
            "dev_fraction": 0.05,
            "has_test": False,
        },
    }


def test_table_and_results_section(tmp_path):
    runs = [run("best", 0.9), run("other", 0.8)]
    runs[0]["size_mb"] = 12.34
    table = comparison_table(runs)
    assert table.splitlines()[2].startswith("| best | 90.00% |")
    assert table.splitlines()[2].endswith("| 1.5 min | 12,346 | 12.3 MB |")
    assert table.splitlines()[3].endswith("| n/a |")
    statement = data_statement(runs)
    assert "18,192-row subset" in statement and "every figure is on dev" in statement
    results = tmp_path / "results.md"
    results.write_text("intro\n<!-- comparison:start -->\nold\n<!-- comparison:end -->\nrest\n")
    update_section(results, table)
    text = results.read_text()
    assert "old" not in text and "| best |" in text and text.endswith("rest\n")


def test_runs_that_share_a_name_are_seeds_of_one_bar(tmp_path):
    runs = [run("a", 0.9), run("a", 0.92), run("b", 0.8)]
    by_name = accuracy_by_name(runs)
    assert by_name == {"a": [90.0, 92.0], "b": [80.0]}
    pytest.importorskip("matplotlib")
    from scripts.plots import plot_accuracy

    assert plot_accuracy(by_name, tmp_path / "accuracy.png", "dev").stat().st_size > 1000


def test_compare_reads_every_metrics_file_of_a_folder(tmp_path):
    (tmp_path / "smoke").mkdir()
    for name, accuracy, path in [
        ("b", 0.8, "b.json"),
        ("a", 0.9, "a.json"),
        ("s", 1.0, "smoke/s.json"),
    ]:
        (tmp_path / path).write_text(json.dumps(run(name, accuracy)))
    assert [r["name"] for r in load_runs([tmp_path])] == ["a", "b"]
    with pytest.raises(ValueError, match="No text classification metrics"):
        (tmp_path / "empty").mkdir()
        load_runs([tmp_path / "empty"])


def test_branch_accuracy_scores_each_part_alone(bilm_dir, corpus_dir):
    import numpy

    from scripts.evaluate import branch_accuracy

    from ..conftest import SCALAR_MIX, examples, make_nlp
    from .conftest import with_bag_of_words

    nlp = make_nlp(bilm_dir, SCALAR_MIX, 0.0, textcat_model=with_bag_of_words())
    train = examples(nlp, corpus_dir / "train.spacy")
    optimizer = nlp.initialize(lambda: train)
    nlp.update(train[:16], sgd=optimizer)
    nlp.update(train[16:32], sgd=optimizer)
    linear, deep = nlp.get_pipe("textcat").model.layers[0].layers
    docs = list(nlp.pipe([eg.reference.text for eg in train[:12]]))
    # Against the labels the linear part picks: it scores 1, the BiLSTM its share.
    labels = list(nlp.get_pipe("textcat").labels)
    gold = [labels[i] for i in linear.predict(docs).argmax(axis=1)]
    parts = branch_accuracy(nlp.get_pipe("textcat").model, docs, gold, labels)
    assert parts["linear_model"] == 1.0
    assert parts["bilstm"] == numpy.mean(
        deep.predict(docs).argmax(axis=1) == [labels.index(g) for g in gold]
    )
