"""The Triton kernel of paged varlen attention; engine/ops/varlen_attention.py is its Python face, plan and
reference (read that first). Imported on first use: importing Triton costs ~0.5 s, and the interpreter
(TRITON_INTERPRET=1, CPU tests) must be chosen before Triton is imported.

A query tile walks its keys in three runs of BLOCK_N-key tiles: the keys every row sees (no mask), the
diagonal tiles inside the context (causal mask), and at most one tile that crosses the end of the context
(causal and length masks). With TMA (sm_90, KV blocks a multiple of BLOCK_N) the first two runs copy each K
and V tile out of its cache block with one tensor-descriptor load; the crossing tile, and everything without
TMA, loads through per-key pointers with masks (a cache slot past the context is never read: it may hold
anything, NaN included).

RESUME: the attention of each query over its own chunk is already in O (normalised) with its log-sum-exp in LSE
(computed by cuDNN's flash attention, ``varlen_attention.chunk_self_attention``); the kernel walks only the cached
prefix, which every row of the chunk sees whole (unmasked tiles and one tile cut by the prefix's end), and merges
that state into its own at the end by the two log-sum-exps.

FP8: the caches hold e4m3 values (--kv-cache-dtype fp8) with a float32 scale each (K_SCALE, V_SCALE in device
memory): each K / V tile is converted to q's dtype after its load, the key scale folded into the exponent's
multiply-add and the value scale applied to the accumulator before any merge (the softmax weights do not depend on
it). The host keeps TMA off for such caches (pointer loads). (Starting the online softmax from the chunk's state
instead, or other tile shapes, warps and stages, made Triton 3.6's ptxas die with SIGSEGV on the TMA
specialisation; this form with the sm_90 configuration compiles: probe of 2026-12-02.)"""

import triton
import triton.language as tl


