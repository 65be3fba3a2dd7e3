"""Python score_mods and mask_mods traced into .score (flexc.torch): every
mod of mods.py traces to source `flexc check` accepts; a representative
few against PyTorch and dense float64 autograd (the whole matrix is
test_mods.py, label slow); captured numbers are params (a new value
compiles nothing), tracing is cached; what cannot be traced is an error
that names the op and the user's line; a .score kernel meets a BlockMask's
mask_mod; flexc.compile(score_mod=, mask_mod=); PyTorch's signature;
jagged nested tensors."""
import inspect

import pytest
import torch
from mods import BY_NAME, MODS
from oracle import dense_mods, eager_only, rel_err
from test_mods import H, HKV, E, _grads_match, _setup, _torch_block_mask
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask
from torch.nn.attention.flex_attention import flex_attention as torch_flex_attention

import flexc
import flexc.torch as ft
from flexc import _mods


def test_every_mod_traces(tmp_path):
    """How many of attention-gym's and PyTorch's mods trace (every one), to
    .score that `flexc check` accepts."""
    failed = []
    for mod in MODS:
        score_mod, mask_mod, _, _, _ = _setup(mod)
        try:
            src = ft.to_score(score_mod, mask_mod)
            path = tmp_path / f"{mod.name}.score"
            path.write_text(src)
            flexc.check(path)
        except Exception as e:  # noqa: BLE001 - collected and reported below
            failed.append(f"{mod.name}: {type(e).__name__}: {str(e).splitlines()[0]}")
    print(f"test_trace: {len(MODS)} mods tried, {len(MODS) - len(failed)} trace")
    assert not failed, "\n".join(failed)


SOME = ["alibi", "graphormer_spatial", "document", "vsa_topk", "euclidean_dist",
        "index_weird2", "module_method", "flamingo"]


@pytest.mark.parametrize("name", SOME)
def test_some_mods_match_torch_and_autograd(name):
    mod = BY_NAME[name]
    eager_only()
    score_mod, mask_mod, _, (q, k, v), _ = _setup(mod)
    bm = _torch_block_mask(mask_mod, mod, 64)
    with torch.no_grad():
        ref = torch_flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=True)
    out = ft.flex_attention(q.float(), k.float(), v.float(), score_mod=score_mod, block_mask=bm)
    assert rel_err(out, ref) < 1e-4
    _grads_match(mod, ft._HOST_BACKEND, torch.float32, 1e-3)


def test_source_is_readable_score():
    bias = torch.randn(H, 16, requires_grad=True)
    cap = 20.0

    def softcap_bias(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh((score + bias[h, torch.clamp(kv_idx - q_idx + 8, 0, 15)]) / cap)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx
    src = ft.to_score(softcap_bias, causal)
    assert "param float cap;" in src
    assert "buffer bias: f32[4, 16] grad;" in src
    assert "score softcap_bias(score, b, h, q_idx, kv_idx) {" in src
    assert "mask causal(b, h, q_idx, kv_idx) {\n    return q_idx >= kv_idx;\n}" in src
    assert "tanh(" in src and "clamp" not in src.split("{", 1)[1].replace("clamp(", "")


def _call(score_mod, mask_mod=None, L=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, L, 8, generator=g)
    k, v = (torch.randn(1, 2, L, 8, generator=g) for _ in range(2))
    bm = None if mask_mod is None else create_block_mask(mask_mod, None, None, L, L,
                                                         device="cpu", BLOCK_SIZE=16)
    out = ft.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)
    ref, _ = dense_mods(q.double(), k.double(), v.double(), score_mod, mask_mod)
    return out, ref


def test_changed_captured_numbers_do_not_recompile():
    def make(cap, window):
        def capped(score, b, h, q_idx, kv_idx):
            return cap * torch.tanh(score / cap)

        def local(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx - kv_idx < window)
        return capped, local
    out, ref = _call(*make(5.0, 8))
    assert rel_err(out, ref) < 1e-4
    before = dict(_mods.stats)
    for cap, window in ((0.5, 3), (30.0, 40), (2.0, 1)):
        out, ref = _call(*make(cap, window))
        assert rel_err(out, ref) < 1e-4, (cap, window)
    assert _mods.stats == before, "a new captured value traced or compiled again"


def test_number_used_as_a_python_value_is_traced_with_its_value():
    # `range(n)` needs the number itself: that function is traced per value.
    def make(n):
        def ladder(score, b, h, q_idx, kv_idx):
            for i in range(n):
                score = score + 0.25 * ((q_idx - kv_idx) > i)
            return score
        return ladder
    for n in (2, 5):
        out, ref = _call(make(n))
        assert rel_err(out, ref) < 1e-4
    assert "param" not in ft.to_score(make(3))


