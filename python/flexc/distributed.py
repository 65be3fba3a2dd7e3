"""flexc.torch.distributed: attention over a sequence sharded across the
ranks of a torch.distributed process group (context parallelism).

    import flexc.torch.distributed as cp
    q, k, v = (cp.shard(x, group) for x in (q_full, k_full, v_full))
    out = cp.context_parallel_attention(q, k, v, mask_mod=causal, group=group)
    out_full = cp.unshard(out, group)

Every rank holds a shard of Q, K and V along the sequence axis (dim 2 of
[B, H, L, E]). A call computes this rank's rows of the whole sequence's
attention from shard pairs: each pair is one kernel call with position
offsets (docs/language.md "Position offsets"), so masks, score functions,
position-indexed buffers and dropout see whole-sequence positions, and a
pair the mask rules out entirely (Kernel.mask_class: 'empty') is skipped
without a launch. Pair results are merged by their log-sum-exp; the
backward gives each pair the merged O and LSE. docs/context-parallel.md
describes the layout, the two methods, the merge, the backward and the
cost. Importing this module initializes nothing; a call needs an
initialized process group.
"""
import math

import torch
import torch.distributed as dist

from . import _kernel as K
from ._capi import FlexError

__all__ = ["context_parallel_attention", "shard", "unshard", "layout", "stats"]

# What every call on this rank did, summed (forward and backward
# separately): `pairs` shard pairs classified, `skipped` of them empty (no
# launch), `area` the rows x keys of the kernel calls launched; `bytes_in`
# the bytes of K, V, dK and dV that reached this rank from others (ring
# steps; all-gather and reduce-scatter counted as a ring algorithm moves
# them: W - 1 blocks in). The few int64 with which the ranks agree on a
# call are not counted.
stats = {"forward_pairs": 0, "forward_skipped": 0, "backward_pairs": 0, "backward_skipped": 0,
         "forward_area": 0, "backward_area": 0, "forward_bytes_in": 0, "backward_bytes_in": 0}


def _nbytes(t):
    return t.numel() * t.element_size()


_NAME = "flexc.torch.distributed"
_METHODS = ("ring", "allgather")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


# ---- the layout ------------------------------------------------------------------

def _bounds(length, n):
    """torch.tensor_split's boundaries of `length` rows in n chunks: the
    first length % n chunks one row longer."""
    q, r = divmod(length, n)
    return [i * q + min(i, r) for i in range(n + 1)]


def layout(length, world_size, load_balance=True):
    """Where each rank's rows lie in the whole sequence: per rank, the list
    of (start, stop) pieces its shard holds, in the shard's order. Without
    load balancing the sequence is cut into world_size chunks and rank r
    holds chunk r; with it, into 2 * world_size chunks and rank r holds
    chunks r and 2 * world_size - 1 - r (the same causal work on every
    rank). Chunks are torch.tensor_split's: lengths that do not divide
    evenly give the first chunks one row more (no padding)."""
    W = int(world_size)
    n = 2 * W if load_balance else W
    if length < n:
        raise ValueError(f"{_NAME}: a sequence of {length} rows cannot be cut into {n} chunks "
                         f"({W} ranks{', load-balanced' if load_balance else ''}); every chunk "
                         "needs at least one row")
    b = _bounds(length, n)
    if load_balance:
        return [[(b[r], b[r + 1]), (b[n - 1 - r], b[n - r])] for r in range(W)]
    return [[(b[r], b[r + 1])] for r in range(W)]


def _span(pieces):
    return sum(e - s for s, e in pieces)


def _world(group):
    """(size, this process's rank) of group (None: the default group)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{_NAME}: torch.distributed is not initialized "
                           "(call torch.distributed.init_process_group first)")
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(f"{_NAME}: this process (global rank {dist.get_rank()}) is not a member "
                         "of the group (torch.distributed.new_group gave it no group); call "
                         "context parallel attention only on the group's ranks")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{_NAME}: group must be a torch.distributed ProcessGroup or None (the "
                        f"default group), got {type(group).__name__}")
    return dist.get_world_size(group), dist.get_rank(group)


def shard(x, group=None, dim=2, load_balance=True):
    """This rank's shard of a whole tensor x (the same on every rank) along
    dim, as context_parallel_attention expects q, k and v (a view where the
    rank holds one piece, else a copy). Differentiable."""
    W, r = _world(group)
    pieces = layout(x.shape[dim], W, load_balance)[r]
    parts = [x.narrow(dim, s, e - s) for s, e in pieces]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def unshard(x, group=None, dim=2, load_balance=True):
    """The whole tensor from every rank's shard x along dim (the inverse of
    shard; on every rank). Shards may differ in length by the layout's
    rule. Not differentiable: it reassembles results."""
    W, r = _world(group)
    x = x.detach()
    sizes = _gather_ints(group, W, x.device, [x.shape[dim]])
    lengths = [s[0] for s in sizes]
    total = sum(lengths)
    lay = layout(total, W, load_balance)
    for i, (n, pieces) in enumerate(zip(lengths, lay)):
        if n != _span(pieces):
            raise ValueError(f"{_NAME}.unshard: rank {i} holds {n} rows along dim {dim}, but "
                             f"the layout of {total} rows gives it {_span(pieces)}")
    moved = x.movedim(dim, 0)
    parts = _all_gather_padded(group, W, moved.contiguous(), max(lengths))
    out = moved.new_empty((total,) + tuple(moved.shape[1:]))
    for n, pieces, part in zip(lengths, lay, parts):
        at = 0
        for s, e in pieces:
            out[s:e] = part[at:at + e - s]
            at += e - s
    return out.movedim(0, dim)


# ---- collectives -------------------------------------------------------------------

def _gather_ints(group, W, device, values):
    """Every rank's list of ints (the same length on all ranks)."""
    t = torch.tensor(values, dtype=torch.int64, device=device)
    out = [torch.empty_like(t) for _ in range(W)]
    dist.all_gather(out, t, group=group)
    return [o.tolist() for o in out]


