"""Python score_mod and mask_mod functions as flexc kernels.

`plan(score_mod, mask_mod)` gives a Plan: the .score source of the two
traced functions, the kernel flexc compiled from it, and how a call binds
its params and buffers. Tracing is cached per function key (_capture), the
kernel per pair of traces, so a training step pays for neither after its
first call; a call only walks the functions' captured values again.

`combine(kernel, mask_mod)` is a .score kernel from flexc.compile with the
mask of a PyTorch BlockMask: its own score and the traced mask, or, when
the kernel has a mask of its own, the kernel itself once a check finds the
two masks equal.
"""
import re
import threading

import torch

from . import _capture
from . import _kernel as K
from . import _trace as T
from ._capi import ERR_INVALID, FlexError
from ._pretty import pretty

_lock = threading.RLock()
_traces = {}    # (key, kind, numbers) -> Traced, or None: trace with the numbers' values
_plans = {}     # (score trace id, mask trace id, sorted flags) -> Plan
_ids = {}       # id(Traced) -> Traced (keeps them alive for the plan keys)


def _constant(fn):
    """fn, which torch.compile calls while tracing and takes the result of
    as a constant (its arguments and result are plain data)."""
    try:
        return torch._dynamo.assume_constant_result(fn)
    except AttributeError:  # pragma: no cover - an older PyTorch
        return fn


_reg = {}       # id string -> Traced / Plan: what the constant-result functions name
stats = {"traces": 0, "compiles": 0}  # functions traced and kernels compiled, for tests


@_constant
def _trace_id(key, kind, numbers):
    """The id of the trace of `key` (numbers: None, or the captured numbers'
    values to trace them as constants); '' when a number is used as a
    Python value and the values are needed."""
    with _lock:
        k = (key, kind, numbers)
        t = _traces.get(k, _MISSING)
        if t is _MISSING:
            stats["traces"] += 1
            t = _traces[k] = T.trace(key, kind, numbers=None if numbers is None else list(numbers))
        if t is None:
            return ""
        tid = f"t{id(t)}"
        _reg[tid] = t
        return tid


def traced(fn, kind):
    """(Traced, leaves) of fn, a score_mod (kind 'score') or a mask_mod."""
    key, leaves = _capture.capture(fn)
    tid = _trace_id(key, kind, None)
    if not tid:  # a captured number is used as a Python value: trace with the values
        numbers = tuple(v if type(v) in (int, float) else None for v in leaves)
        tid = _trace_id(key, kind, numbers)
    return _reg[tid], leaves


_MISSING = object()


class Plan:
    """A kernel made from traced functions. source: its .score text;
    kernel: the compiled flexc.Kernel; parts: (Traced, param names, buffer
    names) for the score and the mask (None where absent)."""

    def __init__(self, source, kernel, parts):
        self.source, self.kernel, self.parts = source, kernel, parts


def _decl_lines(tr, pnames, bnames, flags):
    out = []
    for (leaf, ptype, _), n in zip(tr.params, pnames):
        out.append(f"param {ptype} {n};")
    for b, n, srt in zip(tr.buffers, bnames, flags):
        dims = ", ".join(str(d) for d in (b["shape"] or (1,)))
        attrs = (" grad" if b["grad"] else "") + (" sorted" if srt else "")
        out.append(f"buffer {n}: {T._BUF_DTYPES[b['dtype']]}[{dims}]{attrs};")
    return out


def _body(tr, fname, pnames, bnames):
    def sub(text):
        text = re.sub(r"@P(\d+)@", lambda m: pnames[int(m.group(1))], text)
        return re.sub(r"@B(\d+)@", lambda m: bnames[int(m.group(1))], text)
    head = tr.kind  # score, mask or sink
    lines = [f"{head} {fname}({', '.join(tr.argnames)}) {{"]
    lines += [f"    let {n} = {pretty(sub(t))};" for n, t in tr.lets]
    lines.append(f"    return {pretty(sub(tr.ret))};")
    lines.append("}")
    return lines


