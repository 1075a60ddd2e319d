"""SSL speech encoders and the speech tasks beyond classification (issue 16): checkpoint loading and
its errors, exits, heads, the waveform data path, LibriSpeech / VoxCeleb1 loaders and stand-ins, WER
/ CER / EER by hand, and federated runs from the CLI."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from fedac.cli import main
from fedac.config import load_config
from fedac.data.text import VOCAB, encode, greedy_ctc
from fedac.data.waveform import Padded
from fedac.engine.data import EvalSplit
from fedac.engine.execution import stacking_obstacle
from fedac.errors import DatasetError, EncoderError
from fedac.models import build_model, count_parameters
from fedac.models.ssl import (
    encoder_layers,
    frame_lengths,
    load_encoder,
    size_config,
    stats_pool,
)
from fedac.training.metrics import equal_error_rate, transcription_metrics

pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Tiny random checkpoints written with save_pretrained: pretraining, CTC and HuBERT."""
    from transformers import HubertConfig, HubertModel, Wav2Vec2ForCTC, Wav2Vec2ForPreTraining

    root = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    models = {
        "pre": Wav2Vec2ForPreTraining(size_config("w2v2_tiny")),
        "ctc": Wav2Vec2ForCTC(size_config("w2v2_tiny")),
    }
    hubert = size_config("w2v2_tiny").to_dict()
    hubert.pop("model_type", None)
    models["hubert"] = HubertModel(
        HubertConfig(**{k: v for k, v in hubert.items() if k in HubertConfig().to_dict()})
    )
    for name, model in models.items():
        model.save_pretrained(root / name)
    return root, models


@pytest.fixture(scope="module")
def librispeech_root(tmp_path_factory):
    from fedac.data.synth.librispeech import generate

    out = tmp_path_factory.mktemp("librispeech")
    generate(
        out, speakers=3, utterances=4, eval_speakers=1, eval_utterances=2, workers=1, progress=False
    )
    return out


@pytest.fixture(scope="module")
def voxceleb_root(tmp_path_factory):
    from fedac.data.synth.voxceleb1 import generate

    out = tmp_path_factory.mktemp("voxceleb1")
    generate(out, speakers=3, utterances=6, trial_speakers=3, trials=12, workers=1, progress=False)
    return out