def _all_gather_padded(group, W, x, max_len):
    """Every rank's x (rows along dim 0, up to max_len of them): each is
    padded to max_len for the all-gather (gloo's needs equal sizes), then
    cut back by the caller's lengths."""
    if x.shape[0] < max_len:
        x = torch.cat([x, x.new_zeros((max_len - x.shape[0],) + tuple(x.shape[1:]))])
    out = [torch.empty_like(x) for _ in range(W)]
    dist.all_gather(out, x, group=group)
    return out


def _flat(tensors, size):
    """The tensors flattened into one vector of `size` elements (zero padded)."""
    parts = [t.reshape(-1) for t in tensors]
    n = sum(p.numel() for p in parts)
    if n < size:
        parts.append(parts[0].new_zeros(size - n))
    return torch.cat(parts)


def _unflat(vec, shapes):
    out, at = [], 0
    for s in shapes:
        n = math.prod(s)
        out.append(vec[at:at + n].view(s))
        at += n
    return out


# ---- resolving the functions into one kernel --------------------------------------

def _resolve(score_mod, mask_mod, params, buffers, q):
    """(kernel, params, buffers) of a call, as flexc.torch.flex_attention
    makes them: Python functions traced (a mask_mod alone too), or a
    flexc.Kernel from flexc.compile."""
    from . import _mods as M
    from . import torch as FT
    if isinstance(mask_mod, K.Kernel) and not isinstance(mask_mod, M.TracedKernel):
        if score_mod is not None:
            raise TypeError(f"{_NAME}: a flexc.Kernel as mask_mod goes without score_mod (a "
                            ".score kernel brings its score and its mask)")
        score_mod, mask_mod = mask_mod, None
    if isinstance(mask_mod, M.TracedKernel):
        mask_mod = mask_mod.mask_mod
    if isinstance(score_mod, M.TracedKernel):
        if mask_mod is not None and score_mod.mask_mod is not None:
            raise ValueError(f"{_NAME}: the kernel from flexc.compile(score_mod=, mask_mod=) has "
                             "a mask_mod, and mask_mod= brings another one")
        return M.call_values(score_mod.score_mod, mask_mod or score_mod.mask_mod, q, params,
                             buffers)
    if mask_mod is not None and not callable(mask_mod):
        raise TypeError(f"{_NAME}: mask_mod must be a Python function mask_mod(b, h, q_idx, "
                        f"kv_idx), a kernel from flexc.compile, or None; got "
                        f"{type(mask_mod).__name__}")
    if isinstance(score_mod, K.Kernel):
        if mask_mod is None:
            return score_mod, dict(params or {}), dict(buffers or {})
        if M._kernel_mask(score_mod) is not None:
            raise ValueError(f"{_NAME}: {score_mod.name} has a mask of its own; pass "
                             "mask_mod=None (or a kernel without a mask)")
        return M.combine(score_mod, mask_mod, None, q, dict(params or {}), dict(buffers or {}))
    if score_mod is not None and not callable(score_mod):
        raise TypeError(f"{_NAME}: score_mod must be a Python function score_mod(score, b, h, "
                        f"q_idx, kv_idx), a kernel from flexc.compile, or None; got "
                        f"{type(score_mod).__name__}")
    if score_mod is None and mask_mod is None:
        return FT._PLAIN, dict(params or {}), dict(buffers or {})
    return M.call_values(score_mod, mask_mod, q, params, buffers)


# ---- the plan of one call ---------------------------------------------------------

