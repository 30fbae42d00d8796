// The transports' shared building blocks: matching order of the intrusive
// lists, pool reuse, the unexpected-payload buffer pool, size settings.
#include <gtest/gtest.h>

#include <set>

#include "plugins/common/msg_engine.h"
#include "plugins/common/plugin_util.h"

namespace meshccl::plugin {
namespace {

struct Item : Linked<Item> {
  uint64_t tag = 0;
  int id = 0;
};

TEST(MsgEngine, TakeTagReturnsOldestOfThatTag) {
  Item items[6];
  List<Item> list;
  const uint64_t tags[6] = {1, 2, 1, 3, 2, 1};
  for (int i = 0; i < 6; ++i) {
    items[i].tag = tags[i];
    items[i].id = i;
    list.push_back(&items[i]);
  }
  EXPECT_EQ(list.size(), 6u);
  EXPECT_EQ(list.take_tag(2)->id, 1);
  EXPECT_EQ(list.take_tag(1)->id, 0);
  EXPECT_EQ(list.take_tag(1)->id, 2);
  EXPECT_EQ(list.take_tag(4), nullptr);
  EXPECT_EQ(list.take_tag(2)->id, 4);
  EXPECT_EQ(list.take_tag(2), nullptr);
  EXPECT_EQ(list.size(), 2u);
  EXPECT_EQ(list.pop_front()->id, 3);
  EXPECT_EQ(list.pop_front()->id, 5);
  EXPECT_TRUE(list.empty());
  EXPECT_EQ(list.pop_front(), nullptr);
}

TEST(MsgEngine, ForEachMayRemoveTheCurrentElement) {
  Item items[5];
  List<Item> list;
  for (int i = 0; i < 5; ++i) {
    items[i].id = i;
    list.push_back(&items[i]);
  }
  list.for_each([&](Item* e) {
    if (e->id % 2 == 0) list.remove(e);
  });
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list.front()->id, 1);
  EXPECT_EQ(list.front()->next->id, 3);
  EXPECT_EQ(list.front()->next->next, nullptr);
}

TEST(MsgEngine, PoolReusesReturnedObjects) {
  Pool<Item> pool;
  std::set<Item*> seen;
  std::vector<Item*> live;
  for (int i = 0; i < 200; ++i) {
    Item* it = pool.get();
    ASSERT_NE(it, nullptr);
    EXPECT_EQ(it->prev, nullptr);
    EXPECT_EQ(it->tag, 0u);
    it->tag = 99;
    seen.insert(it);
    live.push_back(it);
  }
  EXPECT_EQ(seen.size(), 200u);
  for (Item* it : live) pool.put(it);
  for (int i = 0; i < 200; ++i) {
    Item* it = pool.get();
    EXPECT_TRUE(seen.count(it)) << "steady state must not allocate";
    EXPECT_EQ(it->tag, 0u) << "objects come back freshly constructed";
  }
}

TEST(MsgEngine, BufferPoolClassesAndBudget) {
  BufferPool pool(1u << 20);
  EXPECT_EQ(pool.get(0).ptr, nullptr);
  BufferPool::Buf a = pool.get(100);
  ASSERT_NE(a.ptr, nullptr);
  EXPECT_GE(a.cap, 100u);
  EXPECT_LT(a.cap, 200u);
  pool.put(a);
  EXPECT_EQ(pool.cached_bytes(), a.cap);
  BufferPool::Buf b = pool.get(120);  // same class: the cached buffer comes back
  EXPECT_EQ(b.ptr, a.ptr);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  pool.put(b);

  BufferPool::Buf big = pool.get(3u << 20);  // beyond the classes, beyond the budget
  ASSERT_NE(big.ptr, nullptr);
  EXPECT_GE(big.cap, 3u << 20);
  size_t before = pool.cached_bytes();
  pool.put(big);
  EXPECT_EQ(pool.cached_bytes(), before) << "over budget: freed, not kept";

  BufferPool roomy(64u << 20);
  BufferPool::Buf c = roomy.get(3u << 20);
  roomy.put(c);
  EXPECT_EQ(roomy.get(5u << 19).ptr, c.ptr);  // 2.5 MiB fits the kept 3 MiB buffer
  roomy.put(c);
  BufferPool::Buf d = roomy.get(1u << 20 | 1);  // would waste more than half: fresh
  EXPECT_NE(d.ptr, c.ptr);
  roomy.put(d);
}

TEST(MsgEngine, ParseSize) {
  uint64_t v = 0;
  EXPECT_TRUE(parse_size("65536", &v));
  EXPECT_EQ(v, 65536u);
  EXPECT_TRUE(parse_size("64K", &v));
  EXPECT_EQ(v, 65536u);
  EXPECT_TRUE(parse_size("64KiB", &v));
  EXPECT_EQ(v, 65536u);
  EXPECT_TRUE(parse_size("1M", &v));
  EXPECT_EQ(v, 1u << 20);
  EXPECT_TRUE(parse_size("2g", &v));
  EXPECT_EQ(v, 2ull << 30);
  EXPECT_TRUE(parse_size("0x100", &v));
  EXPECT_EQ(v, 256u);
  EXPECT_TRUE(parse_size("010", &v));
  EXPECT_EQ(v, 10u) << "a leading zero is not octal";
  EXPECT_TRUE(parse_size(" 7 ", &v));
  EXPECT_EQ(v, 7u);
  for (const char* bad : {"", "abc", "-1", "12Q", "1M2", "K", "99999999999999999999", "17179869184G"})
    EXPECT_FALSE(parse_size(bad, &v)) << bad;
  EXPECT_FALSE(parse_size(nullptr, &v));
}

// Calls that find nothing are spaced by an eighth of the empty stretch once
// it is kFreeNs long, within bounds; a call that moved something, or a wake,
// makes the next due.
TEST(EmptyCalls, SpacingGrowsWithTheEmptyStretchAndResets) {
  EmptyCalls c;
  const uint64_t t = 1'000'000'000;
  EXPECT_TRUE(c.due(t));
  c.empty(t);
  EXPECT_TRUE(c.due(t));  // a short stretch is polled freely
  c.empty(t + EmptyCalls::kFreeNs - 1);
  EXPECT_TRUE(c.due(t + EmptyCalls::kFreeNs - 1));
  c.empty(t + 80'000);  // 80 us empty: an eighth is 10 us
  EXPECT_FALSE(c.due(t + 89'999));
  EXPECT_TRUE(c.due(t + 90'000));
  c.empty(t + 10'000'000);  // capped
  EXPECT_FALSE(c.due(t + 10'000'000 + EmptyCalls::kMaxNs - 1));
  EXPECT_TRUE(c.due(t + 10'000'000 + EmptyCalls::kMaxNs));
  c.moved(t + 10'000'001);
  EXPECT_TRUE(c.due(t + 10'000'001));
  c.empty(t + 20'000'000);  // a new stretch
  EXPECT_TRUE(c.due(t + 20'000'000));
  c.empty(t + 20'400'000);
  EXPECT_FALSE(c.due(t + 20'400'001));
  c.wake();
  EXPECT_TRUE(c.due(t + 20'400'001));

  EmptyCalls spaced(2000, 2000);  // every call at least 2 us after the previous one
  spaced.moved(t);
  EXPECT_FALSE(spaced.due(t + 1999));
  EXPECT_TRUE(spaced.due(t + 2000));
  spaced.empty(t + 2000);
  EXPECT_FALSE(spaced.due(t + 3999));
  EXPECT_TRUE(spaced.due(t + 4000));
}

}  // namespace
}  // namespace meshccl::plugin

// A size from a peer's header that no allocation can have is refused, not
// rounded up past SIZE_MAX into a tiny buffer.
TEST(BufferPool, SizesNearTheAddressSpaceAreRefused) {
  meshccl::plugin::BufferPool pool(1u << 20);
  for (size_t n : {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 65535}) {
    meshccl::plugin::BufferPool::Buf b = pool.get(n);
    EXPECT_EQ(b.ptr, nullptr) << n;
    EXPECT_EQ(b.cap, 0u) << n;
  }
}
