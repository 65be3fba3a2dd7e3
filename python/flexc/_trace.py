"""Python score_mod and mask_mod functions traced into .score source.

The way PyTorch's FlexAttention traces them (seeds: the flex_attention
higher-order op): the function is called by make_fx on 0-d tensors (score
float32; b, h, q_idx, kv_idx int32) under a mode that turns `t[i]` with
tensor indices into aten.index, so the graph is at the aten level. Unlike
PyTorch we trace with fake tensors, and each captured Python number is one
more 0-d placeholder, so it becomes a `param` (a new value is a new
argument, not a new kernel); captured tensors are meta tensors that stand
for whatever tensor a later call captures (_capture). _translate turns the
graph into a .score body; `Traced` is the result, cached per function key.

A score function and a mask function combine into one .score file
(`source`) whose kernel flexc compiles like any other; `bind` gives a
call's params and buffers from each function's captured values.
"""
import keyword
import os
import re
import sys

import torch
from torch.overrides import TorchFunctionMode

from . import _capture
from . import _translate as X
from ._capi import ERR_INVALID, FlexError

DOCS = ("docs/from-pytorch.md (what a traced function may use) and docs/language.md "
        "(the .score language), in the flexc repository")

_TORCH_DIR = os.path.dirname(torch.__file__)
_HERE = os.path.dirname(os.path.abspath(__file__))

# Names a .score declaration or let may not take.
_RESERVED = set("""param const buffer kernel let return true false int float bool score mask
sink grad sorted and or not if elif else True False None def lambda B H HKV Q_LEN KV_LEN
TOTAL_Q TOTAL_KV Q_START KV_START inf pi abs min max clamp exp exp2 log log2 sqrt rsqrt tanh
sigmoid erf sin cos floor ceil pow floordiv floormod where sum f32 f16 bf16 i32 i64 u8""".split())

_BUF_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
               torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8", torch.bool: "bool"}


def sanitize(name, taken):
    """A .score identifier for a user's name, unique among `taken` (which
    it joins)."""
    n = re.sub(r"[^A-Za-z0-9_]", "_", name.split(".")[-1] if name else "x").strip("_") or "x"
    if n[0].isdigit():
        n = "x" + n
    if n in _RESERVED or keyword.iskeyword(n) or re.fullmatch(r"t\d+|e\d+", n):
        n += "_"
    base, i = n, 1
    while n in taken:
        i += 1
        n = f"{base}_{i}"
    taken.add(n)
    return n


# ---- tracing ----------------------------------------------------------------

def _user_frame():
    """(file, line) of the innermost frame outside torch and flexc."""
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if not (fn.startswith(_TORCH_DIR) or fn.startswith(_HERE) or fn.startswith("<frozen")):
            return fn, f.f_lineno
        f = f.f_back
    return None


def _fn_name(func):
    name = getattr(func, "__name__", None) or str(func)
    owner = getattr(func, "__objclass__", None) or getattr(func, "__self__", None)
    if owner is torch.Tensor or getattr(func, "__qualname__", "").startswith("TensorBase."):
        return "Tensor." + name
    mod = getattr(func, "__module__", None) or ""
    if mod.startswith("torch"):
        return ("torch." if mod in ("torch", "torch.functional", "torch._C._VariableFunctions")
                else mod + ".") + name
    return name


class _Mode(TorchFunctionMode):
    """While tracing: `t[i, j]` with tensor (or int) indices is aten.index
    (not a Python int and a view), and each node records the user's line
    and the torch function that made it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        try:
            import torch.fx.traceback as fxtb
            loc = _user_frame()
            if loc is not None:
                fxtb.get_current_meta()["stack_trace"] = f"{loc[0]}:{loc[1]}\t{_fn_name(func)}"
        except Exception:  # noqa: BLE001 - locations are a courtesy
            pass
        if func is torch.Tensor.__getitem__:
            x, idx = args
            idx = idx if isinstance(idx, tuple) else (idx,)
            if any(isinstance(i, torch.Tensor) for i in idx) and \
                    all(isinstance(i, (torch.Tensor, int, slice)) for i in idx) and \
                    all(i == slice(None) for i in idx if isinstance(i, slice)):
                ind = [None if isinstance(i, slice) else
                       torch.tensor(i, dtype=torch.int32) if isinstance(i, int) else i
                       for i in idx]
                return torch.ops.aten.index(x, ind)
        return func(*args, **(kwargs or {}))


def where_of(node):
    """(file, line, torch function) a node came from, or None."""
    st = node.meta.get("stack_trace") if node is not None else None
    if not st or "\t" not in st:
        return None
    loc, fn = st.split("\t", 1)
    file, _, line = loc.rpartition(":")
    return file, int(line), fn


def _source_line(file, line):
    import linecache
    return linecache.getline(file, line).rstrip()


def error(what, node=None, fn_desc="", instead=None, why=None):
    """A FlexError naming what failed and where in the user's code."""
    w = where_of(node)
    head = f"{w[0]}:{w[1]}: " if w else ""
    msg = f"{head}error: {fn_desc + ' ' if fn_desc else ''}{what}"
    if w and w[2]:
        msg += f" (from {w[2]})"
    if why:
        msg += f" {why}"
    msg += ", which .score cannot express"
    if instead:
        msg += f"; write {instead} instead"
    if w:
        src = _source_line(w[0], w[1])
        if src:
            msg += "\n    " + src.strip()
    msg += f"\nsee {DOCS}"
    return FlexError(ERR_INVALID, msg)


