"""flexc.torch.flex_attention against PyTorch: forward outputs and LSE
against torch.nn.attention.flex_attention (eager, CPU) on the same
inputs, gradients against torch autograd through a dense float64
implementation of the same score and mask, for every sample and the
usual attention-gym variants, in float32 and bfloat16."""
import pytest
import torch
from cases import CASES
from conftest import compiled, make_inputs
from oracle import TOL, dense, rel_err, torch_reference

import flexc
from flexc.torch import flex_attention

DTYPES = [torch.float32, torch.bfloat16]
ids = [c.name for c in CASES]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_forward_matches_torch_flex_attention(case, dtype):
    q, k, v, bufs = make_inputs(case, dtype)
    out, lse = flex_attention(q, k, v, score_mod=compiled(case), params=case.params,
                              buffers=bufs, return_lse=True)
    ref_out, ref_lse = torch_reference(case, q, k, v, bufs)
    assert out.dtype == dtype and out.shape == ref_out.shape
    assert lse.dtype == torch.float32 and lse.shape == ref_lse.shape
    tol = TOL[dtype][0]
    assert rel_err(out, ref_out) < tol
    assert rel_err(lse, ref_lse) < tol


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_gradients_match_dense_float64_autograd(case, dtype):
    q, k, v, bufs = make_inputs(case, dtype, grad=True)
    out, lse = flex_attention(q, k, v, score_mod=compiled(case), params=case.params,
                              buffers=bufs, return_lse=True)
    g = torch.Generator().manual_seed(1)
    dout = torch.randn(out.shape, generator=g)
    dlse = torch.randn(lse.shape, generator=g)

    def loss(o, l):  # fully masked rows have LSE -inf: no gradient through them
        return (o * dout.to(o.dtype)).sum() + (l.where(torch.isfinite(l), 0) * dlse.to(l.dtype)).sum()

    loss(out, lse).backward()
    leaves = {"q": q, "k": k, "v": v}
    leaves.update({n: t for n, t in bufs.items() if t.requires_grad})
    wide = {n: t.detach().double().requires_grad_() for n, t in leaves.items()}
    wide_bufs = dict(bufs, **{n: wide[n] for n in bufs if n in wide})
    out64, lse64 = dense(case, wide["q"], wide["k"], wide["v"], wide_bufs)
    loss(out64, lse64).backward()
    tol = TOL[dtype][1]
    assert set(leaves) - {"q", "k", "v"} == set(compiled(case).grad_buffers or ())
    for n, t in leaves.items():
        assert t.grad is not None, n
        assert t.grad.dtype == t.dtype, n
        assert rel_err(t.grad, wide[n].grad) < tol, n


def test_plain_attention_without_score_mod():
    case = next(c for c in CASES if c.name == "plain")
    q, k, v, _ = make_inputs(case, torch.float32)
    out, lse = flex_attention(q, k, v, return_lse=True)
    ref_out, ref_lse = torch_reference(case, q, k, v, {})
    assert rel_err(out, ref_out) < 1e-4 and rel_err(lse, ref_lse) < 1e-4
    assert torch.equal(flex_attention(q, k, v), out)


def test_scale_value_head_dim_and_strided_inputs():
    # q, k, v as views of a [B, L, H, E] layout (strided, not copied), a
    # value head dim unlike E, and an explicit scale, against the dense model.
    case = next(c for c in CASES if c.name == "gemma2")
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, case.q_len, 4, 16, generator=g).transpose(1, 2).requires_grad_()
    k = torch.randn(2, case.kv_len, 2, 16, generator=g).transpose(1, 2).requires_grad_()
    v = torch.randn(2, case.kv_len, 2, 24, generator=g).transpose(1, 2).requires_grad_()
    bufs = case.buffers(2, 4, 0, 0, g)
    out = flex_attention(q, k, v, score_mod=compiled(case), scale=0.4, params=case.params,
                         buffers=bufs)
    out.square().sum().backward()
    wide = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref, _ = dense(case, *wide, bufs, scale=0.4)
    ref.square().sum().backward()
    assert out.shape == (2, 4, case.q_len, 24)
    assert rel_err(out, ref) < 1e-4
    for t, w in zip((q, k, v), wide):
        assert rel_err(t.grad, w.grad) < 1e-3


