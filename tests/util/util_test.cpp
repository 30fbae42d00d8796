// Internal utilities on every call's path: the live-handle set (lock-free
// lookups for the first handles, the locked set beyond them) and the settings
// generation that caches of derived values key on.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "util/live_set.h"
#include "util/param.h"
#include "util/sha256.h"
#include "util/wait.h"

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

std::string hex(const Digest& d) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : d) out += {digits[b >> 4], digits[b & 15]};
  return out;
}

std::string sha256_hex(const std::string& text) {
  Sha256 h;
  h.update(text.data(), text.size());
  return hex(h.finish());
}

// FIPS 180-4's examples (and NIST's one-million-'a' message), also fed in
// pieces that straddle the 64-byte blocks.
TEST(Sha256, FipsTestVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(
      sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
                 "mnopqrstnopqrstu"),
      "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  const std::string million(1000000, 'a');
  EXPECT_EQ(sha256_hex(million), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  for (size_t piece : {1, 7, 63, 64, 65, 1000}) {
    Sha256 h;
    for (size_t at = 0; at < million.size(); at += piece)
      h.update(million.data() + at, std::min(piece, million.size() - at));
    EXPECT_EQ(hex(h.finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") << piece;
  }
}

std::string hmac_hex(const std::string& key, const std::string& data) {
  // Split in two parts: the result is that of the concatenation.
  const size_t half = data.size() / 2;
  return hex(hmac_sha256(key.data(), key.size(), {{data.data(), half}, {data.data() + half, data.size() - half}}));
}

// RFC 4231, test cases 1-4, 6 and 7 (5 truncates the output).
TEST(Sha256, HmacRfc4231TestVectors) {
  EXPECT_EQ(hmac_hex(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hmac_hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hmac_hex(std::string(20, '\xaa'), std::string(50, '\xdd')),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4.push_back(static_cast<char>(i));
  EXPECT_EQ(hmac_hex(key4, std::string(50, '\xcd')),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  EXPECT_EQ(hmac_hex(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_EQ(hmac_hex(std::string(131, '\xaa'),
                     "This is a test using a larger than block-size key and a larger than block-size data. The key "
                     "needs to be hashed before being used by the HMAC algorithm."),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
  const uint8_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 5};
  EXPECT_TRUE(equal_in_constant_time(a, a, 4));
  EXPECT_FALSE(equal_in_constant_time(a, b, 4));
}

}  // namespace
}  // namespace meshccl

// A wait whose idle stretches have been long stops yielding between polls
// (it spins, then sleeps); short stretches bring the yields back, and a
// restart on other work forgets the history.
TEST(Backoff, LongIdleStretchesSkipTheYields) {
  meshccl::Backoff b;
  EXPECT_FALSE(b.skips_yields());
  for (int i = 0; i < 3; ++i) {
    b.idle();
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    b.progress();
  }
  EXPECT_TRUE(b.skips_yields());
  bool back = false;
  for (int i = 0; i < 200 && !back; ++i) {  // a preempted stretch may count long
    b.idle();
    b.progress();
    back = !b.skips_yields();
  }
  EXPECT_TRUE(back);
  for (int i = 0; i < 3; ++i) {
    b.idle();
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    b.progress();
  }
  ASSERT_TRUE(b.skips_yields());
  b.restart();
  EXPECT_FALSE(b.skips_yields());
  b.progress();  // progress without an idle poll measures nothing
  EXPECT_FALSE(b.skips_yields());
}