def source_of(score, mask, taken=(), sorted_flags=((), ()), kernel_line=None, header=None,
              sink=None):
    """(.score text, parts) for Traced score, mask and sink (any may be
    None). taken: names the text must not declare; sorted_flags: per
    buffer of the score, the mask (and the sink), whether it is declared
    `sorted`; kernel_line: parts -> a last line (a kernel block)."""
    names = set(taken)
    for tr in (score, mask, sink):
        if tr is not None:
            names.update(tr.argnames)
            names.update(n for n, _ in tr.lets)
    decls, bodies, parts = [], [], []
    flags3 = tuple(sorted_flags) + ((),) * (3 - len(sorted_flags))
    for tr, default, flags in ((score, "score_mod", flags3[0]), (mask, "mask_mod", flags3[1]),
                               (sink, "sink_mod", flags3[2])):
        if tr is None:
            parts.append(None)
            continue
        pn = [T.sanitize(p[2], names) for p in tr.params]
        bn = [T.sanitize(b["name"], names) for b in tr.buffers]
        fname = T.sanitize(tr.fname or default, names)
        decls += _decl_lines(tr, pn, bn, tuple(flags) + (False,) * len(tr.buffers))
        bodies += _body(tr, fname, pn, bn)
        parts.append((tr, pn, bn, fname))
    if sink is None:
        parts.pop()  # (score, mask) as before
    lines = [header] if header else []
    lines += decls + bodies
    if kernel_line:
        lines.append(kernel_line(parts))
    return "\n".join(lines) + "\n", parts


def _header(score, mask, sink=None):
    said = [f"{tr.kind}_mod {tr.desc}" for tr in (score, mask, sink) if tr is not None]
    return "# traced by flexc.torch from " + (" and ".join(said) or "no function")


@_constant
def _plan_id(score_id, mask_id, sorted_flags, sink_id=""):
    """The id of the Plan of traces score_id, mask_id and sink_id ('' for none)."""
    with _lock:
        pk = (score_id, mask_id, sorted_flags, sink_id)
        p = _plans.get(pk)
        if p is None:
            score, mask, sink = _reg.get(score_id), _reg.get(mask_id), _reg.get(sink_id)
            text, parts = source_of(score, mask, sorted_flags=sorted_flags,
                                    header=_header(score, mask, sink), sink=sink)
            stats["compiles"] += 1
            p = _plans[pk] = Plan(text, K.compile(text), parts)
        pid = f"p{id(p)}"
        _reg[pid] = p
        return pid


def plan_for(score, mask, sorted_flags=((), ()), sink=None):
    """The Plan of Traced score, mask and sink (any may be None)."""
    return _reg[_plan_id(f"t{id(score)}" if score else "", f"t{id(mask)}" if mask else "",
                         sorted_flags, f"t{id(sink)}" if sink else "")]


# ---- a call's values -----------------------------------------------------------

_WIDE = {torch.float64: torch.float32, torch.int8: torch.int32, torch.int16: torch.int32}


def buffer_values(tr, leaves, device):
    """The tensors of Traced tr's buffers for one call, from its leaves:
    captured tensors as they are (moved to `device`, float64 as float32),
    prologue values computed now (with autograd, so gradients reach the
    captured tensors)."""
    pro = None
    out = []
    for b in tr.buffers:
        kind, ref = b["source"]
        if kind == "leaf":
            t = leaves[ref]
        elif kind == "const":
            t = ref
        else:
            if pro is None:
                args = [x if isinstance(x, torch.Tensor) else
                        torch.tensor(x, dtype=torch.int32 if isinstance(x, int) else torch.float32)
                        for x in leaves]
                pro = tr.prologue(*args)
            t = pro[ref]
        if t.dtype in _WIDE:
            t = t.to(_WIDE[t.dtype])
        if t.dim() == 0:
            t = t.reshape(1)
        elif not t.is_contiguous():  # the cpu backend reads buffers row-major
            t = t.contiguous()
        if device is not None and t.device != device:
            t = t.to(device)
        out.append(t)
    return out


def sorted_flags(trs_and_values):
    """Whether each 1-D integer buffer is non-decreasing now (then the
    kernel declares it `sorted`, which lets the mask analysis skip whole
    blocks of a document mask); False under torch.compile."""
    out = []
    compiling = _compiling()
    for tr, values in trs_and_values:
        flags = []
        for t in (values if tr is not None else ()):
            ok = False
            if not compiling and t.dim() == 1 and not t.dtype.is_floating_point and \
                    t.dtype != torch.bool and t.numel() > 1:
                ok = bool((t[1:] >= t[:-1]).all())
            flags.append(ok)
        out.append(tuple(flags))
    return tuple(out)


