#include "elastic.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "checkpoint.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

std::string boot_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  f >> id;
  return id.empty() ? "unknown" : id;
}

fs::path pid_file(const std::string& dir, int orig) {
  return fs::path(dir) / "elastic" / ("rank_" + std::to_string(orig) + ".pid");
}

// True only when the rank is known to be gone: its pid file names this
// machine (boot id) and no process has that pid.
bool known_dead(const std::string& dir, int orig, const std::string& here) {
  std::ifstream f(pid_file(dir, orig));
  std::string boot;
  long pid = 0;
  if (!(f >> boot >> pid) || boot != here || pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

}  // namespace

void elastic_register(const std::string& ckpt_dir, int orig_rank) {
  std::error_code ec;
  fs::create_directories(fs::path(ckpt_dir) / "elastic", ec);
  const fs::path p = pid_file(ckpt_dir, orig_rank);
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream f(tmp);
    f << boot_id() << " " << getpid() << "\n";
    if (!f) throw CheckpointError("--elastic: cannot write " + tmp.string());
  }
  fs::rename(tmp, p, ec);
  if (ec) throw CheckpointError("--elastic: cannot rename " + tmp.string() + ": " + ec.message());
}

void elastic_leave(const std::string& ckpt_dir, int orig_rank) {
  std::error_code ec;
  const fs::path p = pid_file(ckpt_dir, orig_rank);
  fs::rename(p, p.string() + ".left", ec);
}

ElasticPlan elastic_find_dead(const std::string& ckpt_dir, const std::vector<int>& orig, const Layout& layout,
                              double wait_s) {
  ElasticPlan plan;
  const std::string here = boot_id();
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    for (int r = 0; r < static_cast<int>(orig.size()); ++r)
      if (known_dead(ckpt_dir, orig[r], here)) plan.dead.push_back(r);
    if (!plan.dead.empty() || std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= wait_s)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::set<int> lost;
  for (int r : plan.dead) lost.insert(coords_of(r, layout).dp);
  for (int r = 0; r < layout.world(); ++r)
    if (lost.count(coords_of(r, layout).dp)) plan.excluded.push_back(r);
  plan.lost_replicas = static_cast<int>(lost.size());
  return plan;
}

void elastic_abandon(RankComms* rc) {
  for (auto* c : {&rc->dp, &rc->tp, &rc->embed, &rc->cube[0], &rc->cube[1], &rc->cube[2]}) {
    if (*c) (*c)->abandon();
    c->reset();
  }
  // The pipeline is a plain communicator here (--elastic refuses per-stage
  // tensor-parallel degrees, whose pipeline is a StagePipe).
  if (auto* pp = dynamic_cast<NcclComm*>(rc->pp.get())) pp->abandon();
  rc->pp.reset();
}

ncclComm_t elastic_shrink(RankComms* old, const std::vector<int>& excluded) {
  elastic_abandon(old);
  ncclComm_t parent = old->world->release();
  old->world.reset();
  ncclComm_t child = nullptr;
  std::vector<int> ex = excluded;
  const ncclResult_t r =
      ncclCommShrink(parent, ex.data(), static_cast<int>(ex.size()), &child, nullptr, NCCL_SHRINK_ABORT);
  ncclCommAbort(parent);
  check_nccl(r, "ncclCommShrink");
  return child;
}

}  // namespace meshtrain