def _describe(fn):
    """'score_mod `alibi` (model.py:12)' for messages."""
    f = fn
    while hasattr(f, "func"):
        f = f.func
    f = getattr(f, "__func__", f)
    code = getattr(f, "__code__", None)
    if code is None:
        return f"{type(fn).__name__} object"
    return f"`{code.co_name}` ({code.co_filename}:{code.co_firstlineno})"


_NARGS = {"score": 5, "mask": 4, "sink": 3}  # sink_mod(b, h, q_idx) -> its logit


def _make_fx(fn, example):
    from torch.fx.experimental.proxy_tensor import make_fx
    import torch.fx.traceback as fxtb
    with fxtb.preserve_node_meta(), _Mode():
        return make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*example)


class Traced:
    """One traced function: its .score body and what it reads.

    body: the lets and the return, with @P<i>@ and @B<j>@ where param i and
    buffer j go; params: (leaf index, 'int'|'float', user name) per param;
    buffers: dicts (source: ('leaf', i) | ('pro', j) | ('const', tensor),
    dtype, ndim, grad, name) per buffer; prologue: a GraphModule from the
    leaves to the ('pro', j) values, or None; burned: the numbers were
    traced as constants (the key then holds their values)."""

    def __init__(self, kind, fname, argnames, lets, ret, params, buffers, prologue, burned):
        self.kind, self.fname, self.argnames = kind, fname, argnames
        self.lets, self.ret = lets, ret
        self.params, self.buffers, self.prologue = params, buffers, prologue
        self.burned = burned


def _arg_names(fn, n):
    """The names fn gives its first n positional arguments (PyTorch's
    names where it has none: a builtin, *args)."""
    import inspect
    names = []
    try:
        for p in inspect.signature(fn).parameters.values():
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                names.append(p.name)
    except (TypeError, ValueError):
        pass
    names = names[:n]
    defaults = ["score", "b", "h", "q_idx", "kv_idx"][5 - n:]
    return names + defaults[len(names):]


def trace(key, kind, numbers=None):
    """Trace the function `key` describes. numbers: None to trace captured
    numbers as params; else their values, traced as constants."""
    specs = _capture.leaf_specs(key)
    fn_for_names = _capture.rebuild(key, [
        torch.empty(s.shape, dtype=s.dtype, device="meta") if s.kind == "tensor" else
        (0 if s.ptype == "int" else 0.0) for s in specs])
    desc = f"{kind}_mod {_describe(fn_for_names)}"
    n = _NARGS[kind]
    dummies = {}
    nums = []
    values = []
    for i, s in enumerate(specs):
        if s.kind == "tensor":
            # Host tensors (never written: pages stay unallocated), so that they
            # mix with the index arguments as the captured tensors would.
            d = torch.empty(s.shape, dtype=s.dtype)
            dummies[id(d)] = i
            values.append(d)
        elif numbers is not None:
            values.append(numbers[i])
        else:
            values.append(None)
            nums.append(i)
    example = ([torch.zeros((), dtype=torch.float32)] if kind == "score" else []) + \
        [torch.zeros((), dtype=torch.int32) for _ in range(n - (kind == "score"))] + \
        [torch.zeros((), dtype=torch.int32 if specs[i].ptype == "int" else torch.float32)
         for i in nums]
    keep = list(values)  # the stand-ins stay alive while the graph holds them

    def traced(*args):
        vals = list(keep)
        for i, t in zip(nums, args[n:]):
            vals[i] = t
        fn = _capture.rebuild(key, vals)
        return fn(*args[:n])

    try:
        gm = _make_fx(traced, example)
    except FlexError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's code failed while tracing
        if numbers is None and nums:
            return None  # a number used as a Python value: trace with values
        raise _trace_failure(e, desc) from e
    argnames = _arg_names(fn_for_names, n)
    t = _Walk(gm, kind, specs, dummies, nums, argnames, desc, numbers is not None).run()
    f = getattr(fn_for_names, "__func__", fn_for_names)
    name = getattr(getattr(f, "__code__", None), "co_name", "")
    t.fname = name if name.isidentifier() else None
    t.desc = _describe(fn_for_names)
    return t


