"""Precision is what the caller asked for: float64 tensors run in float64
(on the reference backend, which flexc.torch picks for them by default),
so torch.autograd.gradcheck passes as it is; a backend that computes in
float32 refuses float64 inputs with a message naming the one that does."""
import pytest
import torch

import flexc
from flexc.torch import flex_attention


def test_gradcheck_float64_by_default():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    # a captured tensor is an f32 buffer (docs/from-pytorch.md): one whose
    # values are binary32 already is read exactly
    bias = torch.randn(2, generator=g).double()

    def fn(q, k, v):
        def score_mod(score, b, h, q_idx, kv_idx):
            return torch.where(q_idx >= kv_idx, score + bias[h] * (kv_idx - q_idx), -float("inf"))
        return flex_attention(q, k, v, score_mod=score_mod, return_lse=True)

    out, lse = fn(q, k, v)
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-7, rtol=1e-6)


def test_learnable_buffer_gradient_in_float64():
    # The gradient of a learnable captured tensor, against float64 autograd
    # of the same function (the buffer rounded to binary32, as it is read).
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 9, 4, generator=g, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(2, generator=g, dtype=torch.float64).requires_grad_()

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + bias[h] * (kv_idx - q_idx)

    dout = torch.randn(1, 2, 9, 4, generator=g, dtype=torch.float64)
    (flex_attention(q, k, v, score_mod=score_mod) * dout).sum().backward()
    got, bias.grad = bias.grad.clone(), None
    b32 = bias.float().double()
    s = q @ k.transpose(-1, -2) / 2.0
    rel = torch.arange(9.0, dtype=torch.float64)[None, :] - torch.arange(9.0)[:, None]
    s = s + b32.view(1, 2, 1, 1) * rel
    (torch.softmax(s, -1) @ v * dout).sum().backward()
    want = bias.grad
    assert (got - want).norm() / want.norm() < 1e-9


@pytest.mark.parametrize("backend", [b for b in ("cpu", "emu") if b in flexc.backends()])
def test_float64_refused_where_computed_in_float32(backend):
    q = torch.randn(1, 2, 8, 16, dtype=torch.float64)
    with pytest.raises(flexc.FlexError, match="float64 on the reference backend only"):
        flex_attention(q, q, q, backend=backend)
