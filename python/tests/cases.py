"""Attention variants as a .score kernel and as PyTorch functions.

Each case pairs a .score kernel (a sample file, or source text for the
attention-gym variants that no sample covers) with the same score and mask
written with torch ops, usable both as flex_attention's score_mod /
mask_mod and elementwise over broadcast index tensors (the dense float64
model in oracle.py), plus the params and buffers a call needs.
"""
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLES = os.path.join(ROOT, "samples")


@dataclass
class Case:
    name: str
    source: str                   # a samples/ file name, or .score source text
    score: Optional[Callable]     # (s, b, h, q, kv, bufs, params) -> float, or None
    mask: Optional[Callable]      # (b, h, q, kv, bufs, params) -> bool, or None
    params: dict = field(default_factory=dict)
    buffers: Callable = lambda B, H, QL, KL, g: {}   # sizes, torch.Generator -> {name: tensor}
    q_len: int = 64
    kv_len: int = 64
    kernel: Optional[str] = None

    @property
    def path_or_source(self):
        p = os.path.join(SAMPLES, self.source)
        return p if self.source.endswith(".score") else self.source


def _slopes(B, H, QL, KL, g):
    return {"slopes": torch.exp2(-8.0 * torch.arange(1, H + 1, dtype=torch.float32) / H)}


def _causal(b, h, q, kv, u, p):
    return q >= kv


def _tanh_cap(x, cap):
    return cap * torch.tanh(x / cap)


def _gelu(x):
    return 0.5 * x * (1.0 + torch.erf(x * 0.70710678))


def _natten(xy):
    """A 3x3 neighbourhood on an 8x8 grid, clamped at the edges; xy maps a
    token index to its (x, y) cell."""
    def mask(b, h, q, kv, u, p):
        (qx, qy), (kx, ky) = xy(q), xy(kv)
        cx, cy = torch.clamp(qx, 1, 6), torch.clamp(qy, 1, 6)
        return ((cx - kx).abs() <= 1) & ((cy - ky).abs() <= 1)
    return mask