def _compiling():
    try:
        return torch.compiler.is_compiling()
    except AttributeError:  # an older PyTorch
        return False


def bind(plan, values):
    """(params, buffers) dicts of a call: values is (leaves, buffer
    tensors) per part."""
    params, buffers = {}, {}
    for part, (leaves, bufs) in zip(plan.parts, values):
        if part is None:
            continue
        tr, pn, bn, _ = part
        for (leaf, ptype, _), n in zip(tr.params, pn):
            v = leaves[leaf]
            params[n] = int(v) if ptype == "int" else float(v)
        for t, n in zip(bufs, bn):
            buffers[n] = t
    return params, buffers


# ---- entry points ----------------------------------------------------------------

def mask_mod_of(block_mask):
    """The mask_mod a block mask carries (None: none, or PyTorch's noop_mask)."""
    if block_mask is None:
        return None
    mm = getattr(block_mask, "mask_mod", None)
    if type(mm).__name__ == "_MaskModWrapper" and callable(getattr(mm, "fn", None)):
        mm = mm.fn  # how PyTorch keeps it after flattening a BlockMask
    if mm is None:
        return None
    try:
        from torch.nn.attention.flex_attention import noop_mask
    except ImportError:  # pragma: no cover - every PyTorch with BlockMask has it
        noop_mask = None
    return None if mm is noop_mask else mm


def _parts(score_fn, mask_fn, device, sink_fn=None):
    """Traced functions, their leaves and buffer tensors for one call: the
    score's and the mask's, and the sink's when there is one."""
    out = []
    fns = ((score_fn, "score"), (mask_fn, "mask")) + (((sink_fn, "sink"),) if sink_fn else ())
    for fn, kind in fns:
        if fn is None:
            out.append((None, [], []))
            continue
        tr, leaves = traced(fn, kind)
        out.append((tr, leaves, buffer_values(tr, leaves, device)))
    return out


def call_values(score_fn, mask_fn, query, params=None, buffers=None, device=None, sink_fn=None):
    """(kernel, params, buffers) for a call of Python functions (on
    query's device, or `device` when query is None)."""
    if params or buffers:
        raise ValueError("flexc.torch.flex_attention: params= and buffers= go with a kernel from "
                         "flexc.compile; a Python score_mod or mask_mod passes the numbers and "
                         "tensors it captures itself")
    parts = _parts(score_fn, mask_fn, query.device if query is not None else device, sink_fn)
    flags = sorted_flags([(tr, b) for tr, _, b in parts])
    plan = plan_for(parts[0][0], parts[1][0], flags, parts[2][0] if len(parts) > 2 else None)
    p, b = bind(plan, [(lv, b) for _, lv, b in parts])
    return plan.kernel, p, b


def to_score(score_mod=None, mask_mod=None, sink_mod=None):
    """The .score source flexc compiles for these Python functions."""
    parts = _parts(score_mod, mask_mod, None, sink_mod)
    sink = parts[2][0] if len(parts) > 2 else None
    text, _ = source_of(parts[0][0], parts[1][0], header=_header(parts[0][0], parts[1][0], sink),
                        sink=sink)
    return text


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _uncommented(src):
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    return re.sub(r"(#|//)[^\n]*", " ", src)


def _kernel_mask(kernel):
    """The mask expression of a kernel: its `kernel` block's `mask = ...;`,
    or the one mask function of an implicit kernel."""
    info = kernel.info()
    src = _uncommented(kernel.source or "")
    m = re.search(r"\bkernel\s+" + re.escape(info.name) + r"\s*\{([^}]*)\}", src)
    if m:
        mm = re.search(r"\bmask\s*=\s*([^;]*);", m.group(1))
        return mm.group(1).strip() if mm else None
    return info.mask


_combined = {}   # (kernel id, mask trace, flags, 'with'|'agree') -> Kernel
_agreed = {}     # what a mask check found, per call's sizes and values