@triton.jit
def _online_softmax(s, v, m_i, l_i, acc, qk_scale, PRECISION: tl.constexpr):
    """One tile's raw scores s = q.k into the running max m_i (log2 units), sum l_i and output acc; the scale
    (softmax scale * log2 e) is folded into the exponent's one multiply-add."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = tl.math.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
    return m_new, l_i, acc


# Arguments that change from step to step: Triton would compile a variant per value class (a pointer's or an int's
# divisibility by 16, an int equal to 1), so a serving run met fresh compiles in the middle of its steps (slices of
# one packed upload start at any 4-byte offset; the block table's width and the chunk's log-sum-exp stride follow
# the step). The kernel loads through them a scalar or a row at a time, where alignment buys nothing.
STEP_VARYING_ARGS = ["BLOCK_TABLES", "SEQ_LENS", "QUERY_START", "TILE_SEQ", "TILE_START", "stride_lt", "stride_lh",
                     "stride_bt"]


@triton.jit(do_not_specialize=STEP_VARYING_ARGS)
def varlen_paged_attention_kernel(
    Q, K, V, K_DESC, V_DESC, O, LSE, BLOCK_TABLES, SEQ_LENS, QUERY_START, TILE_SEQ, TILE_START, K_SCALE, V_SCALE,
    qk_scale,  # softmax scale * log2(e)
    stride_qt, stride_qh, stride_ot, stride_oh, stride_lt, stride_lh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
    QUERIES_PER_KV: tl.constexpr, CACHE_BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, DOT_F32: tl.constexpr,
    WIDE: tl.constexpr,  # a cache of 2**31 elements or more: block offsets in 64 bits
    TMA: tl.constexpr,  # K_DESC / V_DESC: tensor descriptors of the caches as [blocks * CACHE_BLOCK, nkv * hd]
    RESUME: tl.constexpr,  # O and LSE hold each row's attention over its own chunk: merge in the cached prefix
    FP8: tl.constexpr = False,  # e4m3 caches: K_SCALE / V_SCALE point at their float32 scales
):
    tile = tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.load(TILE_SEQ + tile)
    row0 = tl.load(TILE_START + tile)
    q_begin = tl.load(QUERY_START + seq)
    q_len = tl.load(QUERY_START + seq + 1) - q_begin
    ctx = tl.load(SEQ_LENS + seq)
    prefix = ctx - q_len
    kv_head = head // QUERIES_PER_KV

    rows = row0 + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < q_len
    dim_ok = dims < HEAD_DIM
    q = tl.load(Q + (q_begin + rows)[:, None] * stride_qt + head * stride_qh + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    if DOT_F32:  # Triton's interpreter computes bf16 dots wrongly: upcast there
        q = q.to(tl.float32)
    if FP8:  # the keys' scale into the exponent's multiply-add (scores are q . k_stored * k_scale)
        qk_scale = qk_scale * tl.load(K_SCALE)
    q_pos = prefix + rows  # absolute positions of the tile's rows
    table = BLOCK_TABLES + seq * stride_bt

    o_ptrs = O + (q_begin + rows)[:, None] * stride_ot + head * stride_oh + dims[None, :]
    o_mask = row_ok[:, None] & dim_ok[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if RESUME:  # the prefix's keys first (all before every row), the chunk's own state merged at the end
        ctx = prefix
        full_end = prefix // BLOCK_N * BLOCK_N
        end = prefix
    else:
        full_end = (prefix + row0) // BLOCK_N * BLOCK_N  # keys before it: every row of the tile sees them
        end = tl.minimum(ctx, prefix + row0 + BLOCK_M)  # keys from it on: no row sees them
    mid = full_end  # [mid, end): the tiles loaded through pointers with masks
    if TMA:  # a key tile lies in one cache block (CACHE_BLOCK % BLOCK_N == 0): one bulk copy each of K and V
        for start in range(0, full_end, BLOCK_N):
            row = tl.load(table + start // CACHE_BLOCK) * CACHE_BLOCK + start % CACHE_BLOCK
            k = K_DESC.load([row, kv_head * HEAD_DIM]).T
            v = V_DESC.load([row, kv_head * HEAD_DIM])
            if FP8:
                k = k.to(q.dtype)
                v = v.to(q.dtype)
            elif DOT_F32:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            s = tl.dot(q, k, input_precision=PRECISION)
            m_i, l_i, acc = _online_softmax(s, v, m_i, l_i, acc, qk_scale, PRECISION)
        mid = tl.maximum(full_end, tl.minimum(end, ctx // BLOCK_N * BLOCK_N))
        for start in range(full_end, mid, BLOCK_N):  # diagonal tiles inside the context: the causal mask only
            row = tl.load(table + start // CACHE_BLOCK) * CACHE_BLOCK + start % CACHE_BLOCK
            k = K_DESC.load([row, kv_head * HEAD_DIM]).T
            v = V_DESC.load([row, kv_head * HEAD_DIM])
            if FP8:
                k = k.to(q.dtype)
                v = v.to(q.dtype)
            elif DOT_F32:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            cols = start + tl.arange(0, BLOCK_N)
            s = tl.dot(q, k, input_precision=PRECISION)
            s = tl.where(cols[None, :] <= q_pos[:, None], s, float("-inf"))
            m_i, l_i, acc = _online_softmax(s, v, m_i, l_i, acc, qk_scale, PRECISION)
    else:
        for start in range(0, full_end, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            blk = tl.load(table + cols // CACHE_BLOCK)
            if WIDE:
                blk = blk.to(tl.int64)
            slot = cols % CACHE_BLOCK
            k = tl.load(K + (blk * stride_kb + slot * stride_ks + kv_head * stride_kh)[None, :] + dims[:, None],
                        mask=dim_ok[:, None], other=0.0)
            v = tl.load(V + (blk * stride_vb + slot * stride_vs + kv_head * stride_vh)[:, None] + dims[None, :],
                        mask=dim_ok[None, :], other=0.0)
            if FP8:
                k = k.to(q.dtype)
                v = v.to(q.dtype)
            elif DOT_F32:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            s = tl.dot(q, k, input_precision=PRECISION)
            m_i, l_i, acc = _online_softmax(s, v, m_i, l_i, acc, qk_scale, PRECISION)

    for start in range(mid, end, BLOCK_N):  # the causal mask and the end of the context
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < ctx
        blk = tl.load(table + cols // CACHE_BLOCK, mask=col_ok, other=0)
        if WIDE:
            blk = blk.to(tl.int64)
        slot = cols % CACHE_BLOCK
        k = tl.load(K + (blk * stride_kb + slot * stride_ks + kv_head * stride_kh)[None, :] + dims[:, None],
                    mask=dim_ok[:, None] & col_ok[None, :], other=0.0)
        v = tl.load(V + (blk * stride_vb + slot * stride_vs + kv_head * stride_vh)[:, None] + dims[None, :],
                    mask=dim_ok[None, :] & col_ok[:, None], other=0.0)
        if FP8:
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        elif DOT_F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, k, input_precision=PRECISION)
        s = tl.where((cols[None, :] <= q_pos[:, None]) & col_ok[None, :], s, float("-inf"))
        m_i, l_i, acc = _online_softmax(s, v, m_i, l_i, acc, qk_scale, PRECISION)

    if FP8:  # the values' scale, before the chunk's own state is merged in
        acc = acc * tl.load(V_SCALE)
    if RESUME:
        lse2 = tl.load(LSE + (q_begin + rows) * stride_lt + head * stride_lh, mask=row_ok, other=0.0) * 1.4426950408889634
        m_f = tl.maximum(m_i, lse2)
        a = tl.math.exp2(m_i - m_f)
        b = tl.math.exp2(lse2 - m_f)
        prev = tl.load(o_ptrs, mask=o_mask, other=0.0).to(tl.float32)
        acc = acc * a[:, None] + prev * b[:, None]
        l_i = l_i * a + b
    acc = acc / l_i[:, None]
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=o_mask)
