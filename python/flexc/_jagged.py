"""PyTorch nested tensors (layout=torch.jagged) as packed variable-length
calls.

flexc.torch.flex_attention takes q, k, v as the [B, H, j, E] nested
tensors SDPA takes after `.transpose(1, 2)` of a [B, j, H, E] one; their
values are the packed (TOTAL, H, E) tensors and their offsets the
cu_seqlens of a packed call (docs/language.md, "Packed variable-length batches";
docs/varlen.md). Every function sees b as the sequence and q_idx, kv_idx
as positions inside it. The output (and LSE) are nested tensors of the
same sequences, and gradients flow to the inputs' values.

The inputs are checked the way PyTorch's jagged SDPA checks them (seeds:
torch/nested/_internal/sdpa.py, `_validate_sdpa_input` and the
`_check_*_nested` rules), in its words, before flexc's own packed-call
checks.
"""
import torch


def _validate(query, key, value):
    if not (query.is_nested and key.is_nested and value.is_nested):
        raise ValueError("Expected query, key, and value to be nested tensors, but got "
                         f"query.is_nested: {query.is_nested}, key.is_nested: {key.is_nested}, "
                         f"and value.is_nested: {value.is_nested} instead.")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.layout != torch.jagged:
            raise ValueError(f"Expected {name} to have layout torch.jagged, got {t.layout} "
                             "(flexc takes jagged nested tensors)")
    if query.dtype != key.dtype or query.dtype != value.dtype:
        raise ValueError("Expected query, key, and value to have the same dtype, but got "
                         f"query.dtype: {query.dtype}, key.dtype: {key.dtype}, and value.dtype: "
                         f"{value.dtype} instead.")
    if query.device != key.device or query.device != value.device:
        raise ValueError("Expected query, key, and value to have the same device type, but got "
                         f"query.device: {query.device}, key.device: {key.device}, and "
                         f"value.device: {value.device} instead.")
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError("Expected query, key, and value to be 4 dimensional [B, H, j, E] "
                         f"nested tensors, but got query.dim: {query.dim()}, key.dim: "
                         f"{key.dim()} and value.dim: {value.dim()} instead.")
    ragged = (query._ragged_idx, key._ragged_idx, value._ragged_idx)
    if len(set(ragged)) != 1:
        raise ValueError("Expected query, key, and value to all be ragged on the same "
                         f"dimension, but got ragged dims {ragged[0]}, {ragged[1]}, and "
                         f"{ragged[2]}, respectively.")
    if ragged[0] != 2:
        raise ValueError("Expected query, key, and value ragged in dimension 2 ([B, H, j, E], "
                         f"as after transpose(1, 2)), got dimension {ragged[0]}")
    if query.size(0) != key.size(0) or query.size(0) != value.size(0):
        raise ValueError("Nested tensors for query / key / value must have the same batch "
                         f"size, got query {query.size(0)}, key {key.size(0)} and value "
                         f"{value.size(0)}")
    if query.size(-1) != key.size(-1):
        raise ValueError("Expected query and key to have the same head dimension, got "
                         f"query.size(-1) = {query.size(-1)} and key.size(-1) = {key.size(-1)}")
    if key.size(1) != value.size(1):
        raise ValueError(f"Expected key and value to have the same number of heads, got "
                         f"{key.size(1)} and {value.size(1)}")


def _packed(t):
    """(values [TOTAL, H, E], int64 offsets [B + 1]) of a [B, H, j, E] jagged tensor."""
    x = t.transpose(1, 2)  # [B, j, H, E], ragged in dimension 1
    if x.lengths() is not None:
        raise ValueError("flexc.torch.flex_attention: a jagged tensor with holes (lengths) is "
                         "not supported; make it contiguous first")
    return x.values(), x.offsets()


def _nested(values, offsets):
    """[B, H, j, ...] jagged tensor of packed values [TOTAL, H, ...]."""
    return torch.nested.nested_tensor_from_jagged(values, offsets).transpose(1, 2)


class _MaskOnly:
    """A block mask reduced to its mask_mod: a packed call takes no block
    lists (they would index padded positions)."""

    def __init__(self, mask_mod):
        self.mask_mod = mask_mod


def attention(query, key, value, score_mod, block_mask, scale, params, buffers, backend,
              check_bounds, fast_math, deterministic, sinks=None):
    """(out, lse) as nested tensors: out [B, H, j, EV], lse [B, H, j]."""
    from . import _mods
    from .torch import _call, _resolve
    _validate(query, key, value)
    qv, qo = _packed(query)
    kv_, ko = _packed(key)
    vv, vo = _packed(value)
    if ko is not vo and not torch.equal(ko, vo):
        raise ValueError("Expected key and value to have the same sequence lengths (one "
                         "nested structure)")
    mask = _mods.mask_mod_of(block_mask)
    kernel, params, buffers = _resolve(score_mod, None if mask is None else _MaskOnly(mask),
                                       params, buffers, qv)
    if sinks is not None:
        kernel, buffers = _mods.with_sinks(kernel, buffers, sinks, qv.transpose(0, 1))
    cq = qo.to(device=qv.device, dtype=torch.int32)
    ck = ko.to(device=qv.device, dtype=torch.int32)
    out, lse = _call(kernel, qv, kv_, vv, None, scale, params, buffers, backend, check_bounds,
                     fast_math, deterministic, seqlens=(cq, ck))
    return _nested(out, qo), _nested(lse.transpose(0, 1), qo)
