"""FA / FR of keyword spotting (metrics.false_accept_reject, training.evaluate.kws_rates) on a hand
confusion."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedac.engine.data import EvalSplit
from fedac.training.evaluate import kws_rates
from fedac.training.metrics import false_accept_reject

# Classes 0, 1 keywords; 2, 3 negatives (silence, unknown). Pairs (true, predicted):
# (0,0) accept; (0,2) false reject; (1,1) accept; (2,0) false accept; (3,3) reject; (3,1) false
# accept; (1,3) false reject; (2,1) false accept; (0,1) keyword confusion: neither. M = 9: FA 3/9,
# FR 2/9.
TRUE = [0, 0, 1, 2, 3, 3, 1, 2, 0]
PRED = [0, 2, 1, 0, 3, 1, 3, 1, 1]


def test_fa_fr_on_a_hand_confusion():
    rates = false_accept_reject(TRUE, PRED, [2, 3])
    assert rates == pytest.approx({"fa": 3 / 9, "fr": 2 / 9})
    assert false_accept_reject(TRUE, TRUE, [2, 3]) == {"fa": 0.0, "fr": 0.0}


class Fixed(nn.Module):
    """Logits that predict PRED[i] for the window whose single feature value is i."""

    def forward(self, x):
        return nn.functional.one_hot(torch.tensor(PRED)[x[:, 0, 0].long()], 4).float()


def test_kws_rates_uses_the_silence_and_unknown_classes_by_name():
    split = EvalSplit(torch.arange(9).float().view(9, 1, 1), torch.arange(9), torch.tensor(TRUE))
    classes = ["yes", "no", "_silence_", "_unknown_"]
    assert kws_rates(Fixed(), split, classes) == pytest.approx({"fa": 3 / 9, "fr": 2 / 9})
    # 35-class task: no negatives, no FA/FR
    assert kws_rates(Fixed(), split, ["a", "b", "c", "d"]) == {}
