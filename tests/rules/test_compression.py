"""Upload compression (rules/compression.py) against hand counts and plain per-client references:
the wire bytes of a tiny hand-made model, the stacked computation against a loop over clients,
error feedback's effect, QSGD's unbiasedness and the refusals at start."""

from __future__ import annotations

import math

import pytest
import torch

from fedac.config import load_config
from fedac.errors import ConfigError
from fedac.rules.compression import Compressor, index_bytes, level_bits
from fedac.seeding import torch_generator
from fedac.settings.compatibility import check

CLIENTS = ["a", "b", "c"]


def compressor(method: str, **settings) -> Compressor:
    settings = {"method": method, **settings}
    if method == "qsgd":
        settings.setdefault("error_feedback", False)
    return Compressor(
        load_config(overrides=[f"compression.{k}={v}" for k, v in settings.items()]), True
    )


def tiny_model(fill: float = 0.0) -> dict[str, torch.Tensor]:
    """A hand-made model: a 3 x 4 weight, a bias of 4 and an int64 BatchNorm-style counter."""
    return {
        "w": torch.full((3, 4), fill),
        "b": torch.full((4,), fill),
        "count": torch.tensor(7),
    }


def uploads(count: int = 3, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "w": torch.randn(3, 4, generator=g),
            "b": torch.randn(4, generator=g),
            "count": torch.tensor(9),
        }
        for _ in range(count)
    ]


# --- bytes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, settings, expected",
    [
        # 16 float entries (w 12 + b 4) and the int64 counter sent dense (8 bytes); dense: 72
        ("none", {}, 16 * 4 + 8),
        # k = ceil(0.25 * 16) = 4 pairs of a 1-byte index (16 entries fit a uint8) + a 4-byte value
        ("topk", {"ratio": 0.25}, 4 * (1 + 4) + 8),
        ("randk", {"ratio": 0.25}, 4 * (1 + 4) + 8),
        # k = ceil(0.01 * 16) = 1
        ("topk", {"ratio": 0.01}, 1 * (1 + 4) + 8),
        # s = 16: 5 level bits + 1 sign bit = 6 bits per entry; w: 4 + ceil(72 / 8) = 13, b: 4 + 3
        ("qsgd", {"levels": 16}, 13 + 7 + 8),
        # s = 1: 1 level bit + 1 sign bit; w: 4 + 3, b: 4 + 1
        ("qsgd", {"levels": 1}, 7 + 5 + 8),
        # a 4-byte scale and 1 byte per entry per tensor: (4 + 12) + (4 + 4)
        ("int8", {}, 16 + 8 + 8),
        ("bf16", {}, 2 * 16 + 8),
    ],
)
def test_wire_bytes_of_a_tiny_model_match_a_hand_count(method, settings, expected):
    comp = compressor(method, **settings)
    assert comp.wire_bytes(tiny_model(), uploads(1)[0]) == expected


def test_index_and_level_widths():
    assert [index_bytes(n) for n in (16, 256, 257, 65536, 65537, 2**32 + 1)] == [1, 1, 2, 2, 4, 8]
    assert [level_bits(s) for s in (1, 2, 3, 4, 15, 16)] == [1, 2, 2, 3, 4, 5]


def test_sparse_bytes_use_wider_indices_for_longer_updates():
    payload = {"w": torch.zeros(300)}  # 300 entries: indices need 2 bytes
    comp = compressor("topk", ratio=0.1)
    assert comp.wire_bytes(payload, {"w": torch.ones(300)}) == 30 * (2 + 4)


# --- the stacked computation against a plain loop over clients ------------------------------------


def reference(method: str, comp: Compressor, payload, upload, client: str, round_idx: int):
    """One client's rebuilt upload, computed alone with plain loops (the module docstring's
    equations)."""
    names = ["w", "b"]
    delta = {n: upload[n] - payload[n] for n in names}
    out = dict(upload)
    if method in ("topk", "randk"):
        flat = torch.cat([delta[n].flatten() for n in names])
        k = max(1, math.ceil(comp.cfg.ratio * flat.numel()))
        if method == "topk":
            keys = [abs(float(v)) for v in flat]
        else:  # the client's own seeded draws: the k largest pick the entries
            keys = torch.rand(
                flat.numel(), generator=torch_generator(0, "randk", round_idx, client)
            ).tolist()
        keep = sorted(range(flat.numel()), key=lambda i: -keys[i])[:k]
        sent = torch.zeros_like(flat)
        for i in keep:
            sent[i] = flat[i]
        parts = sent.split([delta[n].numel() for n in names])
        for n, part in zip(names, parts):
            out[n] = payload[n] + part.reshape(delta[n].shape)
        return out
    draws = torch.rand(16, generator=torch_generator(0, "qsgd", round_idx, client)).split([12, 4])
    for n, u in zip(names, draws):
        v = delta[n].flatten()
        if method == "int8":
            scale = float(v.abs().max()) / 127
            q = torch.tensor([round(float(x) / scale) * scale for x in v])
        elif method == "bf16":
            q = torch.tensor([float(torch.tensor(float(x)).to(torch.bfloat16)) for x in v])
        else:  # qsgd
            norm, s = float(v.norm()), comp.cfg.levels
            q = torch.tensor(
                [
                    norm
                    * math.copysign(1, float(x))
                    * math.floor(s * abs(float(x)) / norm + float(r))
                    / s
                    for x, r in zip(v, u)
                ]
            )
        out[n] = payload[n] + q.reshape(delta[n].shape)
    return out