def _copy(src, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


# --------------------------------------------------------------------------- loading and errors


@pytest.mark.slow
def test_pretraining_ctc_and_hubert_checkpoints_load_into_the_bare_encoder(checkpoints):
    root, models = checkpoints
    for name, inner in (
        ("pre", models["pre"].wav2vec2),
        ("ctc", models["ctc"].wav2vec2),
        ("hubert", models["hubert"]),
    ):
        encoder = load_encoder(root / name)
        expected = inner.state_dict()
        loaded = encoder.state_dict()
        assert set(loaded) <= set(expected)
        assert all(torch.equal(loaded[k], expected[k]) for k in loaded), name
        assert encoder.config.layerdrop == 0.0 and encoder.config.apply_spec_augment is False


def test_encoder_path_sets_the_global_model_weights(checkpoints):
    root, models = checkpoints
    cfg = load_config(overrides=["model.name=w2v2_tiny", f"model.encoder_path={root / 'pre'}"])
    model = build_model("w2v2_tiny", 64, 5, 0.1, "classification", cfg.model)
    want = models["pre"].wav2vec2.encoder.layers[1].attention.q_proj.weight
    assert torch.equal(model.encoder.layers[1].attention.q_proj.weight, want)
    random = build_model(
        "w2v2_tiny",
        64,
        5,
        0.1,
        "classification",
        load_config(overrides=["model.name=w2v2_tiny"]).model,
    )
    assert not torch.equal(random.encoder.layers[1].attention.q_proj.weight, want)


@pytest.mark.parametrize(
    "damage, message",
    [
        ("missing", "does not exist"),
        ("no_config", "holds no config.json"),
        ("bad_json", "is not valid JSON"),
        ("wrong_type", "model_type 'bert'"),
        ("no_weights", "holds no weights"),
    ],
)
def test_broken_checkpoint_folders_get_fedacs_own_error(checkpoints, tmp_path, damage, message):
    folder = _copy(checkpoints[0] / "pre", tmp_path)
    if damage == "missing":
        folder = tmp_path / "nowhere"
    elif damage == "no_config":
        (folder / "config.json").unlink()
    elif damage == "bad_json":
        (folder / "config.json").write_text("{not json")
    elif damage == "wrong_type":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    else:
        (folder / "model.safetensors").unlink()
    with pytest.raises(EncoderError, match=message) as err:
        load_encoder(folder)
    assert "model.encoder_path" in str(err.value) and str(folder) in str(err.value)
    assert "save_pretrained" in str(err.value)  # the fix


# --------------------------------------------------------------------------- encoder, exits, heads


def _reference_run(encoder, seconds=(1.0, 0.7)):
    torch.manual_seed(1)
    samples = torch.tensor([int(16000 * s) for s in seconds])
    wav = torch.randn(len(seconds), int(samples.max()))
    attention = (torch.arange(wav.shape[1]) < samples[:, None]).long()
    wav = wav * attention
    encoder.eval()
    with torch.no_grad():
        ref = encoder(wav, attention_mask=attention, output_hidden_states=True)
        feats = encoder.feature_extractor(wav).transpose(1, 2)
    mask = torch.arange(feats.shape[1]) < frame_lengths(encoder.config, samples)[:, None]
    return ref, feats, mask


@pytest.mark.parametrize("stable", [False, True])
def test_encoder_layers_is_the_encoder_forward_stopped_at_a_depth(stable):
    from transformers import Wav2Vec2Model

    config = size_config("w2v2_tiny")
    if stable:
        config.do_stable_layer_norm, config.feat_extract_norm = True, "layer"
    torch.manual_seed(0)
    encoder = Wav2Vec2Model(config)
    ref, feats, mask = _reference_run(encoder)
    with torch.no_grad():
        hidden, _ = encoder.feature_projection(feats)
        full = encoder_layers(encoder.encoder, hidden, mask)
        assert (full - ref.last_hidden_state)[mask].abs().max() < 1e-5
        if not stable:  # post-LN: hidden_states[L] is exactly the output of layers[:L]
            for depth in (1, 2, 3):
                assert (
                    encoder_layers(encoder.encoder, hidden, mask, depth) - ref.hidden_states[depth]
                )[mask].abs().max() < 1e-5


def test_frame_lengths_follow_the_conv_stack():
    # 16000 samples: (16000-10)//5+1 = 3199 -> 1599 -> 799 -> 399 -> 199 -> 99 -> 49 (kernels
    # 3,3,3,3,2,2; stride 2)
    assert frame_lengths(size_config("w2v2_tiny"), torch.tensor([16000, 400, 399])).tolist() == [
        49,
        1,
        0,
    ]


def test_named_sizes():
    counts = {
        name: count_parameters(
            build_model(
                name,
                1,
                10,
                0.1,
                "classification",
                load_config(overrides=["model.freeze_cnn=false"]).model,
            )
        )
        for name in ("w2v2_tiny", "w2v2_s")
    }
    # the spec measured 2.79M for s (12 x 128, FFN 512, conv 7 x 128)
    assert 2.7e6 < counts["w2v2_s"] < 2.9e6
    assert counts["w2v2_tiny"] < counts["w2v2_s"]
    with pytest.raises(Exception, match="w2v2_tiny"):
        build_model("w2v2_huge", 1, 10)


def test_stats_pool_uses_only_valid_frames():
    hidden = torch.tensor([[[1.0], [3.0], [100.0]], [[2.0], [2.0], [2.0]]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    pooled = stats_pool(hidden, mask)
    # mean of (1, 3) = 2, std = 1; mean 2, std 0 (+ the 1e-5 floor inside the sqrt)
    assert torch.allclose(pooled, torch.tensor([[2.0, 1.0], [2.0, 0.0]]), atol=4e-3)


def test_greedy_ctc_decoding_by_hand():
    a, b, space, blank = VOCAB.index("a"), VOCAB.index("b"), VOCAB.index(" "), 0
    assert greedy_ctc([a, a, blank, a, space, space, b, b, blank]) == "aa b"
    assert greedy_ctc([blank, blank]) == ""
    assert encode("It's  A") == [VOCAB.index(c) for c in "it's a"]


def _tiny(kind, **options):
    cfg = load_config(
        overrides=["model.name=w2v2_tiny", *[f"model.{k}={v}" for k, v in options.items()]]
    )
    torch.manual_seed(0)
    return build_model("w2v2_tiny", 64, len(VOCAB) if kind == "ctc" else 4, 0.0, kind, cfg.model)


def test_settings_change_the_model():
    base = _tiny("ctc")
    assert (
        base.depth == 4
        and base.cnn is None
        and not any(k.startswith("cnn.") for k in base.state_dict())
    )
    assert base.lstm.hidden_size == 64
    assert _tiny("ctc", ctc_hidden=16).lstm.hidden_size == 16
    assert _tiny("ctc", freeze_cnn="false").cnn is not None
    shallow = _tiny("classification", encoder_depth=2)
    x = Padded(torch.randn(2, 30, 64), torch.tensor([30, 20]))
    shallow.eval()
    with torch.no_grad():
        hidden, mask = shallow.frames(x)
        assert torch.equal(shallow.hidden(x)[0], encoder_layers(shallow.encoder, hidden, mask, 2))
    with pytest.raises(EncoderError, match="model.encoder_depth=9"):
        _tiny("classification", encoder_depth=9)


def test_ctc_loss_and_transcripts_run_on_padded_batches():
    model = _tiny("ctc")
    x = Padded(torch.randn(2, 40, 64), torch.tensor([40, 25]))
    y = Padded(torch.tensor([[3, 4, 5], [6, 7, 0]]), torch.tensor([3, 2]))
    loss = model.task_loss(x, y)
    assert torch.isfinite(loss) and loss > 0
    loss.backward()
    assert model.encoder.layers[0].attention.q_proj.weight.grad is not None
    texts = model.transcribe(x)
    assert len(texts) == 2 and all(set(t) <= set(VOCAB[1:]) for t in texts)


def test_padded_batches_trim_to_their_longest_member():
    p = Padded.stack([torch.ones(5, 2), torch.ones(2, 2), torch.ones(3, 2)])
    assert p.shape[:2] == (3, 5) and len(p) == 3
    sub = p[torch.tensor([1, 2])]
    assert sub.values.shape == (2, 3, 2) and sub.lengths.tolist() == [2, 3]
    assert sub.mask().tolist() == [[True, True, False], [True, True, True]]
    assert [len(c) for c in p.split(2)] == [2, 1]


# --------------------------------------------------------------------------- metrics by hand


def test_wer_and_cer_by_hand():
    # 1 substitution + 1 deletion over 5 reference words
    assert transcription_metrics(["a b c", "d e"], ["a x c", "d"])["wer"] == pytest.approx(2 / 5)
    # 1 insertion over 3 words; 1 substitution over 3 characters
    assert transcription_metrics(["the cat sat"], ["the cat sat down"])["wer"] == pytest.approx(
        1 / 3
    )
    assert transcription_metrics(["abc"], ["abd"])["cer"] == pytest.approx(1 / 3)
    assert transcription_metrics(["abc def"], [""])["wer"] == pytest.approx(1.0)


def test_eer_by_hand():
    # accept score >= t. targets 0.9 0.8 0.3, non-targets 0.7 0.2 0.1: at t = 0.7 FAR = FRR = 1/3
    assert equal_error_rate([0.9, 0.8, 0.3, 0.7, 0.2, 0.1], [1, 1, 1, 0, 0, 0]) == pytest.approx(
        1 / 3
    )
    # targets 0.9 0.8 0.4, non-targets 0.5 0.2: FRR stays 1/3 from t = 0.8 (FAR 0) to t = 0.5 (FAR
    # 1/2); the interpolated crossing is FAR = FRR = 1/3
    assert equal_error_rate([0.9, 0.8, 0.4, 0.5, 0.2], [1, 1, 1, 0, 0]) == pytest.approx(1 / 3)
    assert equal_error_rate([0.9, 0.8, 0.2, 0.1], [1, 1, 0, 0]) == pytest.approx(0.0)  # separable
    assert np.isnan(equal_error_rate([0.5, 0.4], [1, 1]))


def test_evaluation_dispatches_on_the_split_kind():
    from fedac.training.evaluate import evaluate, selection_score

    class Fixed(torch.nn.Module):
        def embed(self, x):
            return x.values[:, 0]

        def transcribe(self, x):
            return ["a b" for _ in range(len(x))]

    x = Padded(
        torch.tensor([[[1.0, 0.0]], [[0.9, 0.1]], [[0.0, 1.0]], [[0.1, 0.9]]]),
        torch.ones(4, dtype=torch.long),
    )
    # cosines: (0,1) same speaker 0.99, (2,3) same 0.99, (0,2) different 0.0, (1,3) different 0.18
    trials = torch.tensor([[0, 1, 1], [2, 3, 1], [0, 2, 0], [1, 3, 0]])
    split = EvalSplit(
        x, torch.arange(4), torch.zeros(4, dtype=torch.long), kind="verification", trials=trials
    )
    assert evaluate(Fixed(), split) == {"eer": 0.0}
    flipped = EvalSplit(
        x,
        torch.arange(4),
        torch.zeros(4, dtype=torch.long),
        kind="verification",
        trials=trials * torch.tensor([1, 1, 0]) + torch.tensor([0, 0, 1]) * (1 - trials[:, 2:]),
    )
    assert evaluate(Fixed(), flipped) == {"eer": 1.0}
    ctc = EvalSplit(
        x,
        torch.arange(4),
        torch.zeros(4, dtype=torch.long),
        kind="ctc",
        texts=["a b", "a c", "a b", "a b"],
    )
    assert evaluate(Fixed(), ctc)["wer"] == pytest.approx(1 / 8)
    assert (
        selection_score({"wer": 0.3}) == -0.3
        and selection_score({"accuracy": 0.6, "wer": 0.1}) == 0.6
    )


# --------------------------------------------------------------------------- loaders and stand-ins


def test_librispeech_stand_in_loads_in_its_layout(librispeech_root):
    from fedac.data.librispeech import load_manifest

    m = load_manifest(librispeech_root)
    assert m.kind == "ctc" and m.classes == list(VOCAB)
    by_split = {
        s: [c for c in m.clips if c.split == s] for s in ("train", "val", "test", "test_other")
    }
    assert [len(v) for v in by_split.values()] == [12, 2, 2, 2]
    speakers = {s: {c.client for c in v} for s, v in by_split.items()}
    assert len(speakers["train"]) == 3
    for other in ("val", "test", "test_other"):
        assert not speakers[other] & speakers["train"]
    assert all(
        c.text == c.text.lower() and c.text and not set(c.text) - set(VOCAB) for c in m.clips
    )


def test_test_other_is_harder():
    from fedac.data.synth.sentences import harder, talkers

    rng = np.random.default_rng(0)
    for talker in talkers(rng, 3):
        hard = harder(talker, rng)
        assert hard.rate >= 1.3 * talker.rate and 10 <= hard.snr_db <= 20 and hard.room is not None
        assert talker.snr_db is None


@pytest.mark.parametrize(
    "line, message",
    [
        ("1000-100-0000", "expected '<speaker>-<chapter>-<utt> TRANSCRIPT'"),
        ("1000-100-0000 HELLO 3RD", "outside the CTC vocabulary"),
        ("1000-999-0000 HELLO", "does not belong to chapter 1000-100"),
        ("1000-100-0077 HELLO", "1000-100-0077.flac does not exist"),
    ],
)
def test_malformed_transcripts_are_refused(librispeech_root, tmp_path, line, message):
    from fedac.data.librispeech import load_manifest

    root = _copy(librispeech_root, tmp_path)
    trans = root / "train-clean-100" / "1000" / "100" / "1000-100.trans.txt"
    trans.write_text(trans.read_text() + line + "\n")
    with pytest.raises(DatasetError, match=message) as err:
        load_manifest(root)
    assert str(trans) in str(err.value)
    assert "line 3" in str(err.value) or "does not exist" in message


def test_librispeech_without_dev_clean_names_the_folder(librispeech_root, tmp_path):
    from fedac.data.librispeech import load_manifest

    root = _copy(librispeech_root, tmp_path)
    shutil.rmtree(root / "dev-clean")
    with pytest.raises(DatasetError, match="dev-clean"):
        load_manifest(root)


def test_voxceleb1_stand_in_keeps_trial_speakers_apart(voxceleb_root):
    from fedac.data.voxceleb1 import load_manifest

    m = load_manifest(voxceleb_root)
    assert m.classes == ["id10001", "id10002", "id10003"] and len(m.trials) == 12
    assert {c.split for c in m.clips} == {"train", "val", "test"}
    trial_speakers = {p.split("/")[-3] for a, b, _ in m.trials for p in (a, b)}
    assert trial_speakers and not trial_speakers & set(m.classes)
    assert sorted({t for _, _, t in m.trials}) == [0, 1]
    for a, b, target in m.trials:
        assert (a.split("/")[-3] == b.split("/")[-3]) == bool(target)


@pytest.mark.parametrize(
    "file, line, message",
    [
        ("veri_test2.txt", "1 id10004/x/00001.wav", "expected '<1|0> <path a> <path b>'"),
        (
            "veri_test2.txt",
            "2 id10004/a/1.wav id10004/b/1.wav",
            "expected '<1|0> <path a> <path b>'",
        ),
        ("veri_test2.txt", "1 id10004/nope/00001.wav id10005/nope/00002.wav", "does not exist"),
        ("iden_split.txt", "4 id10001/x/00001.wav", "expected '<1|2|3> idNNNNN/<video>/NNNNN.wav'"),
        ("iden_split.txt", "1 id10001.wav", "expected a path idNNNNN/<video>/NNNNN.wav"),
    ],
)
def test_malformed_voxceleb1_lines_are_refused(voxceleb_root, tmp_path, file, line, message):
    from fedac.data.voxceleb1 import load_manifest

    root = _copy(voxceleb_root, tmp_path)
    path = root / file
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], line, *lines[1:]]) + "\n")
    with pytest.raises(DatasetError, match=message) as err:
        load_manifest(root)
    assert f"{path}, line 2" in str(err.value)


