"""Kernels: compile a .score kernel once, call it on torch tensors or NumPy
arrays on a backend. Everything goes through flex.h (see _capi)."""
import ctypes
import os
from dataclasses import dataclass

from . import _capi as C
from . import _tensor as T
from ._capi import FlexError, lib


_available = {}  # backend -> whether it can run here (asked once per process)


def backend_available(name):
    """Whether this build and machine can run backend `name`."""
    if name not in C.BACKENDS:
        raise ValueError(f"flexc: unknown backend {name!r} (one of {', '.join(C.BACKENDS)})")
    if name not in _available:
        if not lib.has("flex_backend_available"):  # a library older than the call
            _available[name] = name in ("reference", "emu")
        else:
            _available[name] = bool(lib.flex_backend_available(C.BACKENDS[name]))
    return _available[name]


def backends():
    """The backends this build and machine can run, fastest first."""
    return [b for b in ("cuda", "cpu", "emu", "reference") if backend_available(b)]


def default_backend(x):
    """The backend a call on x uses when none is named: `cuda` for CUDA
    tensors; for host memory `cpu` where this build has it, else
    `reference` (exact, float64, O(Q_LEN * KV_LEN) memory per head), and
    `reference` for float64 inputs, the one backend that computes in
    float64 (so torch.autograd.gradcheck works as it is). `emu` runs the
    CUDA kernels in emulation and is far too slow to be a default."""
    if T.device_of(x)[0] == C.kDLCUDA:
        return "cuda"
    if T.dtype_name(x) == "float64":
        return "reference"
    return "cpu" if backend_available("cpu") else "reference"


def lse_dtype(q, backend):
    """LSE is float32 (what every backend but the reference writes; the
    others refuse float64 inputs), float64 for float64 inputs on the
    reference."""
    return "float64" if backend == "reference" and T.dtype_name(q) == "float64" else "float32"


@dataclass(frozen=True)
class ParamInfo:
    name: str
    type: str           # 'int' or 'float'
    default: object     # None when the call must give it


@dataclass(frozen=True)
class BufferInfo:
    name: str
    dtype: str          # 'float32', 'int32', 'bool', ...
    shape: tuple        # per dimension an int (fixed) or the size's name ('H', 'KV_LEN', 'T')
    grad: bool          # the backward returns its gradient
    sorted: bool        # 1-D, values promised non-decreasing
    used: bool          # the kernel reads it (an unused one may be left out)


@dataclass(frozen=True)
class KernelInfo:
    name: str
    file: str
    score: object       # the score function's name, or None (identity)
    mask: object        # the mask function's name, or None
    features: frozenset  # of 'score', 'mask', 'grad_buffers', 'implicit_mask', 'ds_is_dt', 'sink'
    params: tuple       # ParamInfo, in declaration order
    buffers: tuple      # BufferInfo, in declaration order
    sink: object = None  # the sink function's name, or None


def _s(b):
    return None if b is None else b.decode()


@dataclass
class Grads:
    """What Kernel.backward returns."""
    dq: object
    dk: object
    dv: object
    buffers: dict       # name -> gradient (float32) of each grad buffer asked for


class BlockMask:
    """A block mask in PyTorch's BlockMask layout, as flexc builds it
    (Kernel.block_mask): int32 NumPy arrays kv_num_blocks [B, H, nQ],
    kv_indices [B, H, nQ, nKV], the full_* pair, the q_* transposed side;
    BLOCK_SIZE (block_q, block_kv); B and H are 1 where the mask ignores
    them. `stats` holds what building it found. Any object with these
    attributes (PyTorch's own BlockMask too) can be passed as block_mask."""

    def __init__(self, arrays, block_size, stats, seq_lengths, mask_mod=None, device="cpu"):
        for name in C.MASK_ARRAYS:
            setattr(self, name, arrays.get(name))
        self.BLOCK_SIZE = tuple(block_size)
        self.stats = stats
        self.seq_lengths = tuple(seq_lengths)  # (Q_LEN, KV_LEN)
        self.mask_mod = mask_mod  # the Python mask_mod it was made from (flexc.torch), or None
        self.device = device      # where as_torch() puts the arrays by default

    def as_torch(self, mask_mod=None, device=None):
        """The same blocks as PyTorch's BlockMask, for PyTorch's own
        flex_attention (which evaluates mask_mod inside partial blocks);
        mask_mod None: the one this mask was made from."""
        import torch
        from torch.nn.attention.flex_attention import BlockMask as TorchBlockMask
        device = self.device if device is None else device

        def t(a):
            return None if a is None else torch.from_numpy(a).to(device)
        return TorchBlockMask.from_kv_blocks(
            t(self.kv_num_blocks), t(self.kv_indices), t(self.full_kv_num_blocks),
            t(self.full_kv_indices), BLOCK_SIZE=self.BLOCK_SIZE,
            mask_mod=self.mask_mod if mask_mod is None else mask_mod,
            seq_lengths=self.seq_lengths)

    def __repr__(self):
        return (f"flexc.BlockMask(kv_num_blocks{list(self.kv_num_blocks.shape)}, "
                f"BLOCK_SIZE={self.BLOCK_SIZE}, stats={self.stats})")


