// A zeroed host buffer whose data starts where cudaMalloc would put a device buffer's (a
// 256-byte boundary), for what the host emulations hand kernel bodies: their 16-byte loads
// want aligned operands, and the emulator's access profile (warp_emu.h) counts 32-byte
// sectors by address.  Plain C++: the bindings, compiled without nvcc, use it too.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace unweight {
namespace emu {

class HostBuffer {
 public:
  static constexpr size_t kAlign = 256;
  explicit HostBuffer(size_t bytes) : store_(bytes + kAlign, 0) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(store_.data());
    data_ = store_.data() + (kAlign - at % kAlign) % kAlign;
  }
  HostBuffer(const HostBuffer&) = delete;  // data_ points into store_'s own heap block
  HostBuffer& operator=(const HostBuffer&) = delete;
  unsigned char* data() const { return data_; }

 private:
  std::vector<unsigned char> store_;
  unsigned char* data_ = nullptr;
};

}  // namespace emu
}  // namespace unweight
