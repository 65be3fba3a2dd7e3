"""What a Python score_mod or mask_mod reads besides its arguments.

A function is described by a key and a list of leaves. The key holds its
code, the code of every function it reaches (closures, globals, defaults,
functools.partial) and the kind, dtype and shape of each value it
captured; the leaves are those values in the order the key lists them:
tensors (buffers) and Python numbers (params). Two closures made by the
same `def` over different tensors or numbers have the same key, so the
trace and the compiled kernel are reused; their leaves are what each call
passes. The key holds only plain data (code objects, strings, dtypes,
tuples), which is also what torch.compile lets a traced function hand to
a constant-valued call: `capture` is written so that Dynamo can trace it.

`rebuild(key, values)` makes the function again from its key with other
leaf values: the tracer passes stand-ins (meta tensors for tensors, 0-d
tensors for numbers) and sees where each one is used.

Objects the function reaches other than functions and containers
(a module's `self`, a config object) are described by their attributes:
tensors and numbers become leaves, other plain values are part of the key,
and the rebuilt function sees a namespace with the same attributes.
"""
import functools
import sys
import types

import torch

_INT32 = (-(1 << 31), (1 << 31) - 1)
_MAX_DEPTH = 12

# Values kept in the key as they are: they select a different trace.
_PLAIN = (bool, str, bytes, type(None), torch.dtype, torch.device, type(Ellipsis))


class Leaf:
    """One captured value as the key describes it."""

    __slots__ = ("kind", "name", "dtype", "shape", "requires_grad", "ptype")

    def __init__(self, kind, name, dtype=None, shape=None, requires_grad=False, ptype=None):
        self.kind = kind                    # 'tensor' or 'number'
        self.name = name                    # the user's name for it ('bias', 'self.scale')
        self.dtype = dtype                  # tensors: torch.dtype
        self.shape = shape                  # tensors: tuple of ints
        self.requires_grad = requires_grad  # tensors
        self.ptype = ptype                  # numbers: 'int' or 'float'


def _compiling():
    try:
        return torch.compiler.is_compiling()
    except AttributeError:  # an older PyTorch
        return False


def _home(fn):
    """Where fn's globals live: its module's name when that module's
    namespace is fn.__globals__ (always assumed under torch.compile, which
    cannot trace fn.__globals__), else the globals themselves."""
    if _compiling():
        return fn.__module__
    mod = sys.modules.get(fn.__module__) if isinstance(fn.__module__, str) else None
    if mod is not None and getattr(mod, "__dict__", None) is fn.__globals__:
        return fn.__module__
    return _Globals(fn.__globals__)


def _global(home, name):
    """Global `name` of a function whose globals are `home`, or _MISSING."""
    if isinstance(home, _Globals):
        return home.d.get(name, _MISSING)
    return getattr(sys.modules[home], name, _MISSING)


_MISSING = object()


class _Globals:
    """An unhashable value kept by identity in a key: the globals of a
    function that no module holds (exec'd code), a NumPy array."""

    __slots__ = ("d",)

    def __init__(self, d):
        self.d = d

    def __eq__(self, other):
        return isinstance(other, _Globals) and other.d is self.d

    def __hash__(self):
        return id(self.d)