@_constant
def _combined_id(kernel_id, mask_id, flags):
    """The id of (kernel, parts, own mask) for kernel_id with traced mask mask_id:
    the kernel's score and the traced mask, or, when the kernel has a mask
    of its own, a kernel whose mask is where the two differ."""
    with _lock:
        ck = (kernel_id, mask_id, flags)
        entry = _combined.get(ck)
        if entry is None:
            kernel, tr = K.registry[kernel_id], _reg[mask_id]
            own = _kernel_mask(kernel)
            info = kernel.info()
            taken = set(_IDENT.findall(kernel.source))
            name = T.sanitize("traced_mask" if own is None else "masks_differ", taken)

            def block(parts):
                mname = parts[1][3]
                if own is None:
                    score = f"score = {info.score}; " if info.score else ""
                    return f"kernel {name} {{ {score}mask = {mname}; }}"
                return f"kernel {name} {{ mask = ({own}) && !{mname} || !({own}) && {mname}; }}"
            text, parts = source_of(None, tr, taken=taken, sorted_flags=((), flags),
                                    kernel_line=block)
            text = kernel.source.rstrip("\n") + "\n\n" + _header(None, tr) + "\n" + text
            stats["compiles"] += 1
            entry = _combined[ck] = (K.compile(text, name), parts, own is None)
        cid = f"c{id(entry)}"
        _reg[cid] = entry
        return cid


def combine(kernel, mask_fn, block_mask, query, params, buffers):
    """(kernel, params, buffers): a .score kernel with a BlockMask's mask_mod."""
    if kernel.source is None:
        raise ValueError(f"flexc: {kernel!r} has no .score source to combine with the "
                         "BlockMask's mask_mod")
    (_, _, _), (tr, leaves, bufs) = _parts(None, mask_fn, query.device)
    flags = sorted_flags([(None, []), (tr, bufs)])[1]
    made, parts, replaces = _reg[_combined_id(kernel.id, f"t{id(tr)}", flags)]
    mp, mb = bind(Plan(None, made, parts), [([], []), (leaves, bufs)])
    allp, allb = dict(params, **mp), dict(buffers, **mb)
    if replaces:
        return made, allp, allb
    if not _compiling():
        _check_agree(made, kernel, block_mask, query, allp, allb)
    return kernel, params, buffers


def _check_agree(check, kernel, block_mask, query, params, buffers):
    """Raises FlexError where the kernel's mask and the BlockMask's mask_mod
    differ at any element (the check kernel's mask is their difference)."""
    B, H, QL = query.shape[:3]
    seq = getattr(block_mask, "seq_lengths", None)
    KL = int(seq[1]) if seq else None
    if KL is None:
        return
    bs = block_mask.BLOCK_SIZE
    bq, bkv = (bs, bs) if isinstance(bs, int) else (int(bs[0]), int(bs[1]))
    vk = (check.id, B, H, QL, KL, bq, bkv, tuple(sorted(params.items())),
          tuple((n, t.data_ptr(), t._version) for n, t in sorted(buffers.items())))
    if vk in _agreed:
        return
    # the reference backend builds the mask on the host: device buffers are
    # copied there (once per buffer version, cached in _agreed)
    bm = check.block_mask(B, H, QL, KL, block_size=(bq, bkv), params=params,
                          buffers={n: t.detach().cpu() for n, t in buffers.items()})
    differ = bm.stats["full"] + bm.stats["partial"]
    if differ:
        raise FlexError(ERR_INVALID, (
            f"flexc.torch.flex_attention: the mask of {kernel.name} and the BlockMask's "
            f"mask_mod differ ({differ} of {bm.stats['total']} blocks of {bq}x{bkv} hold "
            "elements that one keeps and the other masks); pass the BlockMask of the kernel's "
            "own mask, or a kernel without a mask"))
    _agreed[vk] = True


_sinked = {}   # kernel id -> (the kernel with a per-head sink, its buffer's name)


@_constant
def _sinks_id(kernel_id):
    """The id of `kernel_id` with a learnable per-head sink added (a buffer
    of one logit per query head, `grad`, and `sink NAME(b, h, q) { return
    buffer[h]; }`), compiled once."""
    with _lock:
        entry = _sinked.get(kernel_id)
        if entry is None:
            kernel = K.registry[kernel_id]
            info = kernel.info()
            if info.sink is not None:
                raise ValueError(f"flexc.torch.flex_attention: {kernel.name} has a sink function "
                                 f"of its own ({info.sink}); sinks= adds one to kernels without")
            if kernel.source is None:
                raise ValueError(f"flexc: {kernel!r} has no .score source to add sinks to")
            taken = set(_IDENT.findall(kernel.source))
            buf = T.sanitize("sinks", taken)
            taken.add(buf)
            fn = T.sanitize("per_head_sink", taken)
            taken.add(fn)
            name = T.sanitize("with_sinks", taken)
            own = _kernel_mask(kernel)
            items = (f"score = {info.score}; " if info.score else "") + \
                    (f"mask = {own}; " if own else "") + f"sink = {fn};"
            text = (kernel.source.rstrip("\n") + "\n\n# flexc.torch.flex_attention(..., sinks=): "
                    "one learned logit per query head\n"
                    f"buffer {buf}: f32[H] grad;\nsink {fn}(b, h, q) {{ return {buf}[h]; }}\n"
                    f"kernel {name} {{ {items} }}\n")
            stats["compiles"] += 1
            entry = _sinked[kernel_id] = (K.compile(text, name), buf)
        sid = f"s{id(entry)}"
        _reg[sid] = entry
        return sid