def test_unsupported_op_names_the_op_and_the_line():
    def uses_atan(score, b, h, q_idx, kv_idx):
        return score + torch.atan(score)
    line = inspect.getsourcelines(uses_atan)[1] + 1
    with pytest.raises(flexc.FlexError) as e:
        ft.to_score(uses_atan)
    msg = str(e.value)
    assert f"{__file__}:{line}: error:" in msg
    assert "aten.atan" in msg and "torch.atan" in msg and "return score + torch.atan(score)" in msg
    assert "docs/from-pytorch.md" in msg and e.value.status == "invalid"

    def uses_log1p(score, b, h, q_idx, kv_idx):
        return torch.log1p(score.abs())
    with pytest.raises(flexc.FlexError, match=r"write torch.log\(1 \+ x\) instead"):
        ft.to_score(uses_log1p)


def test_python_control_flow_on_a_traced_value_is_an_error():
    def branchy(score, b, h, q_idx, kv_idx):
        if q_idx > kv_idx:
            return score
        return score * 2
    line = inspect.getsourcelines(branchy)[1] + 1
    with pytest.raises(flexc.FlexError) as e:
        ft.to_score(branchy)
    assert f"{__file__}:{line}: error:" in str(e.value) and "torch.where" in str(e.value)


def test_kernel_takes_the_block_masks_mask_mod():
    # A .score kernel without a mask and PyTorch's causal BlockMask: the
    # kernel's score under the BlockMask's mask, as PyTorch gives it.
    eager_only()
    kern = flexc.compile("param float cap = 2.0;\n"
                         "score capped(s, b, h, q, kv) { return cap * tanh(s / cap); }\n")
    q = torch.randn(1, 2, 64, 8, dtype=torch.float64)
    k, v = torch.randn_like(q), torch.randn_like(q)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def capped(score, b, h, q_idx, kv_idx):
        return 2.0 * torch.tanh(score / 2.0)
    bm = create_block_mask(causal, None, None, 64, 64, device="cpu", BLOCK_SIZE=16)
    out = ft.flex_attention(q, k, v, score_mod=kern, block_mask=bm, backend="reference")
    with torch.no_grad():
        ref = torch_flex_attention(q, k, v, score_mod=capped, block_mask=bm)
    assert rel_err(out, ref) < 1e-6


def test_kernel_whose_mask_disagrees_is_an_error():
    kern = flexc.compile("mask causal(b, h, q, kv) { return q >= kv; }\n")
    q = torch.randn(1, 2, 64, 8)
    bm = create_block_mask(lambda b, h, i, j: i >= j, None, None, 64, 64, device="cpu",
                           BLOCK_SIZE=16)
    ft.flex_attention(q, q, q, score_mod=kern, block_mask=bm)  # the same mask: fine
    for other in (lambda b, h, i, j: i > j, lambda b, h, i, j: (i >= j) & (i - j < 40)):
        bm = create_block_mask(other, None, None, 64, 64, device="cpu", BLOCK_SIZE=16)
        with pytest.raises(flexc.FlexError, match="differ"):
            ft.flex_attention(q, q, q, score_mod=kern, block_mask=bm)


def test_compile_takes_python_functions():
    bias = torch.randn(2, 48)

    def biased(score, b, h, q_idx, kv_idx):
        return score + bias[h, kv_idx]

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx
    kern = flexc.compile(score_mod=biased, mask_mod=causal)
    assert isinstance(kern, flexc.Kernel) and "buffer bias" in kern.source
    assert kern.info().score == "biased" and kern.info().mask == "causal"
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 48, 8, generator=g) for _ in range(3))
    ref, _ = dense_mods(q.double(), k.double(), v.double(), biased, causal)
    assert rel_err(kern(q, k, v), ref) < 1e-4                   # captured values passed itself
    assert rel_err(torch.from_numpy(kern(q.numpy(), k.numpy(), v.numpy())), ref) < 1e-4
    assert rel_err(ft.flex_attention(q, k, v, score_mod=kern), ref) < 1e-4
    bias.mul_(3)  # the kernel reads the tensor the function captures, as it is now
    ref, _ = dense_mods(q.double(), k.double(), v.double(), biased, causal)
    assert rel_err(kern(q, k, v), ref) < 1e-4
    assert flexc.compile(causal).info().mask == "causal"        # one function: by its arity
    assert flexc.compile(biased).info().score == "biased"
    with pytest.raises(TypeError, match="score_mod= and mask_mod="):
        flexc.compile("x.score", score_mod=biased)