def _block_size(bm):
    bs = getattr(bm, "BLOCK_SIZE", 128)
    if isinstance(bs, int):
        return bs, bs
    return int(bs[0]), int(bs[1])


def _mask_array(a, like):
    """A block-mask array in like's library and on like's device."""
    if a is None:
        return None
    if T.is_torch(like) and not T.is_torch(a):
        import torch
        return torch.from_numpy(a).to(like.device)
    if not T.is_torch(like) and T.is_torch(a):
        return a.cpu().numpy()
    if T.is_torch(a) and a.device != like.device:
        return a.to(like.device)
    return a


def _u64(name, x):
    x = int(x)
    if not 0 <= x < 1 << 64:
        raise ValueError(f"flexc: {name} must be an unsigned 64-bit integer, got {x}")
    return x


def _packed(cu_q, cu_kv):
    """Whether a call is packed (both offsets given; one alone is an error)."""
    if (cu_q is None) != (cu_kv is None):
        raise ValueError("flexc: a packed call needs both cu_seqlens_q and cu_seqlens_kv")
    return cu_q is not None


class _Call:
    """One flex_args: the DLTensors, params, buffers and block mask of a
    call, alive as long as this object."""

    def __init__(self, kernel, backend, q, k, v, scale, params, buffers, block_mask,
                 check_bounds, fast_math, buffer_grads=None, dropout=(0.0, 0, 0),
                 deterministic=False, arch=None, offsets=(0, 0, 0, 0)):
        self.keep = []
        a = self.args = C.Args()
        if backend not in C.BACKENDS:
            raise ValueError(f"flexc: unknown backend {backend!r} (one of {', '.join(C.BACKENDS)})")
        a.backend = C.BACKENDS[backend]
        a.q, a.k, a.v = (self.ptr(x) for x in (q, k, v))
        a.scale = 0.0 if scale is None else float(scale)
        params = dict(params or {})
        self.params = (C.Param * max(len(params), 1))(
            *[C.Param(n.encode(), float(val)) for n, val in params.items()])
        a.params, a.nparams = self.params, len(params)
        buffers = dict(buffers or {})
        grads = buffer_grads or {}
        unknown = set(grads) - set(buffers)
        if unknown:
            raise ValueError(f"flexc: gradient asked for buffer(s) not given: {sorted(unknown)}")
        self.buffers = (C.Buffer * max(len(buffers), 1))(*[
            C.Buffer(n.encode(), self.ptr(T.readable(t)),
                     self.ptr(grads.get(n)))
            for n, t in buffers.items()])
        a.buffers, a.nbuffers = self.buffers, len(buffers)
        if block_mask is not None:
            bq, bkv = _block_size(block_mask)
            m = self.mask = C.BlockMask(block_q=bq, block_kv=bkv)
            for name in C.MASK_ARRAYS:
                arr = _mask_array(getattr(block_mask, name, None), q)
                setattr(m, name, self.ptr(None if arr is None else T.readable(arr)))
            a.block_mask = ctypes.pointer(m)
        a.stream = T.current_stream(q)
        a.check_bounds = bool(check_bounds)
        a.fast_math = bool(fast_math)
        p, seed, offset = dropout
        a.dropout_p = float(p)  # validated by the library: [0, 1)
        a.dropout_seed, a.dropout_offset = _u64("dropout_seed", seed), _u64("dropout_offset", offset)
        a.deterministic = bool(deterministic)
        a.arch = None if arch is None else str(arch).encode()  # validated by the library
        # validated by the library: >= 0, inside the whole lengths
        a.q_offset, a.kv_offset, a.q_len_total, a.kv_len_total = (int(x) for x in offsets)
        self.kernel = kernel

    def ptr(self, x):
        return T.ptr(x, self.keep)

    def seqlens(self, cu_q, cu_kv):
        """A packed call's offsets (int32 [B + 1] each, on q's device)."""
        if _packed(cu_q, cu_kv):
            self.args.cu_seqlens_q = self.ptr(T.readable(cu_q))
            self.args.cu_seqlens_kv = self.ptr(T.readable(cu_kv))

    def run(self, fn):
        lib.check(fn(self.kernel._handle, ctypes.byref(self.args)))


