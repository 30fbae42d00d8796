// Internal utilities on every call's path: the live-handle set (lock-free
// lookups for the first handles, the locked set beyond them) and the settings
// generation that caches of derived values key on.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "util/live_set.h"
#include "util/param.h"

namespace meshccl {
namespace {

struct Obj {
  int v = 0;
};

TEST(LiveSet, AnswersForHandlesInAndBeyondTheFastArray) {
  LiveSet<Obj> set;
  std::vector<std::unique_ptr<Obj>> objs;
  for (int i = 0; i < 200; ++i) objs.push_back(std::make_unique<Obj>());
  for (auto& o : objs) set.add(o.get());
  for (auto& o : objs) EXPECT_TRUE(set.contains(o.get()));
  Obj stranger;
  EXPECT_FALSE(set.contains(&stranger));
  EXPECT_FALSE(set.contains(nullptr));
  // Remove every other one, from both parts; the rest stay live.
  for (size_t i = 0; i < objs.size(); i += 2) set.remove(objs[i].get());
  for (size_t i = 0; i < objs.size(); ++i) EXPECT_EQ(set.contains(objs[i].get()), i % 2 == 1) << i;
  // Freed fast slots are reused; handles added later are found.
  std::vector<std::unique_ptr<Obj>> more;
  for (int i = 0; i < 150; ++i) {
    more.push_back(std::make_unique<Obj>());
    set.add(more.back().get());
  }
  for (auto& o : more) EXPECT_TRUE(set.contains(o.get()));
  for (auto& o : more) set.remove(o.get());
  for (auto& o : more) EXPECT_FALSE(set.contains(o.get()));
  for (size_t i = 1; i < objs.size(); i += 2) EXPECT_TRUE(set.contains(objs[i].get())) << i;
  // take_if hands a handle back once.
  EXPECT_TRUE(set.take_if(objs[1].get(), [](const Obj&) { return true; }));
  EXPECT_FALSE(set.take_if(objs[1].get(), [](const Obj&) { return true; }));
  EXPECT_FALSE(set.contains(objs[1].get()));
}

TEST(LiveSet, LookupsWhileOtherThreadsAddAndRemove) {
  LiveSet<Obj> set;
  Obj stable;
  set.add(&stable);
  std::vector<std::thread> churn;
  for (int t = 0; t < 3; ++t) {
    churn.emplace_back([&set] {
      std::vector<Obj> mine(50);
      for (int round = 0; round < 200; ++round) {
        for (Obj& o : mine) set.add(&o);
        for (Obj& o : mine) set.remove(&o);
      }
    });
  }
  // A handle that stays live is never missed while others come and go.
  int missed = 0;
  for (int i = 0; i < 200000; ++i) missed += !set.contains(&stable);
  for (auto& t : churn) t.join();
  EXPECT_EQ(missed, 0);
  EXPECT_TRUE(set.contains(&stable));
}

TEST(Params, GenerationChangesExactlyWhenTheValuesDo) {
  unsetenv("MESHCCL_CHUNKSIZE");
  param_refresh();
  const uintptr_t g0 = param_generation();
  param_refresh();
  EXPECT_EQ(param_generation(), g0) << "an unchanged environment keeps its generation";
  setenv("MESHCCL_CHUNKSIZE", "65536", 1);
  param_refresh();
  const uintptr_t g1 = param_generation();
  EXPECT_NE(g1, g0);
  EXPECT_EQ(param_int(Param::ChunkSize), 65536);
  unsetenv("MESHCCL_CHUNKSIZE");
  param_refresh();
  EXPECT_NE(param_generation(), g1);
}

}  // namespace
}  // namespace meshccl