@pytest.mark.parametrize("method", ["topk", "randk", "qsgd", "int8", "bf16"])
def test_stacked_compression_equals_a_loop_over_clients(method):
    comp = compressor(method, ratio=0.25, levels=4, error_feedback=False)
    payload = tiny_model(0.5)
    ups = uploads(len(CLIENTS))
    got = comp(payload, CLIENTS, ups, 3, {})
    for client, upload, rebuilt in zip(CLIENTS, ups, got):
        expected = reference(method, comp, payload, upload, client, 3)
        assert rebuilt.keys() == upload.keys()
        assert torch.equal(rebuilt["count"], upload["count"])  # integer entries travel as they are
        for n in ("w", "b"):
            assert torch.allclose(rebuilt[n], expected[n], atol=1e-6), (method, client, n)
        if method != "bf16":
            assert not torch.allclose(rebuilt["w"], upload["w"], atol=1e-3)  # it did compress


def test_randk_and_qsgd_draw_per_client_and_round():
    comp = compressor("randk", ratio=0.25, error_feedback=False)
    payload = tiny_model()
    same = uploads(1) * 2
    a, b = comp(payload, ["a", "b"], same, 1, {})
    assert not torch.equal(a["w"], b["w"])  # two clients, two subsets of the same update
    again = comp(payload, ["a", "b"], same, 1, {})
    assert torch.equal(again[0]["w"], a["w"])  # seeded: the same client and round, the same subset
    assert not torch.equal(comp(payload, ["a"], same[:1], 2, {})[0]["w"], a["w"])


# --- error feedback -------------------------------------------------------------------------------


def sent_over_rounds(feedback: bool, rounds: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(the sum of what one client sent over `rounds` rounds of the same update, that sum's
    target rounds x update, the residuals) under topk at 10 %."""
    comp = compressor("topk", ratio=0.1, error_feedback=feedback)
    payload = {"w": torch.zeros(100)}
    signs = torch.tensor([1.0, -1.0]).repeat(50)
    update = {"w": torch.linspace(0.1, 1.0, 100) ** 2 * signs}  # every entry at least 0.01
    residuals: dict = {}
    total = torch.zeros(100)
    for r in range(1, rounds + 1):
        total += comp(payload, ["a"], [update], r, residuals)[0]["w"]
    return total, rounds * update["w"], residuals


def test_error_feedback_sends_what_topk_left_out_in_later_rounds():
    total, target, residuals = sent_over_rounds(True, 50)
    # EF telescopes: what was sent plus what is still held back is every update, exactly
    assert torch.allclose(total + residuals["a"]["w"], target, atol=1e-4)
    assert float((total - target).norm() / target.norm()) < 0.1
    # the entries topk left out came through later (without EF: the same 10 every round)
    assert int((total != 0).sum()) > 20


def test_without_error_feedback_the_residual_is_lost():
    total, target, residuals = sent_over_rounds(False, 50)
    assert residuals == {}
    # the same 10 entries every round: 90 entries never sent, most of the update's mass lost
    assert int((total != 0).sum()) == 10
    assert float((total - target).norm() / target.norm()) > 0.3


# --- QSGD is unbiased -----------------------------------------------------------------------------


def test_qsgd_is_unbiased():
    """4,000 quantisations of one vector (4,000 clients, each its own draws) at s = 4: their mean
    equals the vector within 0.03 per entry. Each entry's quantisation error is at most ||v|| / s =
    0.75 (std <= 0.375), so the mean's standard error is <= 0.0059: 0.03 is 5 of them, while a bias
    of one level's tenth (0.075) would fail."""
    comp = compressor("qsgd", levels=4)
    v = torch.tensor([1.0, -2.0, 0.5, 0.0, -0.25, 1.5])  # ||v|| = 3
    payload = {"v": torch.zeros(6)}
    many = 4000
    out = comp(payload, [f"c{i}" for i in range(many)], [{"v": v}] * many, 1, {})
    stack = torch.stack([o["v"] for o in out])
    assert not torch.allclose(stack[0], v, atol=0.1)  # one quantisation alone is coarse
    assert set(torch.unique(stack[:, 0] / 0.75).round().tolist()) <= {1.0, 2.0}  # its levels
    assert torch.allclose(stack.mean(dim=0), v, atol=0.03)


# --- refusals at start ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["compression.method=topk", "algorithm=scaffold"],
            "algorithm scaffold uploads something else",
        ),
        (
            ["compression.method=qsgd", "compression.error_feedback=true"],
            "set compression.error_feedback=false",
        ),
        (["compression.method=int8", "dp.mode=client"], "can lengthen it past dp.clip"),
        (
            ["compression.method=topk", "compression.download=true"],
            "compression.method=topk does not quantise",
        ),
        (["compression.download=true"], "compression.method=none does not quantise"),
    ],
)
def test_nonsensical_combinations_are_refused_at_start(overrides, message):
    """(by the compatibility matrix, settings/compatibility.py)"""
    with pytest.raises(ConfigError, match=message):
        check(load_config(overrides=overrides))


