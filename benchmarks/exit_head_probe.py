"""Why the early-exit tables standardise the pooled vector (`model.head_norm`): a head on frozen
exit features.

Every clip of the embedded Speech Commands stand-in (`--task`, 12 classes by default) goes through
the frozen shipped `w2v2_s` up to `--depth` (the exit) and is pooled to [mean; std]
(`SSLModel.embed`, as in benchmarks/ssl_probe.py). On those fixed features, with the validation
split scored:
- a converged reference: scikit-learn's logistic regression on standardised inputs;
- the paper's head, Linear(2H, C), trained by AdamW with batch 8 for `--steps` steps at each
  `--lrs`, on the raw pooled vector (`raw`) and behind a BatchNorm1d (`norm`, what model.head_norm
  adds);
- the class prior (always the majority class).

    python benchmarks/exit_head_probe.py --out docs/results/earlyexit-head/probe.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from ssl_probe import embeddings  # noqa: E402  (the frozen-encoder features, computed one way)


def train_head(
    x: torch.Tensor, y: torch.Tensor, classes: int, norm: bool, lr: float, steps: int, seed: int = 0
):
    torch.manual_seed(seed)
    head = torch.nn.Sequential(
        *([torch.nn.BatchNorm1d(x.shape[1])] if norm else []), torch.nn.Linear(x.shape[1], classes)
    )
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(y), (8,), generator=generator)
        loss = torch.nn.functional.cross_entropy(head(x[idx]), y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval()


def main() -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from fedac.config import load_config
    from fedac.data.registry import load_manifest

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--task", default="12")
    parser.add_argument("--depth", type=int, default=6, help="exit layer of the 12-layer w2v2_s")
    parser.add_argument("--max-train", type=int, default=2000)
    parser.add_argument("--steps", type=int, nargs="+", default=[400, 4000])
    parser.add_argument("--lrs", type=float, nargs="+", default=[2e-4, 1e-3, 3e-3, 1e-2])
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    cfg = load_config(
        overrides=[
            "model.name=w2v2_s",
            f"data.task={args.task}",
            f"model.encoder_depth={args.depth}",
        ]
    )
    manifest = load_manifest(cfg)
    split = {s: [manifest.clips[i] for i in manifest.split_indices(s)] for s in ("train", "val")}
    keep = np.random.default_rng(0).permutation(len(split["train"]))[: args.max_train]
    split["train"] = [split["train"][i] for i in sorted(keep)]
    feats = {s: embeddings(cfg, clips, progress=False) for s, clips in split.items()}
    labels = {s: np.array([c.label for c in clips]) for s, clips in split.items()}
    classes = len(manifest.classes)
    reference = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(
        feats["train"], labels["train"]
    )
    x, y = torch.tensor(feats["train"]), torch.tensor(labels["train"])
    xv, yv = torch.tensor(feats["val"]), torch.tensor(labels["val"])
    heads = []
    for steps in args.steps:
        for norm in (False, True):
            for lr in args.lrs:
                head = train_head(x, y, classes, norm, lr, steps)
                with torch.no_grad():
                    acc = (head(xv).argmax(1) == yv).float().mean().item()
                heads.append(
                    {
                        "head": "norm" if norm else "raw",
                        "lr": lr,
                        "steps": steps,
                        "val_accuracy": acc,
                    }
                )
                print(heads[-1])
    spread = feats["train"].std(0)
    result = {
        "command": "python benchmarks/exit_head_probe.py " + " ".join(sys.argv[1:]),
        "depth": args.depth,
        "classes": classes,
        "clips": {s: len(v) for s, v in split.items()},
        "prior_val_accuracy": float(np.bincount(labels["val"]).max() / len(labels["val"])),
        "logistic_regression_val_accuracy": float(reference.score(feats["val"], labels["val"])),
        "pooled_std_min_max": [float(spread.min()), float(spread.max())],
        "pooled_abs_mean_max": float(np.abs(feats["train"].mean(0)).max()),
        "heads": heads,
        "seconds": time.perf_counter() - start,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print({k: v for k, v in result.items() if k != "heads"})


if __name__ == "__main__":
    main()
