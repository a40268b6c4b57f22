#include "comm/work_queue.h"

#include "common/errors.h"
#include "common/logging.h"

namespace hetra::comm {

void WorkQueue::Item::wait(Deadline deadline) {
  if (!isCompleted()) owner_->waitFor(*this, deadline);
  if (error_) std::rethrow_exception(error_);
}

// An operation queued behind others starts when they end, and each has the group's timeout from
// its start: twice that covers the common case of one operation ahead.
void WorkQueue::Item::wait() {
  wait(deadlineAfter(2 * owner_->timeout_));
}

void WorkQueue::Item::execute(std::exception_ptr latched, Millis timeout) {
  if (latched) {
    error_ = latched;
  } else {
    try {
      run(deadlineAfter(timeout));
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
  queued_.fetch_add(1, std::memory_order_release);
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
void WorkQueue::waitFor(Item& item, Deadline deadline) {
  // The clock is read only once running the queue's front is not enough: an operation issued and
  // waited for at once completes without one.
  Clock::time_point start{}, spinUntil{};
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
    }
    if (Clock::now() < spinUntil) {
      std::this_thread::yield();
      continue;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    ++waiters_;
    const bool ready = cv_.wait_until(
        lock, deadline, [&] { return item.isCompleted() || (!executing_ && !queue_.empty()); });
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
  queued_.fetch_sub(1, std::memory_order_release);
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
