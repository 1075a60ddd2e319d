"""From the federation to the device: a run's model exported to ONNX (float and int8) and checked
against PyTorch, audio files labelled, keywords spotted in a long recording (docs/export.md).

One file per subject: frontend.py (the waveform -> logits module, feature front end inside),
run.py (a run's selected model), onnx_export.py (export, sidecar, check), quantize.py (int8),
predict.py (`fedac predict`), stream.py (`fedac stream`), commands.py (the three commands' parsers,
light to import: torch, onnx and onnxruntime load when a command runs).

Belongs here: what takes a finished run's model to a device and runs it there. Must not be here:
training, a method's logic or a model family (it reads them through engine/ and models/), and
nothing below the CLI imports it.
"""
