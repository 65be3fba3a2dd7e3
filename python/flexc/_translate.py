"""An aten graph of a score_mod or mask_mod, translated into a .score body.

The graph comes from make_fx (see _trace): its placeholders are the
function's arguments (score, b, h, q_idx, kv_idx as 0-d tensors) and then
one 0-d tensor per captured Python number; captured tensors are get_attr
constants. Each node falls in one of three groups:

- `dyn`: it depends on the arguments: translated into .score, a scalar
  expression or, for a node that still has dimensions (`bias[h]` of a 2-D
  bias), a function from the remaining indices to an expression (`Vec`);
- `par`: a 0-d value made only of captured numbers and literals:
  translated too (the numbers are `param`s);
- `pro`: everything else, values computed from captured tensors alone
  (`bias.exp()`, `slopes * 2`). They do not depend on the position, so
  they run once per call in PyTorch (the prologue) and what the `dyn`
  nodes read of them becomes a buffer.

Every op follows PyTorch's semantics, type promotion included: `q / kv` on
ints is true division (`float(q) / float(kv)`), `q // 3` is `floordiv`,
`%` on ints is `floormod`, `torch.round` rounds half to even. An op with no
translation is a FlexError that names it, the user's line, and the
spelling to use where there is one.
"""
import math
import operator

import torch


_FLT_MAX = 3.4028234663852886e38

# aten ops that .score cannot express, with what to write instead.
_INSTEAD = {
    "log1p": "torch.log(1 + x)", "expm1": "torch.exp(x) - 1",
    "softplus": "torch.log(1 + torch.exp(x))", "square": "x * x", "reciprocal": "1.0 / x",
    "frac": "x - torch.floor(x)", "hardtanh": "torch.clamp(x, lo, hi)",
    "logsumexp": "torch.maximum(...) and torch.log(torch.exp(..) + ..)",
    "item": "the tensor itself (no .item(): the value is not known while tracing)",
    "_local_scalar_dense": "the tensor itself (no .item() or Python control flow on a "
                           "traced value: use torch.where)",
    "arange": "the index arguments b, h, q_idx, kv_idx (or a captured tensor)",
}


class Vec:
    """A value the translation reads: `ty` 'b' (bool), 'i' (int) or 'f'
    (float); `shape` () for a scalar; `at(idx)` the .score expression of
    the element at index expressions idx (len(idx) == len(shape))."""

    __slots__ = ("ty", "shape", "at", "simple", "value")

    def __init__(self, ty, shape, at, simple=False, value=None):
        self.ty, self.shape, self.at, self.simple = ty, tuple(shape), at, simple
        self.value = value  # the Python number of a literal, else None

    def expr(self):
        assert not self.shape
        return self.at(())


def scalar(ty, text, simple=False, value=None):
    return Vec(ty, (), lambda idx: text, simple, value)


def ty_of(dtype):
    if dtype == torch.bool:
        return "b"
    if dtype.is_floating_point:
        return "f"
    if dtype.is_complex:
        return None
    return "i"


def literal(v, ty):
    """A .score literal of Python value v as type ty."""
    if ty == "b":
        return "true" if v else "false"
    if ty == "i":
        if isinstance(v, float):
            v = int(v)
        v = int(v)
        if not -(1 << 31) <= v < (1 << 31):
            raise ValueError(f"integer {v} does not fit in .score's 32-bit int")
        return str(v) if v >= 0 else f"({v})"
    v = float(v)
    if math.isnan(v):
        return "(inf - inf)"
    if abs(v) > _FLT_MAX:
        return "inf" if v > 0 else "(-inf)"
    r = repr(v)
    if "e" not in r and "." not in r:
        r += ".0"
    return r if v >= 0 else f"({r})"


def conv(text, src, dst):
    """Expression `text` of type src converted to dst (PyTorch's rules)."""
    if src == dst:
        return text
    if dst == "f":
        return f"float({text})"
    if dst == "i":
        return f"int({text})"  # from float: truncation; from bool: 0 or 1
    return f"({text} != {'0.0' if src == 'f' else '0'})"  # to bool: nonzero


def promote(*tys):
    return "f" if "f" in tys else "i" if "i" in tys else "b"


