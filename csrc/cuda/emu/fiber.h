// Fibers for the warp emulator (warp_emu.h): every emulated GPU thread runs on its own stack
// on the calling OS thread, and the scheduler switches between them at each collective.
//
// Why not ucontext alone: glibc's swapcontext saves and restores the signal mask, a
// rt_sigprocmask system call on every switch, and an emulated launch switches once per lane
// per collective; through swapcontext those calls take about 80% of an emulated kernel test's time.  The
// emulator's fibers all share one signal mask, so on x86-64 Linux a switch (fiber.cpp) saves
// only what the System V ABI has a called function preserve -- rbx, rbp, r12-r15, the stack
// pointer, MXCSR and the x87 control word -- and makes no system call.  Elsewhere, and in a
// process running with a CET shadow stack (which a plain stack switch would trip), it is
// swapcontext.  No CUDA types here: fiber.cpp compiles with the host compiler.
#pragma once
#include <ucontext.h>

#include <cstddef>

namespace unweight {
namespace emu {

struct Fiber {
  void* sp = nullptr;  // the switch's saved stack pointer (fast path)
  ucontext_t uc;       // the fallback's context
};

// Whether this process switches fibers without ucontext (decided once, at the first call;
// UNWEIGHT_EMU_UCONTEXT=1 in the environment then says no).
bool fiber_fast();
// Sets `f` up to run fn(arg) on stack[0, bytes) at the first fiber_switch to it.  fn must never
// return: it ends by switching away for the last time (nothing resumes it then).
void fiber_make(Fiber* f, char* stack, size_t bytes, void (*fn)(void*), void* arg);
// Saves the running context into `from` and resumes `to` (a fiber made by fiber_make, or a
// context an earlier switch saved).  Returns when something switches back to `from`.
void fiber_switch(Fiber* from, Fiber* to);
// Nanoseconds per switch, timed over n round trips between this context and one fiber (the
// figure warp_emu.h's cost note quotes; _cuda.emu_fiber_switch_ns).
double fiber_switch_ns(long n);

}  // namespace emu
}  // namespace unweight
