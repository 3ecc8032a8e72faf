#include "crc32.cuh"

namespace unweight {
namespace cuda {
namespace detail {

namespace {
__global__ void __launch_bounds__(plan::CRC_THREADS) crc32_kernel(Crc32Args a) {
  emu::DeviceCtx c;
  crc32_body(c, a);
}
}  // namespace

void launch_crc32(const Crc32Args& a, int64_t ctas, cudaStream_t s) {
  crc32_kernel<<<static_cast<unsigned>(ctas), plan::CRC_THREADS, plan::CRC_TABLE_WORDS * 4, s>>>(a);
}

}  // namespace detail
}  // namespace cuda
}  // namespace unweight
