"""The zero-shot paper's Tables 3 and 4 (and its Figs. 2-4; docs/zeroshot.md) as specs, on the
stand-ins, mean ± std over seeds.

A cell is a dataset; each of its seeds is one streaming run (engine/zeroshot.py) in its own run
directory `<out>/<dataset>-s<seed>`; a finished run is read back and a killed one resumes from its
checkpoint, so running the same command again completes a killed reproduction. Writes table.md (the
paper's D0 numbers per user, and the honest test numbers, never mixed), results.csv, summary.json
(mean and std per dataset), figure.png (per-round local and global D0 accuracy of every user, the
paper's Fig. 2), and from each dataset's first run fig3.png (PCA of the impressions by cluster) and
fig4.png (a class-similarity matrix). The scenario (`zeroshot.scenario`) is the spec's protocol;
`--rounds` sets `zeroshot.rounds`.
"""

from __future__ import annotations

import csv
import json
from functools import partial
from pathlib import Path

from fedac.config import load_config
from fedac.experiments.compare import Method
from fedac.experiments.runner import chosen_datasets
from fedac.experiments.spec import Cell, Cost, Experiment, Layout, Request
from fedac.training.metrics import mean_std

PAPER = "zero-shot KWS"
DATASETS = ("speech_commands", "urbansound8k")
# the CREMA-D variant (not in the paper): run with --datasets cremad
OPTIONAL_DATASETS = ("cremad",)
HONEST = {
    "accuracy": "test acc. (all classes)",
    "macro_f1": "test macro-F1",
    "accuracy_old": "test acc. old",
    "accuracy_new": "test acc. new",
    "forgetting_old": "forgetting (old)",
    "ari": "ARI of reports",
    "registration_correct": "reports registered right",
    "labels": "labels at the end",
}
#: The one "method" of a cell: the zero-shot algorithm under the spec's scenario.
ZEROSHOT = Method("zeroshot", "zeroshot", [])


def dataset_cells(spec: Experiment, request: Request) -> list[Cell]:
    """One cell per dataset; its runs are `<out>/<dataset>-s<seed>` (no cell folder)."""
    rounds = [f"zeroshot.rounds={request.rounds}"] if request.rounds else []
    settings = [*spec.protocol, *request.overrides, *rounds]
    return [
        Cell(
            dataset,
            dataset,
            request.out,
            load_config(None, settings, algorithm="zeroshot", dataset=dataset),
            settings,
            [ZEROSHOT],
        )
        for dataset in chosen_datasets(spec, request)
    ]


def run_cell(cell: Cell, request: Request, on_run, wait_for_others: bool) -> None:
    """Every seed of the cell's dataset, one streaming run each, in turn."""
    runs: list[dict] = []
    for seed in request.seeds:
        cfg = load_config(
            None, cell.settings, algorithm="zeroshot", dataset=cell.dataset, seed=seed
        )
        run_dir = cell.folder / f"{cell.dataset}-s{seed}"
        cfg.out = str(run_dir)
        if request.progress:
            print(f"== {cell.dataset} seed {seed}")
        runs.append({**run_one(cfg, run_dir, request.progress), "run_dir": str(run_dir)})
        on_run({ZEROSHOT.label: runs})


def run_one(cfg, run_dir: Path, progress: bool) -> dict:
    from fedac.engine.checkpoint import CHECKPOINT  # lazy: start-up time (the engine imports torch)
    from fedac.engine.zeroshot import ZeroShotDriver

    done = run_dir / "results.json"
    if done.is_file():
        return json.loads(done.read_text())
    results = ZeroShotDriver(cfg, run_dir, progress).run(resume=(run_dir / CHECKPOINT).is_file())
    # run() returns None only with stop_after or on a rank other than 0; this driver runs in one
    # process
    assert results is not None, "a zero-shot run returned no results"
    return results


def write_table(
    spec: Experiment,
    request: Request,
    cells: list[Cell],
    runs: dict[str, dict[str, list[dict]]],
    last_round: bool,
) -> None:
    """The layout's writer: each dataset's runs; `last_round` (Table 4) reports the last round
    alone."""
    write(
        request.out,
        spec.title,
        request.command,
        {d: by.get(ZEROSHOT.label, []) for d, by in runs.items()},
        request.seeds,
        last_round,
    )


def _fmt(values: list[float | None], pct: bool = True) -> str:
    mean, std = mean_std([v for v in values if v is not None])  # results.json writes NaN as null
    if mean != mean:
        return "n/a"
    return f"{100 * mean:.2f} ± {100 * std:.2f}" if pct else f"{mean:.3f} ± {std:.3f}"


