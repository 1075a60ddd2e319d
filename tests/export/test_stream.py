"""`fedac stream`'s decoder on a long recording with keywords at known positions.

The classifier here is a matched filter (the best cosine of the window with each keyword's waveform
within half a hop): its
posterior peaks exactly where a window is aligned with a keyword, so the decoder's own behaviour
(windowing, the silence gate, smoothing, threshold, refractory period) is what the tests see. The
keywords are noise bursts placed off the hop grid."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.signal import correlate

from fedac.errors import ConfigError
from fedac.export.predict import Classifier
from fedac.export.stream import StreamSettings, concatenate, score, stream

RATE = 1000  # (a low rate keeps the recording small; the decoder works in seconds)


class MatchedFilter(Classifier):
    """Logits from the best cosine of the window with each keyword's waveform over lags within
    half a hop (a keyword heard up to 50 ms off the window's start still matches)."""

    def __init__(self, templates: dict[str, np.ndarray], max_lag: int = RATE // 20):
        self.labels = list(templates)
        self.templates = [t / np.linalg.norm(t) for t in templates.values()]
        self.sample_rate, self.clip_samples, self.name = RATE, RATE, "matched filter"
        self.max_lag = max_lag

    def logits(self, rows):
        out = np.zeros((len(rows), len(self.labels)))
        for i, row in enumerate(rows):
            norm = max(float(np.linalg.norm(row)), 1e-9)
            for j, template in enumerate(self.templates):
                full = correlate(row, template, mode="full", method="fft")
                centre = len(template) - 1
                best = full[centre - self.max_lag : centre + self.max_lag + 1].max() / norm
                out[i, j] = 20.0 * best**3  # (sharp: unrelated sound scores near 0 for every word)
        return out


@pytest.fixture(scope="module")
def recording():
    rng = np.random.default_rng(0)
    words = {f"word{i}": (0.3 * rng.standard_normal(RATE)).astype(np.float32) for i in range(4)}
    order = ["word0", "word2", "word1", "word3", "word2", "word0", "word1"]
    audio, starts = concatenate([words[w] for w in order], RATE, 1.23)
    return MatchedFilter(words), audio, list(zip(starts, order))


def test_every_keyword_is_found_within_one_hop_without_false_alarms(recording):
    clf, audio, truth = recording
    s = StreamSettings(hop=0.1, smooth=1, threshold=0.7)
    found = stream(clf, audio, s)
    result = score(found, truth, s.hop)
    assert result["recall"] == 1.0 and result["false_alarms"] == 0
    # the keywords start off the hop grid (1.23 s of silence): the nearest window is at most half
    # a hop away
    assert max(min(abs(d.time - t) for t, _ in truth) for d in found) <= s.hop / 2 + 1e-9


def test_a_threshold_above_every_posterior_finds_nothing_and_silence_is_gated(recording):
    clf, audio, truth = recording
    assert stream(clf, audio, StreamSettings(threshold=1.0, smooth=1)) == []
    silence = np.zeros(5 * RATE, np.float32)
    assert stream(clf, silence, StreamSettings(threshold=0.01, gate_db=-50)) == []


def test_the_refractory_period_merges_keywords_closer_than_it(recording):
    clf, audio, truth = recording
    # keywords start 2.23 s apart: a 3 s refractory period keeps every second one at most
    found = stream(clf, audio, StreamSettings(smooth=1, refractory=3.0))
    assert len(found) < len(truth)
    assert min(b.time - a.time for a, b in zip(found, found[1:])) >= 3.0 - 1e-9


def test_smoothing_lowers_an_isolated_peak(recording):
    clf, audio, truth = recording
    sharp = stream(clf, audio, StreamSettings(smooth=1, threshold=0.5))
    smooth = stream(clf, audio, StreamSettings(smooth=5, threshold=0.5))
    # a matched filter's peak is one window wide: the centred average of 5 windows divides it
    assert len(sharp) == len(truth) and len(smooth) < len(truth)


def test_keywords_restrict_the_detections_and_unknown_ones_are_refused(recording):
    clf, audio, truth = recording
    found = stream(clf, audio, StreamSettings(smooth=1), keywords=["word2"])
    assert [d.label for d in found] == ["word2", "word2"]
    with pytest.raises(ConfigError, match="nope"):
        stream(clf, audio, StreamSettings(), keywords=["nope"])
    with pytest.raises(ConfigError, match="--threshold"):
        stream(clf, audio, StreamSettings(threshold=1.5))
