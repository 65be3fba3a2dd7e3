"""flexc.torch under torch.compile: the custom ops pass PyTorch's own
checks (schema, fake tensors, autograd registration), and a small model
using flex_attention compiles with fullgraph=True (no graph break) and
gives the eager model's outputs and gradients, forward and backward."""
import pytest
import torch
from cases import BY_NAME
from conftest import compiled, make_inputs
from oracle import rel_err
from torch.nn.attention.flex_attention import create_block_mask

import flexc.torch as ft


@pytest.mark.parametrize("name", ["gemma2", "relpos_bias", "plain"])
def test_opcheck(name):
    case = BY_NAME[name]
    q, k, v, bufs = make_inputs(case, torch.float32, grad=True)
    kern = compiled(case)
    grads = [n for n in bufs if bufs[n].requires_grad]
    want = "".join("1" if n in grads else "0" for n in bufs)
    ptext = ",".join(f"{n}={float(x)!r}" for n, x in case.params.items())
    spec = ";".join([kern.id, "reference", ptext, ",".join(bufs), want, "00", ""])
    torch.library.opcheck(torch.ops.flexc.attention.default,
                          (q, k, v, spec, 0.0, list(bufs.values()), [], []))


class Block(torch.nn.Module):
    """One attention layer: projections, a flexc kernel with a learnable
    relative-position bias table (a `grad` buffer), an output projection."""

    def __init__(self, dim=32, heads=4, bias_kernel=None):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.rel_bias = torch.nn.Parameter(0.1 * torch.randn(heads, 16))
        self.kernel = bias_kernel

    def forward(self, x, block_mask=None):
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        o = ft.flex_attention(q, k, v, score_mod=self.kernel, block_mask=block_mask,
                              buffers={"rel_bias": self.rel_bias})
        return self.proj(o.transpose(1, 2).reshape(B, L, D))


def _run(fn, model, x, bm=None):
    for p in model.parameters():
        p.grad = None
    y = fn(x, bm)
    y.square().mean().backward()
    return y.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("with_mask", [False, True], ids=["no_mask", "torch_block_mask"])
def test_compiled_model_forward_and_backward(with_mask):
    torch._dynamo.reset()
    kern = compiled(BY_NAME["relpos_bias"])
    model = Block(bias_kernel=kern)
    x = torch.randn(2, 128, 32)
    # 64 x 64 blocks (empty, full and partial ones): the cpu backend's
    # backward takes a caller's blocks in multiples of 64.
    bm = create_block_mask(lambda b, h, i, j: i >= j, None, None, 128, 128, device="cpu",
                           BLOCK_SIZE=64) if with_mask else None
    y_eager, g_eager = _run(model, model, x, bm)
    y_comp, g_comp = _run(torch.compile(model, fullgraph=True), model, x, bm)
    assert rel_err(y_comp, y_eager) < 1e-5
    assert set(g_comp) == set(g_eager)
    for n in g_eager:
        assert rel_err(g_comp[n], g_eager[n]) < 1e-4, n
    assert g_comp["rel_bias"].abs().sum() > 0  # the buffer's gradient flows


def test_compiled_function_with_lse_and_params():
    torch._dynamo.reset()
    case = BY_NAME["gemma2"]
    kern = compiled(case)
    q, k, v, bufs = make_inputs(case, torch.float32, grad=True)

    def f(q, k, v, slopes):
        out, lse = ft.flex_attention(q, k, v, score_mod=kern, params={"softcap": 5.0, "window": 24},
                                     buffers={"slopes": slopes}, return_lse=True)
        return out.sum() + lse.sum()

    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    loss = cf(q, k, v, bufs["slopes"])
    loss.backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    f(q, k, v, bufs["slopes"]).backward()
    assert rel_err(loss.detach(), f(q, k, v, bufs["slopes"]).detach()) < 1e-6
    for g, t in zip(grads, (q, k, v)):
        assert rel_err(g, t.grad) < 1e-6


class TracedBlock(torch.nn.Module):
    """An attention layer whose score_mod is a Python closure over a
    learnable bias table and a Python number, made anew in each forward
    (as FlexAttention users write it)."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.rel_bias = torch.nn.Parameter(0.1 * torch.randn(heads, 16))
        self.cap = 20.0

    def forward(self, x, block_mask=None):
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        bias, cap = self.rel_bias, self.cap

        def score_mod(score, b, h, q_idx, kv_idx):
            return cap * torch.tanh((score + bias[h, torch.clamp(kv_idx - q_idx + 8, 0, 15)]) / cap)
        o = ft.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)
        return self.proj(o.transpose(1, 2).reshape(B, L, D))


@pytest.mark.parametrize("mask,backend", [("none", "aot_eager"), ("torch", "inductor"),
                                          ("flexc", "aot_eager")])
def test_compiled_model_with_a_python_score_mod(mask, backend):
    torch._dynamo.reset()
    model = TracedBlock()
    x = torch.randn(2, 128, 32)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx
    bm = None if mask == "none" else create_block_mask(
        causal, None, None, 128, 128, device="cpu", BLOCK_SIZE=64) if mask == "torch" else \
        ft.create_block_mask(causal, None, None, 128, 128, BLOCK_SIZE=64)
    y_eager, g_eager = _run(model, model, x, bm)
    y_comp, g_comp = _run(torch.compile(model, fullgraph=True, backend=backend), model, x, bm)
    assert rel_err(y_comp, y_eager) < 1e-5
    for n in g_eager:
        assert rel_err(g_comp[n], g_eager[n]) < 1e-4, n
    assert g_comp["rel_bias"].abs().sum() > 0
