#include "cpu_features.h"

namespace unweight {
namespace detail {
std::atomic<bool> g_force_baseline{false};
}  // namespace detail

void set_force_baseline_cpu(bool on) { detail::g_force_baseline.store(on); }

}  // namespace unweight
