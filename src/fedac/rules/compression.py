"""Compression of client uploads on the wire (`compression.*`): what each client would send instead
of its dense model, how many bytes that is, and the upload the server decompresses from it.

A client's update is its upload minus the broadcast it trained from, Delta_k = theta_k - theta,
over the floating entries the upload shares with the broadcast (integer entries, BatchNorm's
counters, travel dense). A round's updates are compressed together: each entry's updates are
stacked across the cohort into one (clients, ...) tensor and every method works on those stacks
in one computation, never client by client. With `x` a client's update (plus its residual under
error feedback):

- `topk` (Stich et al. 2018, "Sparsified SGD with memory"): the k = max(1, ceil(ratio * d))
  entries of largest magnitude of the whole update as one vector of d entries (every compressed
  entry together, not per tensor); sent as k (index, value) pairs.
- `randk` (same paper): k entries drawn uniformly without replacement, from a generator seeded by
  (seed, round, client); sent as k (index, value) pairs, the values unscaled (with error feedback
  the left-out entries come back later; without it the update shrinks by k / d on average).
- `qsgd` (Alistarh et al. 2017, "QSGD", Sec. 3.1, Eq. for Q_s with the bucket being one tensor):
  per tensor v with s = `levels`, Q(v_i) = ||v||_2 sign(v_i) l_i / s, where l_i = floor(s |v_i| /
  ||v||_2 + u_i) with u_i ~ U[0, 1) seeded by (seed, round, client), so E[Q(v)] = v (unbiased).
  Sent as the norm (fp32) and per entry one sign bit and ceil(log2(s + 1)) level bits, packed back
  to back in fixed-width fields and padded to whole bytes per tensor (Alistarh et al.'s Elias coding
  would be shorter; fixed width is what a plain packer sends).
- `int8`: per tensor, scale = max |v_i| / 127 (fp32) and round(v_i / scale) as one signed byte.
- `bf16`: every entry as bfloat16 (2 bytes).

Wire bytes (`wire_bytes`, a function of the upload's shapes alone, so rejected uploads count too):
sparse methods send k x (index + value) bytes, the value at the update's element size and the index
as the smallest unsigned integer of 1, 2, 4 or 8 bytes that holds d - 1; qsgd 4 + ceil(n (1 + b) /
8) per tensor of n entries (b level bits); int8 4 + n per tensor; bf16 2 n; entries sent dense their
numel x element size.

The simulated round (`Compressor.__call__`) rebuilds the uploads straight from the stacked message;
a deployment's client sends its row as real bytes (`encode`: the index array at its counted width,
QSGD's norm and fixed-width bit fields packed with numpy, int8's scale and bytes, bf16's 2-byte
words), whose length is `wire_bytes`, and the server rebuilds the upload from them (`decode`).

Error feedback (Karimireddy et al. 2019, "Error feedback fixes SignSGD", Alg. 2; Stich et al.'s
memory): a client adds its residual e_k to its update before compressing, sends C(Delta_k + e_k),
and keeps e_k <- Delta_k + e_k - C(Delta_k + e_k). The residuals are client state the engine keeps
(`RunState.compression_residuals`, checkpointed), passed in here. qsgd is unbiased and is run
without it (`compression.error_feedback=true` with qsgd is refused).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedac.config import Config
from fedac.errors import ConfigError
from fedac.settings.codecs import codec_spec, error_feedback
from fedac.seeding import torch_generator
from fedac.training.device import nbytes
from fedac.training.types import Params

METHODS = ("none", "topk", "randk", "qsgd", "int8", "bf16")
SPARSE = ("topk", "randk")
#: Methods whose sent update can be longer than the one given (quantisation rounds entries up),
#: so a client-side DP clip before them bounds nothing.
QUANTISED = ("qsgd", "int8", "bf16")


def index_bytes(entries: int) -> int:
    """The smallest unsigned integer width (1, 2, 4 or 8 bytes) that holds every index of a vector
    of `entries` entries."""
    for width in (1, 2, 4):
        if entries <= 256**width:
            return width
    return 8


def level_bits(levels: int) -> int:
    """Bits of one QSGD level l in 0..s: ceil(log2(s + 1))."""
    return max(1, math.ceil(math.log2(levels + 1)))


class Compressor:
    """The configured compression of one run (`compression.*`); `on` is False for none.

    Which combinations run (a codec with an algorithm whose uploads are not models of the
    broadcast's form, error feedback with an unbiased codec, client-side DP before a quantiser,
    a compressed broadcast without one) is decided by the compatibility matrix when the run
    starts (settings/compatibility.py); `parameter_uploads` is what the algorithm declares
    there (`dp_compatible or sums_uploads`), kept for the callers that pass it."""

    def __init__(self, cfg: Config, parameter_uploads: bool = True):
        self.cfg, c = cfg.compression, cfg.compression
        self.seed = cfg.seed
        spec = codec_spec(c.method)
        self.on = not spec.off
        #: Whether the broadcast travels compressed too (`broadcast`).
        self.download = c.download
        #: Error feedback: `compression.error_feedback`, or as the codec declares when unset.
        self.feedback = self.on and error_feedback(c.method, c.error_feedback)

    # --- which entries -----------------------------------------------------------------------
    @staticmethod
    def compressed_entries(payload: Params, upload: Params) -> list[str]:
        """The upload's floating entries that are the broadcast's entries (same shape), in the
        upload's order; a ConfigError names an upload that is not a model of the broadcast's
        form."""
        if not isinstance(payload, dict) or not isinstance(upload, dict):
            raise ConfigError(
                "compression needs uploads that are models of the broadcast's form (dicts of "
                "tensors); set compression.method=none"
            )
        out = []
        for name, value in upload.items():
            ref = payload.get(name)
            if ref is None or ref.shape != value.shape:
                raise ConfigError(
                    f"compression: upload entry {name!r} is not the broadcast's entry of that "
                    "name and shape, so it has no update to compress; set compression.method=none"
                )
            if value.is_floating_point():
                out.append(name)
        return out

    # --- bytes ---------------------------------------------------------------------------------
    def wire_bytes(self, payload: Params, upload: Params) -> int:
        """The bytes a client sends for `upload` under the configured method (module docstring);
        the dense size when off."""
        if not self.on:
            return nbytes(upload)
        names = self.compressed_entries(payload, upload)
        dense = sum(nbytes(v) for n, v in upload.items() if n not in names)
        sizes = [upload[n].numel() for n in names]
        method = self.cfg.method
        if method in SPARSE:
            d = sum(sizes)
            if not d:
                return dense
            # (the values travel at the dtype torch.cat gives the concatenated update)
            value = functools.reduce(torch.promote_types, [upload[n].dtype for n in names])
            width = torch.empty((), dtype=value).element_size()
            return dense + self.kept(d) * (index_bytes(d) + width)
        if method == "qsgd":
            bits = 1 + level_bits(self.cfg.levels)
            return dense + sum(4 + math.ceil(n * bits / 8) for n in sizes)
        if method == "int8":
            return dense + sum(4 + n for n in sizes)
        return dense + sum(2 * n for n in sizes)  # bf16

    def kept(self, entries: int) -> int:
        """k, the entries a sparse method sends of an update of `entries` entries."""
        return min(entries, max(1, math.ceil(self.cfg.ratio * entries)))

    # --- the broadcast (compression.download=true) --------------------------------------------
    def broadcast(self, payload: Params, round_idx: int) -> Params:
        """The broadcast as the clients receive it: under compression.download=true its floating
        entries quantised as one message, without error feedback (qsgd's draws seeded by (seed,
        round)), every client receiving the same; else `payload` itself. The clients train from
        it and their updates are taken against it."""
        if not self.download:
            return payload
        names = self.compressed_entries(payload, payload)
        stacks = {n: payload[n][None] for n in names}
        sent = self.decoded(self.message(stacks, ["$broadcast"], round_idx), stacks)
        return {n: sent[n][0].to(v.dtype) if n in sent else v for n, v in payload.items()}

    def broadcast_bytes(self, payload: Params) -> int | None:
        """The bytes of a compressed broadcast (None: it travels dense)."""
        return self.wire_bytes(payload, payload) if self.download else None

    # --- the round ---------------------------------------------------------------------------
    def __call__(
        self,
        payload: Params,
        clients: list[str],
        uploads: list[Params],
        round_idx: int,
        residuals: dict[str, Params],
        clip: Callable[[list[Params]], list[Params]] | None = None,
    ) -> list[Params]:
        """The cohort's uploads as the server rebuilds them from what each client sent, compressed
        together (module docstring). `residuals` (client -> its residual per entry) is read and
        updated in place under error feedback. `clip`: applied to the uploads a client is about to
        compress (its update plus its residual), as a client that clips before it sends does
        (dp.mode=client)."""
        if not self.on or not uploads:
            return list(uploads)
        names = self.compressed_entries(payload, uploads[0])
        for upload in uploads[1:]:
            if self.compressed_entries(payload, upload) != names:
                raise ConfigError(
                    "compression: the round's uploads hold different entries; set "
                    "compression.method=none"
                )
        deltas = self._updates(payload, names, clients, uploads, residuals)
        if clip is not None:
            clipped = clip(
                [{n: payload[n] + deltas[n][i] for n in names} for i in range(len(clients))]
            )
            deltas = {n: torch.stack([u[n] for u in clipped]) - payload[n] for n in names}
        sent = self.decoded(self.message(deltas, clients, round_idx), deltas)
        self._keep(residuals, clients, deltas, sent)
        return [
            {**upload, **{n: (payload[n] + sent[n][i]).to(upload[n].dtype) for n in names}}
            for i, upload in enumerate(uploads)
        ]

    def _updates(
        self,
        payload: Params,
        names: list[str],
        clients: list[str],
        uploads: list[Params],
        residuals: dict[str, Params],
    ) -> dict[str, torch.Tensor]:
        """Per entry the (clients, ...) stack of the updates, each plus its client's residual
        under error feedback."""
        deltas = {n: torch.stack([u[n] for u in uploads]) - payload[n] for n in names}
        if self.feedback:
            for n in names:
                deltas[n] += torch.stack(
                    [
                        residuals[c][n].to(deltas[n].device)
                        if c in residuals
                        else torch.zeros_like(payload[n], dtype=deltas[n].dtype)
                        for c in clients
                    ]
                )
        return deltas

    def _keep(
        self,
        residuals: dict[str, Params],
        clients: list[str],
        deltas: dict[str, torch.Tensor],
        sent: dict[str, torch.Tensor],
    ) -> None:
        if self.feedback:
            for i, c in enumerate(clients):
                residuals[c] = {n: (deltas[n][i] - sent[n][i]).clone() for n in deltas}

    # --- what is sent, stacked ------------------------------------------------------------------
    def message(
        self, deltas: dict[str, torch.Tensor], clients: list[str], round_idx: int
    ) -> dict[str, Any]:
        """What the clients send, stacked (row i: client i): sparse methods {"index", "values"}
        (clients, k) over the whole update; qsgd per entry (norm (clients, 1), signed levels
        (clients, n)); int8 per entry (scale (clients, 1), int8 (clients, n)); bf16 per entry the
        (clients, n) bfloat16 rows."""
        method = self.cfg.method
        rows = {n: d.reshape(len(clients), -1) for n, d in deltas.items()}
        if method == "bf16":
            return {n: r.to(torch.bfloat16) for n, r in rows.items()}
        if method == "int8":
            return {n: int8(r) for n, r in rows.items()}
        if method == "qsgd":
            noise = self.uniform(rows, clients, round_idx, "qsgd")
            return {n: qsgd(r, noise[n], self.cfg.levels) for n, r in rows.items()}
        flat = torch.cat(list(rows.values()), dim=1)
        k = self.kept(flat.shape[1])
        if method == "topk":
            index = flat.abs().topk(k, dim=1, sorted=False).indices
        else:  # randk: the k largest of seeded uniform draws are a uniform k-subset
            draws = torch.cat(list(self.uniform(rows, clients, round_idx, "randk").values()), 1)
            index = draws.topk(k, dim=1, sorted=False).indices
        return {"index": index, "values": flat.gather(1, index)}

    def decoded(self, message: dict[str, Any], like: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The updates a stacked `message` stands for, per entry shaped like `like`'s stacks."""
        method = self.cfg.method
        if method in SPARSE:
            sizes = [v[0].numel() for v in like.values()]
            values = message["values"]
            flat = torch.zeros(
                values.shape[0], sum(sizes), dtype=values.dtype, device=values.device
            )
            flat.scatter_(1, message["index"], values)
            parts = flat.split(sizes, dim=1)
            return {n: p.reshape(like[n].shape) for n, p in zip(like, parts)}
        out = {}
        for n, part in message.items():
            if method == "bf16":
                rows = part.to(like[n].dtype)
            elif method == "int8":
                scale, q = part
                rows = q.to(scale.dtype) * scale
            else:  # qsgd: ||v|| sign l / s
                norm, level = part
                rows = level.to(norm.dtype) * (norm / self.cfg.levels)
            out[n] = rows.reshape(like[n].shape)
        return out

    def uniform(
        self, rows: dict[str, torch.Tensor], clients: list[str], round_idx: int, purpose: str
    ) -> dict[str, torch.Tensor]:
        """U[0, 1) draws shaped like `rows`, each client's from its own generator seeded by (seed,
        purpose, round, client), drawn on the CPU (the stream is the same whatever the device)."""
        d = sum(r.shape[1] for r in rows.values())
        first = next(iter(rows.values()))
        draws = torch.stack(
            [
                torch.rand(d, generator=torch_generator(self.seed, purpose, round_idx, c))
                for c in clients
            ]
        ).to(first.device, first.dtype)
        return dict(zip(rows, draws.split([r.shape[1] for r in rows.values()], dim=1)))

    # --- one client's bytes (a deployment's transport) ------------------------------------------
    def encode(
        self, payload: Params, upload: Params, client: str, round_idx: int, residuals: dict
    ) -> dict[str, torch.Tensor]:
        """What one client puts on the wire for `upload`: the entries sent dense as they are, and
        the compressed update as byte strings (uint8 tensors) whose lengths add up to
        `wire_bytes` exactly (module docstring); `residuals` (client -> residual) is updated in
        place. `decode` rebuilds the upload."""
        names = self._wire_entries(payload, upload)
        deltas = self._updates(payload, names, [client], [upload], residuals)
        message = self.message(deltas, [client], round_idx)
        self._keep(residuals, [client], deltas, self.decoded(message, deltas))
        wire = {n: v for n, v in upload.items() if n not in names}
        if self.cfg.method in SPARSE:
            d = sum(payload[n].numel() for n in names)
            index = message["index"][0].cpu().numpy().astype(f"<u{index_bytes(d)}")
            wire[f"{WIRE}index"] = as_bytes(index.tobytes())
            wire[f"{WIRE}values"] = as_bytes(message["values"][0].cpu().numpy().tobytes())
            return wire
        for n, part in message.items():
            wire[f"{WIRE}{n}"] = as_bytes(self._pack(part))
        return wire

    def _pack(self, part: Any) -> bytes:
        """One client's compressed tensor as bytes (its stacked `message` entry, one row)."""
        if self.cfg.method == "bf16":
            return part[0].view(torch.int16).cpu().numpy().astype("<i2").tobytes()
        head, body = part
        scale = np.asarray([float(head[0, 0])], dtype="<f4").tobytes()
        if self.cfg.method == "int8":
            return scale + body[0].cpu().numpy().astype(np.int8).tobytes()
        # qsgd: per entry a sign bit, then the level's bits, most significant first
        level = body[0].cpu().numpy().astype(np.int64)
        bits = level_bits(self.cfg.levels)
        shifts = np.arange(bits - 1, -1, -1)
        fields = np.concatenate(
            [(level < 0)[:, None], (np.abs(level)[:, None] >> shifts) & 1], axis=1
        ).astype(np.uint8)
        return scale + np.packbits(fields.reshape(-1)).tobytes()

    def decode(self, payload: Params, wire: dict[str, torch.Tensor]) -> Params:
        """The upload the server rebuilds from one client's `encode`d wire form."""
        names = [n for n, v in payload.items() if v.is_floating_point()]
        out = {n: v for n, v in wire.items() if not n.startswith(WIRE)}
        device = next(iter(payload.values())).device
        if self.cfg.method in SPARSE:
            d = sum(payload[n].numel() for n in names)
            dtype = functools.reduce(torch.promote_types, [payload[n].dtype for n in names])
            raw = wire[f"{WIRE}index"].cpu().numpy().tobytes()
            index = torch.from_numpy(np.frombuffer(raw, f"<u{index_bytes(d)}").astype(np.int64))
            values = torch.frombuffer(
                bytearray(wire[f"{WIRE}values"].cpu().numpy().tobytes()), dtype=dtype
            )
            like = {n: payload[n][None] for n in names}
            message = {"index": index[None].to(device), "values": values[None].to(device)}
            sent = self.decoded(message, like)
        else:
            like = {n: payload[n][None] for n in names}
            message = {n: self._unpack(wire[f"{WIRE}{n}"], payload[n]) for n in names}
            sent = self.decoded(message, like)
        for n in names:
            out[n] = (payload[n] + sent[n][0]).to(payload[n].dtype)
        return {n: out[n] for n in [*payload, *(k for k in out if k not in payload)] if n in out}

    def _unpack(self, data: torch.Tensor, like: torch.Tensor) -> Any:
        """`_pack`'s bytes back as the one-client stacked `message` entry of a tensor like
        `like`."""
        raw, n = data.cpu().numpy().tobytes(), like.numel()
        if self.cfg.method == "bf16":
            ints = torch.from_numpy(np.frombuffer(raw, "<i2").copy())
            return ints.view(torch.bfloat16)[None].to(like.device)
        scale = torch.tensor([[float(np.frombuffer(raw[:4], "<f4")[0])]], device=like.device)
        if self.cfg.method == "int8":
            q = torch.from_numpy(np.frombuffer(raw[4:], np.int8).copy())
            return scale, q[None].to(like.device)
        bits = level_bits(self.cfg.levels)
        packed = np.unpackbits(np.frombuffer(raw[4:], np.uint8), count=n * (1 + bits))
        fields = packed.reshape(n, 1 + bits).astype(np.int64)
        level = (fields[:, 1:] << np.arange(bits - 1, -1, -1)).sum(axis=1)
        level = np.where(fields[:, 0] == 1, -level, level)
        return scale, torch.from_numpy(level)[None].to(like.device)

    def _wire_entries(self, payload: Params, upload: Params) -> list[str]:
        """The compressed entries of an upload that travels as bytes: every floating entry of the
        broadcast, in its order (`decode` reads the layout from the broadcast alone)."""
        names = self.compressed_entries(payload, upload)
        if names != [n for n, v in payload.items() if v.is_floating_point()]:
            raise ConfigError(
                "compression on the wire needs uploads holding every floating entry of the "
                "broadcast, in its order; set compression.method=none"
            )
        return names


#: The prefix of a wire form's compressed entries (the dense ones keep their names).
WIRE = "$compressed/"


def as_bytes(data: bytes) -> torch.Tensor:
    """Bytes as a uint8 tensor (what a transport of tensors carries)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def qsgd(rows: torch.Tensor, uniform: torch.Tensor, levels: int) -> tuple[torch.Tensor, ...]:
    """Alistarh et al.'s Q_s of each row (one client's tensor) with the given U[0, 1) draws, as
    (the rows' norms (clients, 1), the signed levels sign(v_i) l_i)."""
    norm = rows.norm(dim=1, keepdim=True)
    scaled = rows.abs() * (levels / torch.where(norm > 0, norm, torch.ones_like(norm)))
    return norm, torch.sign(rows) * torch.floor(scaled + uniform)


def int8(rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each row (one client's tensor) as (its scale max |v| / 127 (clients, 1), the entries
    rounded to int8 at that scale)."""
    scale = rows.abs().amax(dim=1, keepdim=True) / 127
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return scale, torch.round(rows / safe).clamp(-127, 127).to(torch.int8)
