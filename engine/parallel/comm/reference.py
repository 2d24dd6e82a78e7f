"""Pure-torch references of the communication kernels in csrc/comm (CPU and CUDA), bit for bit, and the
error bounds each all-reduce strategy promises against a float64 sum.

Numerics of every strategy's reduction (the kernels, these references and the CUDA kernels agree exactly):

- exact strategies (host, nccl/gloo): the sum of the ranks' values in rank order in fp32, rounded once to
  the dtype; every rank ends with the same bits.
- int8 (group size ``GROUP`` = 128 consecutive elements of the flattened message): each rank rotates every
  group with an unnormalised Walsh-Hadamard transform ``v = H x`` (fp32 butterflies, stages h = 1..64), then
  quantises ``q = round_half_even(v * (127 / absmax(v)))``, ``scale = absmax(v) / 127`` (fp32); the owner of
  a part sums ``q_r * scale_r`` over the ranks in fp32 (rank order) and requantises the sum the same way -
  still in the rotated domain, H being linear; everybody dequantises and rotates back,
  ``x = H (q * scale) / 128``, into the dtype.

Why the rotation: decoder MLP outputs carry a few "massive" channels (hundreds of times the others); with
plain absmax the one outlier of a group sets its step and the 127 other values round to nothing. H spreads
every channel over the whole group (QuaRot's trick). Measured on SmolLM2-135M at TP=3 (fp32, the text of
tests/parallel/test_int8_ppl.py): perplexity 22.382 exact; plain absmax int8 21.85 at group 128 (-2.4%),
22.13 at 64, 22.20 at 32, 22.45 at 16; rotated 22.375 at 128 (-0.03%).

Why 128: with the rotation a larger group spreads an outlier thinner, and the fp32 scale costs 4 bytes per
group - 3% on top of the int8 payload (6% at 64, 12.5% at 32) - so a message moves 1.03 bytes per element
instead of 2 (bf16) or 4 (fp32); the transform costs log2(128) = 7 add/sub stages per element, in registers:
128 = one CUDA warp x 4 elements (butterflies by __shfl_xor across lanes), 8 AVX-512 / 16 AVX2 registers.
"""

from __future__ import annotations

import torch

GROUP = 128


# ---------------------------------------------------------------------------------------------------
# kernels


def reduce_sum(srcs: list[torch.Tensor], dtype: torch.dtype | None = None) -> torch.Tensor:
    """dtype(sum of srcs in order, fp32)."""
    acc = srcs[0].float().clone()
    for s in srcs[1:]:
        acc = acc + s.float()
    return acc.to(dtype or srcs[0].dtype)