class _Plan:
    """What both passes of one call share: the kernel and its values, the
    group, the layout of Q and KV over the ranks, and the mask's verdict
    on each shard pair."""

    def __init__(self, kernel, params, bnames, buffers, want, group, W, rank, method, lq, lkv,
                 lb, B, H, scale, backend, dropout, dtype, device, check_bounds):
        self.kernel, self.params, self.bnames, self.want = kernel, params, bnames, want
        self.group, self.W, self.rank, self.method = group, W, rank, method
        self.Lq, self.Lkv = sum(_span(p) for p in lq), sum(_span(p) for p in lkv)
        self.lq, self.lkv, self.lb = lq, lkv, lb
        self.B, self.H, self.scale, self.backend = B, H, scale, backend
        self.dropout, self.device, self.check_bounds = dropout, device, bool(check_bounds)
        self.error = None  # the first kernel call of this pass that failed
        self.phase = "forward"
        # Merged rows and gradients accumulate in float32 (float64 inputs: float64);
        # the LSE the kernels read and write has their dtype (K.lse_dtype).
        self.acc = torch.float64 if dtype == torch.float64 else torch.float32
        self.lse_dtype = getattr(torch, K.lse_dtype(torch.empty(0, dtype=dtype), backend))
        # The mask analysis reads buffers on the host (one copy per call).
        self.host = {n: t.detach().cpu() for n, t in zip(bnames, buffers)}
        self._classes = {}
        # A .score sink rides with the pair whose keys begin the sequence
        # (kv_offset 0, docs/language.md "Position offsets"): never skipped.
        self.has_sink = kernel.info().sink is not None
        self.next, self.prev = (rank + 1) % W, (rank - 1) % W
        self.peer = {p: dist.get_global_rank(group, p) if group is not None and
                     group is not dist.group.WORLD else p for p in (self.next, self.prev)}
        # Every pair this rank may compute, classified now: a mask that
        # cannot be analysed (a buffer of the wrong size) fails here, on
        # every rank, before anything travels.
        for qp in lq[rank]:
            for pieces in lkv:
                for kp in pieces:
                    self.cls(qp, kp)

    def cls(self, qpiece, kvpiece):
        """'empty', 'full' or 'partial' for the rows of qpiece against the
        keys of kvpiece (whole-sequence (start, stop) intervals)."""
        key = (qpiece, kvpiece)
        c = self._classes.get(key)
        if c is None:
            (qs, qe), (ks, ke) = qpiece, kvpiece
            c = self._classes[key] = K.Kernel.mask_class(
                self.kernel, self.B, self.H, qe - qs, ke - ks, params=self.params,
                buffers=self.host, q_offset=qs, kv_offset=ks, q_len_total=self.Lq,
                kv_len_total=self.Lkv)
            if c == "empty" and self.has_sink and kvpiece[0] == 0:
                c = self._classes[key] = "partial"
        return c

    def call(self, fn, *args, **kw):
        """fn(*args, **kw), or None once a kernel call of this pass has
        failed: the rank then goes on with the pass's communication
        without computing (so no peer waits on it forever) and raises at
        the end of the pass (finish)."""
        if self.error is not None:
            return None
        try:
            return fn(*args, **kw)
        except Exception as e:  # noqa: BLE001 - raised again by finish()
            self.error = e
            return None

    def finish(self, what):
        """Raises the error of this pass, if any. A checked run
        (check_bounds, whose errors depend on the data each rank reads)
        first has the ranks agree, so that every rank raises."""
        err, self.error = self.error, None
        failed = []
        if self.check_bounds and self.W > 1:
            flags = _gather_ints(self.group, self.W, self.device, [int(err is not None)])
            failed = [i for i, f in enumerate(flags) if f[0]]
        if err is not None:
            raise err
        if failed:
            raise RuntimeError(f"{_NAME}: the {what} failed on rank(s) {failed} (see the error "
                               "there)")

    def kw(self, qpiece, kvpiece, bufs):
        """The keywords of one pair's kernel call."""
        p, seed, off = self.dropout
        return dict(scale=self.scale, params=self.params, buffers=dict(zip(self.bnames, bufs)),
                    backend=self.backend, check_bounds=self.check_bounds, dropout_p=p,
                    dropout_seed=seed, dropout_offset=off,
                    q_offset=qpiece[0], kv_offset=kvpiece[0], q_len_total=self.Lq,
                    kv_len_total=self.Lkv)

    def exchange(self, send, recv, tag):
        """Start sending `send` to the next rank and receiving `recv` from
        the previous one; returns the requests to wait on."""
        if self.W == 1:
            return []
        ops = [dist.P2POp(dist.isend, t, self.peer[self.next], self.group, tag + i)
               for i, t in enumerate(send)]
        ops += [dist.P2POp(dist.irecv, t, self.peer[self.prev], self.group, tag + i)
                for i, t in enumerate(recv)]
        stats[self.phase + "_bytes_in"] += sum(_nbytes(t) for t in recv)
        return dist.batch_isend_irecv(ops)


def _local(pieces):
    """(whole-sequence piece, start in the shard) of each piece of a shard."""
    out, at = [], 0
    for p in pieces:
        out.append((p, at))
        at += p[1] - p[0]
    return out