def test_float64_inputs_keep_float64():
    case = next(c for c in CASES if c.name == "softcap")
    q, k, v, bufs = make_inputs(case, torch.float64)
    out, lse = flex_attention(q, k, v, score_mod=compiled(case), params=case.params,
                              return_lse=True, backend="reference")
    ref_out, ref_lse = dense(case, q, k, v, bufs)
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    assert rel_err(out, ref_out) < 1e-12 and rel_err(lse, ref_lse) < 1e-12


def test_buffer_that_requires_grad_must_be_declared_grad():
    case = next(c for c in CASES if c.name == "alibi")
    q, k, v, bufs = make_inputs(case, torch.float32)
    bufs["slopes"].requires_grad_()
    if compiled(case).grad_buffers is None:
        # Without flex_kernel_get_info the library refuses it at the backward.
        out = flex_attention(q, k, v, score_mod=compiled(case), buffers=bufs)
        with pytest.raises(flexc.FlexError, match="slopes"):
            out.sum().backward()
    else:
        with pytest.raises(ValueError, match="slopes"):
            flex_attention(q, k, v, score_mod=compiled(case), buffers=bufs)


def test_score_mod_of_a_wrong_type_names_what_is_taken():
    q = torch.randn(1, 1, 8, 8)
    for wrong in ("samples/softcap.score", 3.0):
        with pytest.raises(TypeError, match="flexc.compile") as e:
            flex_attention(q, q, q, score_mod=wrong)
        assert "docs/from-pytorch.md" in str(e.value) and "docs/language.md" in str(e.value)
    with pytest.raises(TypeError, match="docs/language.md"):
        flexc.compile(3.0)
    with pytest.raises(TypeError, match="docs/from-pytorch.md"):
        flex_attention(q, q, q, block_mask=lambda b, h, i, j: i >= j)


def test_errors_name_what_is_wrong():
    case = next(c for c in CASES if c.name == "alibi")
    q, k, v, bufs = make_inputs(case, torch.float32)
    with pytest.raises(flexc.FlexError, match="slopes"):
        flex_attention(q, k, v, score_mod=compiled(case))
    with pytest.raises(flexc.FlexError, match="slopes"):
        flex_attention(q, k, v, score_mod=compiled(case), buffers={"slopes": bufs["slopes"].double()})
    with pytest.raises(flexc.FlexError) as e:
        flex_attention(q, k[..., :8], v, score_mod=compiled(case), buffers=bufs)
    assert e.value.status == "invalid"


def test_deterministic_reaches_the_backward():
    # deterministic=True through autograd: the emulator's CTAs in two seeded
    # orders give bitwise the same dq, dk, dv and buffer gradient (float
    # atomics otherwise), within tolerance of float64 autograd.
    import os
    case = next(c for c in CASES if c.name == "relpos_bias")
    g = torch.Generator().manual_seed(3)
    q0, dout = (torch.randn(1, 4, 64, 16, generator=g) for _ in range(2))
    k0, v0 = (torch.randn(1, 2, 96, 16, generator=g) for _ in range(2))
    bias0 = 0.5 * torch.randn(4, 16, generator=g)
    grads = []
    for shuffle in ("3", "5"):
        q, k, v, bias = (t.clone().requires_grad_() for t in (q0, k0, v0, bias0))
        os.environ["FLEXC_EMU_SHUFFLE"] = shuffle
        try:
            out = flex_attention(q, k, v, score_mod=compiled(case), params=case.params,
                                 buffers={"rel_bias": bias},
                                 backend="emu", deterministic=True)
            (out * dout).sum().backward()
        finally:
            del os.environ["FLEXC_EMU_SHUFFLE"]
        grads.append([q.grad, k.grad, v.grad, bias.grad])
    for a, b in zip(*grads):
        assert torch.equal(a, b)
    wide = [t.double().requires_grad_() for t in (q0, k0, v0, bias0)]
    out64, _ = dense(case, wide[0], wide[1], wide[2], {"rel_bias": wide[3]})
    (out64 * dout.double()).sum().backward()
    for a, w in zip(grads[0], wide):
        assert rel_err(a, w.grad) < 1e-3