# --------------------------------------------------------------------------- waveform data path and
# runs


def test_frozen_cnn_frames_are_cached_and_match_the_cnn(librispeech_root, tmp_path, monkeypatch):
    from fedac.data.waveform import load_waveform
    from fedac.engine import waveform
    from fedac.models.ssl import cnn_frames

    cfg = load_config(
        overrides=[
            "dataset=librispeech",
            f"data.root={librispeech_root}",
            "model.name=w2v2_tiny",
            f"data.cache_dir={tmp_path}",
        ]
    )
    data = waveform.build_waveform_data(cfg, progress=False)
    assert data.task.kind == "ctc" and set(data.extra_test) == {"test_other"}
    client = data.clients[0]
    assert (
        isinstance(client.x, Padded)
        and client.x.values.shape[-1] == 64
        and isinstance(client.y, Padded)
    )
    cnn = waveform.frozen_cnn(cfg)
    first = data.manifest.clips[data.manifest.split_indices("test")[0]]
    expected = cnn_frames(cnn, torch.from_numpy(load_waveform(first))).half()
    got = data.test.x.rows()[0]
    assert got.shape == expected.shape and torch.allclose(got.float(), expected.float(), atol=1e-3)
    assert data.test.texts[0] == first.text
    monkeypatch.setattr(
        waveform, "cnn_frames", lambda *a: (_ for _ in ()).throw(AssertionError("recomputed"))
    )
    again = waveform.build_waveform_data(cfg, progress=False)  # from the cache
    assert torch.equal(again.test.x.values, data.test.x.values)

    raw = load_config(
        overrides=[
            "dataset=librispeech",
            f"data.root={librispeech_root}",
            "model.name=w2v2_tiny",
            f"data.cache_dir={tmp_path}",
            "model.freeze_cnn=false",
        ]
    )
    waves = waveform.build_waveform_data(raw, progress=False)
    # waveforms, not frames
    assert waves.clients[0].x.values.dim() == 2 and waves.task.num_features == 1