def test_an_upload_that_is_not_the_broadcasts_form_is_refused():
    comp = compressor("topk")
    with pytest.raises(ConfigError, match="'extra' is not the broadcast's entry"):
        comp.wire_bytes(tiny_model(), {**uploads(1)[0], "extra": torch.zeros(2)})


# --- the bytes themselves: one client's wire form -------------------------------------------------


@pytest.mark.parametrize(
    "method, settings",
    [
        ("topk", {"ratio": 0.25}),
        ("randk", {"ratio": 0.25}),
        ("qsgd", {"levels": 16}),
        ("qsgd", {"levels": 3}),
        ("int8", {}),
        ("bf16", {}),
    ],
)
def test_the_encoded_bytes_are_the_counted_bytes_and_decode_to_the_stacked_result(method, settings):
    """A client's `encode` is real bytes (uint8 tensors) whose total length is `wire_bytes`, and
    `decode` rebuilds from them the upload the stacked computation gives that client, residuals
    included."""
    feedback = method != "qsgd"
    comp = compressor(method, error_feedback=feedback, **settings)
    payload = tiny_model(0.5)
    stacked_residuals: dict = {}
    one_residuals: dict = {}
    for round_idx in (1, 2):  # the second round sends with the first's residuals
        ups = uploads(len(CLIENTS), seed=round_idx)
        stacked = comp(payload, CLIENTS, ups, round_idx, stacked_residuals)
        for client, upload, expected in zip(CLIENTS, ups, stacked):
            wire = comp.encode(payload, upload, client, round_idx, one_residuals)
            assert all(v.dtype == torch.uint8 for k, v in wire.items() if k != "count")
            assert sum(v.numel() * v.element_size() for v in wire.values()) == comp.wire_bytes(
                payload, upload
            )
            rebuilt = comp.decode(payload, wire)
            assert list(rebuilt) == list(upload)
            for n in upload:
                assert torch.allclose(rebuilt[n], expected[n], atol=1e-6), (method, client, n)
    if feedback:
        for c in CLIENTS:
            for n in ("w", "b"):
                assert torch.allclose(one_residuals[c][n], stacked_residuals[c][n], atol=1e-6)


# --- the broadcast (compression.download=true) ----------------------------------------------------


def test_a_quantised_broadcast_is_each_tensor_at_its_own_int8_scale_and_counted_so():
    comp = compressor("int8", download=True)
    g = torch.Generator().manual_seed(5)
    payload = {"w": torch.randn(3, 4, generator=g), "b": torch.randn(4, generator=g)}
    payload["count"] = torch.tensor(7)
    received = comp.broadcast(payload, 1)
    for n in ("w", "b"):
        scale = float(payload[n].abs().max()) / 127
        by_hand = torch.tensor([round(float(x) / scale) * scale for x in payload[n].flatten()])
        assert torch.allclose(received[n].flatten(), by_hand, atol=1e-6)
        assert not torch.equal(received[n], payload[n])
    assert torch.equal(received["count"], payload["count"])
    assert comp.broadcast_bytes(payload) == (4 + 12) + (4 + 4) + 8
    plain = compressor("int8")  # download=false: the broadcast travels as it is
    assert plain.broadcast(payload, 1) is payload and plain.broadcast_bytes(payload) is None