def broadcast(*shapes):
    nd = max(len(s) for s in shapes)
    out = []
    for d in range(nd):
        sizes = [s[len(s) - nd + d] for s in shapes if len(s) - nd + d >= 0]
        big = max(sizes)
        if any(x not in (1, big) for x in sizes):
            raise ValueError(f"shapes {shapes} do not broadcast")
        out.append(big)
    return tuple(out)


def _at_broadcast(v, shape, idx):
    """v's element at idx of the broadcast shape."""
    off = len(shape) - len(v.shape)
    sub = tuple("0" if n == 1 and shape[off + i] != 1 else idx[off + i]
                for i, n in enumerate(v.shape))
    return v.at(sub)


def elementwise(ty, args, fn):
    """A Vec whose elements are fn(element texts of args) after broadcasting."""
    shape = broadcast(*(a.shape for a in args))
    if not shape:
        texts = [a.expr() for a in args]
        return scalar(ty, fn(*texts))
    return Vec(ty, shape, lambda idx: fn(*(_at_broadcast(a, shape, idx) for a in args)))


class Untranslatable(Exception):
    """An op the translation has no rule for (op name, what to write instead)."""

    def __init__(self, op, instead=None, why=None):
        super().__init__(op)
        self.op, self.instead, self.why = op, instead, why


# ---- the op rules ---------------------------------------------------------
# Each takes (out_ty, args as Vecs or Python values, kwargs) and returns a Vec.

def _v(x, ty=None):
    """A Vec for a Python number or bool (an op's scalar argument)."""
    if isinstance(x, Vec):
        return x
    if isinstance(x, bool):
        t = "b"
    elif isinstance(x, int):
        t = "i"
    elif isinstance(x, float):
        t = "f"
    else:
        raise Untranslatable("argument", why=f"an argument of type {type(x).__name__}")
    return scalar(ty or t, literal(x, ty or t), simple=True, value=x)


def _binary(opname, sym):
    def rule(out, a, b, alpha=None):
        a, b = _v(a), _v(b)
        if alpha is not None and alpha != 1:
            b = elementwise(promote(b.ty, _v(alpha).ty), [b, _v(alpha)],
                            lambda x, y: f"({x} * {y})")
        t = out if out != "b" else "i"
        if out == "b":  # add/mul on bools: or/and
            op = {"+": "||", "*": "&&"}.get(sym)
            if op is None:
                raise Untranslatable(opname, why="on bool tensors")
            return elementwise("b", [a, b], lambda x, y: f"({x} {op} {y})")
        return elementwise(out, [a, b], lambda x, y: f"({conv(x, a.ty, t)} {sym} {conv(y, b.ty, t)})")
    return rule


def _rsub(out, a, b, alpha=None):  # b - alpha * a
    scaled = a if alpha in (None, 1) else _binary("mul", "*")(out, _v(a), _v(alpha))
    return _binary("sub", "-")(out, b, scaled)


def _div(out, a, b, rounding_mode=None):
    a, b = _v(a), _v(b)
    if rounding_mode is None:
        return elementwise("f", [a, b], lambda x, y: f"({conv(x, a.ty, 'f')} / {conv(y, b.ty, 'f')})")
    if rounding_mode == "floor":
        return _floordiv(out, a, b)
    if out == "i":  # trunc on ints: C's /
        return elementwise("i", [a, b], lambda x, y: f"({conv(x, a.ty, 'i')} / {conv(y, b.ty, 'i')})")
    return elementwise("f", [a, b], lambda x, y: _trunc_f(
        f"({conv(x, a.ty, 'f')} / {conv(y, b.ty, 'f')})"))


def _trunc_f(x):
    return f"where({x} < 0.0, ceil({x}), floor({x}))"


def _floordiv(out, a, b):
    a, b = _v(a), _v(b)
    if out == "i":
        return elementwise("i", [a, b], lambda x, y: f"floordiv({conv(x, a.ty, 'i')}, "
                           f"{conv(y, b.ty, 'i')})")
    return elementwise("f", [a, b], lambda x, y: f"floor({conv(x, a.ty, 'f')} / {conv(y, b.ty, 'f')})")