def markdown(
    title: str, command: str, runs: dict[str, list[dict]], seeds: list[int], last_round: bool
) -> str:
    prefix = "final_" if last_round else ""
    lines = [
        f"# {title}",
        "",
        f"Command: `{command}`",
        "",
        f"Mean ± std over seeds {seeds} (n = finished runs per dataset). D0 numbers are the "
        "paper's metric (score tables on the public set, which the users' Choice 2 models also "
        "train on); test numbers are the global score table on the official test clips of all the "
        "scenario's classes (10; CREMA-D 4).",
        "",
    ]
    for dataset, rs in runs.items():
        if not rs:
            continue
        users = [k.split("/")[1] for k in rs[0]["final"] if k.startswith("local_acc/")]
        lines += [
            f"## {dataset} (n={len(rs)})",
            "",
            "| User | D0 local | D0 global | D0 increase |",
            "|---|---|---|---|",
        ]
        if not last_round:
            for u in users:
                lines.append(
                    f"| {u} | "
                    + " | ".join(
                        _fmt([r["final"][f"{k}/{u}"] for r in rs])
                        for k in ("local_acc", "global_acc", "increase")
                    )
                    + " |"
                )
        lines.append(
            "| average | "
            + " | ".join(
                _fmt([r["final"][prefix + k] for r in rs])
                for k in ("local_acc", "global_acc", "increase")
            )
            + " |"
        )
        lines += [
            "",
            "| " + " | ".join(HONEST.values()) + " |",
            "|---" * len(HONEST) + "|",
            "| "
            + " | ".join(
                _fmt([r["final"][k] for r in rs], pct=k not in ("ari", "labels")) for k in HONEST
            )
            + " |",
            "",
        ]
        wall = [r["wall_seconds"] for r in rs]
        di = [r["final"]["di_seconds_per_class"] for r in rs]
        lines += [
            f"Wall time per run: {_fmt(wall, pct=False)} s; data-impression synthesis per reported "
            f"class: {_fmt(di, pct=False)} s.",
            "",
        ]
    return "\n".join(lines)


def plot(path: Path, runs: dict[str, list[dict]]) -> None:
    """Fig. 2: per-round local and global D0 accuracy of every user (seed of the first run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [(d, rs[0]) for d, rs in runs.items() if rs]
    if not shown:
        return
    fig, axes = plt.subplots(len(shown), 2, figsize=(10, 3.5 * len(shown)), squeeze=False)
    for row, (dataset, run) in zip(axes, shown):
        history = run["history"]
        users = [k.split("/")[1] for k in run["final"] if k.startswith("local_acc/")]
        for ax, key in zip(row, ("local_acc", "global_acc")):
            for u in users:
                ax.plot(
                    [h["round"] for h in history],
                    [100 * h.get(f"{key}/{u}", float("nan")) for h in history],
                    marker=".",
                    label=u,
                )
            ax.set_title(
                f"{dataset}: {key.replace('_acc', '')} (D0, seed {run['seed']})", fontsize=9
            )
            ax.set_xlabel("round"), ax.set_ylabel("accuracy (%)"), ax.grid(alpha=0.3)
        row[0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def impression_rounds(run_dir: Path) -> list[dict]:
    """The registration rounds a run saved (engine/zeroshot.py `save_impressions`), in round
    order."""
    import torch

    files = sorted((run_dir / "impressions").glob("round*.pt"), key=lambda f: int(f.stem[5:]))
    return [{"round": int(f.stem[5:]), **torch.load(f, weights_only=False)} for f in files]


def plot_impressions(out: Path, runs: dict[str, list[dict]]) -> list[str]:
    """Fig. 3 (2-D PCA of a round's impressions coloured by k-medoids cluster: reports of different
    classes, and of the same class) and Fig. 4 (a reporting model's class-similarity matrix), from
    the first run of each dataset. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from sklearn.decomposition import PCA

    panels, heat = [], None
    for dataset, rs in runs.items():
        rounds = impression_rounds(Path(rs[0]["run_dir"])) if rs else []
        for kind, pick in (
            ("different classes", lambda t: len(set(t)) > 1),
            ("same class", lambda t: len(t) > 1 and len(set(t)) == 1),
        ):
            chosen = next((r for r in rounds if pick(r["truth"])), None)
            if chosen is not None:
                panels.append((dataset, kind, chosen))
        if heat is None and rounds:
            key, matrix = next(iter(rounds[0]["similarity"].items()))
            heat = (dataset, rounds[0], key, matrix)
    written = []
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4), squeeze=False)
        for ax, (dataset, kind, r) in zip(axes[0], panels):
            points = r["points"].float().numpy()
            xy = PCA(2).fit_transform(np.concatenate([points, r["anchors"].float().numpy()]))
            cluster = np.concatenate([r["cluster"], r["anchor_cluster"]])
            reports = [f"{u} {r['classes'][t]}" for (u, _), t in zip(r["keys"], r["truth"])]
            for g, name in enumerate(reports):
                mine = np.flatnonzero(r["owner"] == g)
                ax.scatter(
                    xy[mine, 0],
                    xy[mine, 1],
                    c=cluster[mine],
                    cmap="tab10",
                    vmin=0,
                    vmax=9,
                    s=8,
                    marker="os^v"[g % 4],
                    label=name,
                )
            if len(r["anchors"]):
                ax.scatter(
                    xy[len(points) :, 0],
                    xy[len(points) :, 1],
                    c="grey",
                    marker="x",
                    s=8,
                    label="anchors",
                )
            ax.set_title(f"{dataset}, round {r['round']}: {kind}", fontsize=9)
            ax.legend(fontsize=6)
        fig.suptitle("Fig. 3: impressions (PCA), colour = k-medoids cluster")
        fig.tight_layout()
        fig.savefig(out / "fig3.png", dpi=100)
        plt.close(fig)
        written.append("fig3.png")
    if heat is not None:
        dataset, r, (user, _), matrix = heat
        old = r.get("num_old", 8)  # runs saved before the CREMA-D variant had 8
        names = r["classes"][:old] + [f"new ({user})"] * (len(matrix) - old)
        fig, ax = plt.subplots(figsize=(5.5, 5))
        image = ax.imshow(matrix.numpy(), cmap="viridis", vmin=-1, vmax=1)
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=7)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        fig.colorbar(image)
        ax.set_title(
            f"Fig. 4: class similarity (Eq. 1), {dataset} round {r['round']}, {user}'s model",
            fontsize=8,
        )
        fig.tight_layout()
        fig.savefig(out / "fig4.png", dpi=100)
        plt.close(fig)
        written.append("fig4.png")
    return written


