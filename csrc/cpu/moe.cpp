// Mixture-of-experts routed step on GGUF experts (engine/layers/moe_native.py): the router's softmax top-k and every
// chosen expert's gate_up -> SiLU-and-mul -> down, grouped by expert, in one native call. Each expert with rows runs
// its two products once over all of them on the GGUF kernels (gguf_linear: the integer GEMV for a few rows, the
// panels for more), so a batch-1 decode reads only its k experts' blocks, and a decode step's routed part is one
// call that the CPU decode tape (engine/runner/cpu_tape.py) records and replays.
#include "moe_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf_ops.h"
#include "ops.h"
#include "types.h"

namespace kestrel::cpu {
namespace {

void need(bool ok, const char* msg) {
  if (!ok) throw std::invalid_argument(std::string("moe_experts: ") + msg);
}

template <typename T>
T* at(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

float load(int dt, const void* base, int64_t i) {
  if (dt == kFloat32) return static_cast<const float*>(base)[i];
  if (dt == kBFloat16) return to_f32(static_cast<const bf16_t*>(base)[i]);
  return to_f32(static_cast<const f16_t*>(base)[i]);
}

void store(int dt, void* base, int64_t i, float v) {
  if (dt == kFloat32) static_cast<float*>(base)[i] = v;
  else if (dt == kBFloat16) static_cast<bf16_t*>(base)[i] = from_f32<bf16_t>(v);
  else static_cast<f16_t*>(base)[i] = from_f32<f16_t>(v);
}

// softmax over E logits in float32, then the k largest (ties: the lower expert first), renormalised if asked
void route_token(int dt, const void* logits, int64_t E, int64_t k, bool renormalize, int64_t* ids, float* w,
                 std::vector<float>& p) {
  p.resize(size_t(E));
  float m = -INFINITY;
  for (int64_t e = 0; e < E; ++e) m = std::max(m, p[size_t(e)] = load(dt, logits, e));
  float s = 0.f;
  for (int64_t e = 0; e < E; ++e) s += (p[size_t(e)] = std::exp(p[size_t(e)] - m));
  for (int64_t e = 0; e < E; ++e) p[size_t(e)] /= s;
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken |= ids[i] == e;
      if (!taken && (best < 0 || p[size_t(e)] > p[size_t(best)])) best = e;
    }
    ids[j] = best;
    w[j] = p[size_t(best)];
  }
  if (renormalize) {
    float sum = 0.f;
    for (int64_t j = 0; j < k; ++j) sum += w[j];
    for (int64_t j = 0; j < k; ++j) w[j] /= sum;
  }
}

struct Scratch {
  std::vector<char> xg, h, a, y;
  std::vector<float> acc, probs;
};

}  // namespace

void moe_experts(int dt_flags, uintptr_t out, uintptr_t x, int64_t xs, int64_t T, int64_t H, int64_t I, int64_t k,
                 uintptr_t logits, int64_t E, int route, uintptr_t ids, uintptr_t weights, uintptr_t w13,
                 int64_t row_bytes13, int qtype13, uintptr_t w2, int64_t row_bytes2, int qtype2) {
  const int dt = dt_flags & kDTypeMask;
  need(dt == kFloat32 || dt == kBFloat16 || dt == kFloat16, "dtype code must be 0, 1 or 2");
  need(T >= 0 && H > 0 && I > 0 && k > 0 && E >= k, "need T >= 0, H, I > 0 and 0 < k <= E");
  need(xs >= H, "x's row stride must be >= H");
  need(route == 0 || route == 1 || route == 2, "route must be 0 (ids / weights given), 1 (softmax top-k) or 2 "
                                               "(softmax top-k renormalised)");
  if (T == 0) return;
  const size_t es = dt == kFloat32 ? 4 : 2;
  int64_t* id = at<int64_t>(ids);
  float* wt = at<float>(weights);
  static thread_local Scratch s;
  if (route != 0) {
    for (int64_t t = 0; t < T; ++t)
      route_token(dt, at<const char>(logits) + size_t(t * E) * es, E, k, route == 2, id + t * k, wt + t * k, s.probs);
  }
  for (int64_t i = 0; i < T * k; ++i) need(id[i] >= 0 && id[i] < E, "an expert id is out of range");
  const int64_t* p13 = at<const int64_t>(w13);
  const int64_t* p2 = at<const int64_t>(w2);
  // the choices grouped by expert, in token order within each (a counting sort)
  std::vector<int64_t> start(size_t(E + 1), 0), order(size_t(T * k));
  for (int64_t i = 0; i < T * k; ++i) ++start[size_t(id[i] + 1)];
  for (int64_t e = 0; e < E; ++e) start[size_t(e + 1)] += start[size_t(e)];
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < T * k; ++i) order[size_t(fill[size_t(id[i])]++)] = i;
  }
  int64_t most = 0;
  for (int64_t e = 0; e < E; ++e) most = std::max(most, start[size_t(e + 1)] - start[size_t(e)]);
  s.xg.resize(size_t(most * H) * es);
  s.h.resize(size_t(most * 2 * I) * es);
  s.a.resize(size_t(most * I) * es);
  s.y.resize(size_t(most * H) * es);
  s.acc.assign(size_t(T * H), 0.f);
  const char* xb = at<const char>(x);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = start[size_t(e + 1)] - start[size_t(e)];
    if (n == 0) continue;
    const int64_t* rows = order.data() + start[size_t(e)];
    uintptr_t xin = uintptr_t(s.xg.data());
    int64_t xin_stride = H;
    if (n == 1) {  // one row (a decode): read x in place
      xin = x + uintptr_t(size_t(rows[0] / k * xs) * es);
      xin_stride = xs;
    } else {
      for (int64_t r = 0; r < n; ++r)
        std::memcpy(s.xg.data() + size_t(r * H) * es, xb + size_t(rows[r] / k * xs) * es, size_t(H) * es);
    }
    gguf_linear(dt_flags, uintptr_t(s.h.data()), 2 * I, xin, xin_stride, uintptr_t(p13[e]), row_bytes13, qtype13, 0,
                n, 2 * I, H);
    silu_and_mul(dt, uintptr_t(s.a.data()), I, uintptr_t(s.h.data()), 2 * I, n, I);
    gguf_linear(dt_flags, uintptr_t(s.y.data()), H, uintptr_t(s.a.data()), I, uintptr_t(p2[e]), row_bytes2, qtype2, 0,
                n, H, I);
    for (int64_t r = 0; r < n; ++r) {  // the expert's output (rounded to dtype) times its float32 weight
      const int64_t t = rows[r] / k;
      const float w = wt[rows[r]];
      float* acc = s.acc.data() + t * H;
      for (int64_t c = 0; c < H; ++c) acc[c] += w * load(dt, s.y.data(), r * H + c);
    }
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < H; ++c) store(dt, at<void>(out), t * H + c, s.acc[size_t(t * H + c)]);
}

}  // namespace kestrel::cpu
