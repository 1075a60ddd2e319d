"""`fedac export`, `fedac predict`, `fedac stream`: parsers (light: nothing heavy is imported to
build them) and handlers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedac.errors import AudioError, ConfigError

#: ExecuTorch: why `--format pte` is not offered (docs/export.md, "ExecuTorch").
PTE_REASON = (
    "--format pte (ExecuTorch) is not offered: docs/export.md, 'ExecuTorch', says why; export "
    "ONNX (--format onnx) instead"
)


def _model_choice(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--client",
        metavar="ID",
        help="a personalised method's own model of client ID (default: the selected shared model)",
    )
    p.add_argument(
        "--exit",
        dest="exit_layer",
        type=int,
        metavar="L",
        help="early-exit models: the exit to run, on the 12-layer scale of earlyexit.exits "
        "(default: earlyexit.eval_exit's)",
    )


def add_export_parsers(sub) -> None:
    ex = sub.add_parser(
        "export",
        help="export a run's model to ONNX (waveform in, logits out), checked against PyTorch on "
        "the test split; --int8 adds a quantised copy (docs/export.md)",
    )
    ex.add_argument("run_dir", metavar="RUN_DIR")
    ex.add_argument("--format", default="onnx", choices=["onnx", "pte"])
    ex.add_argument("--int8", action="store_true", help="also write FILE-int8.onnx (onnxruntime)")
    ex.add_argument("--out", metavar="FILE", help="the .onnx file (default RUN_DIR/model.onnx)")
    _model_choice(ex)
    ex.set_defaults(func=cmd_export)

    pr = sub.add_parser(
        "predict", help="top-k labels of audio files from a run directory or an exported .onnx"
    )
    pr.add_argument("model", metavar="MODEL_OR_RUN")
    pr.add_argument("files", nargs="+", metavar="FILE")
    pr.add_argument("--top", type=int, default=3, metavar="K")
    _model_choice(pr)
    pr.set_defaults(func=cmd_predict)

    st = sub.add_parser(
        "stream", help="spot keywords in a long recording (sliding window, smoothed posteriors)"
    )
    st.add_argument("model", metavar="MODEL_OR_RUN")
    st.add_argument("file", metavar="FILE")
    st.add_argument("--hop", type=float, default=0.1, help="seconds between windows (0.1)")
    st.add_argument("--smooth", type=int, default=3, help="windows averaged (centred; 3)")
    st.add_argument("--threshold", type=float, default=0.7, help="smoothed posterior (0.7)")
    st.add_argument(
        "--refractory", type=float, default=1.0, help="seconds without a new detection (1.0)"
    )
    st.add_argument("--gate-db", type=float, default=-50.0, help="silence below this dBFS (-50)")
    st.add_argument("--window", type=float, default=1.0, help="SSL models: window seconds (1.0)")
    st.add_argument("--keywords", help="comma-separated labels (default: all but _labels_)")
    _model_choice(st)
    st.set_defaults(func=cmd_stream)


def default_out(args: argparse.Namespace) -> Path:
    if args.out:
        return Path(args.out)
    name = "model"
    if args.client:
        name += f"-client-{args.client}"
    if args.exit_layer:
        name += f"-exit{args.exit_layer}"
    return Path(args.run_dir) / f"{name}.onnx"


def cmd_export(args: argparse.Namespace) -> int:
    if args.format == "pte":
        raise ConfigError(PTE_REASON)
    from fedac.export.onnx_export import need_onnx

    need_onnx()
    import torch

    from fedac.export.onnx_export import (
        check_export,
        check_passed,
        file_mb,
        sidecar,
        write_onnx,
        write_sidecar,
    )
    from fedac.export.run import load_trained

    out = default_out(args)
    if out.suffix != ".onnx":
        raise ConfigError(f"--out {out}: give a file name ending in .onnx")
    trained = load_trained(args.run_dir, args.client, args.exit_layer)
    example = torch.randn(2, trained.clip_samples, generator=torch.Generator().manual_seed(0))
    front = write_onnx(trained.deployed, example, out, free_length=trained.ssl)
    check = check_export(trained, out)
    write_sidecar(out, sidecar(trained, out, {"check": check}))
    ok = check_passed(check)
    print(f"wrote {out} ({file_mb(out):.3f} MB) and {out.with_suffix('.json').name}")
    print(
        f"check on {check['clips']} test clips ({check['windows']} windows), onnxruntime against "
        f"PyTorch: max |logit diff| {check['max_abs_logit_diff']:.2e}, argmax agreement "
        f"{100 * check['argmax_agreement']:.2f}% ({'passed' if ok else 'FAILED'}: target 100% "
        f"and 1e-4 x the largest |logit| {check['max_abs_logit']:.2f}, at least 1e-4); "
        f"accuracy {100 * check['accuracy']:.2f}% (the run's own evaluation "
        f"{100 * check['run_accuracy']:.2f}%, same prediction on "
        f"{100 * check['agreement_with_run']:.2f}% of clips)"
    )
    if args.int8:
        _export_int8(trained, out, check, front)
    return 0 if ok else 1


def _export_int8(trained, out: Path, check: dict, front: list[str]) -> None:
    from fedac.export.onnx_export import sidecar, write_sidecar
    from fedac.export.quantize import quantize_int8

    out8 = out.with_name(f"{out.stem}-int8.onnx")
    q = quantize_int8(trained, out, out8, front)
    write_sidecar(out8, sidecar(trained, out8, {"quantization": q, "float_check": check}))
    cal = q["calibration"]
    print(
        f"wrote {out8} ({q['int8_bytes'] / 1e6:.3f} MB, {q['int8_bytes'] / q['float_bytes']:.2f} "
        f"of the float file), calibrated on {cal['clips']} training clips ({cal['draw']}); "
        f"test accuracy {100 * q['int8_accuracy']:.2f}% against float "
        f"{100 * q['float_accuracy']:.2f}%: drop {q['accuracy_drop_points']:.2f} points, same "
        f"prediction on {100 * q['int8_float_agreement']:.2f}% of clips"
    )


def _say(said: set[str], shown: set[str]) -> None:
    for line in sorted(said - shown):
        print(f"fedac: {line}", file=sys.stderr)
    shown |= said


def cmd_predict(args: argparse.Namespace) -> int:
    from fedac.export.predict import open_classifier, predict

    if args.top < 1:
        raise ConfigError(f"--top {args.top}: give at least 1")
    clf = open_classifier(args.model, args.client, args.exit_layer)
    said: set[str] = set()
    shown: set[str] = set()
    failed = 0
    for path in args.files:
        try:
            top = predict(clf, path, said, min(args.top, len(clf.labels)))
        except AudioError as exc:  # this file only: the others are still labelled
            print(f"fedac: error: {exc}", file=sys.stderr)
            failed += 1
            continue
        _say(said, shown)
        print(f"{path}: " + ", ".join(f"{label} {p:.3f}" for label, p in top))
    return 2 if failed else 0


def cmd_stream(args: argparse.Namespace) -> int:
    from fedac.data.audio import load_audio
    from fedac.export.predict import open_classifier
    from fedac.export.stream import StreamSettings, check_settings, keyword_columns, stream

    s = StreamSettings(
        args.hop, args.smooth, args.threshold, args.refractory, args.gate_db, args.window
    )
    check_settings(s)
    clf = open_classifier(args.model, args.client, args.exit_layer)
    keywords = [k.strip() for k in args.keywords.split(",")] if args.keywords else None
    keyword_columns(clf.labels, keywords)  # (an unknown keyword is refused before any audio)
    audio = load_audio(args.file, clf.sample_rate)
    found = stream(clf, audio, s, keywords)
    print(
        f"{args.file}: {len(audio) / clf.sample_rate:.2f} s, {clf.name}; hop {s.hop:g} s, "
        f"smoothing {s.smooth} windows, threshold {s.threshold:g}, refractory {s.refractory:g} s"
    )
    for d in found:
        print(f"  {d.time:8.2f} s  {d.label}  {d.score:.3f}")
    print(f"{len(found)} detection(s)")
    return 0
