#include "core/callback_scope.hpp"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "core/fork.hpp"

namespace ferry::core {

thread_local int CallbackScope::depth_ = 0;

namespace {

// Never destroyed: a thread joined at exit may start another (a shutdown that drops a Region),
// and each refers to this list.
struct DetachedThreads {
  std::mutex mu;
  std::vector<std::thread> running;
  std::vector<std::thread::id> finished;  // in `running` still, to be joined by the next start
  uint64_t born = fork_generation();      // of those in `running`

  // At exit (std::atexit, so before the statics made earlier are destroyed): joins them all,
  // and those they start meanwhile.
  void join_all() {
    for (;;) {
      std::vector<std::thread> all;
      {
        std::lock_guard lock(mu);
        forget_inherited_locked();
        all.swap(running);
        finished.clear();
      }
      if (all.empty()) return;
      for (auto& t : all) {
        if (t.get_id() != std::this_thread::get_id()) {
          t.join();
        } else {
          t.detach();  // the process exits from one of them
        }
      }
    }
  }

  // In a forked child the threads listed are the parent's: none exists here to join.
  void forget_inherited_locked() {
    if (fork_generation() == born) return;
    static auto* inherited = new std::vector<std::thread>;  // reachable: no leak report
    for (auto& t : running) inherited->push_back(std::move(t));
    running.clear();
    finished.clear();
    born = fork_generation();
  }

  // Joins those that finished (each exits right after noting it). Under mu.
  void reap_locked() {
    forget_inherited_locked();
    for (std::thread::id id : finished) {
      auto it = std::find_if(running.begin(), running.end(),
                             [&](const std::thread& t) { return t.get_id() == id; });
      if (it == running.end()) continue;
      it->join();
      running.erase(it);
    }
    finished.clear();
  }
};

DetachedThreads& detached_threads() {
  static DetachedThreads* threads = [] {
    auto* made = new DetachedThreads;
    std::atexit([] { detached_threads().join_all(); });
    return made;
  }();
  return *threads;
}

}  // namespace

void run_detached(std::function<void()> work) {
  DetachedThreads& threads = detached_threads();
  std::lock_guard lock(threads.mu);
  threads.reap_locked();
  threads.running.emplace_back([&threads, work = std::move(work)]() mutable {
    work();
    work = nullptr;  // what it held goes before the thread counts as finished
    std::lock_guard done(threads.mu);
    threads.finished.push_back(std::this_thread::get_id());
  });
}

}  // namespace ferry::core
