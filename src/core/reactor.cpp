#include "core/reactor.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "core/sys.hpp"

namespace ferry::core {

namespace {
// Events handled per epoll_wait call; more only adds latency to the first ones.
constexpr int kMaxEventsPerWait = 64;
}  // namespace

Reactor::Reactor(int threads, std::chrono::nanoseconds busy_poll) : busy_poll_(busy_poll) {
  if (threads < 1) throw Error(ErrorCode::kInvalidArgument, "progress_threads must be >= 1");
  for (int i = 0; i < threads; ++i) {
    auto loop = std::make_unique<Loop>();
    loop->epoll = Fd(::epoll_create1(EPOLL_CLOEXEC));
    if (!loop->epoll.valid()) throw Error(sys_status("epoll_create1"));
    loop->wake = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!loop->wake.valid()) throw Error(sys_status("eventfd"));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;  // null marks the wake-up fd
    if (::epoll_ctl(loop->epoll.get(), EPOLL_CTL_ADD, loop->wake.get(), &ev) != 0) {
      throw Error(sys_status("epoll_ctl ADD eventfd"));
    }
    loops_.push_back(std::move(loop));
  }
  for (auto& loop : loops_) {
    Loop* l = loop.get();
    l->thread = std::thread([this, l] { run(*l); });
  }
}

Reactor::~Reactor() { stop(); }

void Reactor::stop() {
  if (stopping_.exchange(true)) return;
  for (auto& loop : loops_) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(loop->wake.get(), &one, sizeof one);
  }
  for (auto& loop : loops_) {
    if (loop->thread.joinable()) loop->thread.join();
  }
}

int Reactor::pick_loop() { return static_cast<int>(next_.fetch_add(1) % loops_.size()); }

bool Reactor::on_loop_thread(int loop) const {
  return loops_[static_cast<std::size_t>(loop)]->id == std::this_thread::get_id();
}

Status Reactor::add(int loop, int fd, uint32_t events, Handler* handler) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = handler;
  if (::epoll_ctl(loops_[static_cast<std::size_t>(loop)]->epoll.get(), EPOLL_CTL_ADD, fd, &ev) !=
      0) {
    return sys_status("epoll_ctl ADD");
  }
  return {};
}

Status Reactor::modify(int loop, int fd, uint32_t events, Handler* handler) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = handler;
  if (::epoll_ctl(loops_[static_cast<std::size_t>(loop)]->epoll.get(), EPOLL_CTL_MOD, fd, &ev) !=
      0) {
    return sys_status("epoll_ctl MOD");
  }
  return {};
}

void Reactor::remove(int loop, int fd) {
  ::epoll_ctl(loops_[static_cast<std::size_t>(loop)]->epoll.get(), EPOLL_CTL_DEL, fd, nullptr);
}

void Reactor::post(int loop, std::function<void()> task) {
  Loop& l = *loops_[static_cast<std::size_t>(loop)];
  {
    std::lock_guard lock(l.mu);
    l.tasks.push_back(std::move(task));
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(l.wake.get(), &one, sizeof one);
}

void Reactor::keep_polling(int loop, std::chrono::nanoseconds period) {
  std::atomic<int64_t>& until = loops_[static_cast<std::size_t>(loop)]->polling_until;
  int64_t end = (std::chrono::steady_clock::now() + period).time_since_epoch().count();
  // Racing callers may leave the earlier of two ends: a hint, renewed by the next piece.
  if (until.load(std::memory_order_relaxed) < end) until.store(end, std::memory_order_relaxed);
}

bool RequestPolling::start(int64_t now_ns, int64_t period_ns) {
  int64_t until = until_.load(std::memory_order_relaxed);
  if (until != 0 && now_ns <= until) {
    misses_.store(0, std::memory_order_relaxed);
  } else if (until != 0) {
    misses_.fetch_add(1, std::memory_order_relaxed);
  }
  if (misses_.load(std::memory_order_relaxed) >= kMisses) {
    if (skipped_.fetch_add(1, std::memory_order_relaxed) + 1 < kRetry) {
      until_.store(0, std::memory_order_relaxed);
      return false;
    }
    // One more try: a window that sees its next request starts polling again, one that does
    // not stops it at once.
    skipped_.store(0, std::memory_order_relaxed);
    misses_.store(kMisses - 1, std::memory_order_relaxed);
  }
  until_.store(now_ns + period_ns, std::memory_order_relaxed);
  return true;
}

void Reactor::poll_for_requests(int loop, std::chrono::nanoseconds period) {
  if (period <= std::chrono::nanoseconds::zero()) return;
  int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  if (loops_[static_cast<std::size_t>(loop)]->request_polling.start(now, period.count())) {
    keep_polling(loop, period);
  }
}

void Reactor::add_poller(int loop, Poller* poller) {
  Loop& l = *loops_[static_cast<std::size_t>(loop)];
  l.pollers.push_back(poller);
  if (l.polling) poller->begin_polling();
}

void Reactor::remove_poller(int loop, Poller* poller) {
  Loop& l = *loops_[static_cast<std::size_t>(loop)];
  auto it = std::find(l.pollers.begin(), l.pollers.end(), poller);
  if (it == l.pollers.end()) return;
  l.pollers.erase(it);
  if (l.polling) poller->end_polling();
}

void Reactor::set_polling(Loop& loop, bool on) {
  if (loop.polling == on) return;
  loop.polling = on;
  for (Poller* p : loop.pollers) {
    if (on) {
      p->begin_polling();
    } else {
      p->end_polling();
    }
  }
}

void Reactor::retire(int loop, std::shared_ptr<void> handler_owner) {
  loops_[static_cast<std::size_t>(loop)]->retired.push_back(std::move(handler_owner));
}

void Reactor::run(Loop& loop) {
  loop.id = std::this_thread::get_id();
  epoll_event events[kMaxEventsPerWait];
  std::vector<std::function<void()>> tasks;
  auto last_work = std::chrono::steady_clock::now();
  while (!stopping_.load(std::memory_order_relaxed)) {
    auto now = std::chrono::steady_clock::now();
    bool spinning =
        now - last_work < busy_poll_ ||
        now.time_since_epoch().count() < loop.polling_until.load(std::memory_order_relaxed);
    set_polling(loop, spinning);
    int n = ::epoll_wait(loop.epoll.get(), events, kMaxEventsPerWait, spinning ? 0 : 100);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;  // the epoll fd is gone: nothing sensible is left to do on this loop
    }
    bool polled = false;
    // By index: a poller may remove itself (closing) while polled.
    for (std::size_t i = 0; loop.polling && i < loop.pollers.size(); ++i) {
      polled = loop.pollers[i]->poll() || polled;
    }
    if (polled && n == 0) last_work = std::chrono::steady_clock::now();
    if (n == 0) continue;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.ptr == nullptr) {
        uint64_t count;
        [[maybe_unused]] ssize_t r = ::read(loop.wake.get(), &count, sizeof count);
        {
          std::lock_guard lock(loop.mu);
          tasks.swap(loop.tasks);
        }
        for (auto& task : tasks) {
          if (stopping_.load(std::memory_order_relaxed)) break;
          task();
        }
        continue;
      }
      static_cast<Handler*>(events[i].data.ptr)->on_event(events[i].events);
    }
    // Tasks (run or skipped while stopping) may own handlers whose events this round already
    // fetched: they go with the retired ones, after the round.
    tasks.clear();
    loop.retired.clear();
    last_work = std::chrono::steady_clock::now();
  }
}

}  // namespace ferry::core