def _remainder(out, a, b):
    a, b = _v(a), _v(b)
    if out == "i":
        return elementwise("i", [a, b], lambda x, y: f"floormod({conv(x, a.ty, 'i')}, "
                           f"{conv(y, b.ty, 'i')})")
    return elementwise("f", [a, b], lambda x, y: (
        lambda fx, fy: f"({fx} - floor({fx} / {fy}) * {fy})")(conv(x, a.ty, "f"), conv(y, b.ty, "f")))


def _fmod(out, a, b):
    a, b = _v(a), _v(b)
    t = "i" if out == "i" else "f"
    return elementwise(t, [a, b], lambda x, y: f"({conv(x, a.ty, t)} % {conv(y, b.ty, t)})")


def _compare(sym):
    def rule(out, a, b):
        a, b = _v(a), _v(b)
        t = promote(a.ty, b.ty)
        return elementwise("b", [a, b], lambda x, y: f"({conv(x, a.ty, t)} {sym} {conv(y, b.ty, t)})")
    return rule


def _logical(sym):
    def rule(out, a, b):
        a, b = _v(a), _v(b)
        return elementwise("b", [a, b], lambda x, y: f"({conv(x, a.ty, 'b')} {sym} {conv(y, b.ty, 'b')})")
    return rule


def _bitwise(sym, logical):
    def rule(out, a, b):
        a, b = _v(a), _v(b)
        if out == "b":
            return elementwise("b", [a, b], lambda x, y: f"({x} {logical} {y})")
        if out != "i":
            raise Untranslatable("bitwise op", why="on float tensors")
        return elementwise("i", [a, b], lambda x, y: f"({conv(x, a.ty, 'i')} {sym} {conv(y, b.ty, 'i')})")
    return rule


def _unary_float(fname):
    def rule(out, a):
        a = _v(a)
        return elementwise("f", [a], lambda x: f"{fname}({conv(x, a.ty, 'f')})")
    return rule


def _same_int_identity(fname):
    """floor/ceil/round/trunc: identity on ints, a builtin on floats."""
    def rule(out, a, decimals=None):
        a = _v(a)
        if decimals:
            raise Untranslatable("round", instead="torch.round(x * 10**d) / 10**d",
                                 why="with decimals")
        if a.ty != "f":
            return a
        f = {"floor": lambda x: f"floor({x})", "ceil": lambda x: f"ceil({x})",
             "trunc": _trunc_f, "round": _round_even}[fname]
        return elementwise("f", [a], f)
    return rule


def _round_even(x):
    # Half to even, as torch.round: floor(x + 0.5), less one where x + 0.5
    # was an odd integer reached exactly from a tie.
    return (f"(floor({x} + 0.5) - where(floor({x} + 0.5) - {x} == 0.5 && "
            f"floormod(int(floor({x} + 0.5)), 2) == 1, 1.0, 0.0))")


def _neg(out, a):
    a = _v(a)
    if a.ty == "b":
        raise Untranslatable("neg", instead="~x or torch.logical_not(x)", why="on a bool tensor")
    return elementwise(a.ty, [a], lambda x: f"(-{x})")


def _abs(out, a):
    a = _v(a)
    return elementwise(a.ty, [a], lambda x: f"abs({x})")


def _sign(out, a):
    a = _v(a)
    if a.ty == "b":
        return a
    if a.ty == "i":
        return elementwise("i", [a], lambda x: f"(int({x} > 0) - int({x} < 0))")
    return elementwise("f", [a], lambda x: f"where({x} != {x}, {x}, float({x} > 0.0) - float({x} < 0.0))")


def _pow(out, a, b):
    a, b = _v(a), _v(b)
    if b.value is not None and not isinstance(b.value, bool):
        e = float(b.value)
        if e == int(e) and 0 <= e <= 4 and (out == "i" or e != 0):
            if e == 0:
                return scalar(out, literal(1, out))
            return elementwise(out, [a], lambda x: "(" + " * ".join([conv(x, a.ty, out)] * int(e)) + ")")
        if e == 0.5 and out == "f":
            return elementwise("f", [a], lambda x: f"sqrt({conv(x, a.ty, 'f')})")
    if out != "f":
        raise Untranslatable("pow", instead="a float base (x.float() ** n) or a repeated product",
                             why="on ints with an exponent that is not a small constant")
    return elementwise("f", [a, b], lambda x, y: f"pow({conv(x, a.ty, 'f')}, {conv(y, b.ty, 'f')})")


