"""flexc.torch: flexc kernels as a PyTorch attention function.

    from flexc.torch import flex_attention
    softcap = flexc.compile("samples/softcap.score")
    out = flex_attention(q, k, v, score_mod=softcap, params={"softcap": 30.0})

flex_attention mirrors torch.nn.attention.flex_attention: score_mod is a
kernel from flexc.compile (a .score file's score and mask), block_mask may
be PyTorch's own BlockMask or a flexc.BlockMask (the same layout), and
autograd gives dq, dk, dv and the gradients of `grad` buffers. Underneath
are two custom ops, flexc::attention and flexc::attention_backward, with
fake (meta) implementations and a registered autograd formula, so
torch.compile(fullgraph=True) keeps them in its graph as opaque calls.
"""
import functools
from typing import Optional

import torch

from . import _capi as C
from . import _kernel as K

# Plain attention (score_mod=None): the empty .score file's implicit kernel.
_PLAIN = K.compile("")
# The backend for host tensors, decided once (tracing must not call the library).
_HOST_BACKEND = "cpu" if K.backend_available("cpu") else "reference"


class _Spec:
    """The non-tensor part of a call, which the custom ops take as one
    string (they take no lists of strings): 'KERNEL;BACKEND;P=V,...;
    BUFFER,...;WANT;FLAGS;BLOCK' where WANT is one 0/1 per buffer (its
    gradient is wanted), FLAGS check_bounds, fast_math and deterministic
    as 0/1, and BLOCK
    'BQ,BKV' or empty (no block mask)."""

    def __init__(self, spec):
        kid, self.backend, params, bnames, want, flags, block = spec.split(";")
        self.kernel = K.registry[kid]
        self.params = {p.split("=")[0]: float(p.split("=")[1]) for p in params.split(",") if p}
        self.bnames = [n for n in bnames.split(",") if n]
        self.want = [w == "1" for w in want]
        self.check_bounds, self.fast_math = flags[0] == "1", flags[1] == "1"
        self.deterministic = flags[2:3] == "1"  # optional: a two-flag spec is not deterministic
        self.block = [int(b) for b in block.split(",")] if block else []


@functools.lru_cache(maxsize=256)
def _parse(spec):
    return _Spec(spec)


class _Mask:
    """The block mask as the op received it (8 optional arrays, 2 sizes)."""

    def __init__(self, arrays, block):
        for name, a in zip(C.MASK_ARRAYS, arrays):
            setattr(self, name, a)
        self.BLOCK_SIZE = tuple(block)


def _mask(mask, sp):
    return _Mask(mask, sp.block) if sp.block else None


@torch.library.custom_op("flexc::attention", mutates_args=())
def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: str, scale: float,
               buffers: list[torch.Tensor], mask: list[Optional[torch.Tensor]]
               ) -> tuple[torch.Tensor, torch.Tensor]:
    sp = _parse(spec)
    return sp.kernel(q, k, v, scale=scale or None, params=sp.params,
                     buffers=dict(zip(sp.bnames, buffers)), block_mask=_mask(mask, sp),
                     return_lse=True, backend=sp.backend, check_bounds=sp.check_bounds,
                     fast_math=sp.fast_math)


@_attention.register_fake
def _(q, k, v, spec, scale, buffers, mask):
    backend = _parse(spec).backend
    B, H, L = q.shape[:3]
    out = q.new_empty((B, H, L, v.shape[-1]))
    lse = q.new_empty((B, H, L), dtype=getattr(torch, K.lse_dtype(q, backend)))
    return out, lse


@torch.library.custom_op("flexc::attention_backward", mutates_args=())
def _attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                        lse: torch.Tensor, dout: torch.Tensor, dlse: Optional[torch.Tensor],
                        spec: str, scale: float, buffers: list[torch.Tensor],
                        mask: list[Optional[torch.Tensor]]
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    sp = _parse(spec)
    bufs = dict(zip(sp.bnames, buffers))
    wanted = [n for n, w in zip(sp.bnames, sp.want) if w]
    g = sp.kernel.backward(q, k, v, out, lse, dout, dlse, scale=scale or None, params=sp.params,
                           buffers=bufs, block_mask=_mask(mask, sp), backend=sp.backend,
                           buffer_grads=wanted, check_bounds=sp.check_bounds,
                           fast_math=sp.fast_math, deterministic=sp.deterministic)
    dbufs = [g.buffers[n].to(bufs[n].dtype) for n in wanted]
    return g.dq, g.dk, g.dv, dbufs