def test_signature_and_return_aux_as_pytorchs():
    ours = list(inspect.signature(ft.flex_attention).parameters.values())
    theirs = list(inspect.signature(torch_flex_attention).parameters.values())
    for a, b in zip(ours, theirs):
        assert (a.name, a.kind, a.default) == (b.name, b.kind, b.default)
    q = torch.randn(1, 2, 16, 8)
    out, aux = ft.flex_attention(q, q, q, return_aux=AuxRequest(lse=True))
    assert aux.lse.shape == (1, 2, 16) and torch.equal(out, ft.flex_attention(q, q, q))
    out2, lse = ft.flex_attention(q, q, q, None, None, None, False, True)  # return_lse positionally
    assert torch.equal(lse, aux.lse)
    with pytest.raises(NotImplementedError, match="max_scores"):
        ft.flex_attention(q, q, q, return_aux=AuxRequest(max_scores=True))


# ---- jagged nested tensors ------------------------------------------------------

def _nested(lens, heads, g, dtype=torch.float32):
    return torch.nested.nested_tensor([torch.randn(n, heads, E, generator=g, dtype=dtype)
                                       for n in lens], layout=torch.jagged, requires_grad=True)


def test_jagged_forward_and_backward():
    g = torch.Generator().manual_seed(5)
    lens = [int(x) for x in torch.randint(0, 40, (4,), generator=g)] + [0, 1]
    q, k, v = _nested(lens, H, g), _nested(lens, HKV, g), _nested(lens, HKV, g)
    slopes = torch.rand(H, generator=g, requires_grad=True)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx
    bm = ft.create_block_mask(causal, None, None, 64, 64)
    out, lse = ft.flex_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                 score_mod=alibi, block_mask=bm, return_lse=True)
    assert out.is_nested and out.shape[:2] == (len(lens), H) and lse.is_nested
    douts = [torch.randn(H, n, E, generator=g) for n in lens]
    loss = sum((o * d).sum() for o, d in zip(out.unbind(), douts)) + \
        sum(x.sum() for x in lse.unbind() if x.numel())
    got = torch.autograd.grad(loss, [q, k, v, slopes], allow_unused=True)
    # Each sequence on its own, dense float64 (positions inside the sequence).
    want_slopes = torch.zeros(H, dtype=torch.float64)
    for i, n in enumerate(lens):
        if not n:
            assert out.unbind()[i].numel() == 0
            continue
        qi, ki, vi = (t.unbind()[i].detach().double().transpose(0, 1)[None].requires_grad_()
                      for t in (q, k, v))
        s64 = slopes.detach().double().requires_grad_()

        def alibi64(score, b, h, q_idx, kv_idx):
            return score + s64[h] * (kv_idx - q_idx)
        o64, l64 = dense_mods(qi, ki, vi, alibi64, causal)
        assert rel_err(out.unbind()[i], o64[0]) < 1e-4
        gi = torch.autograd.grad((o64[0] * douts[i]).sum() + l64.sum(), [qi, ki, vi, s64])
        for gt, w in zip(got[:3], gi[:3]):
            assert rel_err(gt.unbind()[i], w[0].transpose(0, 1)) < 1e-3
        want_slopes += gi[3]
    assert rel_err(got[3], want_slopes) < 1e-3


def test_jagged_inputs_are_checked_as_pytorch_checks_them():
    g = torch.Generator().manual_seed(1)
    q, k = _nested([3, 5], H, g), _nested([3, 5], HKV, g)
    kd = _nested([3, 5], HKV, g, torch.float64)
    with pytest.raises(ValueError, match="Expected query, key, and value to have the same dtype"):
        ft.flex_attention(q.transpose(1, 2), k.transpose(1, 2), kd.transpose(1, 2))
    dense = torch.randn(2, HKV, 5, E)
    with pytest.raises(ValueError, match="Expected query, key, and value to be nested tensors"):
        ft.flex_attention(q.transpose(1, 2), dense, dense)
    with pytest.raises(ValueError, match="ragged in dimension 2"):
        ft.flex_attention(q, k, k)  # [B, j, H, E]: not transposed
    other = _nested([4, 5], HKV, g)  # keys may differ from queries in length, not from values
    ft.flex_attention(q.transpose(1, 2), other.transpose(1, 2), other.transpose(1, 2))
    with pytest.raises(ValueError, match="key and value to have the same sequence lengths"):
        ft.flex_attention(q.transpose(1, 2), k.transpose(1, 2), other.transpose(1, 2))