def _clamp(out, a, lo=None, hi=None):
    a = _v(a)
    t = out if out in "if" else "i"
    bounds = [(_v(x), f) for x, f in ((lo, "max"), (hi, "min")) if x is not None]

    def f(x, *bs):
        x = conv(x, a.ty, t)
        for y, (v, fname) in zip(bs, bounds):
            x = f"{fname}({x}, {conv(y, v.ty, t)})"
        return x
    return elementwise(t, [a] + [v for v, _ in bounds], f)


def _minmax(fname):
    def rule(out, a, b):
        a, b = _v(a), _v(b)
        t = out if out in "if" else "i"
        if out == "b":
            sym = "&&" if fname == "min" else "||"
            return elementwise("b", [a, b], lambda x, y: f"({x} {sym} {y})")
        if t == "f":  # PyTorch propagates NaN
            return elementwise("f", [a, b], lambda x, y: (lambda fx, fy: (
                f"where({fx} != {fx} || {fy} != {fy}, {fx} + {fy}, {fname}({fx}, {fy}))"))(
                conv(x, a.ty, "f"), conv(y, b.ty, "f")))
        return elementwise(t, [a, b], lambda x, y: f"{fname}({conv(x, a.ty, t)}, {conv(y, b.ty, t)})")
    return rule


def _where(out, c, a, b):
    c, a, b = _v(c), _v(a), _v(b)
    t = out
    return elementwise(t, [c, a, b], lambda x, y, z: f"where({conv(x, c.ty, 'b')}, "
                       f"{conv(y, a.ty, t)}, {conv(z, b.ty, t)})")


def _masked_fill(out, a, c, v):
    return _where(out, c, v, a)


def _logical_not(out, a):
    a = _v(a)
    return elementwise("b", [a], lambda x: f"(!{conv(x, a.ty, 'b')})")


def _bitwise_not(out, a):
    a = _v(a)
    if a.ty == "b":
        return elementwise("b", [a], lambda x: f"(!{x})")
    if a.ty != "i":
        raise Untranslatable("bitwise_not", why="on a float tensor")
    return elementwise("i", [a], lambda x: f"(~{x})")


def _convert(out, a, *rest, **kw):
    a = _v(a)
    return elementwise(out, [a], lambda x: conv(x, a.ty, out))


def _identity(out, a, *rest, **kw):
    return _convert(out, a)


def _relu(out, a):
    a = _v(a)
    return elementwise(a.ty, [a], lambda x: f"max({x}, {literal(0, a.ty)})")


def _sigmoid(out, a):
    return _unary_float("sigmoid")(out, a)


def _gelu(out, a, approximate="none"):
    a = _v(a)
    if approximate == "tanh":
        return elementwise("f", [a], lambda x: (
            f"(0.5 * {x} * (1.0 + tanh(0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x}))))"))
    return elementwise("f", [a], lambda x: f"(0.5 * {x} * (1.0 + erf({x} * 0.7071067811865476)))")


def _silu(out, a):
    a = _v(a)
    return elementwise("f", [a], lambda x: f"({x} * sigmoid({x}))")


def _isnan(out, a):
    a = _v(a)
    return elementwise("b", [a], lambda x: f"({x} != {x})" if a.ty == "f" else "false")


def _isinf(out, a):
    a = _v(a)
    return elementwise("b", [a], lambda x: f"(abs({x}) == inf)" if a.ty == "f" else "false")


def _isfinite(out, a):
    a = _v(a)
    return elementwise("b", [a], lambda x: f"(abs({x}) < inf)" if a.ty == "f" else "true")


def _square(out, a):
    return _pow(out, a, 2)


def _reciprocal(out, a):
    a = _v(a)
    return elementwise("f", [a], lambda x: f"(1.0 / {conv(x, a.ty, 'f')})")


def sym_ty(v):
    """The type of a SymInt, SymFloat or SymBool (a 0-d value made a Python
    number while tracing), or None."""
    return {"SymInt": "i", "SymFloat": "f", "SymBool": "b"}.get(type(v).__name__)


