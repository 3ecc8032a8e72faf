// Run-time choice between the builds of a hot loop: a baseline x86-64 one and, where the CPU
// has the instructions, a faster one (AVX2 + BMI2 for Huffman and palette decode, carry-less
// multiply for crc32).  The fast builds sit in the same translation unit as their baselines,
// compiled through target attributes rather than -mavx2 on the command line, so the rest of
// the unit stays baseline x86-64 and a wheel built on one machine runs on any x86-64.
#pragma once
#include <atomic>

namespace unweight {

// Tests: true makes the codec use its baseline builds (x86-64 decode loop without AVX2/BMI2,
// zlib's crc32 instead of the carry-less-multiply one) so both are checked on one machine.
void set_force_baseline_cpu(bool on);

namespace detail {

// Set by set_force_baseline_cpu; read (relaxed) wherever a fast build is picked.
extern std::atomic<bool> g_force_baseline;

#if defined(__x86_64__) && defined(__GNUC__)
#define UW_HAVE_AVX2_PATH 1
inline bool cpu_has_avx2_bmi2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
  return ok && !g_force_baseline.load(std::memory_order_relaxed);
}
#endif

}  // namespace detail
}  // namespace unweight