def _pages(B, H, QL, KL, g):
    """Four physical pages of 16 keys; each sequence owns a random non-empty
    subset, at logical positions 0.. in a random order (-1: another's)."""
    logical = torch.full((B, KL // 16), -1, dtype=torch.int32)
    for b in range(B):
        owned = torch.randperm(KL // 16, generator=g)[:1 + int(torch.randint(0, KL // 16, (1,), generator=g))]
        logical[b, owned] = torch.arange(len(owned), dtype=torch.int32)
    return {"logical": logical}


CASES = [
    # The samples, with params scaled to 64-token sequences.
    Case("alibi", "alibi.score",
         lambda s, b, h, q, kv, u, p: s + u["slopes"][h] * (kv - q), _causal, buffers=_slopes),
    Case("causal", "causal.score", None, _causal),
    Case("causal_lower_right", "causal_lower_right.score", None,
         lambda b, h, q, kv, u, p: q + (p["KV_LEN"] - p["Q_LEN"]) >= kv, q_len=40, kv_len=72),
    Case("dilated", "dilated.score", None,
         lambda b, h, q, kv, u, p: (q >= kv) & (torch.remainder(q - kv, 4) == torch.remainder(h, 4))),
    Case("document", "document.score", None,
         lambda b, h, q, kv, u, p: (u["doc"][q] == u["doc"][kv]) & (q >= kv),
         buffers=lambda B, H, QL, KL, g: {"doc": torch.tensor(
             [0] * 10 + [1] * 23 + [2] * 5 + [3] * 26, dtype=torch.int32)}),
    Case("gemma2", "gemma2.score",
         lambda s, b, h, q, kv, u, p: _tanh_cap(s + u["slopes"][h] * (kv - q), 5.0),
         lambda b, h, q, kv, u, p: (q >= kv) & (q - kv < 24),
         params={"softcap": 5.0, "window": 24}, buffers=_slopes),
    Case("head_temperature", "head_temperature.score",
         lambda s, b, h, q, kv, u, p: s * torch.exp(u["temp"][h]),
         lambda b, h, q, kv, u, p: kv < u["lengths"][b],
         buffers=lambda B, H, QL, KL, g: {
             "temp": 0.3 * torch.randn(H, generator=g),
             "lengths": torch.tensor([KL, KL - 21][:B], dtype=torch.int32)}),
    Case("natten", "natten.score", None,
         lambda b, h, q, kv, u, p: ((q // 8 - kv // 8).abs() <= 2) & ((q % 8 - kv % 8).abs() <= 2),
         params={"width": 8, "radius": 2}),
    Case("prefix_lm", "prefix_lm.score", None,
         lambda b, h, q, kv, u, p: (kv < 20) | (q >= kv), params={"prefix": 20}),
    Case("relpos_bias", "relpos_bias.score",
         lambda s, b, h, q, kv, u, p: s + u["rel_bias"][h, torch.clamp(kv - q + 8, 0, 15)], None,
         buffers=lambda B, H, QL, KL, g: {"rel_bias": 0.5 * torch.randn(H, 16, generator=g)}),
    Case("sliding_window", "sliding_window.score", None,
         lambda b, h, q, kv, u, p: (q >= kv) & (q - kv < 16), params={"window": 16}),
    Case("softcap", "softcap.score",
         lambda s, b, h, q, kv, u, p: _tanh_cap(s, 2.0), None, params={"softcap": 2.0}),
    Case("chunked_gelu", "chunked_gelu.score",
         lambda s, b, h, q, kv, u, p: (s + 0.25 * _gelu(s)
                                       - 0.125 * sum(((q ^ kv) >> i) & 1 for i in range(3))),
         lambda b, h, q, kv, u, p: ((q >> 3) - (kv >> 3) >= 0) & ((q >> 3) - (kv >> 3) <= 4)),
    Case("natten_gym", "natten_gym.score", None, _natten(lambda q: (q // 8, q % 8)),
         params={"width": 8, "height": 8, "kernel_w": 3, "kernel_h": 3}),
    Case("natten_tiled", "natten_tiled.score", None,
         _natten(lambda q: (q // 16 // 2 * 4 + q % 16 // 4, q // 16 % 2 * 4 + q % 16 % 4)),
         params={"width": 8, "height": 8, "kernel_w": 3, "kernel_h": 3, "tile_w": 4, "tile_h": 4}),
    Case("paged", "paged.score", None,
         lambda b, h, q, kv, u, p: ((u["logical"][b, kv // 16] >= 0)
                                    & (q >= u["logical"][b, kv // 16] * 16 + kv % 16)),
         params={"page_size": 16}, buffers=_pages),
    # attention-gym variants no sample spells this way.
    Case("plain", "", None, None, q_len=48, kv_len=80),
    Case("alibi_bidirectional",
         "buffer slopes: f32[H];\n"
         "score alibi(s, b, h, q, kv) { return s - slopes[h] * float(abs(q - kv)); }\n",
         lambda s, b, h, q, kv, u, p: s - u["slopes"][h] * (q - kv).abs(), None, buffers=_slopes),
    Case("softcap_sliding_window",
         "param float cap = 20.0;\nparam int w = 8;\n"
         "score capped(s, b, h, q, kv) { return cap * tanh(s / cap); }\n"
         "mask near(b, h, q, kv) { return abs(q - kv) <= w; }\n",
         lambda s, b, h, q, kv, u, p: _tanh_cap(s, 3.0),
         lambda b, h, q, kv, u, p: (q - kv).abs() <= 5, params={"cap": 3.0, "w": 5}),
    Case("document_bidirectional",
         "buffer doc: i32[KV_LEN];\n"
         "mask same(b, h, q, kv) { return doc[q] == doc[kv]; }\n",
         None, lambda b, h, q, kv, u, p: u["doc"][q] == u["doc"][kv],
         buffers=lambda B, H, QL, KL, g: {"doc": torch.randint(0, 3, (KL,), generator=g,
                                                               dtype=torch.int32).sort().values}),
]

BY_NAME = {c.name: c for c in CASES}
