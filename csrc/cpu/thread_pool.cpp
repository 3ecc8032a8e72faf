// Persistent worker threads behind parallel_for (thread_pool.h).
#include "thread_pool.h"

#include <pthread.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace unweight {
namespace detail {
namespace {

// Persistent worker threads.  Spawning and joining threads on every call cost ~50 us, as
// much as decoding a whole 384 x 384 matrix, so small tensors ran no faster on 2 threads than
// on 1; the pool keeps its threads parked on a condition variable between calls.  One job
// runs at a time: a caller that finds the pool busy (another Python thread, or a nested
// call) falls back to plain threads.  After fork() the child starts a fresh pool, since the
// parent's threads do not exist there.
class ThreadPool {
 public:
  static ThreadPool& get() {
    static std::once_flag once;
    std::call_once(once, [] { pthread_atfork(nullptr, nullptr, [] { instance() = nullptr; }); });
    ThreadPool*& p = instance();
    if (!p) p = new ThreadPool();  // never destroyed: parked threads end with the process
    return *p;
  }
  // Runs fn on the calling thread and on up to `helpers` pool threads; returns when every
  // thread that started fn has finished.  fn must tolerate helpers that join late or never.
  void run(int helpers, const std::function<void()>& fn) {
    std::unique_lock<std::mutex> own(busy_, std::try_to_lock);
    if (!own.owns_lock()) {
      std::vector<std::thread> ts;
      for (int t = 0; t < helpers; ++t) ts.emplace_back(fn);
      fn();
      for (auto& t : ts) t.join();
      return;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      // A new thread starts from the generation before this job's, so it takes part in it.
      while (static_cast<int>(threads_.size()) < helpers) threads_.emplace_back([this, g = gen_] { loop(g); });
      job_ = &fn;
      wanted_ = helpers;
      ++gen_;
    }
    start_.notify_all();
    fn();
    std::unique_lock<std::mutex> lk(mu_);
    wanted_ = 0;  // helpers that have not woken yet are not needed any more
    done_.wait(lk, [this] { return running_ == 0; });
    job_ = nullptr;
  }

 private:
  static ThreadPool*& instance() {
    static ThreadPool* p = nullptr;
    return p;
  }
  void loop(uint64_t seen) {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      start_.wait(lk, [&] { return gen_ != seen; });
      seen = gen_;
      if (wanted_ == 0) continue;
      --wanted_;
      ++running_;
      const std::function<void()>* fn = job_;
      lk.unlock();
      (*fn)();
      lk.lock();
      if (--running_ == 0) done_.notify_all();
    }
  }
  std::mutex busy_, mu_;
  std::condition_variable start_, done_;
  std::vector<std::thread> threads_;
  const std::function<void()>* job_ = nullptr;
  uint64_t gen_ = 0;
  int wanted_ = 0, running_ = 0;
};

}  // namespace

void run_on_pool(int helpers, const std::function<void()>& fn) { ThreadPool::get().run(helpers, fn); }

}  // namespace detail
}  // namespace unweight
