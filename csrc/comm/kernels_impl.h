// Generic comm kernels, written against a vector type V (W fp32 lanes) defined by the including ISA
// translation unit inside its own namespace. Included once per ISA (kernels_{scalar,avx2,avx512}.cpp).
//
// Rounding / order contract (see comm_kernels.h): fp32 arithmetic, sums in source order, no FMA, one
// rounding to the storage type at the end; int8 = round-half-even of x * (127 / absmax).
// (No include guard: included once per ISA namespace.)

template <class T>
static void reduce_t(T* out, const T* const* src, int nsrc, int64_t n) {
  constexpr int W = V::W;
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    typename V::R a0 = V::load(src[0] + i), a1 = V::load(src[0] + i + W), a2 = V::load(src[0] + i + 2 * W),
                  a3 = V::load(src[0] + i + 3 * W);
    for (int k = 1; k < nsrc; ++k) {
      const T* s = src[k] + i;
      a0 = V::add(a0, V::load(s));
      a1 = V::add(a1, V::load(s + W));
      a2 = V::add(a2, V::load(s + 2 * W));
      a3 = V::add(a3, V::load(s + 3 * W));
    }
    V::store(out + i, a0);
    V::store(out + i + W, a1);
    V::store(out + i + 2 * W, a2);
    V::store(out + i + 3 * W, a3);
  }
  for (; i + W <= n; i += W) {
    typename V::R a = V::load(src[0] + i);
    for (int k = 1; k < nsrc; ++k) a = V::add(a, V::load(src[k] + i));
    V::store(out + i, a);
  }
  for (; i < n; ++i) {
    float a = kc_to_f32(src[0][i]);
    for (int k = 1; k < nsrc; ++k) a += kc_to_f32(src[k][i]);
    kc_store(out + i, a);
  }
}

// In-place unnormalised fast Walsh-Hadamard transform of one group (kGroup = 128 values in NV registers):
// stages h = 1, 2, 4, ..., 64 in that order, pairs (i, i + h) -> (a + b, a - b). The torch reference does the
// same additions in the same order, so results are bit-identical.
static inline void fwht_regs(typename V::R* r) {
  constexpr int NV = int(kGroup) / V::W;
  for (int h = 1; h < V::W; h <<= 1)
    for (int j = 0; j < NV; ++j) r[j] = V::butterfly(r[j], h);
  for (int hv = 1; hv < NV; hv <<= 1)
    for (int j = 0; j < NV; j += 2 * hv)
      for (int k = j; k < j + hv; ++k) {
        const typename V::R a = r[k], b = r[k + hv];
        r[k] = V::add(a, b);
        r[k + hv] = V::sub(a, b);
      }
}

// Quantize one group whose fp32 values are in acc[kGroup / W] registers.
static inline void quantize_regs(const typename V::R* acc, int8_t* q, float* s) {
  constexpr int NV = int(kGroup) / V::W;
  typename V::R m = V::abs(acc[0]);
  for (int j = 1; j < NV; ++j) m = V::max(m, V::abs(acc[j]));
  const float amax = V::hmax(m);
  *s = amax / 127.0f;
  const typename V::R inv = V::set1(amax > 0.0f ? 127.0f / amax : 0.0f);
  for (int j = 0; j < NV; ++j) V::store_i8(q + j * V::W, V::mul(acc[j], inv));
}

template <class T>
static void quantize_t(const T* x, int64_t n, int8_t* q, float* s) {
  constexpr int NV = int(kGroup) / V::W;
  typename V::R acc[NV];
  for (int64_t g = 0; g < n / kGroup; ++g) {
    const T* xg = x + g * kGroup;
    for (int j = 0; j < NV; ++j) acc[j] = V::load(xg + j * V::W);
    fwht_regs(acc);  // rotate: spreads a massive channel over the whole group before the absmax
    quantize_regs(acc, q + g * kGroup, s + g);
  }
}

static void dequant_sum_requant_k(const int8_t* const* q, const float* const* s, int nsrc, int64_t n, int8_t* oq,
                                  float* os) {
  constexpr int NV = int(kGroup) / V::W;
  typename V::R acc[NV];
  for (int64_t g = 0; g < n / kGroup; ++g) {
    const int64_t off = g * kGroup;
    const typename V::R s0 = V::set1(s[0][g]);
    for (int j = 0; j < NV; ++j) acc[j] = V::mul(V::load_i8(q[0] + off + j * V::W), s0);
    for (int k = 1; k < nsrc; ++k) {
      const typename V::R sk = V::set1(s[k][g]);
      for (int j = 0; j < NV; ++j) acc[j] = V::add(acc[j], V::mul(V::load_i8(q[k] + off + j * V::W), sk));
    }
    quantize_regs(acc, oq + off, os + g);
  }
}

template <class T>
static void dequantize_t(const int8_t* q, const float* s, int64_t n, T* out) {
  constexpr int NV = int(kGroup) / V::W;
  typename V::R acc[NV];
  const typename V::R inv_n = V::set1(1.0f / float(kGroup));  // H H = kGroup I: the inverse is H / kGroup
  for (int64_t g = 0; g < n / kGroup; ++g) {
    const typename V::R sg = V::set1(s[g]);
    for (int j = 0; j < NV; ++j) acc[j] = V::mul(V::load_i8(q + g * kGroup + j * V::W), sg);
    fwht_regs(acc);
    for (int j = 0; j < NV; ++j) V::store(out + g * kGroup + j * V::W, V::mul(acc[j], inv_n));
  }
}

static void reduce_k(int dtype, void* out, const void* const* src, int nsrc, int64_t n) {
  switch (dtype) {
    case kF32: return reduce_t(static_cast<float*>(out), reinterpret_cast<const float* const*>(src), nsrc, n);
    case kBF16: return reduce_t(static_cast<BF16*>(out), reinterpret_cast<const BF16* const*>(src), nsrc, n);
    default: return reduce_t(static_cast<F16*>(out), reinterpret_cast<const F16* const*>(src), nsrc, n);
  }
}

static void quantize_k(int dtype, const void* x, int64_t n, int8_t* q, float* s) {
  switch (dtype) {
    case kF32: return quantize_t(static_cast<const float*>(x), n, q, s);
    case kBF16: return quantize_t(static_cast<const BF16*>(x), n, q, s);
    default: return quantize_t(static_cast<const F16*>(x), n, q, s);
  }
}

static void dequantize_k(int dtype, const int8_t* q, const float* s, int64_t n, void* out) {
  switch (dtype) {
    case kF32: return dequantize_t(q, s, n, static_cast<float*>(out));
    case kBF16: return dequantize_t(q, s, n, static_cast<BF16*>(out));
    default: return dequantize_t(q, s, n, static_cast<F16*>(out));
  }
}