def _merge(acc, o, lse):
    """acc (O float32, LSE float32) merged with one pair's (o, lse): the
    softmax over both key sets. Rows empty in both stay (0, -inf)."""
    ao, al = acc
    m = torch.logaddexp(al, lse)
    finite = torch.isfinite(m)
    wa = torch.where(finite, torch.exp(al - m), torch.zeros_like(m))
    wb = torch.where(finite, torch.exp(lse - m), torch.zeros_like(m))
    return ao * wa.unsqueeze(-1) + o.to(ao.dtype) * wb.unsqueeze(-1), m


def _add_sink(o, lse, sk):
    """The merged rows with the sink logits sk [B, H, L] added once: one
    more key of score sk and no value (docs/language.md "Attention
    sinks"). A NaN or +inf sink makes the row's O NaN and its LSE the sink."""
    o, m = _merge((o, lse), torch.zeros_like(o), sk)
    bad = (torch.isnan(sk) | (sk == math.inf)).unsqueeze(-1)
    return torch.where(bad, torch.full_like(o, math.nan), o), torch.where(
        torch.isnan(sk) | (sk == math.inf), sk, m)


def _sink_grad(sk, out, lse, dout, dlse, acc):
    """d loss / d sk = Ps * (dLSE - rowsum(dO * O)), Ps = exp(sk - LSE):
    the sink's share of the row's softmax (0 where sk is -inf)."""
    sk, lse = sk.to(acc), lse.to(acc)
    ps = torch.where(sk == -math.inf, torch.zeros_like(sk), torch.exp(sk - lse))
    d = (dout.to(acc) * out.to(acc)).sum(-1)
    if dlse is not None:
        d = d - dlse.to(acc)
    return -ps * d


def _sink_logits(sinks, B, H, rows, device):
    """The sink logits [B, H, len(rows)] of this rank's rows (whole-sequence
    positions), differentiable: per-head logits broadcast, or a Python
    sink_mod(b, h, q_idx) evaluated by torch.vmap as PyTorch evaluates
    mask_mod."""
    if isinstance(sinks, torch.Tensor):
        return sinks.to(device)[None, :, None].expand(B, H, len(rows))
    b, h = torch.arange(B, device=device), torch.arange(H, device=device)
    q = torch.tensor(rows, dtype=torch.int64, device=device)
    f = torch.vmap(sinks, in_dims=(None, None, 0))
    f = torch.vmap(f, in_dims=(None, 0, None))
    f = torch.vmap(f, in_dims=(0, None, None))
    try:
        sk = f(b, h, q)
    except Exception as e:  # noqa: BLE001 - said again with what failed
        raise ValueError(f"{_NAME}: the sink function could not be evaluated on the ranks' "
                         f"rows (torch.vmap over b, h, q_idx): {type(e).__name__}: {e}") from e
    if not isinstance(sk, torch.Tensor) or not sk.is_floating_point() and \
            sk.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{_NAME}: the sink function must return a number (a tensor), got "
                         f"{type(sk).__name__}")
    return sk.expand(B, H, len(rows))


def _wait(reqs):
    for r in reqs:
        r.wait()


# ---- forward ----------------------------------------------------------------------

def _pair_forward(plan, q, kq, vq, qpiece, kvpiece, bufs, acc):
    stats["forward_pairs"] += 1
    if plan.cls(qpiece, kvpiece) == "empty":
        stats["forward_skipped"] += 1
        return acc
    stats["forward_area"] += q.shape[2] * kq.shape[2]
    r = plan.call(K.Kernel.__call__, plan.kernel, q, kq, vq, return_lse=True,
                  **plan.kw(qpiece, kvpiece, bufs))
    return acc if r is None else _merge(acc, r[0], r[1].to(acc[1].dtype))


def _start_acc(plan, q, v, n):
    B, H = q.shape[:2]
    return (torch.zeros((B, H, n, v.shape[-1]), dtype=plan.acc, device=q.device),
            torch.full((B, H, n), -math.inf, dtype=plan.acc, device=q.device))


def _forward_ring(plan, q, k, v, bufs):
    qparts = _local(plan.lq[plan.rank])
    accs = [_start_acc(plan, q, v, p[1] - p[0]) for p, _ in qparts]
    for s in range(plan.W):
        src = (plan.rank - s) % plan.W
        reqs, nk, nv = [], None, None
        if s < plan.W - 1:  # the next step's K and V travel while this step computes
            n = _span(plan.lkv[(src - 1) % plan.W])
            nk = k.new_empty(k.shape[:2] + (n,) + k.shape[3:])
            nv = v.new_empty(v.shape[:2] + (n,) + v.shape[3:])
            reqs = plan.exchange([k, v], [nk, nv], 0)
        for kvp, kat in _local(plan.lkv[src]):
            ks, vs = (x.narrow(2, kat, kvp[1] - kvp[0]) for x in (k, v))
            for i, (qp, qat) in enumerate(qparts):
                qs = q.narrow(2, qat, qp[1] - qp[0])
                accs[i] = _pair_forward(plan, qs, ks, vs, qp, kvp, bufs, accs[i])
        _wait(reqs)
        if nk is not None:
            k, v = nk, nv
    return accs