_ids = iter(range(1, 1 << 62))
registry = {}  # Kernel.id -> Kernel: how torch's custom ops find a kernel by a string


class Kernel:
    """A loaded .score kernel (flexc.compile). Call it like an attention
    function; .backward gives the gradients; .info() says what it reads."""

    source = None  # the .score text it was compiled from (None: unknown)

    def __init__(self, handle, origin):
        self._handle = handle
        self._free = lib.flex_kernel_free  # still there while the interpreter exits
        self.origin = origin
        self.id = f"k{next(_ids)}"
        try:
            self._info = self._get_info()
        except FlexError:
            self._info = None  # a library without flex_kernel_get_info
        self.name = self._info.name if self._info else origin
        # What the torch layer reads while torch.compile traces it: plain data.
        self.grad_buffers = frozenset(
            b.name for b in self._info.buffers if b.grad) if self._info else None
        registry[self.id] = self

    def __del__(self):
        if getattr(self, "_handle", None):
            self._free(self._handle)
            self._handle = None

    def __repr__(self):
        return f"<flexc.Kernel {self.name!r} from {self.origin}>"

    def _get_info(self):
        ci = C.KernelInfo()
        lib.check(lib.flex_kernel_get_info(self._handle, ctypes.byref(ci)))
        params = tuple(ParamInfo(
            p.name.decode(), C.TYPE_NAMES.get(p.type, str(p.type)),
            (int(p.default_value) if p.type == 1 else p.default_value) if p.has_default else None)
            for p in ci.params[:ci.nparams])
        buffers = tuple(BufferInfo(
            b.name.decode(), T._DL.get((b.dtype.code, b.dtype.bits), "?"),
            tuple(_s(b.dim_name[d]) if b.dim_name[d] else int(b.extent[d]) for d in range(b.ndim)),
            bool(b.grad), bool(b.sorted), bool(b.used))
            for b in ci.buffers[:ci.nbuffers])
        feats = frozenset(n for n, bit in C.FEATURES.items() if ci.features & bit)
        return KernelInfo(_s(ci.name), _s(ci.file), _s(ci.score), _s(ci.mask), feats,
                          params, buffers, _s(ci.sink))

    def info(self):
        """KernelInfo: name, file, score and mask names, features, params
        and buffers (from flex_kernel_get_info)."""
        if self._info is None:
            self._info = self._get_info()
        return self._info

    def __call__(self, q, k, v, *, scale=None, params=None, buffers=None, block_mask=None,
                 return_lse=False, backend=None, check_bounds=False, fast_math=False,
                 cu_seqlens_q=None, cu_seqlens_kv=None, dropout_p=0.0, dropout_seed=0,
                 dropout_offset=0, kv_splits=0, arch=None, q_offset=0, kv_offset=0,
                 q_len_total=0, kv_len_total=0):
        """out [B, H, Q_LEN, EV] in q's dtype (and LSE [B, H, Q_LEN], float32;
        float64 for float64 inputs on the reference, with return_lse).

        q, k, v: torch tensors or NumPy arrays [B, H|HKV, LEN, E|EV];
        packed variable-length batches: cu_seqlens_q and cu_seqlens_kv (int32
        [B + 1] offsets, on q's device) with q [TOTAL_Q, H, E], k and v
        [TOTAL_KV, HKV, E|EV]; then out is [TOTAL_Q, H, EV] and LSE
        [H, TOTAL_Q] (docs/language.md, "Packed variable-length batches");
        params: {name: number}; buffers: {name: tensor of the declared dtype};
        block_mask: flexc.BlockMask or PyTorch's BlockMask (which blocks to
        visit; the kernel's mask function decides inside partial blocks);
        backend: 'reference', 'emu', 'cuda' or 'cpu' (default:
        default_backend(q)). CUDA tensors run on PyTorch's current stream.
        dropout_p in [0, 1), dropout_seed, dropout_offset (unsigned 64-bit):
        dropout by Philox bits (docs/language.md); pass the same three to backward.
        kv_splits: split-KV decoding on emu and cuda (docs/decoding.md): 0
        automatic, 1 never, N key chunks (ignored by reference and cpu).
        arch: the emu backend's target ('sm_80' by default; 'sm_90a' runs
        the TMA + wgmma forward and backward); other backends ignore it.
        q_offset, kv_offset, q_len_total, kv_len_total: the call is a shard
        of a longer sequence (docs/language.md "Position offsets"): q's rows
        are positions q_offset.., k's and v's kv_offset.., of sequences of
        those whole lengths (0: the call's own)."""
        backend = backend or default_backend(q)
        q, k, v = (T.readable(x) for x in (q, k, v))
        packed = _packed(cu_seqlens_q, cu_seqlens_kv)
        if packed:
            total, H = q.shape[0], q.shape[1]
            out = T.empty(q, (total, H, v.shape[-1]), T.dtype_name(q))
            lse = T.empty(q, (H, total), lse_dtype(q, backend))
        else:
            B, H, L = q.shape[0], q.shape[1], q.shape[2]
            out = T.empty(q, (B, H, L, v.shape[-1]), T.dtype_name(q))
            lse = T.empty(q, (B, H, L), lse_dtype(q, backend))
        call = _Call(self, backend, q, k, v, scale, params, buffers, block_mask,
                     check_bounds, fast_math, dropout=(dropout_p, dropout_seed, dropout_offset),
                     arch=arch, offsets=(q_offset, kv_offset, q_len_total, kv_len_total))
        call.seqlens(cu_seqlens_q, cu_seqlens_kv)
        call.args.kv_splits = int(kv_splits)  # validated by the library: >= 0
        call.args.out, call.args.lse = call.ptr(out), call.ptr(lse)
        call.run(lib.flex_forward)
        return (out, lse) if return_lse else out

    def backward(self, q, k, v, out, lse, dout, dlse=None, *, scale=None, params=None,
                 buffers=None, block_mask=None, backend=None, buffer_grads=(),
                 check_bounds=False, fast_math=False, cu_seqlens_q=None, cu_seqlens_kv=None,
                 dropout_p=0.0, dropout_seed=0, dropout_offset=0, deterministic=False, arch=None,
                 q_offset=0, kv_offset=0, q_len_total=0, kv_len_total=0):
        """Grads(dq, dk, dv, buffers) of the call that gave out and lse, for
        the incoming gradients dout (q's dtype) and dlse (optional); packed
        calls pass the forward's cu_seqlens_q and cu_seqlens_kv.
        buffer_grads names the `grad` buffers whose gradient to return
        (float32, the buffer's shape). dropout_p, dropout_seed and
        dropout_offset: the forward's. deterministic: gradients bitwise the
        same on every run (docs/language.md "Determinism"; no float atomics). arch
        and the position offsets as for the forward (a shard's backward is
        given the whole sequence's merged out and lse)."""
        backend = backend or default_backend(q)
        q, k, v, out, lse, dout = (T.readable(x) for x in (q, k, v, out, lse, dout))
        dq, dk, dv = (T.empty(x, tuple(x.shape), T.dtype_name(x)) for x in (q, k, v))
        bufs = dict(buffers or {})
        gb = {n: T.zeros(bufs[n], tuple(bufs[n].shape), "float32")
              for n in buffer_grads if n in bufs}
        call = _Call(self, backend, q, k, v, scale, params, bufs, block_mask,
                     check_bounds, fast_math, gb, (dropout_p, dropout_seed, dropout_offset),
                     deterministic, arch, (q_offset, kv_offset, q_len_total, kv_len_total))
        call.seqlens(cu_seqlens_q, cu_seqlens_kv)
        a = call.args
        a.out, a.lse, a.dout = call.ptr(out), call.ptr(lse), call.ptr(dout)
        a.dlse = call.ptr(None if dlse is None else T.readable(dlse))
        a.dq, a.dk, a.dv = call.ptr(dq), call.ptr(dk), call.ptr(dv)
        call.run(lib.flex_backward)
        return Grads(dq, dk, dv, gb)

    def block_mask(self, B, H, q_len, kv_len, *, block_size=128, params=None, buffers=None):
        """The kernel's BlockMask for these sizes, built as the runtime
        builds it (interval analysis, then element-wise evaluation of the
        blocks it leaves open), as a flexc.BlockMask of NumPy arrays.
        block_size: an int or (block_q, block_kv)."""
        bq, bkv = (block_size, block_size) if isinstance(block_size, int) else block_size
        call = _Call(self, "reference", None, None, None, None, params, buffers, None,
                     False, False)
        stats = C.MaskStats()
        m = ctypes.POINTER(C.BlockMask)()
        lib.check(lib.flex_block_mask_create(ctypes.byref(m), self._handle,
                                             ctypes.byref(call.args), B, H, q_len, kv_len,
                                             bq, bkv, ctypes.byref(stats)))
        owner = _MaskMemory(m)  # freed with the last array that views it
        arrays = {name: _view(getattr(m.contents, name), owner) for name in C.MASK_ARRAYS}
        bs = (m.contents.block_q, m.contents.block_kv)
        return BlockMask(arrays, bs, {n: getattr(stats, n) for n, _ in C.MaskStats._fields_},
                         (q_len, kv_len))

    def mask_class(self, B, H, q_len, kv_len, *, params=None, buffers=None, q_offset=0,
                   kv_offset=0, q_len_total=0, kv_len_total=0):
        """'empty', 'full' or 'partial': how the kernel's mask covers a whole
        call of B x H x q_len x kv_len (with position offsets: a shard pair),
        by the interval analysis alone (O(1); buffers must be host tensors).
        An empty call contributes nothing (O = 0, LSE = -inf)."""
        call = _Call(self, "reference", None, None, None, None, params, buffers, None,
                     False, False, offsets=(q_offset, kv_offset, q_len_total, kv_len_total))
        cls = ctypes.c_int()
        lib.check(lib.flex_mask_classify(self._handle, ctypes.byref(call.args), B, H, q_len,
                                         kv_len, ctypes.byref(cls)))
        return ("empty", "full", "partial")[cls.value]

    def emit(self, *, target="cuda", arch="sm_80", dtype="float16", head_dim=64, head_dim_v=0,
             forward_only=False, fast_math=False, resource_usage=False):
        """The generated CUDA source (str), or PTX (str) or cubin (bytes);
        with resource_usage, (code, report). target: cuda, ptx or cubin;
        dtype: fp16, bf16 or fp32 (the CLI's spellings), float16, bfloat16,
        float32 or a torch dtype."""
        if target not in C.TARGETS:
            raise ValueError(f"flexc: emit target must be one of {', '.join(C.TARGETS)}, "
                             f"got {target!r}")
        code, bits = T._CODE[_dtype_name(dtype)]
        o = C.EmitOptions(target=C.TARGETS[target], arch=arch.encode(),
                          dtype=C.DLDataType(code, bits, 1), head_dim=head_dim,
                          head_dim_v=head_dim_v, forward_only=forward_only,
                          fast_math=fast_math, resource_usage=resource_usage)
        out, rep, n = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_size_t()
        lib.check(lib.flex_emit(self._handle, ctypes.byref(o), ctypes.byref(out),
                                ctypes.byref(n), ctypes.byref(rep)))
        try:
            data = ctypes.string_at(out, n.value)
            report = ctypes.string_at(rep).decode() if rep.value else None
        finally:
            lib.flex_free(out)
            lib.flex_free(rep)
        text = data if target == "cubin" else data.decode()
        return (text, report) if resource_usage else text


