// OpState::transport_area: a transport's own per-operation state, zeroed for each new use of
// a pooled op, so a fresh one never carries the previous operation's values.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>

#include "transport/op.hpp"

namespace ferry::transport {
namespace {

struct ExampleArea {
  uint64_t token;
  int64_t on_wire;
  bool flag;
  unsigned char handle[40];  // a 64-byte area holds a CUDA IPC event or a libfabric context
};
static_assert(sizeof(ExampleArea) <= OpState::kTransportAreaBytes);

TEST(OpTransportArea, IsZeroForEachNewUseOfAPooledOp) {
  auto pool = std::make_shared<OpPool>();
  OpState* op = pool->acquire();
  ExampleArea& area = op->transport_area<ExampleArea>();
  EXPECT_EQ(area.token, 0u);
  area.token = 7;
  area.flag = true;
  area.handle[39] = 0xAB;
  std::atomic_ref<int64_t>(area.on_wire).fetch_add(3);
  EXPECT_EQ(op->transport_area<ExampleArea>().on_wire, 3);
  op->release();
  OpState* again = pool->acquire();
  ASSERT_EQ(again, op) << "the pool hands out the op just freed";
  const ExampleArea& fresh = again->transport_area<ExampleArea>();
  EXPECT_EQ(fresh.token, 0u);
  EXPECT_EQ(fresh.on_wire, 0);
  EXPECT_FALSE(fresh.flag);
  EXPECT_EQ(fresh.handle[39], 0);
  again->release();
}

}  // namespace
}  // namespace ferry::transport