def _gather_kv(plan, k, v):
    """The whole sequence's K and V, in sequence order, on every rank (one
    all-gather of both, padded to the longest shard)."""
    shapes = [(k.shape[:2] + (_span(p),) + k.shape[3:], v.shape[:2] + (_span(p),) + v.shape[3:])
              for p in plan.lkv]
    size = max(math.prod(a) + math.prod(b) for a, b in shapes)
    vec = _flat([k, v], size)
    out = [torch.empty_like(vec) for _ in range(plan.W)]
    dist.all_gather(out, vec, group=plan.group)
    stats["forward_bytes_in"] += (plan.W - 1) * _nbytes(vec)
    kf = k.new_empty(k.shape[:2] + (plan.Lkv,) + k.shape[3:])
    vf = v.new_empty(v.shape[:2] + (plan.Lkv,) + v.shape[3:])
    for vec_r, shp, pieces in zip(out, shapes, plan.lkv):
        kr, vr = _unflat(vec_r, shp)
        for (s, e), at in _local(pieces):
            kf[:, :, s:e] = kr[:, :, at:at + e - s]
            vf[:, :, s:e] = vr[:, :, at:at + e - s]
    return kf, vf


def _kv_span(plan, qp):
    """The keys one query piece needs under all-gather: from the first to
    the last chunk of the sequence the mask does not rule out for it
    (None: all empty). Counts the chunk pairs and the skipped ones."""
    chunks = [p for pieces in plan.lkv for p in pieces]
    live = []
    for c in chunks:
        stats["forward_pairs"] += 1
        if plan.cls(qp, c) == "empty":
            stats["forward_skipped"] += 1
        else:
            live.append(c)
    if not live:
        return None
    return min(s for s, _ in live), max(e for _, e in live)


def _forward_allgather(plan, q, k, v, bufs):
    kf, vf = _gather_kv(plan, k, v)
    accs = []
    for qp, qat in _local(plan.lq[plan.rank]):
        acc = _start_acc(plan, q, v, qp[1] - qp[0])
        span = _kv_span(plan, qp)
        if span is not None:
            qs = q.narrow(2, qat, qp[1] - qp[0])
            ks, vs = (x.narrow(2, span[0], span[1] - span[0]) for x in (kf, vf))
            stats["forward_area"] += qs.shape[2] * ks.shape[2]
            r = plan.call(K.Kernel.__call__, plan.kernel, qs, ks, vs, return_lse=True,
                          **plan.kw(qp, span, bufs))
            if r is not None:
                acc = (r[0].to(plan.acc), r[1].to(plan.acc))
        accs.append(acc)
    return accs, (kf, vf)


# ---- backward ---------------------------------------------------------------------

def _pair_backward(plan, q, k, v, o, lse, do, dlse, qpiece, kvpiece, bufs, check=True):
    """Grads of one pair given the merged o and lse rows (None: skipped)."""
    if check:
        stats["backward_pairs"] += 1
        if plan.cls(qpiece, kvpiece) == "empty":
            stats["backward_skipped"] += 1
            return None
    wanted = [n for n, w in zip(plan.bnames, plan.want) if w]
    stats["backward_area"] += q.shape[2] * k.shape[2]
    return plan.call(K.Kernel.backward, plan.kernel, q, k, v, o, lse, do, dlse,
                     buffer_grads=wanted, **plan.kw(qpiece, kvpiece, bufs))


def _add_buffer_grads(total, g):
    for n, t in g.buffers.items():
        total[n] = t if n not in total else total[n] + t


def _backward_ring(plan, q, k, v, out, lse, dout, dlse, bufs):
    qparts = _local(plan.lq[plan.rank])
    dq = torch.zeros(q.shape, dtype=plan.acc, device=q.device)
    dbuf = {}
    f32 = dict(dtype=plan.acc, device=k.device)
    racc, areqs, sent = None, [], None
    for s in range(plan.W):
        src = (plan.rank - s) % plan.W
        reqs, nk, nv = [], None, None
        if s < plan.W - 1:
            n = _span(plan.lkv[(src - 1) % plan.W])
            nk = k.new_empty(k.shape[:2] + (n,) + k.shape[3:])
            nv = v.new_empty(v.shape[:2] + (n,) + v.shape[3:])
            reqs = plan.exchange([k, v], [nk, nv], 0)
        dk = torch.zeros(k.shape, **f32)
        dv = torch.zeros(v.shape, **f32)
        for kvp, kat in _local(plan.lkv[src]):
            n = kvp[1] - kvp[0]
            ks, vs = k.narrow(2, kat, n), v.narrow(2, kat, n)
            for qp, qat in qparts:
                m = qp[1] - qp[0]
                g = _pair_backward(plan, q.narrow(2, qat, m), ks, vs, out.narrow(2, qat, m),
                                   lse.narrow(2, qat, m), dout.narrow(2, qat, m),
                                   None if dlse is None else dlse.narrow(2, qat, m), qp, kvp,
                                   bufs)
                if g is None:
                    continue
                dq.narrow(2, qat, m).add_(g.dq)
                dk.narrow(2, kat, n).add_(g.dk)
                dv.narrow(2, kat, n).add_(g.dv)
                _add_buffer_grads(dbuf, g)
        # The accumulators of src's dK and dV arrive from the previous rank
        # (sent at the end of its last step), take this step's share and go on.
        _wait(areqs)
        if racc is not None:
            dk.add_(racc[0])
            dv.add_(racc[1])
        n = _span(plan.lkv[(src - 1) % plan.W])
        racc = (torch.zeros(k.shape[:2] + (n,) + k.shape[3:], **f32),
                torch.zeros(v.shape[:2] + (n,) + v.shape[3:], **f32))
        sent = (dk, dv)  # alive until the requests complete
        areqs = plan.exchange(list(sent), list(racc), 2)
        if plan.W == 1:
            racc = (dk, dv)
        _wait(reqs)
        if nk is not None:
            k, v = nk, nv
    _wait(areqs)  # after W steps the accumulators are back with their owner
    del sent
    return dq, racc[0], racc[1], dbuf


