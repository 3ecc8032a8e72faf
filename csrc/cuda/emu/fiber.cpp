// Fiber switching for the warp emulator (fiber.h says why it is not swapcontext alone).
#include "fiber.h"

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define UW_FIBER_ASM 1
#else
#define UW_FIBER_ASM 0
#endif

namespace unweight {
namespace emu {
namespace {

// The fallback's entry: makecontext passes int arguments only, so fn and arg travel as halves.
void uc_entry(unsigned fn_hi, unsigned fn_lo, unsigned arg_hi, unsigned arg_lo) {
  auto fn = reinterpret_cast<void (*)(void*)>((static_cast<uintptr_t>(fn_hi) << 32) | fn_lo);
  fn(reinterpret_cast<void*>((static_cast<uintptr_t>(arg_hi) << 32) | arg_lo));
}

// fiber_switch_ns: the timed context and one fiber, switching back and forth `left` times.
constexpr size_t kPingPongStack = 64 * 1024;
struct PingPong {
  Fiber main, other;
  long left = 0;
};
void ping_pong_body(void* arg) {
  PingPong& p = *static_cast<PingPong*>(arg);
  for (;;) {
    --p.left;
    fiber_switch(&p.other, &p.main);
  }
}

}  // namespace
}  // namespace emu
}  // namespace unweight

#if UW_FIBER_ASM
extern "C" void uw_emu_fiber_switch(void** save_sp, void* new_sp);
extern "C" void uw_emu_fiber_start();

// uw_emu_fiber_switch(save_sp, new_sp): pushes the callee-saved registers and the floating-
// point control words onto the running stack, stores the stack pointer to *save_sp, loads
// new_sp and pops the same frame from there.  A new fiber's stack holds such a frame
// (fiber_make) whose return address is uw_emu_fiber_start, with fn in r12 and arg in r13:
// it calls fn(arg) with the stack 16-byte aligned, as the ABI asks at a call.
asm(R"(
  .pushsection .text
  .p2align 4
  .globl uw_emu_fiber_switch
  .hidden uw_emu_fiber_switch
  .type uw_emu_fiber_switch, @function
uw_emu_fiber_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size uw_emu_fiber_switch, .-uw_emu_fiber_switch

  .p2align 4
  .globl uw_emu_fiber_start
  .hidden uw_emu_fiber_start
  .type uw_emu_fiber_start, @function
uw_emu_fiber_start:
  movq %r13, %rdi
  callq *%r12
  ud2
  .size uw_emu_fiber_start, .-uw_emu_fiber_start
  .popsection
)");
#endif

namespace unweight {
namespace emu {

bool fiber_fast() {
#if UW_FIBER_ASM
  // UNWEIGHT_EMU_UCONTEXT=1 takes the fallback anyway (its tests run the same bodies on it).
  // arch_prctl(ARCH_SHSTK_STATUS): bit 0 set while the thread runs with a shadow stack, which
  // checks every return against the stack the call was made on.  Kernels without it say
  // EINVAL: no shadow stack.
  static const bool fast = [] {
    const char* force = std::getenv("UNWEIGHT_EMU_UCONTEXT");
    if (force != nullptr && std::strcmp(force, "1") == 0) return false;
    unsigned long features = 0;
    return !(syscall(SYS_arch_prctl, 0x5005, &features) == 0 && (features & 1));
  }();
  return fast;
#else
  return false;
#endif
}

void fiber_make(Fiber* f, char* stack, size_t bytes, void (*fn)(void*), void* arg) {
#if UW_FIBER_ASM
  if (fiber_fast()) {
    // The frame uw_emu_fiber_switch pops, lowest address first: control words, r15, r14, r13
    // (arg), r12 (fn), rbx, rbp, return address.  It sits 16-byte aligned below 16 spare
    // bytes at the top, so the stack pointer is aligned again once the return has popped it.
    const uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t(15);
    uint64_t* frame = reinterpret_cast<uint64_t*>(top - 16 - 8 * sizeof(uint64_t));
    uint32_t mxcsr = 0;
    uint16_t fpucw = 0;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpucw));
    frame[0] = mxcsr | (static_cast<uint64_t>(fpucw) << 32);
    frame[1] = frame[2] = frame[5] = frame[6] = 0;
    frame[3] = reinterpret_cast<uintptr_t>(arg);
    frame[4] = reinterpret_cast<uintptr_t>(fn);
    frame[7] = reinterpret_cast<uintptr_t>(&uw_emu_fiber_start);
    f->sp = frame;
    return;
  }
#endif
  getcontext(&f->uc);
  f->uc.uc_stack.ss_sp = stack;
  f->uc.uc_stack.ss_size = bytes;
  f->uc.uc_link = nullptr;  // fn never returns
  const uintptr_t fp = reinterpret_cast<uintptr_t>(fn), ap = reinterpret_cast<uintptr_t>(arg);
  makecontext(&f->uc, reinterpret_cast<void (*)()>(&uc_entry), 4, static_cast<unsigned>(fp >> 32),
              static_cast<unsigned>(fp & 0xFFFFFFFFu), static_cast<unsigned>(ap >> 32),
              static_cast<unsigned>(ap & 0xFFFFFFFFu));
}

void fiber_switch(Fiber* from, Fiber* to) {
#if UW_FIBER_ASM
  if (fiber_fast()) {
    uw_emu_fiber_switch(&from->sp, to->sp);
    return;
  }
#endif
  swapcontext(&from->uc, &to->uc);
}

double fiber_switch_ns(long n) {
  if (n < 1) n = 1;
  PingPong p;
  std::unique_ptr<char[]> stack(new char[kPingPongStack]);
  fiber_make(&p.other, stack.get(), kPingPongStack, &ping_pong_body, &p);
  p.left = n;
  const auto t0 = std::chrono::steady_clock::now();
  while (p.left > 0) fiber_switch(&p.main, &p.other);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s * 1e9 / (2.0 * static_cast<double>(n));  // two switches per round trip
}

}  // namespace emu
}  // namespace unweight
