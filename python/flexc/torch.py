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
    BUFFER,...;WANT;FLAGS;BLOCK;CALL' where WANT is one 0/1 per buffer (its
    gradient is wanted), FLAGS check_bounds, fast_math and deterministic
    as 0/1, BLOCK 'BQ,BKV' or empty (no block mask), and CALL the position
    offsets and dropout, 'QO,KO,QT,KT,P,SEED,OFFSET' (empty: none)."""

    def __init__(self, spec):
        kid, self.backend, params, bnames, want, flags, block, *call = spec.split(";")
        extra = call[0].split(",") if call and call[0] else ["0"] * 4 + ["0.0", "0", "0"]
        self.offsets = tuple(int(x) for x in extra[:4])
        self.dropout = (float(extra[4]), int(extra[5]), int(extra[6]))
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


def _seqlens(seqlens):
    """cu_seqlens_q and cu_seqlens_kv of a packed call, or (None, None)."""
    return (seqlens[0], seqlens[1]) if seqlens else (None, None)


@torch.library.custom_op("flexc::attention", mutates_args=())
def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: str, scale: float,
               buffers: list[torch.Tensor], mask: list[Optional[torch.Tensor]],
               seqlens: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    sp = _parse(spec)
    cq, ckv = _seqlens(seqlens)
    qo, ko, qt, kt = sp.offsets
    dp, ds, do = sp.dropout
    return sp.kernel(q, k, v, scale=scale or None, params=sp.params,
                     buffers=dict(zip(sp.bnames, buffers)), block_mask=_mask(mask, sp),
                     return_lse=True, backend=sp.backend, check_bounds=sp.check_bounds,
                     fast_math=sp.fast_math, cu_seqlens_q=cq, cu_seqlens_kv=ckv,
                     dropout_p=dp, dropout_seed=ds, dropout_offset=do, q_offset=qo,
                     kv_offset=ko, q_len_total=qt, kv_len_total=kt)


@_attention.register_fake
def _(q, k, v, spec, scale, buffers, mask, seqlens):
    backend = _parse(spec).backend
    lse_dtype = getattr(torch, K.lse_dtype(q, backend))
    if seqlens:  # packed: q [TOTAL_Q, H, E]
        total, H = q.shape[:2]
        return q.new_empty((total, H, v.shape[-1])), q.new_empty((H, total), dtype=lse_dtype)
    B, H, L = q.shape[:3]
    out = q.new_empty((B, H, L, v.shape[-1]))
    lse = q.new_empty((B, H, L), dtype=lse_dtype)
    return out, lse


@torch.library.custom_op("flexc::attention_backward", mutates_args=())
def _attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                        lse: torch.Tensor, dout: torch.Tensor, dlse: Optional[torch.Tensor],
                        spec: str, scale: float, buffers: list[torch.Tensor],
                        mask: list[Optional[torch.Tensor]], seqlens: list[torch.Tensor]
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    sp = _parse(spec)
    bufs = dict(zip(sp.bnames, buffers))
    wanted = [n for n, w in zip(sp.bnames, sp.want) if w]
    cq, ckv = _seqlens(seqlens)
    qo, ko, qt, kt = sp.offsets
    dp, ds, do = sp.dropout
    g = sp.kernel.backward(q, k, v, out, lse, dout, dlse, scale=scale or None, params=sp.params,
                           buffers=bufs, block_mask=_mask(mask, sp), backend=sp.backend,
                           buffer_grads=wanted, check_bounds=sp.check_bounds,
                           fast_math=sp.fast_math, deterministic=sp.deterministic,
                           cu_seqlens_q=cq, cu_seqlens_kv=ckv, dropout_p=dp, dropout_seed=ds,
                           dropout_offset=do, q_offset=qo, kv_offset=ko, q_len_total=qt,
                           kv_len_total=kt)
    dbufs = [g.buffers[n].to(bufs[n].dtype) for n in wanted]
    return g.dq, g.dk, g.dv, dbufs


@_attention_backward.register_fake
def _(q, k, v, out, lse, dout, dlse, spec, scale, buffers, mask, seqlens):
    want = _parse(spec).want
    # Compact, as Kernel.backward allocates them (whatever the inputs' strides).
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            [b.new_empty(b.shape) for b, w in zip(buffers, want) if w])


def _setup_context(ctx, inputs, output):
    q, k, v, spec, scale, buffers, mask, seqlens = inputs
    out, lse = output
    ctx.spec, ctx.scale = spec, scale
    ctx.nbuffers, ctx.nseqlens = len(buffers), len(seqlens)
    ctx.mask_given = [m is not None for m in mask]
    ctx.save_for_backward(q, k, v, out, lse, *buffers, *seqlens,
                          *[m for m in mask if m is not None])


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, *rest = ctx.saved_tensors
    buffers = rest[:ctx.nbuffers]
    seqlens = rest[ctx.nbuffers:ctx.nbuffers + ctx.nseqlens]
    given = iter(rest[ctx.nbuffers + ctx.nseqlens:])
    mask = [next(given) if g else None for g in ctx.mask_given]
    if dout is None:  # only the LSE reached the loss
        dout = torch.zeros_like(out)
    dq, dk, dv, dbufs = _attention_backward(q, k, v, out, lse, dout, dlse, ctx.spec, ctx.scale,
                                            list(buffers), mask, list(seqlens))
    want, it = _parse(ctx.spec).want, iter(dbufs)
    # One entry per input; list inputs get lists of the same length.
    return (dq, dk, dv, None, None, [next(it) if w else None for w in want], [None] * len(mask),
            [None] * len(seqlens))


_attention.register_autograd(_backward, setup_context=_setup_context)


_TYPE_HELP = ("a Python function score_mod(score, b, h, q_idx, kv_idx) as PyTorch's "
              "flex_attention takes, a kernel from flexc.compile, or None; see "
              "docs/from-pytorch.md and docs/language.md in the flexc repository")


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, kernel_options=None, *, return_aux=None,
                   params=None, buffers=None, backend=None, check_bounds=False, fast_math=False,
                   deterministic=False, sinks=None, q_offset=0, kv_offset=0, q_len_total=0,
                   kv_len_total=0, dropout_p=0.0, dropout_seed=0, dropout_offset=0):
    """Attention like torch.nn.attention.flex_attention.flex_attention, on
    flexc's kernels. The first ten arguments are PyTorch's, with its
    defaults.

    query [B, H, Q_LEN, E], key [B, HKV, KV_LEN, E], value [B, HKV, KV_LEN,
    EV] (H a multiple of HKV: grouped heads are always allowed, enable_gqa
    is accepted for compatibility), or PyTorch nested tensors with
    layout=torch.jagged ([B, H, j, E] after transpose(1, 2)), run as a
    packed variable-length batch (docs/varlen.md).

    score_mod: a Python function (score, b, h, q_idx, kv_idx) -> score, as
    PyTorch's flex_attention takes it, traced once into .score (see
    flexc.torch.to_score) with the tensors it captures as buffers (their
    gradients reach .grad) and the Python numbers it captures as params;
    or a flexc.Kernel from flexc.compile (a .score file); None: plain
    attention. block_mask: PyTorch's BlockMask (its block lists, and its
    mask_mod traced like score_mod) or a flexc.BlockMask
    (flexc.torch.create_block_mask, Kernel.block_mask). A kernel with a
    mask of its own must agree with the BlockMask's mask_mod (checked; an
    error otherwise). scale: None for 1/sqrt(E). return_lse, or
    return_aux=AuxRequest(lse=True): also the log-sum-exp (float32,
    natural log). kernel_options: PyTorch's Triton options, ignored.

    flexc's own: params {name: number} and buffers {name: tensor} of a
    flexc.Kernel (a buffer that requires grad gets its gradient; it must be
    declared `grad`); backend: None picks `cuda` for CUDA tensors, `cpu`
    for host tensors where this build has it, else `reference`;
    check_bounds: report out-of-range buffer reads; fast_math: hardware
    approximations on emu and cuda; deterministic: the backward's
    gradients bitwise the same on every run (docs/language.md "Determinism");
    sinks: one learned logit per query head (a float32 [H] tensor; a
    tensor that requires grad gets its gradient), an extra key of every
    row's softmax with no value, as gpt-oss trains them (docs/language.md
    "Attention sinks"; the kernel must not have a sink of its own), or a
    Python function sink_mod(b, h, q_idx) -> logit, traced like score_mod;
    q_offset, kv_offset, q_len_total, kv_len_total: the call is a shard of
    a longer sequence (docs/language.md "Position offsets"; what
    flexc.torch.distributed uses); dropout_p, dropout_seed, dropout_offset:
    dropout of the attention weights by Philox bits (docs/language.md
    "Dropout"), the backward using the same."""
    if block_mask is not None and not hasattr(block_mask, "kv_num_blocks"):
        raise TypeError("flexc.torch.flex_attention: block_mask must be PyTorch's BlockMask "
                        "(create_block_mask) or a flexc.BlockMask (flexc.torch.create_block_mask), "
                        f"got {type(block_mask).__name__}; see docs/from-pytorch.md in the flexc "
                        "repository")
    want_lse = bool(return_lse)
    if return_aux is not None:
        if getattr(return_aux, "max_scores", False):
            raise NotImplementedError("flexc.torch.flex_attention: return_aux max_scores is not "
                                      "supported (lse is)")
        want_lse = want_lse or bool(getattr(return_aux, "lse", False))
    if getattr(query, "is_nested", False):
        from . import _jagged
        out, lse = _jagged.attention(query, key, value, score_mod, block_mask, scale, params,
                                     buffers, backend, check_bounds, fast_math, deterministic,
                                     sinks)
    else:
        sink_fn = sinks if callable(sinks) and not isinstance(sinks, torch.Tensor) else None
        kernel, params, buffers = _resolve(score_mod, block_mask, params, buffers, query, sink_fn)
        if sinks is not None and sink_fn is None:
            from . import _mods
            kernel, buffers = _mods.with_sinks(kernel, buffers, sinks, query)
        out, lse = _call(kernel, query, key, value, block_mask, scale, params, buffers, backend,
                         check_bounds, fast_math, deterministic,
                         call=(q_offset, kv_offset, q_len_total, kv_len_total, dropout_p,
                               dropout_seed, dropout_offset))
    if return_aux is not None:
        from torch.nn.attention.flex_attention import AuxOutput
        return out, AuxOutput(lse=lse if getattr(return_aux, "lse", False) else None)
    return (out, lse) if want_lse else out


def _resolve(score_mod, block_mask, params, buffers, query, sink_fn=None):
    """(kernel, params, buffers) of a call: score_mod, the block mask's
    mask_mod and sink_fn traced and compiled, or the caller's flexc.Kernel
    (with the BlockMask's mask where it has none)."""
    from . import _mods as M
    mask_mod = M.mask_mod_of(block_mask)
    if sink_fn is not None:
        if isinstance(score_mod, M.TracedKernel):
            return M.call_values(score_mod.score_mod, mask_mod or score_mod.mask_mod, query,
                                 params, buffers, sink_fn=sink_fn)
        if score_mod is not None and (isinstance(score_mod, K.Kernel) or not callable(score_mod)):
            raise TypeError("flexc.torch.flex_attention: a Python sink function goes with a "
                            "Python score_mod (or none); with a .score kernel, declare the sink "
                            "in the .score file or pass sinks= as a tensor of per-head logits")
        return M.call_values(score_mod, mask_mod, query, params, buffers, sink_fn=sink_fn)
    if score_mod is None or isinstance(score_mod, K.Kernel) and \
            not isinstance(score_mod, M.TracedKernel):
        kernel = _PLAIN if score_mod is None else score_mod
        if mask_mod is None:
            return kernel, params or {}, buffers or {}
        if score_mod is None:
            return M.call_values(None, mask_mod, query, params, buffers)
        return M.combine(kernel, mask_mod, block_mask, query, params or {}, buffers or {})
    if isinstance(score_mod, M.TracedKernel):
        if mask_mod is not None and score_mod.mask_mod is not None and \
                mask_mod is not score_mod.mask_mod:
            raise ValueError("flexc.torch.flex_attention: the kernel from flexc.compile("
                             "score_mod=, mask_mod=) has a mask_mod, and the block_mask brings "
                             "another one")
        return M.call_values(score_mod.score_mod, mask_mod or score_mod.mask_mod, query, params,
                             buffers)
    if not callable(score_mod):
        raise TypeError(f"flexc.torch.flex_attention: score_mod must be {_TYPE_HELP}; got "
                        f"{type(score_mod).__name__}")
    return M.call_values(score_mod, mask_mod, query, params, buffers)


def _call(kernel, query, key, value, block_mask, scale, params, buffers, backend, check_bounds,
          fast_math, deterministic, seqlens=(), call=None):
    """(out, lse) through the custom op (autograd, torch.compile)."""
    pnames = list(params)
    bnames = list(buffers)
    btensors = [buffers[n] for n in bnames]
    for n, t in zip(bnames, btensors):
        if t.requires_grad and kernel.grad_buffers is not None and n not in kernel.grad_buffers:
            raise ValueError(f"flexc.torch.flex_attention: buffer {n!r} requires grad but "
                             f"{kernel.name} does not declare it `grad`")
    want = "".join("1" if t.requires_grad else "0" for t in btensors)
    if backend is None:
        # float64: the reference, the one backend that computes in float64
        backend = "cuda" if query.is_cuda else \
            "reference" if query.dtype == torch.float64 else _HOST_BACKEND
    flags = "".join("1" if f else "0" for f in (check_bounds, fast_math, deterministic))
    if block_mask is None:
        mask, block = [], ""
    else:
        mask = [_as_tensor(getattr(block_mask, n, None), query) for n in C.MASK_ARRAYS]
        bs = block_mask.BLOCK_SIZE
        bs = (bs, bs) if isinstance(bs, int) else bs
        block = str(int(bs[0])) + "," + str(int(bs[1]))
    ptext = ",".join(n + "=" + repr(float(params[n])) for n in pnames)
    extra = ""
    if call and any(call):
        qo, ko, qt, kt, dp, ds, do = call
        extra = f"{int(qo)},{int(ko)},{int(qt)},{int(kt)},{float(dp)!r},{int(ds)},{int(do)}"
    spec = ";".join([kernel.id, backend, ptext, ",".join(bnames), want, flags, block, extra])
    return torch.ops.flexc.attention(query, key, value, spec, 0.0 if scale is None else float(scale),
                                     btensors, mask, list(seqlens))


def _as_tensor(a, like):
    """A block-mask array as a tensor on like's device."""
    if a is None:
        return None
    if not isinstance(a, torch.Tensor):
        a = torch.from_numpy(a)
    return a.to(like.device)


def to_score(score_mod=None, mask_mod=None, sink_mod=None):
    """The .score source flexc compiles for a Python score_mod, mask_mod
    and sink_mod(b, h, q_idx) (as flex_attention traces them), to read or
    to keep as a .score file: captured numbers are `param`s, captured
    tensors `buffer`s (with the values a call passes: the source declares
    no defaults)."""
    from . import _mods
    return _mods.to_score(score_mod, mask_mod, sink_mod)


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=None, BLOCK_SIZE=128):
    """The BlockMask of a Python mask_mod, like PyTorch's create_block_mask
    (same arguments), built by flexc: mask_mod is traced into .score, the
    interval analysis decides the blocks it can, and only the blocks it
    leaves open are evaluated element by element (no dense Q_LEN x KV_LEN
    pass where the analysis decides). Returns a flexc.BlockMask (int32
    NumPy arrays in PyTorch's layout, mask_mod kept): pass it as
    flex_attention's block_mask, or .as_torch() for PyTorch's own
    BlockMask. B, H: None for 1 (the mask is the same for every batch or
    head). device: where .as_torch() puts the arrays (None: cpu)."""
    from . import _mods as M
    dev = torch.device("cpu") if device is None else torch.device(device)
    kernel, params, buffers = M.call_values(None, mask_mod, None, device=torch.device("cpu"))
    bm = kernel.block_mask(1 if B is None else int(B), 1 if H is None else int(H), int(Q_LEN),
                           int(KV_LEN), block_size=BLOCK_SIZE, params=params,
                           buffers={n: t.detach() for n, t in buffers.items()})
    bm.mask_mod, bm.device = mask_mod, dev
    return bm


# flexc.torch.distributed (context parallelism) is flexc/distributed.py:
# importing it initializes nothing, and `import flexc.torch.distributed`
# finds it here once flexc.torch is loaded.
from . import distributed  # noqa: E402
import sys as _sys  # noqa: E402
_sys.modules[__name__ + ".distributed"] = distributed
