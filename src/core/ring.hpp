// A FIFO that grows by doubling and never shrinks, so a warm queue allocates nothing.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace ferry::core {

template <typename T>
class Ring {
 public:
  bool empty() const { return count_ == 0; }
  std::size_t size() const { return count_; }
  T& front() { return items_[head_]; }
  void push_back(T value) {
    if (count_ == items_.size()) grow();
    items_[(head_ + count_) & (items_.size() - 1)] = std::move(value);
    ++count_;
  }
  void pop_front() {
    items_[head_] = T();
    head_ = (head_ + 1) & (items_.size() - 1);
    --count_;
  }
  void clear() {
    while (!empty()) pop_front();
  }
  template <typename Pred>
  bool any_of(Pred pred) const {
    for (std::size_t i = 0; i < count_; ++i) {
      if (pred(items_[(head_ + i) & (items_.size() - 1)])) return true;
    }
    return false;
  }

 private:
  void grow() {
    std::vector<T> bigger(items_.empty() ? 16 : items_.size() * 2);
    for (std::size_t i = 0; i < count_; ++i) {
      bigger[i] = std::move(items_[(head_ + i) & (items_.size() - 1)]);
    }
    items_ = std::move(bigger);
    head_ = 0;
  }
  std::vector<T> items_;
  std::size_t head_ = 0;
  std::size_t count_ = 0;
};

}  // namespace ferry::core
