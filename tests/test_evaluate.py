"""Metrics, the report and the comparison table, on cases worked out by hand."""

import pytest

from elmo_spacy.compare import comparison_table, data_statement, update_readme
from elmo_spacy.evaluate import classification_metrics, classification_report


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


def test_table_and_readme_section(tmp_path):
    runs = [run("best", 0.9), run("other", 0.8)]
    table = comparison_table(runs)
    assert table.splitlines()[2].startswith("| best | 90.00% |")
    assert "1.5 min" in table and "12,346" in table
    statement = data_statement(runs)
    assert "18,192-row subset" in statement and "every figure is on dev" in statement
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- comparison:start -->\nold\n<!-- comparison:end -->\nrest\n")
    update_readme(readme, table)
    text = readme.read_text()
    assert "old" not in text and "| best |" in text and text.endswith("rest\n")