def _run(tmp_path, name, *args):
    out = tmp_path / name
    assert (
        main(
            [
                "run",
                "--quiet",
                "--rounds",
                "2",
                "--out",
                str(out),
                "--set",
                "model.name=w2v2_tiny",
                "--set",
                "train.local_epochs=1",
                "--set",
                "train.batch_size=4",
                "--set",
                "train.lr=0.01",
                "--set",
                "train.eval_every=1",
                "--set",
                "train.fraction=1.0",
                *args,
            ]
        )
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    return results, (out / "metrics.csv").read_text().splitlines()


@pytest.mark.slow
def test_federated_ctc_asr_from_the_cli(librispeech_root, tmp_path):
    results, metrics = _run(
        tmp_path, "asr", "--dataset", "librispeech", "--set", f"data.root={librispeech_root}"
    )
    final = results["final"]
    for key in ("wer", "cer", "test_other_wer", "test_other_cer"):
        assert 0 <= final[key] <= 5, key
    assert "val_wer" in metrics[0] and "accuracy" not in final
    rows = [dict(zip(metrics[0].split(","), line.split(","))) for line in metrics[1:]]
    best = min(rows, key=lambda r: (float(r["val_wer"]), float(r["round"])))
    # best validation WER selects the model
    assert final["selected_round"] == int(float(best["round"]))
    assert "wer" in results["legend"]


@pytest.mark.slow
def test_speaker_identification_and_verification_from_the_cli(voxceleb_root, tmp_path):
    results, _ = _run(
        tmp_path,
        "sid",
        "--dataset",
        "voxceleb1",
        "--set",
        f"data.root={voxceleb_root}",
        "--set",
        "data.num_clients=2",
    )
    final = results["final"]
    assert 0 <= final["accuracy"] <= 1 and 0 <= final["asv_eer"] <= 1


@pytest.mark.slow
def test_keyword_spotting_on_the_same_encoder(tmp_path, checkpoints):
    from gsc_fixture import make_gsc_tree

    gsc_root = make_gsc_tree(tmp_path / "gsc", speakers=4, clips=1)
    results, _ = _run(
        tmp_path,
        "kws",
        "--dataset",
        "speech_commands",
        "--set",
        f"data.root={gsc_root}",
        "--set",
        f"model.encoder_path={checkpoints[0] / 'pre'}",
    )
    assert 0 <= results["final"]["accuracy"] <= 1 and results["num_classes"] == 35


def test_adamw_optimizer_setting():
    from fedac.algorithms import build_algorithm
    from fedac.algorithms.base import Task
    from fedac.errors import ConfigError
    from fedac.training.local import make_optimizer, train_supervised

    cfg = load_config(
        overrides=[
            "train.optimizer=adamw",
            "train.lr=0.1",
            "train.local_epochs=1",
            "train.batch_size=2",
        ]
    )
    model = torch.nn.Linear(1, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0], [-1.0]]))
    x, y = torch.tensor([[1.0], [2.0]]), torch.tensor([0, 0])
    train_supervised(model, x, y, cfg.train, torch.Generator().manual_seed(0))
    # Adam's first step moves every weight by lr * sign(gradient): class 0's logit goes up, class
    # 1's down
    assert torch.allclose(model.weight, torch.tensor([[1.1], [-1.1]]), atol=1e-4)
    assert isinstance(make_optimizer(model.parameters(), cfg.train), torch.optim.AdamW)
    sgd = load_config(overrides=["train.optimizer=sgd"]).train
    assert isinstance(make_optimizer(model.parameters(), sgd), torch.optim.SGD)
    with pytest.raises(ConfigError, match="train.optimizer must be sgd, adam or adamw, got 'lion'"):
        make_optimizer(model.parameters(), load_config(overrides=["train.optimizer=lion"]).train)
    task = Task(40, 5, ["a"])
    assert (
        stacking_obstacle(build_algorithm(load_config(overrides=["model.name=crnn_tiny"]), task))
        is None
    )
    # the stacked path has AdamW (training/functional.py)
    assert stacking_obstacle(build_algorithm(cfg, task)) is None


