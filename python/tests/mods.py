"""Attention variants as the Python functions PyTorch's FlexAttention takes:
the score_mods and mask_mods of attention-gym (attn_gym/mods, attn_gym/masks)
and of PyTorch's own FlexAttention tests (test/inductor/test_flex_attention.py),
written here as their users write them: closures over tensors and Python
numbers, helpers, and_masks/or_masks, functools.partial, nn.Module state.

Each Mod makes its functions for the sizes of a test (B, H, Q_LEN, KV_LEN)
and a torch.Generator; `learn` names the captured tensors whose gradients
the tests check (they are created with requires_grad=True).
"""
import functools
import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import and_masks, or_masks


@dataclass
class Mod:
    name: str
    origin: str                  # 'attention-gym' or 'pytorch-tests'
    make: Callable               # (B, H, QL, KL, g) -> (score_mod or None, mask_mod or None, leaves)
    q_len: int = 64
    kv_len: int = 64
    learn: tuple = ()            # names of the leaves that require grad
    fp: dict = field(default_factory=dict)  # per-test notes (unused by the checks)


def causal_mask(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _randn(g, *shape, scale=1.0, grad=False):
    t = scale * torch.randn(*shape, generator=g)
    return t.requires_grad_(grad)


# ---- attention-gym: score mods ----------------------------------------------

def gym_alibi(B, H, QL, KL, g):
    def alibi_mod(score, b, h, q_idx, kv_idx):
        scale = torch.exp2(-((h + 1) * 8.0 / H))
        return score + (kv_idx - q_idx) * scale
    return alibi_mod, causal_mask, {}


def gym_softcap(B, H, QL, KL, g):
    soft_cap = 3.0

    def tanh_softcap(score, b, h, q_idx, kv_idx):
        return soft_cap * torch.tanh(score / soft_cap)
    return tanh_softcap, None, {}


def gym_activation(activation, offset=1.0):
    def make(B, H, QL, KL, g):
        def activation_score_mod(score, b, h, q_idx, kv_idx):
            return torch.log(activation(score) + offset)
        return activation_score_mod, None, {}
    return make


def gym_sandwich(B, H, QL, KL, g):
    d_bar = 16
    freqs = 1.0 / 10000 ** (2 * torch.arange(d_bar // 2, dtype=torch.float32) / d_bar)
    max_seq = max(QL, KL)
    padded = -(-(2 * max_seq - 1) // 8) * 8
    distances = torch.arange(padded, dtype=torch.float32) - (max_seq - 1)
    rel_bias = torch.cos(distances.abs()[:, None] * freqs).sum(dim=-1)
    offset = max_seq - 1
    head_scale = H / (8.0 * torch.arange(1, H + 1, dtype=torch.float32))

    def sandwich_mod(score, b, h, q_idx, kv_idx):
        return score + rel_bias[q_idx - kv_idx + offset] * head_scale[h]
    return sandwich_mod, causal_mask, {}


def gym_graphormer_spatial(B, H, QL, KL, g):
    max_distance = 5
    distances = torch.randint(0, max_distance + 2, (B, QL, KL), generator=g, dtype=torch.int32)
    spatial_bias = _randn(g, H, max_distance + 2, scale=0.5, grad=True)

    def graphormer_spatial_bias(score, b, h, q_idx, kv_idx):
        return score + spatial_bias[h, distances[b, q_idx, kv_idx]]
    return graphormer_spatial_bias, None, {"spatial_bias": spatial_bias}


def gym_graphormer_edge(B, H, QL, KL, g):
    K, types = 3, 4
    edge_bias = _randn(g, H, K, types, scale=0.5, grad=True)
    path_edge_types = torch.randint(0, types, (B, QL, KL, K), generator=g, dtype=torch.int32)
    path_lengths = torch.randint(0, K + 1, (B, QL, KL), generator=g, dtype=torch.int32)
    position_tables = [edge_bias[:, n] for n in range(K)]

    def graphormer_edge_bias(score, b, h, q_idx, kv_idx):
        length = path_lengths[b, q_idx, kv_idx]
        total = 0.0
        for n, table in enumerate(position_tables):
            contrib = table[h, path_edge_types[b, q_idx, kv_idx, n]]
            total = total + torch.where(length > n, contrib, 0.0)
        return score + total / torch.clamp(length, min=1)
    return graphormer_edge_bias, None, {"edge_bias": edge_bias}


def gym_mla_rope(B, H, QL, KL, g):
    R = 8
    query_rope = _randn(g, B, H, QL, R, scale=0.3)
    key_rope = _randn(g, B, 1, KL, R, scale=0.3)
    num_heads, scale = H, 0.5

    def mla_rope_score_mod(score, b, h, q_idx, kv_idx):
        return score + scale * torch.dot(query_rope[b, h, q_idx], key_rope[b, h // num_heads, kv_idx])
    return mla_rope_score_mod, None, {}


# ---- attention-gym: masks ---------------------------------------------------

def gym_sliding_window(B, H, QL, KL, g):
    window_size = 12

    def sliding_window(b, h, q_idx, kv_idx):
        return q_idx - kv_idx <= window_size
    return None, and_masks(sliding_window, causal_mask), {}


def gym_dilated_sliding_window(B, H, QL, KL, g):
    window_size, dilation = 20, 3

    def dilated_sliding_window(b, h, q_idx, kv_idx):
        diff = torch.abs(q_idx - kv_idx)
        return (diff <= window_size) & ((diff % dilation) == 0)
    return None, dilated_sliding_window, {}


def gym_prefix_lm(B, H, QL, KL, g):
    prefix_length = 19

    def prefix_mask(b, h, q_idx, kv_idx):
        return kv_idx < prefix_length
    return None, or_masks(prefix_mask, causal_mask), {}


def _doc_ids(offsets):
    counts = offsets[1:] - offsets[:-1]
    return torch.repeat_interleave(torch.arange(len(counts), dtype=torch.int32), counts)


def _offsets(L, g, docs=4):
    cuts = torch.randperm(L - 1, generator=g)[:docs - 1] + 1
    return torch.cat([torch.tensor([0]), cuts.sort().values, torch.tensor([L])]).to(torch.int32)


def gym_document(B, H, QL, KL, g):
    offsets = _offsets(QL, g)
    document_id = _doc_ids(offsets)

    def doc_mask_mod(b, h, q_idx, kv_idx):
        same_doc = document_id[q_idx] == document_id[kv_idx]
        q_logical = q_idx - offsets[document_id[q_idx]]
        kv_logical = kv_idx - offsets[document_id[kv_idx]]
        return same_doc & causal_mask(b, h, q_logical, kv_logical)
    return None, doc_mask_mod, {}


def gym_packed_causal_document(B, H, QL, KL, g):
    offsets = _offsets(QL, g)
    document_id = _doc_ids(offsets)

    def doc_causal_mask_mod(b, h, q_idx, kv_idx):
        doc_start = offsets[document_id[q_idx]]
        return (kv_idx >= doc_start) & causal_mask(b, h, q_idx, kv_idx)
    return None, doc_causal_mask_mod, {}


def gym_shared_prefix(B, H, QL, KL, g):
    offsets = torch.tensor([0, 16, 30, 41, QL], dtype=torch.int32)
    prefix_document_id = torch.tensor([0, 0, 2, 2], dtype=torch.int32)
    document_id = _doc_ids(offsets)

    def shared_prefix_mask_mod(b, h, q_idx, kv_idx):
        q_document = document_id[q_idx]
        q_document_start = offsets[q_document]
        q_prefix_document = prefix_document_id[q_document]
        q_prefix_start = offsets[q_prefix_document]
        q_prefix_end = offsets[q_prefix_document + 1]
        same_document_causal = (kv_idx >= q_document_start) & causal_mask(b, h, q_idx, kv_idx)
        prefix_document = ((q_document != q_prefix_document) & (kv_idx >= q_prefix_start)
                           & (kv_idx < q_prefix_end))
        return same_document_causal | prefix_document
    return None, shared_prefix_mask_mod, {}


def gym_natten(B, H, QL, KL, g):
    canvas_w, canvas_h, kernel_w, kernel_h = 8, 8, 3, 5

    def get_x_y(idx):
        return idx // canvas_w, idx % canvas_w

    def natten_mask_mod(b, h, q_idx, kv_idx):
        q_x, q_y = get_x_y(q_idx)
        kv_x, kv_y = get_x_y(kv_idx)
        kernel_center_x = q_x.clamp(kernel_w // 2, (canvas_w - 1) - kernel_w // 2)
        kernel_center_y = q_y.clamp(kernel_h // 2, (canvas_h - 1) - kernel_h // 2)
        hori_mask = (kernel_center_x - kv_x).abs() <= kernel_w // 2
        vert_mask = (kernel_center_y - kv_y).abs() <= kernel_h // 2
        return hori_mask & vert_mask
    return None, natten_mask_mod, {}


def gym_tiled_natten(B, H, QL, KL, g):
    W, Hc, K_W, K_H, T_W, T_H = 8, 8, 3, 3, 4, 4

    def get_x_y_tiled(idx):
        t_id = idx // (T_H * T_W)
        t_y, t_x = t_id // (W // T_W), t_id % (W // T_W)
        t_offset = idx % (T_H * T_W)
        i_y, i_x = t_offset // T_W, t_offset % T_W
        return t_x * T_W + i_x, t_y * T_H + i_y

    def tiled_natten_mask(b, h, q_idx, kv_idx):
        q_x, q_y = get_x_y_tiled(q_idx)
        kv_x, kv_y = get_x_y_tiled(kv_idx)
        kernel_x = q_x.clamp(K_W // 2, (W - 1) - K_W // 2)
        kernel_y = q_y.clamp(K_H // 2, (Hc - 1) - K_H // 2)
        return ((kernel_x - kv_x).abs() <= K_W // 2) & ((kernel_y - kv_y).abs() <= K_H // 2)
    return None, tiled_natten_mask, {}


def gym_global_sliding_window(B, H, QL, KL, g):
    window_size = 6
    is_global = torch.zeros(KL, dtype=torch.bool)
    is_global[torch.randperm(KL, generator=g)[:3]] = True

    def sliding_window(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= window_size

    def global_attention(b, h, q_idx, kv_idx):
        return is_global[q_idx] | is_global[kv_idx]
    return None, or_masks(sliding_window, global_attention), {}


def gym_flamingo(B, H, QL, KL, g):
    image_token_length = 16
    intervals = torch.tensor([[0, 20], [10, 48], [40, QL], [5, 30]], dtype=torch.int32)
    image_boundaries = torch.repeat_interleave(torch.arange(intervals.shape[0]),
                                               repeats=image_token_length)

    def vision_cross_attention_mask_mod(b, h, q_idx, kv_idx):
        image_idx = image_boundaries[kv_idx]
        interval = intervals[image_idx]
        return (q_idx >= interval[0]) & (q_idx < interval[1])
    return None, vision_cross_attention_mask_mod, {}


def gym_batchify(B, H, QL, KL, g):
    batchify_size = 16

    def batched_mask_mod(b, h, q_idx, kv_idx):
        same_batch = q_idx // batchify_size == kv_idx // batchify_size
        return same_batch & causal_mask(b, h, q_idx % batchify_size, kv_idx % batchify_size)
    return None, batched_mask_mod, {}


def gym_block_diffusion(B, H, QL, KL, g):
    seq_len, block_size = QL // 2, 8

    def block_diffusion_mask(b, h, q_idx, kv_idx):
        q_noised = q_idx < seq_len
        kv_noised = kv_idx < seq_len
        q_block = (q_idx % seq_len) // block_size
        kv_block = (kv_idx % seq_len) // block_size
        block_diagonal = (q_block == kv_block) & (q_noised == kv_noised)
        offset_block_causal = (q_block > kv_block) & q_noised & ~kv_noised
        block_causal = (q_block >= kv_block) & ~q_noised & ~kv_noised
        return block_diagonal | offset_block_causal | block_causal
    return None, block_diffusion_mask, {}


def gym_jetspec_tree(B, H, QL, KL, g):
    prefix_length = KL - QL
    n = QL
    parent = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)])
    anc = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            anc[i, j] = True
            j = int(parent[j])
    tree_stop = prefix_length + n

    def jetspec_tree_causal_mask_mod(b, h, q_idx, kv_idx):
        tree_idx = (kv_idx - prefix_length).clamp(min=0, max=n - 1)
        tree_visible = (kv_idx >= prefix_length) & (kv_idx < tree_stop)
        return (kv_idx < prefix_length) | (tree_visible & anc[q_idx, tree_idx])
    return None, jetspec_tree_causal_mask_mod, {}


def gym_jetspec_training(B, H, QL, KL, g):
    prefix_length, block_size = KL - QL, 8

    def jetspec_training_mask_mod(b, h, q_idx, kv_idx):
        q_block, q_off = q_idx // block_size, q_idx % block_size
        kvb = kv_idx - prefix_length
        kv_block, kv_off = kvb // block_size, kvb % block_size
        same = (kv_idx >= prefix_length) & (q_block == kv_block) & (kv_off <= q_off)
        return (kv_idx < prefix_length) | same
    return None, jetspec_training_mask_mod, {}


def gym_sta(B, H, QL, KL, g):
    canvas_h, canvas_w, kernel_h, kernel_w, tile_h, tile_w, text = 4, 12, 2, 4, 2, 2, 16
    tile_numel = tile_h * tile_w
    canvas_tile_w = canvas_w // tile_w
    canvas_tile_h = canvas_h // tile_h
    kth, ktw = kernel_h // tile_h, kernel_w // tile_w
    vision = canvas_h * canvas_w

    def tiles(idx):
        t = idx // tile_numel
        return t // canvas_tile_w, t % canvas_tile_w

    def border(k):
        return k // 2, k // 2 + (k % 2 - 1)

    def sta_mask_mod_2d(b, h, q_idx, kv_idx):
        qh, qw = tiles(q_idx)
        kh, kw = tiles(kv_idx)
        lh, rh = border(kth)
        lw, rw = border(ktw)
        ch = qh.clamp(lh, (canvas_tile_h - 1) - rh)
        cw = qw.clamp(lw, (canvas_tile_w - 1) - rw)
        hm = (kh >= ch - lh) & (kh <= ch + rh)
        wm = (kw >= cw - lw) & (kw <= cw + rw)
        vis = (q_idx < vision) & (kv_idx < vision)
        v2t = (q_idx < vision) & (kv_idx >= vision) & (kv_idx < vision + text)
        t2a = (q_idx >= vision) & (kv_idx < vision + text)
        return (vis & hm & wm) | v2t | t2a
    return None, sta_mask_mod_2d, {}


def gym_svg_spatial(B, H, QL, KL, g):
    prompt_length, token_per_frame, width, round_width = 8, 12, 2, 4

    def spatial_mask_mod(b, h, q_idx, kv_idx):
        mask_width = math.floor(width * token_per_frame / round_width) * round_width
        return (kv_idx < prompt_length) | (q_idx < prompt_length) | \
            (torch.abs(q_idx - kv_idx) < mask_width)
    return None, spatial_mask_mod, {}


def gym_svg_temporal(B, H, QL, KL, g):
    prompt_length, num_frames, token_per_frame, width = 8, 4, 14, 2

    def token_in_frame(idx):
        return (idx - prompt_length) % token_per_frame

    def temporal_mask_mod(b, h, q_idx, kv_idx):
        mask_width = (width * token_per_frame) // num_frames
        return (kv_idx < prompt_length) | (q_idx < prompt_length) | \
            (torch.abs(token_in_frame(q_idx) - token_in_frame(kv_idx)) < mask_width)
    return None, temporal_mask_mod, {}


def gym_vsa_topk(B, H, QL, KL, g):
    tile_numel, topk = 8, 3
    topk_indices = torch.stack([torch.randperm(KL // tile_numel, generator=g)[:topk]
                                for _ in range(B * H * (QL // tile_numel))]).view(
        B, H, QL // tile_numel, topk).to(torch.int32)

    def vsa_mask_mod(b, h, q_idx, kv_idx):
        selected_tiles = topk_indices[b, h, q_idx // tile_numel]
        return (selected_tiles == (kv_idx // tile_numel).unsqueeze(-1)).any(dim=-1)
    return None, vsa_mask_mod, {}


def gym_vsa_block_map(B, H, QL, KL, g):
    tile_numel = 8
    block_map = torch.rand(B, H, QL // tile_numel, KL // tile_numel, generator=g) < 0.4
    sizes = torch.randint(1, tile_numel + 1, (KL // tile_numel,), generator=g, dtype=torch.int32)

    def vsa_block_map_mask_mod(b, h, q_idx, kv_idx):
        kv_tile = kv_idx // tile_numel
        selected = block_map[b, h, q_idx // tile_numel, kv_tile]
        return selected & (kv_idx % tile_numel < sizes[kv_tile])
    return None, vsa_block_map_mask_mod, {}


# ---- PyTorch's FlexAttention tests --------------------------------------------

def _plain(fn, mask=None):
    return lambda B, H, QL, KL, g: (fn, mask, {})


def _times_two(score, b, h, m, n):
    return score * 2


def _squared(score, b, h, m, n):
    return score * score


def _causal(score, batch, head, token_q, token_kv):
    return torch.where(token_q >= token_kv, score, float("-inf"))


def _inverse_causal(score, b, h, m, n):
    return torch.where(m <= n, score, float("-inf"))


def _rel_bias(score, batch, head, token_q, token_kv):
    return score + (token_q - token_kv)


def _rel_causal(score, batch, head, token_q, token_kv):
    return torch.where(token_q >= token_kv, score + (token_q - token_kv), float("-inf"))


def _trig(score, b, h, m, n):
    return torch.sin(torch.cos(score)) + torch.tan(b)


def _trig2(score, b, h, m, n):
    z = torch.cos(score) * torch.sin(score) + torch.tan(b)
    return z


def _skip_odd_keys(score, b, h, q, kv):
    return torch.where(kv % 2 == 0, score, float("-inf"))


def _composed(score, b, h, m, n):
    def score_mod_1(score, b, h, m, n):
        return score + (m - n)

    def score_mod_2(score, b, h, m, n):
        return torch.where(m <= n, score, float("-inf"))
    return score_mod_2(score_mod_1(score, b, h, m, n), b, h, m, n)


def _silu(score, b, h, q, kv):
    return F.silu(score)


def pt_head_offset(B, H, QL, KL, g):
    head_offset = torch.rand(H, generator=g, requires_grad=True)

    def score_mod(score, b, h, m, n):
        return score * head_offset[h]
    return score_mod, None, {"head_offset": head_offset}


def pt_all_bias(B, H, QL, KL, g):
    head_scale, batch_scale = _randn(g, H, grad=True), _randn(g, B, grad=True)
    tok_scale = _randn(g, QL, grad=True)

    def all_bias(score, batch, head, token_q, token_kv):
        score = score + tok_scale[token_q]
        score = score + batch_scale[batch]
        return score + head_scale[head]
    return all_bias, None, {"head_scale": head_scale, "batch_scale": batch_scale,
                            "tok_scale": tok_scale}


def pt_document_causal(B, H, QL, KL, g):
    document_id = torch.arange(QL, dtype=torch.int32) // 16

    def document_masking_causal(score, b, h, q_idx, kv_idx):
        mask = (q_idx >= kv_idx) & (document_id[q_idx] == document_id[kv_idx])
        return torch.where(mask, score, -float("inf"))
    return document_masking_causal, None, {}


def pt_index_multiple(B, H, QL, KL, g):
    bias = _randn(g, B, QL, grad=True)

    def index_multiple(score, b, h, q_idx, kv_idx):
        return score + bias[b][q_idx]
    return index_multiple, None, {"bias": bias}


def pt_index_weird1(B, H, QL, KL, g):
    bias = _randn(g, 4, B, H, QL, grad=True)

    def index_weird1(score, b, h, q_idx, kv_idx):
        return score + bias[0][b, h][q_idx]
    return index_weird1, None, {"bias": bias}


def pt_index_weird2(B, H, QL, KL, g):
    bias = _randn(g, B, H, 4, QL, grad=True)
    which_bias = torch.tensor(0)

    def index_weird2(score, b, h, q_idx, kv_idx):
        return score + bias[b][h][which_bias, q_idx]
    return index_weird2, None, {"bias": bias}


def pt_seq_masking(B, H, QL, KL, g):
    seq_idx = torch.zeros(QL, dtype=torch.bool)
    seq_idx[QL // 2:] = 1

    def seq_mask_mod(score, b, h, q, kv):
        return torch.where(seq_idx[q] == seq_idx[kv], score, float("-inf"))
    return seq_mask_mod, None, {}


def pt_bias_seq_batch(B, H, QL, KL, g):
    bias = _randn(g, B, QL, KL, grad=True)

    def bias_mod(score, b, h, q, kv):
        return score + bias[b, q, kv]
    return bias_mod, None, {"bias": bias}


def pt_bias_head_seq_batch(B, H, QL, KL, g):
    bias = _randn(g, B, H, QL, KL, grad=True)

    def bias_mod(score, b, h, q, kv):
        return score + bias[b, h, q, kv]
    return bias_mod, None, {"bias": bias}


def pt_rel_bias_1d(B, H, QL, KL, g):
    rel_bias = _randn(g, 2 * QL, grad=True)

    def bias_mod(score, b, h, q, kv):
        return score + rel_bias[(q - kv) + QL]
    return bias_mod, None, {"rel_bias": rel_bias}


def pt_rel_pos_3d_transposed(B, H, QL, KL, g):
    bias = _randn(g, H, KL, QL, grad=True)

    def rel_pos_3d_transposed(score, b, h, q_idx, kv_idx):
        return score + bias[h, kv_idx, q_idx]
    return rel_pos_3d_transposed, None, {"bias": bias}


def pt_dependent_causal_bidirectional(B, H, QL, KL, g):
    num_bidirectional = torch.randint(0, QL, (B,), generator=g, dtype=torch.int32)

    def bias_mod(score, b, h, q, kv):
        cur = num_bidirectional[b]
        bidirectional = (q <= cur) & (kv <= cur)
        return torch.where(bidirectional | (q >= kv), score, -float("inf"))
    return bias_mod, None, {}


def pt_natten_2d(B, H, QL, KL, g):
    W, WINDOW = 8, 1

    def get_x_y(idx):
        return idx / W, idx % W

    def natten_mask(score, b, h, q, kv):
        q_x, q_y = get_x_y(q)
        kv_x, kv_y = get_x_y(kv)
        return torch.where(((q_x - kv_x).abs() <= WINDOW) | ((q_y - kv_y).abs() <= WINDOW),
                           score, float("-inf"))
    return natten_mask, None, {}


def pt_floor_div(score, b, h, q, kv):
    return score - q // (1 + kv)


def pt_padded_dense_causal(B, H, QL, KL, g):
    seq_len = torch.arange(B, dtype=torch.int32) + 1

    def njt_score_mod(qk, b, h, q, kv):
        return torch.where(qk <= seq_len[b], _causal(qk, b, h, q, kv), -float("inf"))
    return njt_score_mod, None, {}


def pt_captured_scale(B, H, QL, KL, g):
    scale = torch.ones((), dtype=torch.int32)

    def score_mod_scale(qk, b, h, q, kv):
        return qk + scale
    return score_mod_scale, None, {}


def pt_captured_reduction(B, H, QL, KL, g):
    scale = _randn(g, B, 8, scale=0.2, grad=True)

    def score_mod_scale(qk, b, h, q, kv):
        return qk + scale[b].sum(dim=-1)
    return score_mod_scale, None, {"scale": scale}


def pt_njt_causal(B, H, QL, KL, g):
    offsets = torch.tensor([0, 24, 36, QL], dtype=torch.int32)
    seq_idx = _doc_ids(offsets)

    def njt_score_mod(qk, b, h, q, kv):
        return _causal(qk, b, h, q - offsets[seq_idx[q]], kv - offsets[seq_idx[kv]])
    return njt_score_mod, None, {}


def pt_new_zeros(B, H, QL, KL, g):
    attn_mask = torch.ones(B, 1, QL, KL, dtype=torch.bool).tril()

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + attn_mask[b, h.new_zeros(h.shape), q_idx, kv_idx]

    def causal(b, h, q_idx, kv_idx):
        return attn_mask[b, h.new_zeros(h.shape), q_idx, kv_idx]
    return score_mod, causal, {}


def pt_euclidean(B, H, QL, KL, g):
    means = _randn(g, max(QL, KL), 3)
    length_scales = torch.logspace(0.001, 0.1, H)

    def euclidean_dist_pos_embed(score, b, h, q_idx, k_idx):
        dist = (means[q_idx] - means[k_idx]).pow(2).sum(-1).sqrt()
        return torch.exp(-dist / length_scales[h]) * score
    return euclidean_dist_pos_embed, None, {}


def pt_input_lengths(B, H, QL, KL, g):
    lengths = torch.randint(QL // 2, QL + 1, (B,), generator=g, dtype=torch.int32)

    def _flex_attention_mask(b, h, q_idx, kv_idx, input_lengths):
        return (q_idx < input_lengths[b]) & (kv_idx < input_lengths[b])
    return None, functools.partial(_flex_attention_mask, input_lengths=lengths), {}


def pt_autograd_function(B, H, QL, KL, g):
    class ApplyMask(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(a, mask):
            return torch.where(mask, a, -float("inf"))

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.mark_non_differentiable(inputs[1])

        @staticmethod
        def backward(ctx, i):
            return i, None

    def score_mod(score, b, h, q, kv):
        return ApplyMask.apply(score, q <= kv)
    return score_mod, None, {}


def pt_fully_masked_rows(B, H, QL, KL, g):
    M = QL // 2

    def mask_mod(b, h, q, kv):
        return q < M
    return None, mask_mod, {}


def pt_block_mask_non_divisible(B, H, QL, KL, g):
    seq = torch.arange(QL) // 16

    def mod(b, h, q, kv):
        return seq[q] == seq[kv]
    return None, mod, {}


class _ModuleBias(torch.nn.Module):
    """A module whose score_mod is a method reading its parameters."""

    def __init__(self, H, g):
        super().__init__()
        self.rel_bias = torch.nn.Parameter(0.3 * torch.randn(H, 32, generator=g))
        self.cap = 4.0

    def score_mod(self, score, b, h, q_idx, kv_idx):
        x = score + self.rel_bias[h, torch.clamp(kv_idx - q_idx + 16, 0, 31)]
        return self.cap * torch.tanh(x / self.cap)


def own_module_method(B, H, QL, KL, g):
    m = _ModuleBias(H, g)
    return m.score_mod, causal_mask, {"rel_bias": m.rel_bias}


MODS = [
    Mod("alibi", "attention-gym", gym_alibi),
    Mod("softcap", "attention-gym", gym_softcap),
    Mod("activation_gelu", "attention-gym", gym_activation(F.gelu)),
    Mod("activation_relu", "attention-gym", gym_activation(F.relu)),
    Mod("activation_sigmoid", "attention-gym", gym_activation(torch.sigmoid)),
    Mod("sandwich", "attention-gym", gym_sandwich),
    Mod("graphormer_spatial", "attention-gym", gym_graphormer_spatial, learn=("spatial_bias",)),
    Mod("graphormer_edge", "attention-gym", gym_graphormer_edge, learn=("edge_bias",)),
    Mod("mla_rope", "attention-gym", gym_mla_rope),
    Mod("sliding_window", "attention-gym", gym_sliding_window),
    Mod("dilated_sliding_window", "attention-gym", gym_dilated_sliding_window),
    Mod("prefix_lm", "attention-gym", gym_prefix_lm),
    Mod("document", "attention-gym", gym_document),
    Mod("packed_causal_document", "attention-gym", gym_packed_causal_document),
    Mod("shared_prefix", "attention-gym", gym_shared_prefix),
    Mod("natten", "attention-gym", gym_natten),
    Mod("tiled_natten", "attention-gym", gym_tiled_natten),
    Mod("global_sliding_window", "attention-gym", gym_global_sliding_window),
    Mod("flamingo", "attention-gym", gym_flamingo),
    Mod("batchify", "attention-gym", gym_batchify),
    Mod("block_diffusion", "attention-gym", gym_block_diffusion),
    Mod("jetspec_tree", "attention-gym", gym_jetspec_tree, q_len=24, kv_len=64),
    Mod("jetspec_training", "attention-gym", gym_jetspec_training, q_len=32, kv_len=64),
    Mod("sta_2d", "attention-gym", gym_sta),
    Mod("svg_spatial", "attention-gym", gym_svg_spatial),
    Mod("svg_temporal", "attention-gym", gym_svg_temporal),
    Mod("vsa_topk", "attention-gym", gym_vsa_topk),
    Mod("vsa_block_map", "attention-gym", gym_vsa_block_map),
    Mod("times_two", "pytorch-tests", _plain(_times_two)),
    Mod("squared", "pytorch-tests", _plain(_squared)),
    Mod("causal", "pytorch-tests", _plain(_causal, causal_mask)),
    Mod("inverse_causal", "pytorch-tests", _plain(_inverse_causal,
                                                  lambda b, h, q, kv: q <= kv)),
    Mod("rel_bias", "pytorch-tests", _plain(_rel_bias)),
    Mod("rel_causal", "pytorch-tests", _plain(_rel_causal, causal_mask)),
    Mod("trig", "pytorch-tests", _plain(_trig)),
    Mod("trig2", "pytorch-tests", _plain(_trig2)),
    Mod("skip_odd_keys", "pytorch-tests", _plain(_skip_odd_keys)),
    Mod("function_composition", "pytorch-tests", _plain(_composed)),
    Mod("silu", "pytorch-tests", _plain(_silu)),
    Mod("floor_div", "pytorch-tests", _plain(pt_floor_div)),
    Mod("head_offset", "pytorch-tests", pt_head_offset, learn=("head_offset",)),
    Mod("captured_buffers_all_dims", "pytorch-tests", pt_all_bias,
        learn=("head_scale", "batch_scale", "tok_scale")),
    Mod("document_causal", "pytorch-tests", pt_document_causal),
    Mod("index_multiple", "pytorch-tests", pt_index_multiple, learn=("bias",)),
    Mod("index_weird1", "pytorch-tests", pt_index_weird1, learn=("bias",)),
    Mod("index_weird2", "pytorch-tests", pt_index_weird2, learn=("bias",)),
    Mod("seq_masking", "pytorch-tests", pt_seq_masking),
    Mod("bias_seq_batch", "pytorch-tests", pt_bias_seq_batch, learn=("bias",)),
    Mod("bias_head_seq_batch", "pytorch-tests", pt_bias_head_seq_batch, learn=("bias",)),
    Mod("rel_bias_1d", "pytorch-tests", pt_rel_bias_1d, learn=("rel_bias",)),
    Mod("rel_pos_3d_transposed", "pytorch-tests", pt_rel_pos_3d_transposed, learn=("bias",)),
    Mod("dependent_causal_bidirectional", "pytorch-tests", pt_dependent_causal_bidirectional),
    Mod("natten_2d", "pytorch-tests", pt_natten_2d),
    Mod("padded_dense_causal", "pytorch-tests", pt_padded_dense_causal),
    Mod("captured_scale", "pytorch-tests", pt_captured_scale),
    Mod("captured_reduction", "pytorch-tests", pt_captured_reduction, learn=("scale",)),
    Mod("njt_causal", "pytorch-tests", pt_njt_causal),
    Mod("new_zeros", "pytorch-tests", pt_new_zeros),
    Mod("euclidean_dist", "pytorch-tests", pt_euclidean),
    Mod("input_lengths_partial", "pytorch-tests", pt_input_lengths),
    Mod("autograd_function", "pytorch-tests", pt_autograd_function),
    Mod("fully_masked_rows", "pytorch-tests", pt_fully_masked_rows),
    Mod("block_mask_non_divisible", "pytorch-tests", pt_block_mask_non_divisible,
        q_len=63, kv_len=63),
    Mod("module_method", "flexc", own_module_method, learn=("rel_bias",)),
]

BY_NAME = {m.name: m for m in MODS}
