#include "comm/work_queue.h"

#include <time.h>

#include <new>

#include "common/errors.h"
#include "common/logging.h"

namespace hetra::comm {
namespace {

// An operation's deadline without a precise clock read (tens of ns in a VM, as much as a small
// collective's own work): CLOCK_MONOTONIC_COARSE is the steady clock's time base (libstdc++ reads
// CLOCK_MONOTONIC) kept in memory by the kernel, which trails it by at most one tick; the deadline
// adds that tick back, so it is never earlier than the precise one.
Deadline coarseDeadlineAfter(Millis timeout) {
  static const std::chrono::nanoseconds tick = [] {
    timespec res{};
    clock_getres(CLOCK_MONOTONIC_COARSE, &res);
    return std::chrono::seconds(res.tv_sec) + std::chrono::nanoseconds(res.tv_nsec);
  }();
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  return Deadline(std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec) + tick) +
         timeout;
}

// The calling thread's free blocks. Trivially destructible, so giveBlock() may still look at it
// while the thread's destructors run; BlockReturn hands the blocks back when the thread ends.
struct FreeBlock {
  FreeBlock* next;
};
constexpr int kKeptBlocks = 64;  // the most operations one thread has in flight, kept for reuse
thread_local FreeBlock* tFreeBlocks = nullptr;
thread_local int tFreeCount = 0;
thread_local bool tThreadEnded = false;

struct BlockReturn {
  ~BlockReturn() {
    tThreadEnded = true;
    while (FreeBlock* block = tFreeBlocks) {
      tFreeBlocks = block->next;
      ::operator delete(block);
    }
    tFreeCount = 0;
  }
};
thread_local BlockReturn tBlockReturn;

}  // namespace

void* WorkQueue::takeBlock() {
  if (FreeBlock* block = tFreeBlocks) {
    tFreeBlocks = block->next;
    --tFreeCount;
    return block;
  }
  return ::operator new(kBlockBytes);
}

void WorkQueue::giveBlock(void* block) {
  (void)&tBlockReturn;  // constructs it in this thread, so its blocks go back when it ends
  if (tThreadEnded || tFreeCount >= kKeptBlocks) return ::operator delete(block);
  tFreeBlocks = new (block) FreeBlock{tFreeBlocks};
  ++tFreeCount;
}

void WorkQueue::Item::wait(Deadline deadline) {
  if (!isCompleted()) owner_->waitFor(*this, &deadline);
  if (error_) std::rethrow_exception(error_);
}

void WorkQueue::Item::wait() {
  if (!isCompleted()) owner_->waitFor(*this, nullptr);
  if (error_) std::rethrow_exception(error_);
}

void WorkQueue::Item::execute(std::exception_ptr latched, Millis timeout) {
  if (latched) {
    error_ = latched;
  } else {
    try {
      run(coarseDeadlineAfter(timeout));
    } catch (const std::exception& e) {
      HETRA_WARN("comm", describe(), " failed: ", e.what());
      error_ = std::current_exception();
    }
  }
  done_.store(true, std::memory_order_release);
}

WorkQueue::WorkQueue(int rank, Millis timeout,
                     std::function<void(std::exception_ptr)> onFirstFailure)
    : rank_(rank), timeout_(timeout), onFirstFailure_(std::move(onFirstFailure)) {
  worker_ = std::thread([this] { workLoop(); });
}

WorkQueue::~WorkQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void WorkQueue::push(std::shared_ptr<Item> item) {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.push_back(std::move(item));
  queued_.store(queue_.size(), std::memory_order_release);  // a plain store: written under the lock
  // A polling progress thread finds the operation by itself; only a deep sleeper needs a wake-up.
  if (workerAsleep_) cv_.notify_all();
}

void WorkQueue::latch(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failed_) failed_ = error;
}

// The waiting thread runs queued operations itself, in order, when nobody else is running one: an
// operation issued and waited for at once never crosses threads, so small collectives cost what
// the algorithm costs (no thread wake-up on the critical path).
void WorkQueue::waitFor(Item& item, const Deadline* deadline) {
  // The clock is read only once running the queue's front is not enough: an operation issued and
  // waited for at once completes without one. An operation queued behind others starts when they
  // end, and each has the group's timeout from its start: twice that covers the common case of one
  // operation ahead, and is the default deadline.
  Clock::time_point start{}, spinUntil{}, limit{};
  while (!item.isCompleted()) {
    if (!executing_.load(std::memory_order_acquire) &&
        queued_.load(std::memory_order_acquire) > 0) {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!executing_ && !queue_.empty()) executeFront(lock);
      continue;
    }
    if (start == Clock::time_point{}) {
      start = Clock::now();
      spinUntil = start + std::chrono::microseconds(kWaitSpinUs);
      limit = deadline ? *deadline : start + 2 * timeout_;
    }
    if (Clock::now() < spinUntil) {
      std::this_thread::yield();
      continue;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    ++waiters_;
    const bool ready = cv_.wait_until(
        lock, limit, [&] { return item.isCompleted() || (!executing_ && !queue_.empty()); });
    --waiters_;
    if (!ready)
      throw TimeoutError(str("waiting for ", item.describe(), " timed out after ",
                             std::chrono::duration_cast<Millis>(Clock::now() - start).count(),
                             " ms"));
  }
}

// Runs the operation at the front of the queue with the lock released; exactly one thread
// executes at a time, which keeps the group's operations in issue order on every rank.
// Returns with the lock released. The end of an operation takes the lock again only to wake
// somebody: a waiter or a sleeping progress thread announces itself (seq_cst) before it checks
// executing_ and the queue, and this thread clears executing_ (seq_cst) before it looks for them,
// so one of the two always sees the other.
void WorkQueue::executeFront(std::unique_lock<std::mutex>& lock) {
  std::shared_ptr<Item> item = std::move(queue_.front());
  queue_.pop_front();
  queued_.store(queue_.size(), std::memory_order_release);
  executing_.store(true, std::memory_order_release);
  const std::exception_ptr latched = failed_;
  lock.unlock();
  item->execute(latched, timeout_);
  if (auto error = item->exception(); error && !latched) {
    latch(error);
    onFirstFailure_(error);
  }
  executing_.store(false);
  if (waiters_.load() > 0 || workerAsleep_.load() || queued_.load() > 0) {
    lock.lock();
    cv_.notify_all();
    lock.unlock();
  }
}

// The progress thread runs operations nobody waits for yet (gradient buckets during backward).
void WorkQueue::workLoop() {
  log::setRank(rank_);
  std::unique_lock<std::mutex> lock(mutex_);
  Deadline lastActive = Clock::now();
  for (;;) {
    if (!executing_ && !queue_.empty()) {
      executeFront(lock);
      lock.lock();
      lastActive = Clock::now();
      continue;
    }
    if (stopping_ && queue_.empty() && !executing_) return;
    if (Clock::now() - lastActive < Millis(kDeepSleepMs)) {
      cv_.wait_for(lock, std::chrono::microseconds(kPollUs));
    } else {
      workerAsleep_ = true;
      cv_.wait(lock, [&] { return stopping_ || (!executing_ && !queue_.empty()); });
      workerAsleep_ = false;
      lastActive = Clock::now();
    }
  }
}

}  // namespace hetra::comm