def test_central_pools_every_waveform_client_into_one(librispeech_root, tmp_path):
    """`--algorithm central` with an SSL encoder trains one pooled client, as on features
    (engine/data.py `default_partition`); the dataset's own partition gave several, which central
    refuses."""
    from fedac.engine.data import build_federated_data

    base = ["dataset=librispeech", f"data.root={librispeech_root}", f"data.cache_dir={tmp_path}"]
    cfg = load_config(overrides=[*base, "model.name=w2v2_tiny"])
    several = build_federated_data(cfg, progress=False)
    pooled = build_federated_data(
        load_config(overrides=[*base, "model.name=w2v2_tiny", "algorithm=central"]),
        progress=False,
    )
    assert len(several.clients) > 1 and [c.name for c in pooled.clients] == ["pooled"]
    # every training clip, in training or held out (each client holds out its own share)
    clips = lambda c: c.num_samples + len(c.holdout_y)  # noqa: E731
    assert clips(pooled.clients[0]) == sum(clips(c) for c in several.clients)


def test_models_and_tasks_that_do_not_fit_are_refused(librispeech_root, tmp_path):
    from fedac.engine.data import build_federated_data
    from fedac.errors import ConfigError

    base = ["dataset=librispeech", f"data.root={librispeech_root}", f"data.cache_dir={tmp_path}"]
    with pytest.raises(
        ConfigError,
        match="librispeech is a ctc task, which needs an SSL encoder: --set model.name=w2v2_tiny",
    ):
        build_federated_data(load_config(overrides=[*base, "model.name=crnn_lite"]), progress=False)
    with pytest.raises(ConfigError, match="algorithm 'fedmlac' keeps CRNN client models"):
        build_federated_data(
            load_config(overrides=[*base, "model.name=w2v2_tiny", "algorithm=fedmlac"]),
            progress=False,
        )
    # a feature network's method is refused before any data is built, naming those that fit
    with pytest.raises(ConfigError, match="algorithm 'fedkwsui' trains a feature network") as err:
        build_federated_data(
            load_config(overrides=[*base, "model.name=w2v2_tiny", "algorithm=fedkwsui"]),
            progress=False,
        )
    able = str(err.value).split("use ", 1)[1].split(", ")
    assert {"fedavg", "fedmmd", "earlyexit", "central"} <= set(able)
    assert not {"fedkwsui", "fedmlac", "fedkad", "zeroshot"} & set(able)


def test_cli_verbs_of_the_speech_datasets(tmp_path, monkeypatch):
    from fedac.cli import build_parser, cmd_synth
    from fedac.data.synth import librispeech

    args = build_parser().parse_args(
        ["data", "synth-librispeech", "--out", str(tmp_path), "--speakers", "2"]
    )
    assert args.func is cmd_synth and args.dataset_name == "librispeech" and args.size == 2
    seen = {}
    monkeypatch.setattr(librispeech, "generate", lambda out, **kw: seen.update(kw) or {"ok": 1})
    assert (
        main(["data", "synth-librispeech", "--out", str(tmp_path), "--speakers", "2", "--quiet"])
        == 0
    )
    assert seen["speakers"] == 2
    args = build_parser().parse_args(
        ["data", "synth-voxceleb1", "--out", str(tmp_path), "--speakers", "5"]
    )
    assert args.dataset_name == "voxceleb1" and args.size == 5