def _trace_failure(e, desc):
    tb = e.__traceback__
    where = None
    while tb is not None:
        fn = tb.tb_frame.f_code.co_filename
        if not (fn.startswith(_TORCH_DIR) or fn.startswith(_HERE)):
            where = (fn, tb.tb_lineno)
        tb = tb.tb_next
    head = f"{where[0]}:{where[1]}: " if where else ""
    msg = f"{head}error: {desc} could not be traced: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if where:
        src = _source_line(*where)
        if src:
            msg += "\n    " + src.strip()
    msg += ("\nA traced function runs once on 0-d tensors: no Python control flow on their "
            f"values (use torch.where), no .item(); see {DOCS}")
    return FlexError(ERR_INVALID, msg)


class _Walk:
    """The translation of one graph (see _translate's docstring)."""

    def __init__(self, gm, kind, specs, dummies, nums, argnames, desc, burned):
        self.gm, self.kind, self.specs, self.dummies = gm, kind, specs, dummies
        self.nums, self.desc, self.burned = nums, desc, burned
        self.n = _NARGS[kind]
        taken = set()
        # score, mask, sink, grad and sorted may name parameters (docs/language.md)
        self.argnames = [a if a in ("score", "mask", "sink", "grad", "sorted") and a not in taken
                         and not taken.add(a) else sanitize(a, taken) for a in argnames]
        self.taken = taken
        self.env = {}        # node -> Vec (translated) or ('pro', node)
        self.lets = []       # (name, text)
        self.params = []     # (leaf index, ptype, user name)
        self.param_of = {}   # leaf index -> param number
        self.buffers = []    # buffer dicts
        self.buffer_of = {}  # node -> buffer number
        self.pro_nodes = []  # prologue outputs, in buffer order
        self.nlet = 0
        self.nsum = 0

    # -- values
    def arg(self, x):
        """An op argument as the rules take it: Vec, Python value, list."""
        if isinstance(x, torch.fx.Node):
            v = self.env[x]
            return self.buffer_vec(x) if isinstance(v, tuple) else v
        if isinstance(x, (list, tuple)):
            return type(x)(self.arg(a) for a in x)
        return x

    def buffer_vec(self, node):
        """A Vec reading the prologue value `node` through a buffer."""
        val = node.meta.get("val")
        ident = self._identity(node)
        if ident not in self.buffer_of:
            src = self._source(node)
            dtype = val.dtype
            wide = {torch.float64: torch.float32, torch.int8: torch.int32, torch.int16: torch.int32}
            dtype = wide.get(dtype, dtype)
            if dtype not in _BUF_DTYPES:
                raise error(f"reads a captured tensor of dtype {val.dtype}", node, self.desc)
            grad = dtype.is_floating_point and self._needs_grad(node)
            name = self._user_name(node)
            self.buffer_of[ident] = len(self.buffers)
            self.buffers.append(dict(source=src, dtype=dtype, ndim=max(val.dim(), 1),
                                     shape=tuple(val.shape), grad=grad, name=name))
        j = self.buffer_of[ident]
        ty = X.ty_of(self.buffers[j]["dtype"])
        if val.dim() == 0:
            return X.scalar(ty, f"@B{j}@[0]")
        return X.Vec(ty, tuple(val.shape), lambda idx: f"@B{j}@[{', '.join(idx)}]")

    def _identity(self, node):
        """What a buffer holds: one buffer per captured tensor or prologue value."""
        if node.op == "get_attr":
            t = getattr(self.gm, node.target)
            return ("leaf", self.dummies[id(t)]) if id(t) in self.dummies else ("const", id(t))
        return ("pro", node)

    def _source(self, node):
        if node.op == "get_attr":
            t = getattr(self.gm, node.target)
            if id(t) in self.dummies:
                return ("leaf", self.dummies[id(t)])
            return ("const", t)
        self.pro_nodes.append(node)
        return ("pro", len(self.pro_nodes) - 1)

    def _needs_grad(self, node):
        seen, todo = set(), [node]
        while todo:
            x = todo.pop()
            if x in seen:
                continue
            seen.add(x)
            if x.op == "get_attr":
                t = getattr(self.gm, x.target)
                if id(t) in self.dummies and self.specs[self.dummies[id(t)]].requires_grad:
                    return True
            todo.extend(x.all_input_nodes)
        return False

    def _user_name(self, node):
        seen, todo = set(), [node]
        while todo:
            x = todo.pop(0)
            if x in seen:
                continue
            seen.add(x)
            if x.op == "get_attr":
                t = getattr(self.gm, x.target)
                if id(t) in self.dummies:
                    return self.specs[self.dummies[id(t)]].name
            todo.extend(x.all_input_nodes)
        return "table"

    def param(self, leaf):
        if leaf not in self.param_of:
            self.param_of[leaf] = len(self.params)
            self.params.append((leaf, self.specs[leaf].ptype, self.specs[leaf].name))
        return self.param_of[leaf]

    # -- the walk
    def run(self):
        placeholders = 0
        out = None
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.env[node] = self._placeholder(placeholders)
                placeholders += 1
            elif node.op == "get_attr":
                t = getattr(self.gm, node.target)
                if id(t) not in self.dummies and isinstance(t, torch.Tensor) and t.dim() == 0 \
                        and X.ty_of(t.dtype):
                    self.env[node] = X._v(t.item() if t.dtype != torch.bool else bool(t.item()),
                                          X.ty_of(t.dtype))
                else:
                    self.env[node] = ("pro", node)
            elif node.op == "call_function":
                self.env[node] = self._call(node)
            elif node.op == "output":
                out = node.args[0]
        return self._finish(out)

    def _placeholder(self, i):
        if i < self.n:
            ty = "f" if (self.kind == "score" and i == 0) else "i"
            return X.scalar(ty, self.argnames[i], simple=True)
        leaf = self.nums[i - self.n]
        return X.scalar("i" if self.specs[leaf].ptype == "int" else "f", f"@P{self.param(leaf)}@",
                        simple=True)

    def _group(self, node):
        """'dyn' when any input is translated, 'pro' when any is a prologue value."""
        g = None
        for x in node.all_input_nodes:
            v = self.env[x]
            if not isinstance(v, tuple):
                return "dyn"
            g = "pro"
        return g

    def _call(self, node):
        name = X.opname(node.target)
        val = node.meta.get("val")
        if name == "getitem":
            raise error("uses a multi-output op", node, self.desc)
        group = self._group(node)
        if group == "pro":
            return ("pro", node)
        if group is None:  # no node inputs: a factory (a literal) or a constant tensor op
            if isinstance(val, torch.Tensor) and val.dim() == 0 and name in X._FACTORY:
                try:
                    v = X.factory_value(name, node.args, node.kwargs, val)
                except KeyError:
                    return ("pro", node)
                ty = X.ty_of(val.dtype)
                return X._v(bool(v) if ty == "b" else v, ty)
            return ("pro", node)
        ty = X.ty_of(val.dtype) if isinstance(val, torch.Tensor) else X.sym_ty(val)
        if ty is None:
            raise error(f"makes a value of type {getattr(val, 'dtype', type(val).__name__)}",
                        node, self.desc)
        try:
            v = self._translate(name, node, ty)
        except X.Untranslatable as u:
            raise error(f"uses aten.{u.op}", node, self.desc, instead=u.instead or
                        X._INSTEAD.get(u.op), why=u.why) from None
        except ValueError as e:
            raise error(f"uses aten.{name}", node, self.desc, why=f"({e})") from None
        if not v.shape and len(node.users) > 1 and not v.simple:
            self.nlet += 1
            letname = f"t{self.nlet}"
            self.lets.append((letname, v.expr()))
            v = X.scalar(v.ty, letname, simple=True)
        return v

    def _translate(self, name, node, ty):
        args = [self.arg(a) for a in node.args]
        kwargs = {k: self.arg(a) for k, a in node.kwargs.items()}
        for k in ("dtype", "layout", "device", "pin_memory", "memory_format", "non_blocking",
                  "copy"):
            kwargs.pop(k, None)
        if name == "_local_scalar_dense":  # x.item() passed on as a Python number
            return X._v(args[0])
        name = X.SYM_OPS.get(name, name)
        if name == "index":
            return self._index(args[0], args[1], node)
        if name in ("dot", "vdot", "inner"):
            return self._dot(X._v(args[0]), X._v(args[1]), node, ty)
        if name in ("any", "all", "mean", "amax", "amin"):
            return self._reduce(name, X._v(args[0]), args[1] if len(args) > 1 else None,
                                node, ty)
        if name == "select":
            base, dim, i = args
            idx = [None] * dim + [i]
            return self._index(base, idx, node)
        if name in ("expand", "broadcast_to"):
            shape = tuple(int(s) for s in args[1])
            v = X._v(args[0])
            return X.Vec(v.ty, shape, lambda idx: X._at_broadcast(v, shape, idx)) if shape else v
        if name in ("view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "view_as",
                    "reshape_as"):
            return self._reshape(X._v(args[0]), tuple(node.meta["val"].shape), node)
        if name == "sum":
            return self._sum(X._v(args[0]), args[1] if len(args) > 1 else None, node, ty)
        if name in ("new_zeros", "new_ones", "new_full", "new_empty", "zeros_like", "ones_like",
                    "full_like", "empty_like", "scalar_tensor", "full"):
            v = X.factory_value(name, node.args, node.kwargs, node.meta["val"])
            return X._v(bool(v) if ty == "b" else v, ty)
        rule = X.RULES.get(name)
        if rule is None:
            raise X.Untranslatable(name)
        v = rule(ty, *args, **kwargs)
        if v.ty != ty and not v.shape:  # the rules compute in PyTorch's promoted type
            v = X.scalar(ty, X.conv(v.expr(), v.ty, ty))
        return v

    def _index(self, base, idx, node):
        base = X._v(base) if not isinstance(base, X.Vec) else base
        idx = list(idx)
        if len(idx) > len(base.shape):
            raise error("indexes a tensor with more indices than it has dimensions", node, self.desc)
        parts = []
        for d, i in enumerate(idx):
            if i is None:
                parts.append(None)
                continue
            v = X._v(i)
            if v.shape:
                raise error("indexes with a tensor of indices (not one index per dimension)",
                            node, self.desc)
            if v.ty == "b":
                raise error("indexes with a bool mask", node, self.desc)
            text = v.expr()
            if v.ty == "f":
                raise error("indexes with a float", node, self.desc)
            if v.value is not None and v.value < 0:  # a negative literal counts from the end
                text = str(base.shape[d] + int(v.value))
            parts.append(text)
        keep = [d for d in range(len(base.shape)) if d >= len(parts) or parts[d] is None]
        shape = tuple(base.shape[d] for d in keep)

        def at(sub):
            it = iter(sub)
            full = [next(it) if (d >= len(parts) or parts[d] is None) else parts[d]
                    for d in range(len(base.shape))]
            return base.at(tuple(full))
        return X.Vec(base.ty, shape, at)

    def _reshape(self, v, shape, node):
        if tuple(d for d in v.shape if d != 1) != tuple(d for d in shape if d != 1):
            raise error("reshapes a tensor it indexes", node, self.desc)
        src = [d for d, n in enumerate(v.shape) if n != 1]
        dst = [d for d, n in enumerate(shape) if n != 1]

        def at(idx):
            full = ["0"] * len(v.shape)
            for s, t in zip(src, dst):
                full[s] = idx[t]
            return v.at(tuple(full))
        return X.Vec(v.ty, shape, at)

    def _sum(self, v, dims, node, ty):
        nd = len(v.shape)
        dims = list(range(nd)) if dims is None or dims == [] else [d % nd for d in dims]
        keepdim = bool(node.kwargs.get("keepdim") or (len(node.args) > 2 and node.args[2]))
        for d in dims:
            if v.shape[d] > 4096:
                raise error(f"sums {v.shape[d]} values (.score's sum takes at most 4096)",
                            node, self.desc)
        t = ty if ty in "if" else "i"
        out_shape = tuple(1 if d in dims else n for d, n in enumerate(v.shape)) if keepdim else \
            tuple(n for d, n in enumerate(v.shape) if d not in dims)

        def at(idx):
            it = iter(idx)
            names = {}
            full = []
            for d in range(nd):
                if d in dims:
                    if keepdim:
                        next(it)
                    self.nsum += 1
                    names[d] = f"e{self.nsum}"
                    full.append(names[d])
                else:
                    full.append(next(it))
            text = X.conv(v.at(tuple(full)), v.ty, t)
            for d in reversed(dims):
                text = f"sum({names[d]}, 0, {v.shape[d]}, {text})"
            return text
        return X.Vec(t, out_shape, at)

    def _dot(self, a, b, node, ty):
        if len(a.shape) != 1 or a.shape != b.shape:
            raise error("takes a dot product of tensors that are not two vectors of one length",
                        node, self.desc)
        prod = X.elementwise(ty, [a, b], lambda x, y: f"({X.conv(x, a.ty, ty)} * "
                             f"{X.conv(y, b.ty, ty)})")
        return self._sum(prod, None, node, ty)

    def _reduce(self, name, v, dims, node, ty):
        """any, all, mean (through sum), amax and amin (unrolled, up to 64 values)."""
        nd = len(v.shape)
        if isinstance(dims, int):
            dims = [dims]
        dims = list(range(nd)) if not dims else [d % nd for d in dims]
        count = 1
        for d in dims:
            count *= v.shape[d]
        if name in ("any", "all"):
            ones = X.elementwise("i", [v], lambda x: f"int({X.conv(x, v.ty, 'b')})")
            total = self._sum(ones, dims, node, "i")
            test = "!= 0" if name == "any" else f"== {count}"
            return X.elementwise("b", [total], lambda x: f"({x} {test})")
        if name == "mean":
            total = self._sum(v, dims, node, "f")
            return X.elementwise("f", [total], lambda x: f"({x} / {X.literal(count, 'f')})")
        if count > 64 or len(dims) != 1:
            raise error(f"takes {name} over {count} values (.score unrolls at most 64, "
                        "over one dimension)", node, self.desc)
        d, fname = dims[0], "max" if name == "amax" else "min"
        keep = [i for i in range(nd) if i != d]
        shape = tuple(v.shape[i] for i in keep)

        def at(idx):
            it = iter(idx)
            base = [next(it) if i != d else None for i in range(nd)]
            terms = [v.at(tuple(str(j) if x is None else x for x in base))
                     for j in range(v.shape[d])]
            text = terms[0]
            for t in terms[1:]:
                text = f"{fname}({text}, {t})"
            return text
        return X.Vec(v.ty, shape, at)

    def _finish(self, out):
        want = "b" if self.kind == "mask" else "f"
        if isinstance(out, (list, tuple)):
            if len(out) != 1:
                raise error(f"returns {len(out)} values", None, self.desc)
            out = out[0]
        if isinstance(out, torch.fx.Node):
            v = self.env[out]
            if isinstance(v, tuple):
                v = self.buffer_vec(out)
        else:
            v = X._v(out)
        if v.shape:
            raise error(f"returns a tensor of shape {list(v.shape)}, not one value", out
                        if isinstance(out, torch.fx.Node) else None, self.desc)
        ret = X.conv(v.expr(), v.ty, want)
        prologue = self._prologue() if self.pro_nodes else None
        return Traced(self.kind, None, self.argnames, self.lets, ret, self.params, self.buffers,
                      prologue, self.burned)

    def _prologue(self):
        """A GraphModule from the leaves (tensors, and numbers as 0-d
        tensors) to the prologue values the buffers read."""
        g = torch.fx.Graph()
        root = torch.nn.Module()
        env = {}
        leaf_in = [g.placeholder(f"leaf{i}") for i in range(len(self.specs))]
        i = 0
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                if i >= self.n:
                    env[node] = leaf_in[self.nums[i - self.n]]
                i += 1
        consts = 0

        def copy(node):
            if node in env:
                return env[node]
            if node.op == "placeholder":
                raise AssertionError("a prologue value depends on an index")
            if node.op == "get_attr":
                t = getattr(self.gm, node.target)
                if id(t) in self.dummies:
                    env[node] = leaf_in[self.dummies[id(t)]]
                else:
                    nonlocal consts
                    consts += 1
                    setattr(root, f"c{consts}", t)
                    env[node] = g.get_attr(f"c{consts}")
                return env[node]
            for x in node.all_input_nodes:
                copy(x)
            env[node] = g.node_copy(node, lambda x: env[x])
            return env[node]
        outs = [copy(n) for n in self.pro_nodes]
        g.output(tuple(outs))
        return torch.fx.GraphModule(root, g)
