"""The Triton kernels of engine/ops/quant_linear.py (imported only where Triton is installed).

Integer weights (IntWeight, engine/weight_quant.py): 4-bit codes in one plane of nibbles, 8-bit codes in two (the
high nibble, then the low), laid out per chunk of 128 K positions as 16 int32 words per plane, nibble i of word j
holding position 16 i + j of the chunk. So nibble i of a [BLOCK_N, 16] tile of words is the [BLOCK_N, 16] tile of
weights at chunk positions 16 i .. 16 i + 15, and an OR with the bits of 128.0 (bf16; 1024.0 in fp16) turns four
nibbles into two exact 16-bit floats 128 + c per instruction pair (``lop3`` then an unpack: no int-to-float
conversion, whose units are a sixteenth of the FMA rate): the tensor cores multiply x by 128 + c, and the group's
zero point absorbs the 128.

Float8 weights (Fp8Weight): e4m3 values [N, K] converted to x's dtype in registers; the scale of output row n and K
group g at ``s_ptr + (n // S_ROWS) * stride_sn + g * stride_sg`` (per tensor: both strides 0; 128 x 128 blocks:
S_ROWS = 128).
"""

from __future__ import annotations

import triton
import triton.language as tl


def _nibbles_asm(magic: int) -> str:
    """PTX turning a word's 8 nibbles into 8 16-bit floats magic + c: four (shift, lop3 (a & b) | c) pairs, each
    giving nibbles i and i + 4 as the two halves of one register."""
    steps = []
    for i in range(4):
        src = "$8" if i == 0 else "t"
        shift = "" if i == 0 else f"shr.u32 t, $8, {4 * i};\n"
        steps.append(f"{shift}lop3.b32 t, {src}, 0x000F000F, 0x{magic:04X}{magic:04X}, 0xEA;\n"
                     f"mov.b32 {{${i}, ${i + 4}}}, t;\n")
    return "{\n.reg .b32 t;\n" + "".join(steps) + "}"


_ASM_BF16: tl.constexpr = tl.constexpr(_nibbles_asm(0x4300))  # bf16 128.0: 128 + c exactly
_ASM_F16: tl.constexpr = tl.constexpr(_nibbles_asm(0x6400))  # fp16 1024.0: 1024 + c exactly


@triton.jit
def _nibbles_f32(words, OFF: tl.constexpr):
    """The same values by plain integer ops in float32 (Triton's interpreter runs no PTX)."""
    return ((words & 0xF).to(tl.float32) + OFF, ((words >> 4) & 0xF).to(tl.float32) + OFF,
            ((words >> 8) & 0xF).to(tl.float32) + OFF, ((words >> 12) & 0xF).to(tl.float32) + OFF,
            ((words >> 16) & 0xF).to(tl.float32) + OFF, ((words >> 20) & 0xF).to(tl.float32) + OFF,
            ((words >> 24) & 0xF).to(tl.float32) + OFF, ((words >> 28) & 0xF).to(tl.float32) + OFF)


@triton.jit
def _nibbles(words, IS_F16: tl.constexpr, INTERPRET: tl.constexpr, OFF: tl.constexpr):
    if INTERPRET:
        return _nibbles_f32(words, OFF)
    elif IS_F16:
        return tl.inline_asm_elementwise(asm=_ASM_F16, constraints="=h,=h,=h,=h,=h,=h,=h,=h,r", args=[words],
                                         dtype=(tl.float16,) * 8, is_pure=True, pack=1)
    else:
        return tl.inline_asm_elementwise(asm=_ASM_BF16, constraints="=h,=h,=h,=h,=h,=h,=h,=h,r", args=[words],
                                         dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)


@triton.jit
def _apply(acc, part, part_lo, xacc, s_ptr, z_ptr, rn, nmask, g, stride_sn, stride_zn, PLANES: tl.constexpr,
           OFF: tl.constexpr):
    """acc + (sum_k x_k (c_k - z)) * s for one group: part holds sum x (OFF + c) (two planes: 16 x the high
    nibbles' plus the low nibbles'), xacc the group's x summed elementwise over its 16-position slices."""
    s = tl.load(s_ptr + rn * stride_sn + g, mask=nmask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + rn * stride_zn + g, mask=nmask, other=0).to(tl.float32)
    if PLANES == 2:
        tot = part * 16.0 + part_lo
        corr = z + 17.0 * OFF
    else:
        tot = part
        corr = z + OFF
    xs = tl.sum(xacc, axis=1)
    return acc + (tot - xs[:, None] * corr[None, :]) * s[None, :]