# Python operators on such numbers, as the aten op they stand for.
SYM_OPS = {"add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "floordiv": "floor_divide",
           "mod": "remainder", "neg": "neg", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge",
           "eq": "eq", "ne": "ne", "and_": "bitwise_and", "or_": "bitwise_or", "pow": "pow",
           "sym_max": "maximum", "sym_min": "minimum", "sym_not": "logical_not"}


def _tan(out, a):
    a = _v(a)
    return elementwise("f", [a], lambda x: (lambda f: f"(sin({f}) / cos({f}))")(conv(x, a.ty, "f")))


RULES = {
    "add": _binary("add", "+"), "sub": _binary("sub", "-"), "mul": _binary("mul", "*"),
    "rsub": _rsub, "div": _div, "true_divide": _div, "floor_divide": _floordiv,
    "remainder": _remainder, "fmod": _fmod, "neg": _neg, "abs": _abs, "sign": _sign,
    "pow": _pow, "exp": _unary_float("exp"), "exp2": _unary_float("exp2"),
    "log": _unary_float("log"), "log2": _unary_float("log2"), "sqrt": _unary_float("sqrt"),
    "rsqrt": _unary_float("rsqrt"), "tanh": _unary_float("tanh"), "sigmoid": _sigmoid,
    "sin": _unary_float("sin"), "cos": _unary_float("cos"), "erf": _unary_float("erf"),
    "tan": _tan,
    "floor": _same_int_identity("floor"), "ceil": _same_int_identity("ceil"),
    "round": _same_int_identity("round"), "trunc": _same_int_identity("trunc"),
    "fix": _same_int_identity("trunc"),
    "clamp": _clamp, "clip": _clamp, "clamp_min": lambda o, a, lo: _clamp(o, a, lo, None),
    "clamp_max": lambda o, a, hi: _clamp(o, a, None, hi),
    "minimum": _minmax("min"), "maximum": _minmax("max"),
    "where": _where, "masked_fill": _masked_fill,
    "eq": _compare("=="), "ne": _compare("!="), "lt": _compare("<"), "le": _compare("<="),
    "gt": _compare(">"), "ge": _compare(">="),
    "logical_and": _logical("&&"), "logical_or": _logical("||"), "logical_xor": _logical("!="),
    "logical_not": _logical_not,
    "bitwise_and": _bitwise("&", "&&"), "bitwise_or": _bitwise("|", "||"),
    "bitwise_xor": _bitwise("^", "!="), "bitwise_not": _bitwise_not,
    "__and__": _bitwise("&", "&&"), "__or__": _bitwise("|", "||"), "__xor__": _bitwise("^", "!="),
    "bitwise_left_shift": _bitwise("<<", None), "bitwise_right_shift": _bitwise(">>", None),
    "__lshift__": _bitwise("<<", None), "__rshift__": _bitwise(">>", None),
    "_to_copy": _convert, "to": _convert, "convert_element_type": _convert, "type_as": _convert,
    "clone": _identity, "alias": _identity, "detach": _identity, "lift_fresh_copy": _identity,
    "contiguous": _identity, "positive": _identity, "_conj": _identity,
    "relu": _relu, "gelu": _gelu, "silu": _silu, "isnan": _isnan, "isinf": _isinf,
    "isfinite": _isfinite, "square": _square, "reciprocal": _reciprocal,
}

# Ops that make a value from their arguments alone (no tensor input).
_FACTORY = {"scalar_tensor", "full", "zeros", "ones", "empty", "new_zeros", "new_ones",
            "new_full", "new_empty", "zeros_like", "ones_like", "full_like", "empty_like",
            "lift_fresh_copy", "tensor"}


def opname(target):
    """'add' for aten.add.Tensor (and operator.add)."""
    if hasattr(target, "_opname"):
        return target._opname
    if target in (operator.getitem,):
        return "getitem"
    return getattr(target, "__name__", str(target))


def factory_value(name, args, kwargs, meta):
    """The value of a factory op (scalar_tensor(-inf), full((), 2.0), ...)."""
    if name == "scalar_tensor":
        return args[0]
    if name in ("full", "new_full"):
        return args[-1] if name == "full" else args[2]
    if name in ("full_like",):
        return args[1]
    if name in ("zeros", "new_zeros", "zeros_like", "empty", "new_empty", "empty_like"):
        return 0
    if name in ("ones", "new_ones", "ones_like"):
        return 1
    raise KeyError(name)
