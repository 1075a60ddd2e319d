"""The forms a client's windows take (training/types.py: feature tensors, the SSL encoders' padded
waveforms and CTC targets, `features.augment`'s windows) and the checks of the methods that read
only some of them: they pass what they read through untouched and refuse the rest by name."""

from __future__ import annotations

import pytest
import torch

from fedac.config import load_config
from fedac.data.waveform import Padded
from fedac.training.local import train_supervised
from fedac.training.types import ClientData, class_labels, feature_windows


def _ctc_targets() -> Padded:
    return Padded.stack([torch.tensor([3, 4]), torch.tensor([5])], dtype=torch.long)


def test_feature_tensors_pass_through_untouched():
    x, y = torch.randn(2, 4, 5), torch.tensor([0, 1])
    assert feature_windows(x, "FedX") is x and class_labels(y, "FedX") is y


def test_padded_waveforms_and_ctc_targets_are_refused_naming_the_method():
    waves = Padded.stack([torch.randn(7), torch.randn(5)])
    with pytest.raises(TypeError, match="FedX reads feature windows, not the padded waveforms"):
        feature_windows(waves, "FedX")
    with pytest.raises(
        TypeError, match="FedX needs one class label per window, not CTC target sequences"
    ):
        class_labels(_ctc_targets(), "FedX")


def test_the_stacked_cohort_path_refuses_padded_waveforms():
    from fedac.training.stacking import CohortChunk

    waves = Padded.stack([torch.randn(7), torch.randn(5)])
    data = ClientData("c0", waves, torch.tensor([0, 1]), waves, torch.tensor([0, 1]))
    cfg = load_config(overrides=["train.batch_size=2"]).train
    with pytest.raises(TypeError, match="the stacked path reads feature windows"):
        CohortChunk([0], [data], cfg, 0, 0)


def test_train_supervised_refuses_ctc_targets_for_a_model_without_its_own_loss():
    cfg = load_config(overrides=["train.batch_size=2", "train.local_epochs=1"]).train
    model = torch.nn.Linear(3, 4)
    with pytest.raises(TypeError, match="CTC targets need a model with its own task_loss"):
        train_supervised(
            model, torch.randn(2, 3), _ctc_targets(), cfg, torch.Generator().manual_seed(0)
        )
