// A save killed at any moment leaves the previous checkpoint usable: a child
// process saves checkpoints of two ranks back to back, exactly in the order
// Engine::save_checkpoint does (stale temporaries removed, every shard
// written, then `latest`, then pruning), and is SIGKILLed at a random moment,
// many times. After each kill `latest` names a step whose every shard reads
// back, verifies, and holds that step's values, and the steps never go back.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint.h"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

constexpr int kRanks = 2;
constexpr size_t kParams = 40000;  // 480 KB per shard

float value(int step, int rank, size_t i, int which) {
  return static_cast<float>((step * 131 + rank * 17 + which * 7 + static_cast<int>(i % 1000)) % 1000) * 0.5f;
}

ShardHeader header(int rank, int step) {
  ModelConfig m;
  Layout l{kRanks, 1, 1};
  return make_shard_header(m, l, rank, step, kParams, 0, m.layers);
}

// The child: saves steps from `first` on until it is killed (bounded).
void save_step(const fs::path& dir, int step, std::vector<float>& p, std::vector<float>& m, std::vector<float>& v) {
  for (int r = 0; r < kRanks; ++r) {
    remove_stale_tmp(dir.string(), r);
    fs::create_directories(dir / step_dir_name(step));
    for (size_t i = 0; i < kParams; ++i)
      p[i] = value(step, r, i, 0), m[i] = value(step, r, i, 1), v[i] = value(step, r, i, 2);
    write_shard((dir / step_dir_name(step) / rank_file_name(r)).string(), header(r, step), p.data(), m.data(),
                v.data());
  }
  write_latest(dir.string(), step);
  prune_checkpoints(dir.string(), step, 2);
}

[[noreturn]] void save_forever(const fs::path& dir, int first) {
  std::vector<float> p(kParams), m(kParams), v(kParams);
  for (int step = first; step < first + 100000; ++step) save_step(dir, step, p, m, v);
  _exit(0);
}

bool has_tmp(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec))
    if (e.path().extension() == ".tmp") return true;
  return false;
}

}  // namespace

TEST(CheckpointKill, AKilledSaveLeavesThePreviousCheckpointUsable) {
  const fs::path dir = fs::temp_directory_path() / ("meshtrain_ckpt_kill_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::mt19937 rng(std::random_device{}());
  // How long one save takes here and now (the machine may be loaded): kills
  // land anywhere within about three saves.
  long save_us = 0;
  {
    const fs::path probe = dir / "probe";
    std::vector<float> p(kParams), m(kParams), v(kParams);
    const auto t0 = std::chrono::steady_clock::now();
    save_step(probe, 0, p, m, v);
    save_us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
    fs::remove_all(probe);
  }
  const unsigned window_us = static_cast<unsigned>(std::max(3000L, 3 * save_us));
  int last = -1, mid_save = 0, advanced = 0;
  const int kills = 120;
  for (int k = 0; k < kills; ++k) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        save_forever(dir, last + 1);
      } catch (...) { _exit(3); }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % window_us));
    kill(pid, SIGKILL);
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(st)) << "the saving child ended by itself (status " << st << ") on kill " << k;
    mid_save += has_tmp(dir);
    // What a resuming run does first: remove temporaries of killed saves.
    for (int r = 0; r < kRanks; ++r) remove_stale_tmp(dir.string(), r);
    EXPECT_FALSE(has_tmp(dir));
    if (!fs::exists(dir / "latest")) {
      ASSERT_EQ(last, -1) << "latest disappeared after step " << last << " on kill " << k;
      continue;
    }
    int step = -1;
    try {
      step = read_latest(dir.string());
    } catch (const CheckpointError& e) { FAIL() << "kill " << k << ": " << e.what(); }
    ASSERT_GE(step, last) << "kill " << k << ": latest went back";
    advanced += step > last;
    for (int r = 0; r < kRanks; ++r) {
      std::vector<float> p, m, v;
      try {
        read_shard((dir / step_dir_name(step) / rank_file_name(r)).string(), header(r, step), &p, &m, &v);
      } catch (const CheckpointError& e) {
        FAIL() << "kill " << k << ": step " << step << " rank " << r << ": " << e.what();
      }
      for (size_t i = 0; i < kParams; i += 997) {
        ASSERT_EQ(p[i], value(step, r, i, 0)) << "step " << step << " rank " << r << " element " << i;
        ASSERT_EQ(m[i], value(step, r, i, 1));
        ASSERT_EQ(v[i], value(step, r, i, 2));
      }
    }
    last = step;
  }
  std::printf(
      "[ ckpt-kill ] one save %.1f ms; %d kills, %d landed inside a shard or pointer write, latest advanced %d times "
      "to step %d\n",
      save_us / 1e3, kills, mid_save, advanced, last);
  // The kills did land inside saves, and saves made progress between them.
  EXPECT_GT(mid_save, 0);
  EXPECT_GT(advanced, 0);
  fs::remove_all(dir);
}
