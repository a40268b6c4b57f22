// WorkQueue: runs one group's operations in the order they were issued, on a progress thread or on
// the thread that waits for them, and latches the first failure.
//
// Vocabulary:
//   operation  a closure with a deadline, queued by the communicator; its Work completes when it
//              ran (or was failed by the latched error without running).
//   execute    exactly one thread runs the front operation at a time, with the queue's lock
//              released: either the progress thread or a waiter that finds nobody running one.
//   latch      the first error of any operation; every later operation fails with it at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/communicator.h"
#include "common/timing.h"

namespace hetra::comm {

class WorkQueue {
 public:
  // `timeout`: each operation's deadline, from when it starts. `onFirstFailure` runs once, on the
  // executing thread, with the first error an operation raised (the communicator aborts the
  // transport there, so peers blocked in the same operation wake).
  WorkQueue(int rank, Millis timeout, std::function<void(std::exception_ptr)> onFirstFailure);
  // Operations still queued run before the progress thread stops, so no Work is left pending.
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // `describe()` builds the operation's name only when a message needs it; `run(deadline)` runs it.
  // One block holds the Work and both closures, reused from the calling thread's free list.
  template <typename Describe, typename Run>
  WorkPtr enqueue(Describe describe, Run run) {
    using Queued = ItemOf<Describe, Run>;
    auto item = std::allocate_shared<Queued>(BlockAllocator<Queued>(), this, std::move(describe),
                                             std::move(run));
    push(item);
    return item;
  }

  // Fails every operation from now on with `error` (the first latched error stays).
  void latch(std::exception_ptr error);

  Millis timeout() const { return timeout_; }

 private:
  // One queued operation and its Work handle.
  class Item : public Work {
   public:
    explicit Item(WorkQueue* owner) : owner_(owner) {}
    bool isCompleted() const override { return done_.load(std::memory_order_acquire); }
    void wait(Deadline deadline) override;
    void wait() override;
    std::exception_ptr exception() const override { return isCompleted() ? error_ : nullptr; }
    virtual std::string describe() const = 0;
    // Runs the operation (once, on whichever thread executes it) and publishes the result.
    void execute(std::exception_ptr latched, Millis timeout);

   protected:
    virtual void run(Deadline deadline) = 0;

   private:
    WorkQueue* owner_;  // valid until done_: the queue drains before it dies
    std::exception_ptr error_;
    std::atomic<bool> done_{false};
  };

  template <typename Describe, typename Run>
  class ItemOf final : public Item {
   public:
    ItemOf(WorkQueue* owner, Describe describe, Run run)
        : Item(owner), describe_(std::move(describe)), run_(std::move(run)) {}
    std::string describe() const override { return describe_(); }

   private:
    void run(Deadline deadline) override { run_(deadline); }
    Describe describe_;
    Run run_;
  };

  // Memory of queued operations: blocks of kBlockBytes on a free list per thread, so that an
  // operation issued and released on one thread (issued, waited for, dropped: the common case)
  // takes its predecessor's block instead of calling the allocator. Larger ones use the allocator.
  static constexpr size_t kBlockBytes = 512;
#if defined(__SANITIZE_ADDRESS__)
  static constexpr bool kPooled = false;  // AddressSanitizer then sees every Work's memory freed
#else
  static constexpr bool kPooled = true;
#endif
  static void* takeBlock();
  static void giveBlock(void* block);
  template <typename T>
  struct BlockAllocator {
    using value_type = T;
    static constexpr bool kFits =
        kPooled && sizeof(T) <= kBlockBytes && alignof(T) <= alignof(std::max_align_t);
    BlockAllocator() = default;
    template <typename U>
    BlockAllocator(const BlockAllocator<U>&) {}
    T* allocate(size_t n) {
      if (kFits && n == 1) return static_cast<T*>(takeBlock());
      return std::allocator<T>().allocate(n);
    }
    void deallocate(T* p, size_t n) {
      if (kFits && n == 1) return giveBlock(p);
      std::allocator<T>().deallocate(p, n);
    }
    template <typename U>
    bool operator==(const BlockAllocator<U>&) const {
      return true;
    }
  };

  void push(std::shared_ptr<Item> item);

  // `deadline` null: twice the group's timeout from when the waiter first finds nothing to run.
  void waitFor(Item& item, const Deadline* deadline);
  void executeFront(std::unique_lock<std::mutex>& lock);
  void workLoop();

  int rank_;
  Millis timeout_;
  std::function<void(std::exception_ptr)> onFirstFailure_;

  // While the group is busy the progress thread polls every kPollUs instead of being woken per
  // operation; after kDeepSleepMs without work it sleeps until an enqueue wakes it. A waiter spins
  // kWaitSpinUs before it sleeps.
  static constexpr int kWaitSpinUs = 50;
  static constexpr int kPollUs = 1000;
  static constexpr int kDeepSleepMs = 50;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Item>> queue_;
  std::atomic<size_t> queued_{0};          // queue_.size(), set under the lock, read without it
  std::atomic<bool> executing_{false};     // an operation is running (on any thread)
  std::atomic<int> waiters_{0};            // callers blocked on cv_ (changed under the lock)
  std::atomic<bool> workerAsleep_{false};  // the progress thread waits for an explicit wake-up
  std::exception_ptr failed_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace hetra::comm