@triton.jit
def int_mm_kernel(x_ptr, q_ptr, s_ptr, z_ptr, b_ptr, y_ptr, M, N, K, G, stride_xm, stride_ym, stride_qn, stride_sn,
                  stride_zn, PLANES: tl.constexpr, GROUP: tl.constexpr, PER_ROW: tl.constexpr, HAS_BIAS: tl.constexpr,
                  PDL: tl.constexpr, IS_F16: tl.constexpr, INTERPRET: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """y = x @ W^T (+ bias) for integer weights, x [M, K]: program (i, j) computes rows j * BLOCK_M .. of output
    columns i * BLOCK_N .., streaming those BLOCK_N rows of codes once, one chunk of 128 K positions per step of one
    flat (software-pipelined) loop, as 8 tensor-core products of 16 positions. Scales and zero points: per group of
    GROUP = 16 / 32 / 64 positions within the chunk, per chunk for groups of a multiple of 128 (each chunk's sums
    scaled by its group's scale: the same sum), or once at the end (PER_ROW: one group per output row; x is read as
    zero past K, the last chunk's padding)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    OFF: tl.constexpr = 1024.0 if IS_F16 else 128.0
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    mmask = rm < M
    rj = tl.arange(0, 16)
    qrows = q_ptr + rn.to(tl.int64)[:, None] * stride_qn
    xrows = x_ptr + rm[:, None] * stride_xm
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    part = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    part_lo = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # x summed elementwise over the slices since the last scale: one reduction per group, not one per product
    xacc = tl.zeros([BLOCK_M, 16], dtype=tl.float32)
    for k0 in range(0, K, 128):
        words = tl.load(qrows + (k0 // 128) * 16 * PLANES + rj[None, :], mask=nmask[:, None], other=0)
        hi = _nibbles(words, IS_F16, INTERPRET, OFF)
        if PLANES == 2:
            lo = _nibbles(tl.load(qrows + (k0 // 128) * 32 + 16 + rj[None, :], mask=nmask[:, None], other=0),
                          IS_F16, INTERPRET, OFF)
        for i in tl.static_range(8):
            kk = k0 + 16 * i + rj
            xi = tl.load(xrows + kk[None, :], mask=mmask[:, None] & (kk < K)[None, :], other=0.0)
            if INTERPRET:
                xi = xi.to(tl.float32)
                part = tl.dot(xi, tl.trans(hi[i]), part, input_precision="ieee")
                if PLANES == 2:
                    part_lo = tl.dot(xi, tl.trans(lo[i]), part_lo, input_precision="ieee")
            else:
                part = tl.dot(xi, tl.trans(hi[i]), part)
                if PLANES == 2:
                    part_lo = tl.dot(xi, tl.trans(lo[i]), part_lo)
            xacc += xi.to(tl.float32)
            if GROUP < 128:
                if (i + 1) * 16 % GROUP == 0:
                    g = tl.minimum((k0 + 16 * i) // GROUP, G - 1)  # past K (padding): any finite scale
                    acc = _apply(acc, part, part_lo, xacc, s_ptr, z_ptr, rn, nmask, g, stride_sn, stride_zn, PLANES,
                                 OFF)
                    part = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                    part_lo = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                    xacc = tl.zeros([BLOCK_M, 16], dtype=tl.float32)
        if GROUP >= 128 and not PER_ROW:
            acc = _apply(acc, part, part_lo, xacc, s_ptr, z_ptr, rn, nmask, k0 // GROUP, stride_sn, stride_zn, PLANES,
                         OFF)
            part = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            part_lo = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            xacc = tl.zeros([BLOCK_M, 16], dtype=tl.float32)
    if PER_ROW:
        acc = _apply(acc, part, part_lo, xacc, s_ptr, z_ptr, rn, nmask, 0, stride_sn, stride_zn, PLANES, OFF)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=mmask[:, None] & nmask[None, :])


@triton.jit
def _magic_codes(words, SHIFT: tl.constexpr):
    """Nibble SHIFT / 4 of each word as the float32 2**23 + c (the code in the mantissa of 2**23: an OR, no
    int-to-float conversion)."""
    return (((words >> SHIFT) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True)


@triton.jit
def int_gemv_kernel(x_ptr, q_ptr, s_ptr, z_ptr, b_ptr, y_ptr, N, K, G, stride_qn, stride_sn, stride_zn,
                    PLANES: tl.constexpr, GROUP: tl.constexpr, PER_ROW: tl.constexpr, HAS_BIAS: tl.constexpr,
                    PDL: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr):
    """y = x @ W^T (+ bias) for one row of x and integer weights, without the tensor cores (whose operand layout
    would cost a trip through shared memory for the whole tile): per weight, its code as 2**23 + c (OR), minus
    2**23 + z (exact), times x, accumulated in a [BLOCK_N, 16] float32 tile; each group's tile is scaled as it
    ends, reduced over K once at the end. CHUNKS chunks of 128 positions per loop step (more bytes in flight)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    MAGIC: tl.constexpr = 8388608.0
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    rj = tl.arange(0, 16)
    qrows = q_ptr + rn.to(tl.int64)[:, None] * stride_qn
    acc = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
    part = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
    zrow = tl.load(z_ptr + rn * stride_zn, mask=nmask, other=0).to(tl.float32)  # PER_ROW: the one zero point
    for k00 in range(0, K, 128 * CHUNKS):
        for c in tl.static_range(CHUNKS):
            k0 = k00 + 128 * c
            cmask = nmask[:, None] & ((rj * 0 + k0) < K)[None, :]
            words = tl.load(qrows + (k0 // 128) * 16 * PLANES + rj[None, :], mask=cmask, other=0)
            if PLANES == 2:
                words_lo = tl.load(qrows + (k0 // 128) * 32 + 16 + rj[None, :], mask=cmask, other=0)
            if GROUP >= 128 and not PER_ROW:
                g = tl.minimum(k0 // GROUP, G - 1)  # a chunk past K (CHUNKS > 1): any finite scale
                zrow = tl.load(z_ptr + rn * stride_zn + g, mask=nmask, other=0).to(tl.float32)
            for i in tl.static_range(8):
                if GROUP < 128:
                    if (16 * i) % GROUP == 0:
                        gi = tl.minimum((k0 + 16 * i) // GROUP, G - 1)
                        zrow = tl.load(z_ptr + rn * stride_zn + gi, mask=nmask, other=0).to(tl.float32)
                kk = k0 + 16 * i + rj
                xv = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
                if PLANES == 2:
                    cv = (_magic_codes(words, 4 * i) - MAGIC) * 16.0 + (_magic_codes(words_lo, 4 * i) - MAGIC)
                    d = cv - zrow[:, None]
                else:
                    d = _magic_codes(words, 4 * i) - (zrow[:, None] + MAGIC)
                part += d * xv[None, :]
                if GROUP < 128:
                    if (16 * (i + 1)) % GROUP == 0:
                        gi = tl.minimum((k0 + 16 * i) // GROUP, G - 1)
                        s = tl.load(s_ptr + rn * stride_sn + gi, mask=nmask, other=0.0).to(tl.float32)
                        acc += part * s[:, None]
                        part = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
            if GROUP >= 128 and not PER_ROW:
                s = tl.load(s_ptr + rn * stride_sn + g, mask=nmask, other=0.0).to(tl.float32)
                acc += part * s[:, None]
                part = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
    if PER_ROW:
        acc = part * tl.load(s_ptr + rn * stride_sn, mask=nmask, other=0.0).to(tl.float32)[:, None]
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
    tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=nmask)


@triton.jit
def int_dequantize_kernel(q_ptr, s_ptr, z_ptr, perm_ptr, w_ptr, N, K, stride_qn, stride_sn, stride_zn,
                          PLANES: tl.constexpr, GROUP: tl.constexpr, HAS_PERM: tl.constexpr, BLOCK_N: tl.constexpr):
    """W [N, K] in w_ptr's dtype, one chunk of 128 positions of BLOCK_N rows per program (any group size: each
    position looks up its group); act-order weights (HAS_PERM) go back to the checkpoint's order: stored position
    k to column perm[k]."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * 128
    nmask = rn < N
    rj = tl.arange(0, 16)
    qrows = q_ptr + rn.to(tl.int64)[:, None] * stride_qn + (k0 // 128) * 16 * PLANES + rj[None, :]
    hi = _nibbles_f32(tl.load(qrows, mask=nmask[:, None], other=0), 0.0)
    if PLANES == 2:
        lo = _nibbles_f32(tl.load(qrows + 16, mask=nmask[:, None], other=0), 0.0)
    for i in tl.static_range(8):
        kk = k0 + 16 * i + rj
        kmask = kk < K
        if PLANES == 2:
            c = hi[i] * 16.0 + lo[i]
        else:
            c = hi[i]
        g = kk // GROUP
        m2 = nmask[:, None] & kmask[None, :]
        s = tl.load(s_ptr + rn[:, None] * stride_sn + g[None, :], mask=m2, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + rn[:, None] * stride_zn + g[None, :], mask=m2, other=0).to(tl.float32)
        w = (c - z) * s
        col = tl.load(perm_ptr + kk, mask=kmask, other=0) if HAS_PERM else kk
        tl.store(w_ptr + rn.to(tl.int64)[:, None] * K + col[None, :], w.to(w_ptr.dtype.element_ty), mask=m2)


@triton.jit
def fp8_mm_kernel(x_ptr, q_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_ym, stride_sn, stride_sg,
                  GROUP: tl.constexpr, S_ROWS: tl.constexpr, HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
                  F32_DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y = x @ W^T (+ bias) for e4m3 weights: program (i, j) computes rows j * BLOCK_M .. of output columns
    i * BLOCK_N ..; per scale group (GROUP positions: 128 for blocks, K per channel / tensor) the values go through
    the tensor cores in x's dtype (exact: e4m3 fits bf16 and fp16) and the scale multiplies the group's sums.
    BLOCK_K divides GROUP, GROUP divides K. F32_DOT: float32 products (the interpreter, whose bf16 dot is wrong)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    mmask = rm < M
    srow = rn // S_ROWS
    rows = rn.to(tl.int64)[:, None] * K
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for g0 in range(0, K, GROUP):
        part = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for t in range(0, GROUP, BLOCK_K):
            kk = g0 + t + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=mmask[:, None], other=0.0)
            # rows past N are left undefined: they reach only outputs that are not stored
            w = tl.load(q_ptr + rows + kk[None, :], mask=nmask[:, None]).to(tl.float32)
            if F32_DOT:
                part = tl.dot(x.to(tl.float32), tl.trans(w), part, input_precision="ieee")
            else:
                part = tl.dot(x, tl.trans(w.to(x.dtype)), part)
        s = tl.load(s_ptr + srow * stride_sn + (g0 // GROUP) * stride_sg, mask=nmask, other=0.0).to(tl.float32)
        acc += part * s[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=mmask[:, None] & nmask[None, :])


@triton.jit
def fp8_dequantize_kernel(q_ptr, s_ptr, w_ptr, N, K, stride_sn, stride_sg, GROUP: tl.constexpr, S_ROWS: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """W [N, K] in w_ptr's dtype from e4m3 values and their scales, one [BLOCK_N, BLOCK_K] tile per program
    (BLOCK_K divides GROUP)."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    nmask = rn < N
    kk = k0 + tl.arange(0, BLOCK_K)
    rows = rn.to(tl.int64)[:, None] * K
    w = tl.load(q_ptr + rows + kk[None, :], mask=nmask[:, None]).to(tl.float32)
    s = tl.load(s_ptr + (rn // S_ROWS) * stride_sn + (k0 // GROUP) * stride_sg, mask=nmask, other=0.0).to(tl.float32)
    tl.store(w_ptr + rows + kk[None, :], (w * s[:, None]).to(w_ptr.dtype.element_ty), mask=nmask[:, None])


@triton.jit
def fp8_per_token_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, BLOCK_K: tl.constexpr):
    """One row of x per program: its absmax / 448 into s_ptr[row] (float32; 1 for a zero row), the row divided by
    it and rounded to e4m3 into q_ptr (contiguous rows). Two passes over the row (it stays in L1/L2)."""
    row = tl.program_id(0)
    xr = x_ptr + row.to(tl.int64) * stride_xm
    amax = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        amax = tl.maximum(amax, tl.abs(tl.load(xr + kk, mask=kk < K, other=0.0).to(tl.float32)))
    m = tl.max(amax, axis=0)
    scale = tl.where(m > 0, m / 448.0, 1.0)
    tl.store(s_ptr + row, scale)
    qr = q_ptr + row.to(tl.int64) * K
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        v = tl.load(xr + kk, mask=kk < K, other=0.0).to(tl.float32) / scale
        v = tl.minimum(tl.maximum(v, -448.0), 448.0)
        tl.store(qr + kk, v.to(q_ptr.dtype.element_ty), mask=kk < K)
