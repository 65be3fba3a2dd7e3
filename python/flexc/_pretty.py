""".score expressions printed with only the parentheses C's precedence needs.

The translation (_translate) writes every operation in parentheses, which
is always right and hard to read; `pretty(text)` parses such an expression
and prints it again, keeping a pair of parentheses only where removing it
would change the meaning.
"""
import re

_TOKEN = re.compile(r"\s*(?:(\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+"
                    r"|0[xX][0-9a-fA-F]+|\d+)|([A-Za-z_@][A-Za-z0-9_@]*)"
                    r"|(<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%<>&|^!~?:(),\[\]]))")

# Binary operators, loosest first (C's order).
_BINARY = {"||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6, "<": 7, "<=": 7,
           ">": 7, ">=": 7, "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "%": 10}
_UNARY, _ATOM = 11, 12


def _tokens(text):
    pos, out = 0, []
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise ValueError(f"cannot read {text[pos:pos + 20]!r}")
        out.append(next(g for g in m.groups() if g is not None))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, toks):
        self.toks, self.i = toks, 0

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, want=None):
        t = self.peek()
        if want is not None and t != want:
            raise ValueError(f"expected {want!r}, got {t!r}")
        self.i += 1
        return t

    def expr(self, minprec=1):
        left = self.unary()
        while True:
            op = self.peek()
            prec = _BINARY.get(op)
            if prec is None or prec < minprec:
                return left
            self.take()
            right = self.expr(prec + 1)
            left = ("bin", op, left, right)

    def unary(self):
        t = self.peek()
        if t in ("-", "!", "~"):
            self.take()
            return ("un", t, self.unary())
        return self.postfix()

    def postfix(self):
        t = self.take()
        if t == "(":
            e = self.expr(1)
            self.take(")")
            node = e
        else:
            node = ("atom", t)
        while self.peek() in ("(", "["):
            close = ")" if self.peek() == "(" else "]"
            self.take()
            args = []
            while self.peek() != close:
                args.append(self.expr(1))
                if self.peek() == ",":
                    self.take()
            self.take(close)
            node = ("call" if close == ")" else "index", node, args)
        return node


def _prec(node):
    if node[0] == "bin":
        return _BINARY[node[1]]
    if node[0] == "un":
        return _UNARY
    return _ATOM


_COMPARE = {"==", "!=", "<", "<=", ">", ">="}


def _clear(parent, child):
    """Whether child (an operator) reads clearly without parentheses inside
    parent: arithmetic anywhere, a comparison inside && or ||, an operator
    inside itself; not two different logical, bitwise or comparison
    operators (`(x & 1) == 0`, `(a || b) && c`), which C programmers
    parenthesize."""
    if _BINARY[child] >= 8 or child == parent:
        return True
    return parent in ("&&", "||") and child in _COMPARE


def _show(node, need=0, parent=None):
    kind = node[0]
    if kind == "atom":
        text = node[1]
    elif kind in ("call", "index"):
        o, c = ("(", ")") if kind == "call" else ("[", "]")
        text = _show(node[1], _ATOM) + o + ", ".join(_show(a) for a in node[2]) + c
    elif kind == "un":
        inner = _show(node[2], _UNARY)
        text = node[1] + (" " + inner if inner.startswith(node[1]) else inner)
    else:
        p = _BINARY[node[1]]
        text = f"{_show(node[2], p, node[1])} {node[1]} {_show(node[3], p + 1, node[1])}"
    paren = _prec(node) < need or (kind == "bin" and parent is not None and
                                   not _clear(parent, node[1]))
    return f"({text})" if paren else text


def pretty(text):
    """text with only the parentheses its meaning needs (text itself when
    it cannot be read)."""
    try:
        p = _Parser(_tokens(text))
        tree = p.expr(1)
        if p.peek() is not None:
            return text
        return _show(tree)
    except (ValueError, StopIteration, KeyError):
        return text