_DTYPE_SPELLINGS = {"fp16": "float16", "f16": "float16", "half": "float16",
                    "bf16": "bfloat16", "fp32": "float32", "f32": "float32", "float": "float32"}


def _dtype_name(dtype):
    """'float16', 'bfloat16' or 'float32' for the spellings flexc's CLI takes
    (fp16, bf16, fp32), NumPy's and PyTorch's names and dtypes."""
    name = str(dtype).replace("torch.", "")
    name = _DTYPE_SPELLINGS.get(name, name)
    if name not in ("float16", "bfloat16", "float32"):
        raise ValueError(f"flexc: emit dtype must be fp16, bf16 or fp32 (or float16, bfloat16, "
                         f"float32, a torch dtype), got {dtype!r}")
    return name


class _MaskMemory:
    """A flex_block_mask the library made, freed when no array views it."""

    def __init__(self, m):
        self.m = m
        self._free = lib.flex_block_mask_free

    def __del__(self):
        if self.m:
            self._free(self.m)
            self.m = None


class _HostArray:
    """NumPy's view of int32 host memory that `owner` keeps alive."""

    def __init__(self, address, shape, owner):
        self.owner = owner
        self.__array_interface__ = {"shape": shape, "typestr": "<i4", "data": (address, False),
                                    "version": 3}