def fwht(v: torch.Tensor) -> torch.Tensor:
    """Unnormalised Walsh-Hadamard transform of each row of v [G, GROUP] (float32), stages h = 1, 2, ..., 64,
    pairs (i, i + h) -> (a + b, a - b): the kernels' exact order of operations."""
    rows = v.shape[0]
    h = 1
    while h < GROUP:
        w = v.reshape(rows, GROUP // (2 * h), 2, h)
        a, b = w[:, :, 0, :], w[:, :, 1, :]
        v = torch.stack([a + b, a - b], dim=2).reshape(rows, GROUP)
        h *= 2
    return v


def _quantize_groups(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """v float32 [G, GROUP] (already rotated) -> (int8 [G, GROUP], fp32 scales [G])."""
    amax = v.abs().amax(dim=1)
    inv = torch.where(amax > 0, torch.tensor(127.0, dtype=torch.float32) / amax, torch.zeros_like(amax))
    q = torch.round(v * inv[:, None]).clamp_(-128, 127).to(torch.int8)
    return q, amax / 127.0


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (any shape, f32/bf16/f16) -> (q int8 [ceil(n/128)*128] zero-padded, scales fp32 [ceil(n/128)])."""
    v = x.reshape(-1).float()
    n = v.numel()
    ng = -(-n // GROUP)
    if ng * GROUP != n:
        v = torch.cat([v, v.new_zeros(ng * GROUP - n)])
    q, s = _quantize_groups(fwht(v.view(ng, GROUP)))
    return q.reshape(-1), s


def dequant_sum_requant(qs: list[torch.Tensor], ss: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole groups: sum_k q_k * s_k (fp32, in order), requantised."""
    ng = ss[0].numel()
    acc = qs[0].view(ng, GROUP).float() * ss[0][:, None]
    for q, s in zip(qs[1:], ss[1:]):
        acc = acc + q.view(ng, GROUP).float() * s[:, None]
    q, s = _quantize_groups(acc)
    return q.reshape(-1), s


def dequantize_int8(q: torch.Tensor, s: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """First n values of H (q * s) / 128 (per group), in dtype."""
    ng = s.numel()
    v = fwht(q.view(ng, GROUP).float() * s[:, None]) * (1.0 / GROUP)
    return v.reshape(-1)[:n].to(dtype)


# ---------------------------------------------------------------------------------------------------
# whole all-reduces (what every rank must end with), for tests and the start-up correctness check


def exact_all_reduce(xs: list[torch.Tensor]) -> torch.Tensor:
    """The exact strategies' result: fp32 sum in rank order, rounded once."""
    return reduce_sum(xs)


def int8_all_reduce(xs: list[torch.Tensor], chunk_groups: int | None = None) -> torch.Tensor:
    """The int8 strategy's result (owner of each part sums and requantises; parts are whole groups, so the
    result does not depend on how the message is cut into parts or chunks)."""
    n = xs[0].numel()
    qs, ss = zip(*(quantize_int8(x) for x in xs))
    q, s = dequant_sum_requant(list(qs), list(ss))
    return dequantize_int8(q, s, n, xs[0].dtype).view(xs[0].shape)


def float64_sum(xs: list[torch.Tensor]) -> torch.Tensor:
    acc = xs[0].double().clone()
    for x in xs[1:]:
        acc += x.double()
    return acc


def _fwht64(v: torch.Tensor) -> torch.Tensor:
    rows = v.shape[0]
    h = 1
    while h < GROUP:
        w = v.reshape(rows, GROUP // (2 * h), 2, h)
        v = torch.stack([w[:, :, 0, :] + w[:, :, 1, :], w[:, :, 0, :] - w[:, :, 1, :]], dim=2).reshape(rows, GROUP)
        h *= 2
    return v


_EPS = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def error_bound(strategy: str, xs: list[torch.Tensor]) -> torch.Tensor:
    """Per-element bound on |result - float64 sum| a correct strategy keeps (float64 tensor).

    exact: (N - 1) fp32 roundings of partial sums (each <= u32 * sum|x|) plus the final rounding to the dtype
    (half an ulp: u_dtype * |sum|), with u = unit roundoff.
    dtype_sum (NCCL / gloo): partial sums may be rounded to the dtype between steps (gloo sums bf16 in bf16):
    (N - 1) roundings of u_dtype * sum|x| each, plus the final one.
    int8: in the rotated domain each rank's quantisation error is at most half a step of its group
    (s_r / 2, s_r = absmax(H x_r) / 127) and the requantised sum adds half a step of the sum's group
    (<= (absmax(H sum) + sum_r s_r / 2) / 127 / 2); rotating back (H / 128) averages 128 such errors, so an
    output element is off by at most their maximum; plus the exact part above for the fp32 arithmetic of
    the transforms (7 stages) and the final rounding to the dtype, with a 1% slack.
    """
    n = xs[0].numel()
    dtype = xs[0].dtype
    abs_sum = xs[0].double().abs().reshape(-1)
    for x in xs[1:]:
        abs_sum = abs_sum + x.double().abs().reshape(-1)
    exact_sum = float64_sum(xs).reshape(-1)
    u32, ud = _EPS[torch.float32], _EPS[dtype]
    u_step = ud if strategy == "dtype_sum" else u32
    e_sum = (len(xs) - 1) * u_step * abs_sum * (1 + 1e-6)  # roundings of the partial sums
    base = e_sum + ud * (exact_sum.abs() + e_sum) * (1 + 1e-6) + 1e-30  # + the final rounding to the dtype
    if strategy == "int8":
        ng = -(-n // GROUP)

        def rotated_absmax(v: torch.Tensor) -> torch.Tensor:
            v = v.reshape(-1).double()
            if ng * GROUP != n:
                v = torch.cat([v, v.new_zeros(ng * GROUP - n)])
            return _fwht64(v.view(ng, GROUP)).abs().amax(dim=1)

        in_err = sum(rotated_absmax(x) for x in xs) / 127.0 / 2
        out_err = (rotated_absmax(exact_sum) + in_err) / 127.0 / 2
        q_err = (in_err + out_err).repeat_interleave(GROUP)[:n]
        # fp32 transforms: 7 stages each way; a stage rounds at most u32 of the group's L1 norm and later
        # stages at most double earlier errors: <= 2 x 128 u32 L1 per transform, two transforms
        l1 = abs_sum if ng * GROUP == n else torch.cat([abs_sum, abs_sum.new_zeros(ng * GROUP - n)])
        e_fwht = (512 * u32 * l1.view(ng, GROUP).sum(dim=1)).repeat_interleave(GROUP)[:n]
        bound = (base + q_err + e_fwht) * 1.01 + ud * (exact_sum.abs() + q_err)
        return bound.view(xs[0].shape)
    return base.view(xs[0].shape)
