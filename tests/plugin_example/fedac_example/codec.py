# fedac_example/codec.py
"""A compression codec: the scaled sign of Karimireddy et al. 2019 (EF-SignSGD, Alg. 2's C). Per
tensor v of n entries a client sends its mean magnitude ||v||_1 / n (fp32) and one sign bit per
entry; the server rebuilds (||v||_1 / n) sign(v), a zero entry as +. Biased: error feedback is on
by default, as its table entry declares no `unbiased`."""

import math

import numpy as np
import torch

from fedac.rules.compression import PerEntry


class ScaledSign(PerEntry):
    def encode_rows(self, rows, uniform):
        return rows.abs().mean(dim=1, keepdim=True), rows < 0

    def decode_rows(self, part, dtype):
        scale, negative = part
        return scale.to(dtype) * (1 - 2 * negative.to(dtype))

    def wire_bytes(self, sizes, dtype):
        return sum(4 + math.ceil(n / 8) for n in sizes)

    def pack_entry(self, part):
        scale, negative = part
        head = np.asarray([float(scale[0, 0])], dtype="<f4").tobytes()
        return head + np.packbits(negative[0].cpu().numpy()).tobytes()

    def unpack_entry(self, data, like):
        scale = torch.tensor([[float(np.frombuffer(data[:4], "<f4")[0])]], device=like.device)
        bits = np.unpackbits(np.frombuffer(data[4:], np.uint8), count=like.numel())
        return scale, torch.from_numpy(bits.astype(bool))[None].to(like.device)