def write(
    out: Path, title: str, command: str, runs: dict[str, list[dict]], seeds: list[int], last: bool
) -> None:
    (out / "table.md").write_text(markdown(title, command, runs, seeds, last))
    keys = [
        "local_acc",
        "global_acc",
        "increase",
        "final_local_acc",
        "final_global_acc",
        "final_increase",
        *HONEST,
        "di_seconds_per_class",
    ]
    with open(out / "results.csv", "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["dataset", "seed", *keys, "wall_seconds"])
        for dataset, rs in runs.items():
            for r in rs:
                writer.writerow(
                    [dataset, r["seed"], *[r["final"].get(k) for k in keys], r["wall_seconds"]]
                )
    plot(out / "figure.png", runs)
    plot_impressions(out, runs)

    def stats(values: list) -> dict[str, float]:
        return dict(zip(("mean", "std"), mean_std([v for v in values if v is not None])))

    summary = {
        d: {
            "n": len(rs),
            **{k: stats([r["final"].get(k) for r in rs]) for k in keys},
            "wall_seconds": stats([r["wall_seconds"] for r in rs]),
        }
        for d, rs in runs.items()
        if rs
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))


def _measured(name: str, seconds: dict[str, float]) -> Cost:
    """Three seeds of each default dataset at the mean run time of the committed tables."""
    total = 3 * sum(seconds.values())
    return Cost(
        round(total / 60),
        " and ".join(
            f"docs/results/{name}-{d}/summary.json wall_seconds mean {s:,.0f} s"
            for d, s in seconds.items()
        )
        + " x 3 seeds",
    )


def _spec(
    name: str, table: str, title: str, scenario: str, cost: Cost, last_round: bool
) -> Experiment:
    layout = Layout(
        cells=dataset_cells,
        write=partial(write_table, last_round=last_round),
        run_cell=run_cell,
        two_passes=False,
    )
    return Experiment(
        name,
        PAPER,
        table,
        title,
        cost,
        datasets=DATASETS,
        dataset_settings={d: [] for d in DATASETS + OPTIONAL_DATASETS},
        protocol=[f"zeroshot.scenario={scenario}"],
        options=(),
        layout=layout,
    )


SPECS = [
    _spec(
        "zeroshot-table3",
        "Table 3, Fig. 2",
        "Table 3: homogeneous (3 users, 10 rounds), averages over rounds",
        "homogeneous",
        _measured("zeroshot-table3", {"speech_commands": 1907, "urbansound8k": 1955}),
        False,
    ),
    _spec(
        "zeroshot-table4",
        "Table 4",
        "Table 4: heterogeneous (10 users, 30 rounds), last round",
        "heterogeneous",
        _measured("zeroshot-table4", {"speech_commands": 997, "urbansound8k": 1033}),
        True,
    ),
]
EXPERIMENTS: dict[str, Experiment] = {spec.name: spec for spec in SPECS}