@_attention_backward.register_fake
def _(q, k, v, out, lse, dout, dlse, spec, scale, buffers, mask):
    want = _parse(spec).want
    # Compact, as Kernel.backward allocates them (whatever the inputs' strides).
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            [b.new_empty(b.shape) for b, w in zip(buffers, want) if w])


def _setup_context(ctx, inputs, output):
    q, k, v, spec, scale, buffers, mask = inputs
    out, lse = output
    ctx.spec, ctx.scale = spec, scale
    ctx.nbuffers = len(buffers)
    ctx.mask_given = [m is not None for m in mask]
    ctx.save_for_backward(q, k, v, out, lse, *buffers, *[m for m in mask if m is not None])


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, *rest = ctx.saved_tensors
    buffers, given = rest[:ctx.nbuffers], iter(rest[ctx.nbuffers:])
    mask = [next(given) if g else None for g in ctx.mask_given]
    if dout is None:  # only the LSE reached the loss
        dout = torch.zeros_like(out)
    dq, dk, dv, dbufs = _attention_backward(q, k, v, out, lse, dout, dlse, ctx.spec, ctx.scale,
                                            list(buffers), mask)
    want, it = _parse(ctx.spec).want, iter(dbufs)
    # One entry per input; list inputs get lists of the same length.
    return (dq, dk, dv, None, None, [next(it) if w else None for w in want], [None] * len(mask))


_attention.register_autograd(_backward, setup_context=_setup_context)


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, params=None,
                   buffers=None, return_lse=False, *, enable_gqa=False, backend=None,
                   check_bounds=False, fast_math=False, deterministic=False):
    """Attention with a flexc kernel, like torch.nn.attention.flex_attention.

    query [B, H, Q_LEN, E], key [B, HKV, KV_LEN, E], value [B, HKV, KV_LEN,
    EV] (H a multiple of HKV: grouped heads are always allowed, enable_gqa
    is accepted for compatibility); score_mod: a flexc.Kernel (None: plain
    attention); block_mask: PyTorch's BlockMask or a flexc.BlockMask (which
    blocks to visit; the kernel's own mask decides inside partial blocks,
    so it must be the mask the BlockMask was made from); scale: None for
    1/sqrt(E); params: {name: number}; buffers: {name: tensor}, and a
    buffer that requires grad gets its gradient (it must be declared
    `grad`). Returns out in query's dtype, or (out, lse) with return_lse
    (lse float32, natural log). backend: None picks `cuda` for CUDA
    tensors, `cpu` for host tensors where this build has it, else
    `reference`. deterministic: the backward's gradients bitwise the same on
    every run (DSL.md "Determinism")."""
    kernel = _PLAIN if score_mod is None else score_mod
    if not isinstance(kernel, K.Kernel):
        raise TypeError("flexc.torch.flex_attention: score_mod must be a kernel from "
                        f"flexc.compile (a .score file), got {type(score_mod).__name__}")
    params, buffers = params or {}, buffers or {}
    pnames = list(params)
    bnames = list(buffers)
    btensors = [buffers[n] for n in bnames]
    for n, t in zip(bnames, btensors):
        if t.requires_grad and kernel.grad_buffers is not None and n not in kernel.grad_buffers:
            raise ValueError(f"flexc.torch.flex_attention: buffer {n!r} requires grad but "
                             f"{kernel.name} does not declare it `grad`")
    want = "".join("1" if t.requires_grad else "0" for t in btensors)
    if backend is None:
        backend = "cuda" if query.is_cuda else _HOST_BACKEND
    flags = "".join("1" if f else "0" for f in (check_bounds, fast_math, deterministic))
    if block_mask is None:
        mask, block = [], ""
    else:
        mask = [_as_tensor(getattr(block_mask, n, None), query) for n in C.MASK_ARRAYS]
        bs = block_mask.BLOCK_SIZE
        bs = (bs, bs) if isinstance(bs, int) else bs
        block = str(int(bs[0])) + "," + str(int(bs[1]))
    ptext = ",".join(n + "=" + repr(float(params[n])) for n in pnames)
    spec = ";".join([kernel.id, backend, ptext, ",".join(bnames), want, flags, block])
    out, lse = torch.ops.flexc.attention(query, key, value, spec,
                                         0.0 if scale is None else float(scale), btensors, mask)
    return (out, lse) if return_lse else out


def _as_tensor(a, like):
    """A block-mask array as a tensor on like's device."""
    if a is None:
        return None
    if not isinstance(a, torch.Tensor):
        a = torch.from_numpy(a)
    return a.to(like.device)
