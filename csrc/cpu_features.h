// The CPU features each kernel level needs, defined once for the three ISA dispatchers (csrc/cpu/dispatch.cpp: the
// linear and other CPU kernels; csrc/cpu/gguf_dispatch.cpp: the GGUF kernels; csrc/comm/hostar.cpp: the host
// all-reduce). engine/cpu_features.py CPU_LEVELS is the Python side (with /proc/cpuinfo's names, the comment after
// each feature below); tests/unit/test_cpu_features.py parses this file and checks that the two agree.
//
// Internal linkage (static inline) on purpose, as csrc/cpu/types.h explains: the translation units that include it
// are compiled with different -m flags. Where the build is not x86 (KESTREL_X86_VARIANTS unset), no level is there.
#pragma once

namespace kestrel {

enum class CpuFeature : int {
  kAVX2,        // cpuinfo: avx2
  kFMA,         // cpuinfo: fma
  kF16C,        // cpuinfo: f16c
  kAVX512F,     // cpuinfo: avx512f
  kAVX512BW,    // cpuinfo: avx512bw
  kAVX512VL,    // cpuinfo: avx512vl
  kAVX512DQ,    // cpuinfo: avx512dq
  kAVX512BF16,  // cpuinfo: avx512_bf16
  kAVX512VNNI,  // cpuinfo: avx512_vnni
  kAVXVNNI,     // cpuinfo: avx_vnni
};

static inline bool cpu_has(CpuFeature f) {
#if defined(KESTREL_X86_VARIANTS)
  __builtin_cpu_init();
  switch (f) {  // __builtin_cpu_supports takes a string constant: one case per feature
    case CpuFeature::kAVX2: return __builtin_cpu_supports("avx2");
    case CpuFeature::kFMA: return __builtin_cpu_supports("fma");
    case CpuFeature::kF16C: return __builtin_cpu_supports("f16c");
    case CpuFeature::kAVX512F: return __builtin_cpu_supports("avx512f");
    case CpuFeature::kAVX512BW: return __builtin_cpu_supports("avx512bw");
    case CpuFeature::kAVX512VL: return __builtin_cpu_supports("avx512vl");
    case CpuFeature::kAVX512DQ: return __builtin_cpu_supports("avx512dq");
    case CpuFeature::kAVX512BF16: return __builtin_cpu_supports("avx512bf16");
    case CpuFeature::kAVX512VNNI: return __builtin_cpu_supports("avx512vnni");
    case CpuFeature::kAVXVNNI: return __builtin_cpu_supports("avxvnni");
  }
#endif
  (void)f;
  return false;
}

// The levels: each needs every feature listed (a level's kernels are also compiled only where the compiler knows
// its flags: the dispatchers check KESTREL_HAVE_* for that). tests/unit/test_cpu_features.py reads these bodies.
static inline bool cpu_has_avx2() {
  return cpu_has(CpuFeature::kAVX2) && cpu_has(CpuFeature::kFMA) && cpu_has(CpuFeature::kF16C);
}
static inline bool cpu_has_avx512() {
  return cpu_has_avx2() && cpu_has(CpuFeature::kAVX512F) && cpu_has(CpuFeature::kAVX512BW) &&
         cpu_has(CpuFeature::kAVX512VL) && cpu_has(CpuFeature::kAVX512DQ);
}
static inline bool cpu_has_avx512bf16() {
  return cpu_has_avx512() && cpu_has(CpuFeature::kAVX512BF16) && cpu_has(CpuFeature::kAVX512VNNI);
}
static inline bool cpu_has_avxvnni() { return cpu_has_avx2() && cpu_has(CpuFeature::kAVXVNNI); }
static inline bool cpu_has_avx512vnni() { return cpu_has_avx512() && cpu_has(CpuFeature::kAVX512VNNI); }

}  // namespace kestrel
