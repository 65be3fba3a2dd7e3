"""Position offsets from Python (docs/language.md "Position offsets"):
flex_attention on shards of a sequence with q_offset, kv_offset and the
whole lengths, merged by LSE, equals the whole call forward and backward
(and with dropout, whose bits see the whole sequence's positions);
Kernel.mask_class decides a shard pair without evaluating it."""
import pytest
import torch

import flexc
from flexc.torch import flex_attention

BACKENDS = [b for b in ("reference", "cpu") if b in flexc.backends()]


def causal(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx >= kv_idx, score, -float("inf"))


@pytest.mark.parametrize("dropout", [0.0, 0.25])
@pytest.mark.parametrize("backend", BACKENDS)
def test_shards_merge_to_the_whole(backend, dropout):
    g = torch.Generator().manual_seed(7)
    dt = torch.float64 if backend == "reference" else torch.float32
    B, H, L, E = 1, 2, 60, 16
    q, k, v, dout = (torch.randn(B, H, L, E, generator=g, dtype=dt) for _ in range(4))
    kw = dict(score_mod=causal, backend=backend, dropout_p=dropout, dropout_seed=11)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o, lse = flex_attention(*leaves, return_lse=True, **kw)
    (o * dout).sum().backward()
    cuts = [0, 23, 60]
    sq, sk, sv = (x.clone().requires_grad_() for x in (q, k, v))
    outs = []
    for a in range(2):
        q0, q1 = cuts[a], cuts[a + 1]
        pairs = [flex_attention(sq[:, :, q0:q1], sk[:, :, k0:k1], sv[:, :, k0:k1], return_lse=True,
                                q_offset=q0, kv_offset=k0, q_len_total=L, kv_len_total=L, **kw)
                 for k0, k1 in zip(cuts, cuts[1:])]
        m = torch.logsumexp(torch.stack([p[1] for p in pairs]), 0)
        outs.append(sum(torch.nan_to_num(torch.exp(p[1] - m))[..., None] * p[0] for p in pairs))
    merged = torch.cat(outs, 2)
    (merged * dout).sum().backward()
    tol = 1e-10 if backend == "reference" else 1e-5
    assert (merged - o).abs().max() < tol
    for a, b in zip((sq, sk, sv), leaves):
        assert ((a.grad - b.grad).norm() / b.grad.norm()) < (1e-10 if backend == "reference" else 1e-4)


def test_mask_class_of_shard_pairs():
    k = flexc.compile("samples/causal.score")
    kw = dict(q_len_total=256, kv_len_total=256)
    assert k.mask_class(1, 4, 128, 128, kv_offset=128, **kw) == "empty"
    assert k.mask_class(1, 4, 128, 128, q_offset=128, **kw) == "full"
    assert k.mask_class(1, 4, 128, 128, **kw) == "partial"
    with pytest.raises(flexc.FlexError, match="lie past"):
        k.mask_class(1, 4, 128, 128, q_offset=200, **kw)
