#include "prefetch.cuh"

namespace unweight {
namespace cuda {
namespace detail {

namespace {
__global__ void __launch_bounds__(plan::PREFETCH_THREADS) prefetch_kernel(PrefetchArgs a) {
  emu::DeviceCtx c;
  prefetch_body(c, a);
}
}  // namespace

void launch_prefetch_l2(const PrefetchArgs& a, int64_t ctas, cudaStream_t s) {
  prefetch_kernel<<<static_cast<unsigned>(ctas), plan::PREFETCH_THREADS, 0, s>>>(a);
}

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