def _backward_allgather(plan, q, kf, vf, out, lse, dout, dlse, bufs):
    dq = torch.zeros(q.shape, dtype=plan.acc, device=q.device)
    dkf = torch.zeros(kf.shape, dtype=plan.acc, device=kf.device)
    dvf = torch.zeros(vf.shape, dtype=plan.acc, device=vf.device)
    dbuf = {}
    for qp, qat in _local(plan.lq[plan.rank]):
        m = qp[1] - qp[0]
        chunks = [c for pieces in plan.lkv for c in pieces]
        live = [c for c in chunks if plan.cls(qp, c) != "empty"]
        stats["backward_pairs"] += len(chunks)
        stats["backward_skipped"] += len(chunks) - len(live)
        if not live:
            continue
        s, e = min(c[0] for c in live), max(c[1] for c in live)
        g = _pair_backward(plan, q.narrow(2, qat, m), kf.narrow(2, s, e - s),
                           vf.narrow(2, s, e - s), out.narrow(2, qat, m), lse.narrow(2, qat, m),
                           dout.narrow(2, qat, m),
                           None if dlse is None else dlse.narrow(2, qat, m), qp, (s, e), bufs,
                           check=False)
        if g is None:
            continue
        dq.narrow(2, qat, m).add_(g.dq)
        dkf.narrow(2, s, e - s).add_(g.dk)
        dvf.narrow(2, s, e - s).add_(g.dv)
        _add_buffer_grads(dbuf, g)
    # One reduce-scatter of dK and dV: rank r's block holds its own rows.
    shapes = [(kf.shape[:2] + (_span(p),) + kf.shape[3:], vf.shape[:2] + (_span(p),) +
               vf.shape[3:]) for p in plan.lkv]
    size = max(math.prod(a) + math.prod(b) for a, b in shapes)
    blocks = [_flat([torch.cat([x[:, :, s:e] for s, e in pieces], 2) for x in (dkf, dvf)], size)
              for pieces in plan.lkv]
    mine = torch.empty(size, dtype=plan.acc, device=kf.device)
    dist.reduce_scatter_tensor(mine, torch.cat(blocks), group=plan.group)
    stats["backward_bytes_in"] += (plan.W - 1) * _nbytes(mine)
    dk, dv = _unflat(mine, shapes[plan.rank])
    return dq, dk, dv, dbuf


class _Attention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, plan, sink, *bufs):
        k, v = k.contiguous(), v.contiguous()  # they travel (isend and all-gather want that)
        if plan.method == "ring":
            accs, kv = _forward_ring(plan, q, k, v, bufs), (k, v)
        else:
            accs, kv = _forward_allgather(plan, q, k, v, bufs)
        o = torch.cat([a[0] for a in accs], 2)
        lse = torch.cat([a[1] for a in accs], 2)
        if sink is not None:
            o, lse = _add_sink(o, lse, sink.to(plan.acc))
        out, lse = o.to(q.dtype), lse.to(plan.lse_dtype)
        plan.finish("forward")
        ctx.plan, ctx.has_sink = plan, sink is not None
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, *kv, out, lse, *bufs, *([sink] if sink is not None else []))
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        plan = ctx.plan
        plan.phase = "backward"
        q, k, v, out, lse, *bufs = ctx.saved_tensors
        sink = bufs.pop() if ctx.has_sink else None
        if dout is None:  # only the LSE reached the loss
            dout = torch.zeros_like(out)
        dsink = None
        if sink is not None and ctx.needs_input_grad[4]:
            dsink = _sink_grad(sink, out, lse, dout, dlse, plan.acc).to(sink.dtype)
        if plan.method == "ring":
            dq, dk, dv, dbuf = _backward_ring(plan, q, k, v, out, lse, dout, dlse, bufs)
        else:
            dq, dk, dv, dbuf = _backward_allgather(plan, q, k, v, out, lse, dout, dlse, bufs)
        # A buffer's gradient here is this rank's share (its pairs'), as
        # every replicated input's: summed over the ranks it is the whole
        # call's (docs/context-parallel.md "Gradients of replicated inputs").
        dbufs = [None if not w else dbuf[n].to(b.dtype) if n in dbuf else torch.zeros_like(b)
                 for n, b, w in zip(plan.bnames, bufs, plan.want)]
        plan.finish("backward")
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, dsink, *dbufs)