# ---- the op set, each against the dense float64 evaluation of the same function ----

_T = torch.randn(4, 4, 5, generator=torch.Generator().manual_seed(9))
OPS = {  # name -> (score_mod, whether the result is continuous in the score; None:
    # neither, and PyTorch has no derivative of float floor_divide for the oracle)
    "round_half_even": (lambda s, b, h, q, kv: s + torch.round((q - kv) / 2.0), True),
    "sign": (lambda s, b, h, q, kv: s * torch.sign(s) + torch.sign(q - kv), False),
    "exp2_log2": (lambda s, b, h, q, kv: torch.exp2(s) + torch.log2(torch.abs(s) + 1), True),
    "sqrt_rsqrt": (lambda s, b, h, q, kv: torch.rsqrt(s * s + 1) + torch.sqrt(torch.abs(s)), True),
    "erf_sigmoid": (lambda s, b, h, q, kv: torch.erf(s) + torch.sigmoid(s), True),
    "pow": (lambda s, b, h, q, kv: torch.pow(torch.abs(s) + 0.5, 1.5) + s ** 2
            + torch.pow(1.5, s), True),
    "floor_ceil": (lambda s, b, h, q, kv: torch.floor(s * 3) + torch.ceil(s * 3) / 4, False),
    "clamp": (lambda s, b, h, q, kv: s + torch.clamp(s, -0.5, 0.5) + s.clamp(min=0)
              + (q - kv).clamp(max=3), True),
    "minimum_maximum": (lambda s, b, h, q, kv: torch.minimum(s, (q - kv).float() / 8)
                        + torch.maximum(s, torch.zeros_like(s)), True),
    "int_division": (lambda s, b, h, q, kv: s + torch.floor_divide(q - kv, 5)
                     + torch.remainder(q - kv, 7) - torch.fmod(q - kv, 7)
                     + torch.div(q - kv, 3, rounding_mode="trunc") + (q - kv) / 3, True),
    "float_division": (lambda s, b, h, q, kv: s + torch.remainder(s * 4, 1.5)
                       + torch.floor_divide(s * 4, 1.5) + torch.fmod(s * 4, 1.5), None),
    "bitwise": (lambda s, b, h, q, kv: s + ((q ^ kv) & 7) + ((q << 2) >> 3) + (~kv & 1)
                + (q | 3), True),
    "logical": (lambda s, b, h, q, kv: torch.where(
        torch.logical_xor(q > kv, (q + kv) % 2 == 0) | torch.logical_not(h == 1)
        & torch.logical_and(q != 3, torch.logical_or(kv < 20, b == 0)), s, -float("inf")), True),
    "conversions": (lambda s, b, h, q, kv: s + (s * 10).to(torch.int32) + (q > kv).float()
                    + (q - kv).to(torch.float16) + s.to(torch.bool).float() + (s > 0).int(),
                    False),
    "transcendental": (lambda s, b, h, q, kv: s + torch.tanh(s) * torch.sin(s)
                       - torch.cos(s) * torch.log(torch.abs(s) + 1e-3) + torch.exp(-s * s), True),
    "neg_abs": (lambda s, b, h, q, kv: -s.abs() + (q - kv).abs() - torch.abs(-s), True),
    "activations": (lambda s, b, h, q, kv: torch.nn.functional.gelu(s, approximate="tanh")
                    + torch.nn.functional.relu(s) + torch.nn.functional.silu(s), True),
    "indexing": (lambda s, b, h, q, kv: s + _T[h][q % 4, kv % 5] + _T[h, q % 4][kv % 5]
                 + _T[0, 1, 2] + _T[-1][h, 0], True),
}


@pytest.mark.parametrize("name", list(OPS))
def test_op_set(name):
    fn, continuous = OPS[name]
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 32, 8, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    out, lse = ft.flex_attention(q, k, v, score_mod=fn, backend="reference", return_lse=True)
    ref, ref_lse = dense_mods(q, k, v, fn)
    assert rel_err(out, ref) < 1e-6 and rel_err(lse, ref_lse) < 1e-6
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((out * dout).sum(), (q, k, v))
    if continuous is not None:
        want = torch.autograd.grad((ref * dout).sum(), (q, k, v))
        for a, w in zip(got, want):
            assert rel_err(a, w) < 1e-6
    if continuous:  # a float32 score may cross a step of floor, round or int()
        out32 = ft.flex_attention(q.detach().float(), k.detach().float(), v.detach().float(),
                                  score_mod=fn)
        assert rel_err(out32, ref) < 1e-4