def _global_names(code):
    """The global names code (and the code nested in it) may read."""
    names = list(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names.extend(n for n in _global_names(c) if n not in names)
    return names


def capture(fn):
    """(key, leaves): the key of fn (a tuple of plain data) and the values
    it captured, as a list parallel to the key's Leaf entries."""
    key, leaves = [], []
    _walk(fn, "", key, leaves, 0, [])
    return tuple(key), leaves


def _walk(v, name, key, leaves, depth, seen):
    if depth > _MAX_DEPTH:
        raise TypeError(f"flexc: {name or 'the function'} nests functions and containers "
                        f"more than {_MAX_DEPTH} levels deep")
    if isinstance(v, torch.Tensor):
        if v.is_nested or v.layout != torch.strided:
            raise TypeError(f"flexc: captured tensor {name} is not a strided tensor")
        key.append(("tensor", name, v.dtype, tuple(v.shape), bool(v.requires_grad)))
        leaves.append(v)
    elif isinstance(v, _PLAIN):
        key.append(("const", v))
    elif isinstance(v, int) and _INT32[0] <= v <= _INT32[1]:
        key.append(("number", name, "int"))
        leaves.append(v)
    elif isinstance(v, float):
        key.append(("number", name, "float"))
        leaves.append(v)
    elif isinstance(v, int):  # too wide for an int param: traced as the value it is
        key.append(("const", v))
    elif isinstance(v, types.FunctionType) and not _library(v):
        _walk_function(v, name, key, leaves, depth, seen)
    elif isinstance(v, types.FunctionType):
        key.append(("object", v))  # torch.nn.functional.gelu ...: PyTorch's own, traced as it is
    elif isinstance(v, functools.partial):
        key.append(("partial", len(v.args), tuple(v.keywords)))
        _walk(v.func, name, key, leaves, depth + 1, seen)
        for i, a in enumerate(v.args):
            _walk(a, f"{name}.args[{i}]", key, leaves, depth + 1, seen)
        for k, a in v.keywords.items():
            _walk(a, f"{name}.{k}", key, leaves, depth + 1, seen)
    elif isinstance(v, types.MethodType):
        key.append(("method",))
        _walk(v.__func__, name, key, leaves, depth + 1, seen)
        _walk(v.__self__, "self", key, leaves, depth + 1, seen)
    elif isinstance(v, (tuple, list)):
        key.append(("seq", type(v).__name__, len(v)))
        for i, a in enumerate(v):
            _walk(a, f"{name}[{i}]", key, leaves, depth + 1, seen)
    elif isinstance(v, dict):
        ks = tuple(v)
        if not all(isinstance(k, (str, int)) for k in ks):
            key.append(("object", _hashable(v)))
            return
        key.append(("dict", ks))
        for k in ks:
            _walk(v[k], f"{name}[{k!r}]", key, leaves, depth + 1, seen)
    elif isinstance(v, (types.ModuleType, type, types.BuiltinFunctionType)) or \
            callable(v) and type(v).__module__.startswith("torch") and \
            not isinstance(v, torch.nn.Module):
        key.append(("object", v))  # torch, math, torch.where ...: the same object each time
    elif isinstance(v, torch.nn.Module) or hasattr(v, "__dict__"):
        _walk_object(v, name, key, leaves, depth, seen)
    else:
        key.append(("object", _hashable(v)))


def _hashable(v):
    """v, or a wrapper that compares it by identity when v is unhashable."""
    try:
        hash(v)
        return v
    except TypeError:
        return _Globals(v)


def _library(fn):
    """Whether fn is PyTorch's (or flexc's) own code, not the user's."""
    mod = fn.__module__ or ""
    return mod == "torch" or mod.startswith(("torch.", "flexc."))


def _walk_function(fn, name, key, leaves, depth, seen):
    code = fn.__code__
    if code in seen:  # a function that reaches itself (recursion through a global)
        key.append(("object", fn))
        return
    seen.append(code)
    closure = fn.__closure__ or ()
    defaults = fn.__defaults__ or ()
    home = _home(fn)
    globs = []
    for g in _global_names(code):
        value = _global(home, g)
        if isinstance(value, torch.Tensor) or type(value) in (int, float) or \
                isinstance(value, (types.FunctionType, functools.partial)):
            globs.append((g, value))
    key.append(("function", code, home, len(defaults), len(closure), tuple(g for g, _ in globs)))
    argnames = code.co_varnames[:code.co_argcount]
    for i, d in enumerate(defaults):
        _walk(d, argnames[len(argnames) - len(defaults) + i], key, leaves, depth + 1, seen)
    for var, cell in zip(code.co_freevars, closure):
        try:
            value = cell.cell_contents
        except ValueError:
            raise TypeError(f"flexc: {fn.__qualname__} reads {var} before it is assigned") from None
        _walk(value, var, key, leaves, depth + 1, seen)
    for g, value in globs:
        _walk(value, g, key, leaves, depth + 1, seen)
    seen.pop()


def _walk_object(obj, name, key, leaves, depth, seen):
    """An object as the namespace of its attributes (an nn.Module's
    parameters, buffers and submodules, then its plain attributes)."""
    attrs = {}
    if isinstance(obj, torch.nn.Module):
        attrs.update(obj._parameters)
        attrs.update(obj._buffers)
        attrs.update(obj._modules)
    for k, a in vars(obj).items():
        if k.startswith("_") or k in attrs:
            continue
        if isinstance(a, (torch.Tensor, int, float, bool, str, type(None), tuple, list, dict,
                          torch.nn.Module, types.FunctionType, functools.partial)):
            attrs[k] = a
    names = tuple(k for k, a in attrs.items() if a is not None)
    key.append(("namespace", type(obj).__qualname__, names))
    for k in names:
        _walk(attrs[k], f"{name}.{k}" if name else k, key, leaves, depth + 1, seen)


def leaf_specs(key):
    """The Leaf of each leaf, in order."""
    out = []
    for e in key:
        if e[0] == "tensor":
            out.append(Leaf("tensor", e[1], dtype=e[2], shape=e[3], requires_grad=e[4]))
        elif e[0] == "number":
            out.append(Leaf("number", e[1], ptype=e[2]))
    return out


def rebuild(key, values):
    """The function key describes, with its leaves replaced by `values`
    (in leaf order)."""
    return _make(iter(key), iter(values))


class _Namespace:
    """Stands for a captured object in a rebuilt function."""

    def __init__(self, qualname, attrs):
        self.__dict__.update(attrs)
        self._flexc_qualname = qualname

    def __repr__(self):
        return f"<{self._flexc_qualname} as traced>"


def _make(it, vals):
    e = next(it)
    tag = e[0]
    if tag in ("tensor", "number"):
        return next(vals)
    if tag in ("const", "object"):
        return e[1].d if isinstance(e[1], _Globals) else e[1]
    if tag == "partial":
        func = _make(it, vals)
        args = [_make(it, vals) for _ in range(e[1])]
        kw = {k: _make(it, vals) for k in e[2]}
        return functools.partial(func, *args, **kw)
    if tag == "method":
        func = _make(it, vals)
        return types.MethodType(func, _make(it, vals))
    if tag == "seq":
        items = [_make(it, vals) for _ in range(e[2])]
        return tuple(items) if e[1] == "tuple" else items
    if tag == "dict":
        return {k: _make(it, vals) for k in e[1]}
    if tag == "namespace":
        return _Namespace(e[1], {k: _make(it, vals) for k in e[2]})
    if tag == "function":
        return _make_function(e, it, vals)
    raise AssertionError(f"flexc: unknown key entry {e!r}")


def _make_function(e, it, vals):
    _, code, module, ndefaults, nclosure, gnames = e
    defaults = tuple(_make(it, vals) for _ in range(ndefaults))
    cells = tuple(types.CellType(_make(it, vals)) for _ in range(nclosure))
    if isinstance(module, _Globals):
        base = module.d
    else:
        base = getattr(sys.modules.get(module), "__dict__", None) or {"__builtins__": __builtins__}
    globs = dict(base)
    for g in gnames:  # the globals the key lists; the module's others are as they are
        globs[g] = _make(it, vals)
    return types.FunctionType(code, globs, code.co_name, defaults or None, cells or None)