def _view(p, owner):
    """A NumPy array over a host DLTensor the library owns (None for NULL),
    without a copy: a 131072-token mask's eight arrays are 16 MB."""
    if not p:
        return None
    import numpy as np
    t = p.contents
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        raise FlexError(C.ERR_RUNTIME, "flexc: a block-mask array the library made is not compact")
    if not int(np.prod(shape)):
        return np.zeros(shape, dtype=np.int32)
    return np.asarray(_HostArray(t.data + t.byte_offset, shape, owner))


_DOCS = "docs/language.md and docs/from-pytorch.md in the flexc repository"


def compile(path_or_source=None, kernel=None, *, score_mod=None, mask_mod=None):
    """Load kernel `kernel` (None: the file's only or implicit kernel) from
    a .score file (when path_or_source names an existing file, or is a
    one-line string ending in .score or holding a '/') or from .score
    source text. Raises FlexError with the rendered diagnostics.

    score_mod, mask_mod: Python functions as PyTorch's flex_attention takes
    them, traced into .score (flexc.torch.to_score shows the source) and
    compiled; a kernel made so passes the tensors and numbers the functions
    capture on each call. A function as path_or_source is a score_mod (five
    arguments) or a mask_mod (four). Needs PyTorch."""
    if callable(path_or_source) and not isinstance(path_or_source, os.PathLike):
        if score_mod is not None or mask_mod is not None:
            raise TypeError("flexc.compile: give functions as score_mod= and mask_mod=")
        if _positional_args(path_or_source) == 4:
            mask_mod = path_or_source
        else:
            score_mod = path_or_source
        path_or_source = None
    if score_mod is not None or mask_mod is not None:
        if path_or_source is not None or kernel is not None:
            raise TypeError("flexc.compile: score_mod= and mask_mod= go without a .score "
                            "file or kernel name")
        from . import _mods
        return _mods.compile_fns(score_mod, mask_mod)
    if not isinstance(path_or_source, (str, bytes, os.PathLike)):
        raise TypeError("flexc.compile: wants a .score path or source text, or Python "
                        "functions as score_mod= and mask_mod=; got "
                        f"{type(path_or_source).__name__} (see {_DOCS})")
    h = ctypes.c_void_p()
    kname = None if kernel is None else kernel.encode()
    if isinstance(path_or_source, bytes):
        path_or_source = path_or_source.decode()
    if isinstance(path_or_source, os.PathLike) or os.path.isfile(path_or_source) or \
            _looks_like_path(path_or_source):
        path = os.fspath(path_or_source)
        lib.check(lib.flex_kernel_load(ctypes.byref(h), path.encode(), kname))
        origin = path
        try:
            with open(path, encoding="utf-8") as f:
                source = f.read()
        except (OSError, UnicodeDecodeError):
            source = None
    else:
        text = path_or_source.encode()
        lib.check(lib.flex_kernel_from_source(ctypes.byref(h), b"<source>", text, len(text), kname))
        origin = "<source>"
        source = path_or_source
    k = Kernel(h, origin)
    k.source = source
    return k


def _positional_args(fn):
    """How many positional arguments without defaults fn takes (PyTorch's
    rule: five for a score_mod, four for a mask_mod)."""
    import inspect
    try:
        ps = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 5
    return sum(1 for p in ps if p.default is p.empty and
               p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def _looks_like_path(s):
    """A missing file named like one ('model/alibi.score') is reported as a
    missing file, not parsed as source text."""
    return bool(s) and not any(c in s for c in "\n{};") and (
        s.endswith(".score") or os.sep in s)


def check(path):
    """Check every declaration and kernel of a .score file; raises
    FlexError with the diagnostics."""
    lib.check(lib.flex_check_file(os.fspath(path).encode()))


def ir(path, kernel=None, *, grad=False, after=None):
    """The IR text of a kernel after pass `after` (None: all passes), with
    the joint backward function when grad."""
    out = ctypes.c_void_p()
    lib.check(lib.flex_ir_text(ctypes.byref(out), os.fspath(path).encode(),
                               None if kernel is None else kernel.encode(), grad,
                               None if after is None else after.encode()))
    try:
        return ctypes.string_at(out).decode()
    finally:
        lib.flex_free(out)