def with_sinks(kernel, buffers, sinks, query):
    """(kernel, buffers) of a call with flex_attention's sinks=: kernel with a
    per-head sink whose logits are `sinks` (float32 [H]; a tensor that
    requires grad gets its gradient)."""
    H = int(query.shape[1])
    if not isinstance(sinks, torch.Tensor) or sinks.dim() != 1 or int(sinks.shape[0]) != H:
        raise ValueError(f"flexc.torch.flex_attention: sinks must be a 1-D tensor of one logit "
                         f"per query head (shape [{H}]), got "
                         f"{tuple(sinks.shape) if isinstance(sinks, torch.Tensor) else type(sinks).__name__}")
    if not sinks.is_floating_point():
        raise ValueError(f"flexc.torch.flex_attention: sinks must be float32, got {sinks.dtype}")
    made, buf = _reg[_sinks_id(kernel.id)]
    return made, dict(buffers, **{buf: sinks.to(device=query.device, dtype=torch.float32)})


class TracedKernel(K.Kernel):
    """A kernel flexc.compile made from Python functions. Called without
    params and buffers it passes what the functions capture now."""

    def __init__(self, score_mod, mask_mod, plan):
        self._base = plan.kernel
        self.score_mod, self.mask_mod, self.plan = score_mod, mask_mod, plan
        self.__dict__.update({k: v for k, v in plan.kernel.__dict__.items() if k != "_handle"})
        self.source = plan.source
        self.origin = "<traced>"

    @property
    def _handle(self):
        return self._base._handle

    def __del__(self):
        pass  # the plan's kernel owns the handle

    def __repr__(self):
        said = [f"{tr.kind}_mod {tr.desc}" for tr, *_ in self.plan.parts if tr is not None]
        return f"<flexc.Kernel {self.name!r} traced from {' and '.join(said)}>"

    def _values(self, q, params, buffers):
        if params is not None or buffers is not None:
            return params, buffers
        dev = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
        parts = _parts(self.score_mod, self.mask_mod, dev)
        p, b = bind(self.plan, [(lv, bv) for _, lv, bv in parts])
        if not isinstance(q, torch.Tensor):  # NumPy inputs: NumPy buffers
            b = {n: t.detach().cpu().numpy() for n, t in b.items()}
        return p, b

    def __call__(self, q, k, v, *, params=None, buffers=None, **kw):
        params, buffers = self._values(q, params, buffers)
        return K.Kernel.__call__(self, q, k, v, params=params, buffers=buffers, **kw)

    def backward(self, q, k, v, out, lse, dout, dlse=None, *, params=None, buffers=None, **kw):
        params, buffers = self._values(q, params, buffers)
        return K.Kernel.backward(self, q, k, v, out, lse, dout, dlse, params=params,
                                 buffers=buffers, **kw)

    def block_mask(self, B, H, q_len, kv_len, *, block_size=128, params=None, buffers=None):
        params, buffers = self._values(torch.empty(0), params, buffers)
        return K.Kernel.block_mask(self, B, H, q_len, kv_len, block_size=block_size,
                                   params=params, buffers={n: t.detach() for n, t in
                                                           buffers.items()})


def compile_fns(score_mod, mask_mod):
    """flexc.compile(score_mod=, mask_mod=)."""
    parts = _parts(score_mod, mask_mod, None)
    flags = sorted_flags([(tr, b) for tr, _, b in parts])
    plan = plan_for(parts[0][0], parts[1][0], flags)
    return TracedKernel(score_mod, mask_mod, plan)