# ---- the entry point ----------------------------------------------------------------

def _check_local(q, k, v, method, dropout_p):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{_NAME}: {name} must be a torch tensor, got {type(t).__name__}")
        if getattr(t, "is_nested", False):
            raise ValueError(f"{_NAME}: {name} is a nested tensor; context parallelism takes "
                             "dense [B, H, L, E] shards")
        if t.dim() != 4:
            raise ValueError(f"{_NAME}: {name} must be [B, H, L_local, E] (4 dimensions), got "
                             f"shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise ValueError(f"{_NAME}: {name} has dtype {t.dtype}; float32, float16, bfloat16 "
                             "or float64 expected")
    if method not in _METHODS:
        raise ValueError(f"{_NAME}: method must be 'ring' or 'allgather', got {method!r}")
    B, H, _, E = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"{_NAME}: q, k and v must have the same batch size, got "
                         f"{q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
    if k.shape[1] != v.shape[1] or H % k.shape[1]:
        raise ValueError(f"{_NAME}: k and v must have the same number of heads HKV, a divisor "
                         f"of q's {H}; got k {k.shape[1]}, v {v.shape[1]}")
    if k.shape[3] != E:
        raise ValueError(f"{_NAME}: k's head dimension must be q's ({E}), got {k.shape[3]}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"{_NAME}: k and v must hold the same rows, got {k.shape[2]} and "
                         f"{v.shape[2]}")
    if len({q.device, k.device, v.device}) != 1 or len({q.dtype, k.dtype, v.dtype}) != 1:
        raise ValueError(f"{_NAME}: q, k and v must share a device and a dtype, got "
                         f"{q.device}/{q.dtype}, {k.device}/{k.dtype}, {v.device}/{v.dtype}")
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"{_NAME}: dropout_p must be in [0, 1), got {dropout_p}")


def _check_sinks(sinks, q):
    if sinks is None or callable(sinks) and not isinstance(sinks, torch.Tensor):
        return
    H = int(q.shape[1])
    if not isinstance(sinks, torch.Tensor) or sinks.dim() != 1 or int(sinks.shape[0]) != H:
        shape = tuple(sinks.shape) if isinstance(sinks, torch.Tensor) else type(sinks).__name__
        raise ValueError(f"{_NAME}: sinks must be a 1-D tensor of one logit per query head "
                         f"(shape [{H}]) or a Python function sink_mod(b, h, q_idx), got {shape}")
    if not sinks.is_floating_point():
        raise ValueError(f"{_NAME}: sinks must be floating point, got {sinks.dtype}")


