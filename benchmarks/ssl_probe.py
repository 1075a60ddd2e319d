"""Frozen-encoder linear probe on the Speech Commands stand-in: does `fedac pretrain` help? (issue
16)

For each encoder (a `fedac pretrain` folder, and the same size with random weights), every clip of
the embedded Speech Commands stand-in (35 words) goes through the frozen encoder (its CNN frames
cached by engine/waveform.py) and is pooled to [mean; std] of the last layer (`SSLModel.embed`). A
multinomial logistic regression (scikit-learn, standardised inputs) is fitted on the training split
(a seeded subset of `--max-train` clips), and its
accuracy is measured on the validation and test splits (unseen speakers). Centralised: a probe of
the representation, not a federated run.

    python benchmarks/ssl_probe.py --encoder DIR --model w2v2_tiny --out
    docs/results/ssl-probe/probe.json # the shipped encoder:
    python benchmarks/ssl_probe.py --model w2v2_s --out docs/results/ssl-probe-w2v2_s/probe.json

`--only pretrained|random` probes one of the two (each half takes minutes; run them as two
commands).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch


def embeddings(cfg, split_clips, progress=True) -> np.ndarray:
    from fedac.data.waveform import Padded
    from fedac.engine.waveform import clip_inputs, frozen_cnn
    from fedac.models import build_model

    inputs = clip_inputs(split_clips, cfg, frozen_cnn(cfg), f"probe-{len(split_clips)}", progress)
    torch.manual_seed(0)
    model = build_model(cfg.model.name, 0, 2, 0.0, "classification", cfg.model).eval()
    with torch.no_grad():
        return torch.cat([model.embed(chunk) for chunk in Padded.stack(inputs).split(256)]).numpy()


def main() -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from fedac.config import load_config
    from fedac.data.registry import load_manifest
    from fedac.models.ssl import RANDOM_INIT, resolve_encoder_path

    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--encoder",
        help="a `fedac pretrain` output folder (default: the encoder fedac ships for --model)",
    )
    parser.add_argument("--model", default="w2v2_tiny")
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", choices=("pretrained", "random"), help="probe only this encoder")
    parser.add_argument(
        "--max-train",
        type=int,
        default=2000,
        help="training clips (a seeded subset); val and test are whole",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {
        "command": "python benchmarks/ssl_probe.py " + " ".join(sys.argv[1:]),
        "encoders": {},
    }
    for name, path in (("pretrained", args.encoder), ("random", RANDOM_INIT)):
        if args.only not in (None, name):
            continue
        start = time.perf_counter()
        cfg = load_config(
            overrides=[
                f"model.name={args.model}",
                f"model.encoder_path={path}" if path else "model.encoder_path=null",
            ]
        )
        if path is None and resolve_encoder_path(args.model, None) is None:
            parser.error(f"fedac ships no pretrained {args.model}: pass --encoder DIR")
        manifest = load_manifest(cfg)
        split = {
            s: [manifest.clips[i] for i in manifest.split_indices(s)]
            for s in ("train", "val", "test")
        }
        keep = np.random.default_rng(0).permutation(len(split["train"]))[: args.max_train]
        split["train"] = [split["train"][i] for i in sorted(keep)]
        feats = {s: embeddings(cfg, clips) for s, clips in split.items()}
        labels = {s: np.array([c.label for c in clips]) for s, clips in split.items()}
        probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(
            feats["train"], labels["train"]
        )
        results["encoders"][name] = {
            "encoder_path": path or f"shipped ({args.model})",
            "val_accuracy": float(probe.score(feats["val"], labels["val"])),
            "test_accuracy": float(probe.score(feats["test"], labels["test"])),
            "clips": {s: len(v) for s, v in split.items()},
            "seconds": time.perf_counter() - start,
        }
        print(name, results["encoders"][name])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
