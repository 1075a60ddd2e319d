"""Accuracy, macro-F1 and UAR on hand-computed confusions; per-client mean / std."""

from __future__ import annotations

import math

import pytest

from fedac.training.metrics import classification_metrics, mean_std


def test_three_class_confusion():
    y_true = [0, 0, 0, 1, 1, 2]
    y_pred = [0, 0, 1, 1, 2, 2]
    m = classification_metrics(y_true, y_pred)
    # 4 of 6 correct
    assert m["accuracy"] == pytest.approx(4 / 6)
    # class 0: P = 2/2, R = 2/3 -> F1 = 0.8; class 1: P = 1/2, R = 1/2 -> 0.5; class 2: P = 1/2, R =
    # 1 -> 2/3
    assert m["macro_f1"] == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)
    # UAR = mean recall = (2/3 + 1/2 + 1) / 3
    assert m["uar"] == pytest.approx((2 / 3 + 0.5 + 1.0) / 3)


def test_predicted_class_absent_from_truth():
    y_true = [0, 0, 1, 1]
    y_pred = [0, 2, 1, 1]
    m = classification_metrics(y_true, y_pred)
    assert m["accuracy"] == pytest.approx(0.75)
    # macro-F1 over classes in truth or prediction: class 0 F1 = 2 * 1 * 0.5 / 1.5 = 2/3, class 1 =
    # 1, class 2 = 0
    assert m["macro_f1"] == pytest.approx((2 / 3 + 1 + 0) / 3)
    # UAR over the classes present in truth: (1/2 + 1) / 2
    assert m["uar"] == pytest.approx(0.75)


def test_imbalanced_accuracy_differs_from_uar():
    y_true = [0] * 8 + [1] * 2
    y_pred = [0] * 10
    m = classification_metrics(y_true, y_pred)
    assert m["accuracy"] == pytest.approx(0.8)
    assert m["uar"] == pytest.approx(0.5)
    # class 0: P = 0.8, R = 1 -> F1 = 1.6 / 1.8; class 1: 0
    assert m["macro_f1"] == pytest.approx((1.6 / 1.8) / 2)


def test_empty_split_gives_nan():
    m = classification_metrics([], [])
    assert all(math.isnan(v) for v in m.values())
    assert set(m) == {"accuracy", "macro_f1", "uar"}


def test_mean_std_population_std_ignores_nan():
    mean, std = mean_std([0.5, 1.0, float("nan")])
    assert mean == pytest.approx(0.75)
    assert std == pytest.approx(0.25)  # population std of [0.5, 1.0]
    mean, std = mean_std([0.2, 0.4, 0.9])
    assert mean == pytest.approx(0.5)
    assert std == pytest.approx(math.sqrt(((0.3) ** 2 + 0.1**2 + 0.4**2) / 3))
    assert all(math.isnan(v) for v in mean_std([]))
    assert all(math.isnan(v) for v in mean_std([float("nan")]))