def context_parallel_attention(q, k, v, *, score_mod=None, mask_mod=None, group=None,
                               method="ring", load_balance=True, scale=None, params=None,
                               buffers=None, return_lse=False, dropout_p=0.0, dropout_seed=0,
                               dropout_offset=0, backend=None, check_bounds=False, sinks=None):
    """This rank's rows of attention over a sequence sharded across `group`
    (None: the default group), differentiable.

    q [B, H, Lq_local, E], k [B, HKV, Lkv_local, E], v [B, HKV, Lkv_local,
    EV]: this rank's shards along the sequence axis, as shard() cuts them
    with the same load_balance (H a multiple of HKV: grouped heads stay at
    HKV heads, also in transit). Lengths that do not divide evenly are cut
    as torch.tensor_split cuts them (the first chunks one row longer), not
    padded; every chunk needs at least one row.

    score_mod, mask_mod: Python functions as flexc.torch.flex_attention
    takes them (traced; a mask_mod alone too), or a flexc.Kernel from
    flexc.compile (with params= and buffers=). Functions see whole-sequence
    positions, and buffers indexed by position are the whole sequence's,
    the same on every rank. A kernel's own sink is carried by the shard
    pairs whose keys begin the sequence (kv_offset 0), which are never
    skipped, so the merged rows count it once.

    method: 'ring' (K and V shards travel around the ring with isend/irecv
    while the current pair computes) or 'allgather' (one all-gather of K
    and V, one call per query piece). load_balance: rank r holds chunks r
    and 2W-1-r of 2W (equal causal work); False: chunk r of W. scale: None
    for 1/sqrt(E). return_lse: also the log-sum-exp rows (float32, natural
    log), differentiable. dropout_p, dropout_seed, dropout_offset: dropout
    of the attention weights by positions (the same elements dropped as an
    unsharded call). backend: as flex_attention's (None: cuda for CUDA
    tensors, cpu on the host where built, else reference). check_bounds:
    report out-of-range buffer reads (a buffer cut to the shard instead of
    the whole sequence's; unchecked, such a read gives 0); the ranks then
    agree after each pass, so every rank raises.

    sinks: as flex_attention's (docs/language.md "Attention sinks"): one
    logit per query head (a floating [H] tensor; one that requires grad
    gets its gradient) or a Python sink_mod(b, h, q_idx) (whole-sequence
    q_idx; evaluated with torch.vmap, its captured tensors get their
    gradients through autograd). The sink is added once per row, to the
    merged result, never to a shard pair; a kernel with a sink of its own
    takes no sinks=.

    Every rank must call it with the same functions, method, load_balance
    and sizes: a mismatch is found by one small all-gather before any
    attention and raised on every rank. The gradient of a buffer (and of
    sinks) is this rank's share, as the gradient of any input every rank
    holds alike: summed over the ranks (as DDP or FSDP reduce parameter
    gradients) it is the whole call's.
    """
    group = group if group is not None else (dist.group.WORLD if dist.is_available() else None)
    W, rank = _world(group)
    error, kernel = None, None
    try:
        _check_local(q, k, v, method, dropout_p)
        kernel, params, buffers = _resolve(score_mod, mask_mod, params, buffers, q)
        if kernel.info().sink is not None and sinks is not None:
            raise ValueError(f"{_NAME}: kernel {kernel.name!r} has a sink function of its own; "
                             "sinks= would add a second one")
        _check_sinks(sinks, q)
        bnames = list(buffers)
        btensors = [buffers[n] for n in bnames]
        grad_ok = kernel.grad_buffers
        for n, t in zip(bnames, btensors):
            if t.requires_grad and grad_ok is not None and n not in grad_ok:
                raise ValueError(f"{_NAME}: buffer {n!r} requires grad but {kernel.name} does "
                                 "not declare it `grad`")
        want = [bool(t.requires_grad and torch.is_grad_enabled()) for t in btensors]
    except (TypeError, ValueError, FlexError) as e:
        error = e
    device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
    if error is None:
        B, H, lq, E = q.shape
        _, HKV, lkv, EV = v.shape
        mine = [0, lq, lkv, B, H, HKV, E, EV, _METHODS.index(method), int(bool(load_balance)),
                _DTYPES.index(q.dtype), sum(want), sum(t.numel() for t, w in zip(btensors, want)
                                                     if w), int(sinks is not None)]
    else:
        mine = [1] + [0] * 13
    everyone = _gather_ints(group, W, device, mine)
    if error is not None:
        raise error
    bad = [i for i, e in enumerate(everyone) if e[0]]
    if bad:
        raise ValueError(f"{_NAME}: rank(s) {bad} of the group refused the call (their inputs "
                         "are invalid; see the error there)")
    names = ("B", "H", "HKV", "E", "EV", "method", "load_balance", "dtype",
             "buffers wanting gradients", "their sizes", "sinks")
    for j, name in enumerate(names, start=3):
        vals = [e[j] for e in everyone]
        if len(set(vals)) != 1:
            raise ValueError(f"{_NAME}: the ranks disagree on {name}: {vals} (rank by rank)")
    lb = bool(load_balance)
    lays = []
    for j, what in ((1, "q"), (2, "k and v")):
        lengths = [e[j] for e in everyone]
        total = sum(lengths)
        lay = layout(total, W, lb)
        wrong = [i for i, (n, p) in enumerate(zip(lengths, lay)) if n != _span(p)]
        if wrong:
            raise ValueError(f"{_NAME}: {what} shards of {lengths} rows (rank by rank) are not "
                             f"the layout of a {total}-row sequence on {W} ranks "
                             f"({'load-balanced: ' if lb else ''}{[_span(p) for p in lay]}); "
                             "cut them with flexc.torch.distributed.shard")
        lays.append(lay)
    plan = _Plan(kernel, params, bnames, btensors, want, group, W, rank, method, lays[0],
                 lays[1], lb, B, H, scale, backend or K.default_backend(q),
                 (float(dropout_p), int(dropout_seed), int(dropout_offset)), q.dtype, device,
                 check_bounds)
    sink = None
    if sinks is not None:  # a function may fail on some ranks' rows only: they agree first
        try:
            sink = _sink_logits(sinks, B, H, [i for s, e in lays[0][rank] for i in range(s, e)],
                                device)
        except ValueError as e:
            error = e
        failed = [i for i, f in enumerate(_gather_ints(group, W, device, [int(error is not None)]))
                  if f[0]]
        if error is not None:
            raise error
        if failed:
            raise ValueError(f"{_NAME}: rank(s) {failed} could not evaluate the sink function "
                             "(see the error there)")
    out, lse = _Attention.apply(q, k, v, plan, sink, *btensors)
    return (out, lse) if return_lse else out
