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

Each method is a registered codec (settings/codecs.py, `fedac list codecs`; plug-ins through the
`fedac.codecs` entry points): a `Codec` subclass here declaring its stacked message, its decode, its
wire bytes and its packing into bytes, its capabilities (sparse, quantised, unbiased, needs a
residual) in its table entry. `Compressor` is the one run-time driver every codec shares: which
entries, the updates and residuals, the seeded draws, the broadcast and the wire form.

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
(`RunState.compression_residuals`, checkpointed), passed in here. It is on by default for the
biased codecs and off for the unbiased qsgd (`compression.error_feedback` unset: what the codec
declares; true with qsgd is refused by the compatibility matrix).
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
from fedac.seeding import torch_generator
from fedac.settings.codecs import codec_spec, error_feedback
from fedac.training.device import nbytes
from fedac.training.types import Params


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


#: Seeded U[0, 1) draws shaped like a codec's rows, one generator per client (`Compressor.uniform`):
#: draws(rows, clients, round_idx, purpose).
Draws = Callable[[dict[str, torch.Tensor], list[str], int, str], dict[str, torch.Tensor]]


class Codec:
    """One compression method, on the stacked updates of a round (`rows`: per compressed entry a
    (clients, n) tensor, row i client i). A subclass declares what is sent (`message`), what the
    server rebuilds from it (`decoded`), its bytes on the wire (`wire_bytes`) and how one client's
    message travels as bytes (`pack`, `unpack`); its capabilities live in its table entry
    (settings/codecs.py `CodecSpec`). `settings`: the `compression` section."""

    def __init__(self, settings: Any):
        self.settings = settings

    def message(
        self, rows: dict[str, torch.Tensor], clients: list[str], round_idx: int, draws: Draws
    ) -> dict[str, Any]:
        """What the clients send, stacked (row i: client i)."""
        raise NotImplementedError

    def decoded(self, message: dict[str, Any], like: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The updates a stacked `message` stands for, per entry shaped like `like`'s stacks."""
        raise NotImplementedError

    def wire_bytes(self, sizes: list[int], dtype: torch.dtype) -> int:
        """Bytes of the compressed entries, of `sizes` entries each, values of `dtype`."""
        raise NotImplementedError

    def pack(self, message: dict[str, Any], sizes: list[int]) -> dict[str, bytes]:
        """One client's `message` (its stacks of one row) as named byte strings whose lengths add
        up to `wire_bytes`."""
        raise NotImplementedError

    def unpack(
        self, wire: dict[str, bytes], like: dict[str, torch.Tensor], dtype: torch.dtype
    ) -> dict[str, Any]:
        """`pack`'s byte strings back as the one-client stacked message of entries like `like`
        (each (1, ...)), values of `dtype`."""
        raise NotImplementedError


class Dense(Codec):
    """`none`: every entry as it is (the run never compresses; here so the table's entry names a
    codec)."""

    def message(self, rows, clients, round_idx, draws):
        return dict(rows)

    def decoded(self, message, like):
        return {n: r.reshape(like[n].shape) for n, r in message.items()}

    def wire_bytes(self, sizes, dtype):
        return sum(sizes) * torch.empty((), dtype=dtype).element_size()

    def pack(self, message, sizes):
        return {n: r[0].cpu().numpy().tobytes() for n, r in message.items()}

    def unpack(self, wire, like, dtype):
        return {
            n: torch.frombuffer(bytearray(wire[n]), dtype=like[n].dtype)[None].to(like[n].device)
            for n in like
        }


class Sparse(Codec):
    """k (index, value) pairs over the whole update as one vector (every compressed entry
    together): {"index", "values"} stacks of (clients, k)."""

    def kept(self, entries: int) -> int:
        """k, the entries sent of an update of `entries` entries."""
        return min(entries, max(1, math.ceil(self.settings.ratio * entries)))

    def chosen(self, flat: torch.Tensor, k: int, rows, clients, round_idx, draws) -> torch.Tensor:
        """The (clients, k) indices each client sends of its `flat` update."""
        raise NotImplementedError

    def message(self, rows, clients, round_idx, draws):
        flat = torch.cat(list(rows.values()), dim=1)
        index = self.chosen(flat, self.kept(flat.shape[1]), rows, clients, round_idx, draws)
        return {"index": index, "values": flat.gather(1, index)}

    def decoded(self, message, like):
        sizes = [v[0].numel() for v in like.values()]
        values = message["values"]
        flat = torch.zeros(values.shape[0], sum(sizes), dtype=values.dtype, device=values.device)
        flat.scatter_(1, message["index"], values)
        parts = flat.split(sizes, dim=1)
        return {n: p.reshape(like[n].shape) for n, p in zip(like, parts)}

    def wire_bytes(self, sizes, dtype):
        d = sum(sizes)
        if not d:
            return 0
        width = torch.empty((), dtype=dtype).element_size()
        return self.kept(d) * (index_bytes(d) + width)

    def pack(self, message, sizes):
        index = message["index"][0].cpu().numpy().astype(f"<u{index_bytes(sum(sizes))}")
        return {"index": index.tobytes(), "values": message["values"][0].cpu().numpy().tobytes()}

    def unpack(self, wire, like, dtype):
        d = sum(v[0].numel() for v in like.values())
        device = next(iter(like.values())).device
        index = torch.from_numpy(
            np.frombuffer(wire["index"], f"<u{index_bytes(d)}").astype(np.int64)
        )
        values = torch.frombuffer(bytearray(wire["values"]), dtype=dtype)
        return {"index": index[None].to(device), "values": values[None].to(device)}


class TopK(Sparse):
    """`topk` (Stich et al. 2018): the k entries of largest magnitude."""

    def chosen(self, flat, k, rows, clients, round_idx, draws):
        return flat.abs().topk(k, dim=1, sorted=False).indices


class RandK(Sparse):
    """`randk` (Stich et al. 2018): k entries drawn uniformly without replacement, seeded by
    (seed, round, client); the k largest of seeded uniform draws are a uniform k-subset."""

    def chosen(self, flat, k, rows, clients, round_idx, draws):
        uniform = torch.cat(list(draws(rows, clients, round_idx, "randk").values()), 1)
        return uniform.topk(k, dim=1, sorted=False).indices


class PerEntry(Codec):
    """A quantiser that sends each entry (tensor) on its own: `encode_rows` / `decode_rows` of one
    entry's (clients, n) rows, packed per entry."""

    def encode_rows(self, rows: torch.Tensor, uniform: torch.Tensor | None) -> Any:
        raise NotImplementedError

    def decode_rows(self, part: Any, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    #: The purpose of its seeded draws (None: it draws nothing).
    draws: str | None = None

    def message(self, rows, clients, round_idx, draws):
        noise = draws(rows, clients, round_idx, self.draws) if self.draws else {}
        return {n: self.encode_rows(r, noise.get(n)) for n, r in rows.items()}

    def decoded(self, message, like):
        return {
            n: self.decode_rows(part, like[n].dtype).reshape(like[n].shape)
            for n, part in message.items()
        }

    def pack(self, message, sizes):
        return {n: self.pack_entry(part) for n, part in message.items()}

    def unpack(self, wire, like, dtype):
        return {n: self.unpack_entry(wire[n], like[n][0]) for n in like}

    def pack_entry(self, part: Any) -> bytes:
        raise NotImplementedError

    def unpack_entry(self, data: bytes, like: torch.Tensor) -> Any:
        raise NotImplementedError


class BF16(PerEntry):
    """`bf16`: every entry as bfloat16 (2 bytes)."""

    def encode_rows(self, rows, uniform):
        return rows.to(torch.bfloat16)

    def decode_rows(self, part, dtype):
        return part.to(dtype)

    def wire_bytes(self, sizes, dtype):
        return sum(2 * n for n in sizes)

    def pack_entry(self, part):
        return part[0].view(torch.int16).cpu().numpy().astype("<i2").tobytes()

    def unpack_entry(self, data, like):
        ints = torch.from_numpy(np.frombuffer(data, "<i2").copy())
        return ints.view(torch.bfloat16)[None].to(like.device)


def _scale_bytes(head: torch.Tensor) -> bytes:
    """A one-client (1, 1) fp32 scale or norm as 4 little-endian bytes."""
    return np.asarray([float(head[0, 0])], dtype="<f4").tobytes()


def _scale_of(data: bytes, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor([[float(np.frombuffer(data[:4], "<f4")[0])]], device=like.device)


class Int8(PerEntry):
    """`int8`: per tensor, scale = max |v_i| / 127 (fp32) and round(v_i / scale) as one signed
    byte."""

    def encode_rows(self, rows, uniform):
        return int8(rows)

    def decode_rows(self, part, dtype):
        scale, q = part
        return q.to(scale.dtype) * scale

    def wire_bytes(self, sizes, dtype):
        return sum(4 + n for n in sizes)

    def pack_entry(self, part):
        head, body = part
        return _scale_bytes(head) + body[0].cpu().numpy().astype(np.int8).tobytes()

    def unpack_entry(self, data, like):
        q = torch.from_numpy(np.frombuffer(data[4:], np.int8).copy())
        return _scale_of(data, like), q[None].to(like.device)


class QSGD(PerEntry):
    """`qsgd` (Alistarh et al. 2017): per tensor its norm and each entry's signed stochastic level,
    seeded by (seed, round, client); sent as the fp32 norm and per entry a sign bit and the level's
    ceil(log2(s + 1)) bits, most significant first, padded to whole bytes per tensor."""

    draws = "qsgd"

    def encode_rows(self, rows, uniform):
        return qsgd(rows, uniform, self.settings.levels)

    def decode_rows(self, part, dtype):  # ||v|| sign l / s
        norm, level = part
        return level.to(norm.dtype) * (norm / self.settings.levels)

    def wire_bytes(self, sizes, dtype):
        bits = 1 + level_bits(self.settings.levels)
        return sum(4 + math.ceil(n * bits / 8) for n in sizes)

    def pack_entry(self, part):
        head, body = part
        level = body[0].cpu().numpy().astype(np.int64)
        bits = level_bits(self.settings.levels)
        shifts = np.arange(bits - 1, -1, -1)
        fields = np.concatenate(
            [(level < 0)[:, None], (np.abs(level)[:, None] >> shifts) & 1], axis=1
        ).astype(np.uint8)
        return _scale_bytes(head) + np.packbits(fields.reshape(-1)).tobytes()

    def unpack_entry(self, data, like):
        n, bits = like.numel(), level_bits(self.settings.levels)
        packed = np.unpackbits(np.frombuffer(data[4:], np.uint8), count=n * (1 + bits))
        fields = packed.reshape(n, 1 + bits).astype(np.int64)
        level = (fields[:, 1:] << np.arange(bits - 1, -1, -1)).sum(axis=1)
        level = np.where(fields[:, 0] == 1, -level, level)
        return _scale_of(data, like), torch.from_numpy(level)[None].to(like.device)


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
        #: The configured codec (settings/codecs.py's entry, its class here or a plug-in's).
        self.codec: Codec = spec.load()(c)
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
        if not names:
            return dense
        return dense + self.codec.wire_bytes(
            [upload[n].numel() for n in names], _dtype(upload, names)
        )

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
        """What the clients send, stacked (row i: client i): the codec's message of the
        (clients, n) rows of every entry."""
        rows = {n: d.reshape(len(clients), -1) for n, d in deltas.items()}
        return self.codec.message(rows, clients, round_idx, self.uniform)

    def decoded(self, message: dict[str, Any], like: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The updates a stacked `message` stands for, per entry shaped like `like`'s stacks."""
        return self.codec.decoded(message, like)

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
        sizes = [payload[n].numel() for n in names]
        for key, data in self.codec.pack(message, sizes).items():
            wire[f"{WIRE}{key}"] = as_bytes(data)
        return wire

    def decode(self, payload: Params, wire: dict[str, torch.Tensor]) -> Params:
        """The upload the server rebuilds from one client's `encode`d wire form."""
        names = [n for n, v in payload.items() if v.is_floating_point()]
        out = {n: v for n, v in wire.items() if not n.startswith(WIRE)}
        packed = {
            n[len(WIRE) :]: v.cpu().numpy().tobytes() for n, v in wire.items() if n.startswith(WIRE)
        }
        like = {n: payload[n][None] for n in names}
        sent = self.decoded(self.codec.unpack(packed, like, _dtype(payload, names)), like)
        for n in names:
            out[n] = (payload[n] + sent[n][0]).to(payload[n].dtype)
        return {n: out[n] for n in [*payload, *(k for k in out if k not in payload)] if n in out}

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


def _dtype(upload: Params, names: list[str]) -> torch.dtype:
    """The dtype torch.cat gives the concatenated update of entries `names` (a sparse codec's
    values travel at it)."""
    return functools.reduce(torch.promote_types, [upload[n].dtype for n in names])


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
