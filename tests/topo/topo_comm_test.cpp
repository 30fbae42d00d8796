// Communicators whose system graph comes from MESHCCL_TOPO_FILE or from
// discovery: ranks as threads of this process.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "comm/comm.h"
#include "tests/common/harness.h"
#include "topo/exchange.h"
#include "topo/topo_file.h"
#include "util/log.h"

namespace meshccl {
namespace {

using meshccl_test::run_ranks;
using meshccl_test::ScopedEnv;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A scratch directory, removed with what is in it.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/meshccl_topo_XXXXXX";
    const char* d = mkdtemp(tmpl);
    path_ = d != nullptr ? d : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& dir() const { return path_; }
  std::string file(const std::string& name, const std::string& content = "") {
    const std::string p = path_ + "/" + name;
    if (!content.empty()) std::ofstream(p) << content;
    return p;
  }

 private:
  std::string path_;
};

// The expected class of each pair, row by row ("S" self, "N" same NUMA,
// "X" across NUMA, "W" network).
void expect_classes(const SystemGraph& g, const std::vector<std::string>& rows) {
  ASSERT_EQ(g.nranks(), static_cast<int>(rows.size()));
  for (int a = 0; a < g.nranks(); ++a)
    for (int b = 0; b < g.nranks(); ++b)
      EXPECT_EQ("SNXW"[static_cast<int>(g.link(a, b).cls)], rows[a][b]) << "ranks " << a << "," << b;
}

TEST(TopoComm, TwoNumaNodesFromFile) {
  TempDir tmp;
  const std::string dump = tmp.file("dump.xml");
  ScopedEnv env({{"MESHCCL_TOPO_FILE", TOPO_DATA_DIR "/two_numa_4ranks.xml"}, {"MESHCCL_TOPO_DUMP_FILE", dump}});
  std::mutex mu;
  std::vector<std::string> xml(4);
  std::vector<SystemGraph> children(4);
  run_ranks(4, [&](ncclComm_t comm, int rank) {
    const SystemGraph& g = comm->topo;
    expect_classes(g, {"SNXX", "NSXX", "XXSN", "XXNS"});
    EXPECT_EQ(g.link(0, 1).bw_gbs, 20);
    EXPECT_EQ(g.link(0, 3).bw_gbs, 8);
    ASSERT_EQ(g.hosts.size(), 1u);
    EXPECT_EQ(g.hosts[0].name, "numa2");
    EXPECT_EQ(g.ranks[rank].numa, rank / 2);
    // The communicator works as usual.
    float v = static_cast<float>(rank + 1);
    EXPECT_EQ(ncclAllReduce(&v, &v, 1, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
    EXPECT_EQ(v, 10.0f);
    // A split keeps each member's placement: ranks 1 and 2 sit on different nodes.
    ncclComm_t child = nullptr;
    const int color = rank == 1 || rank == 2 ? 0 : NCCL_SPLIT_NOCOLOR;
    ASSERT_EQ(ncclCommSplit(comm, color, rank, &child, nullptr), ncclSuccess);
    if (child != nullptr) {
      {
        std::lock_guard<std::mutex> lock(mu);
        children[rank] = child->topo;
      }
      EXPECT_EQ(ncclCommDestroy(child), ncclSuccess);
    }
    std::lock_guard<std::mutex> lock(mu);
    xml[rank] = topo_to_xml(g);
  });
  for (int r = 1; r < 4; ++r) EXPECT_EQ(xml[r], xml[0]) << "rank " << r << " has another graph";
  for (int r : {1, 2}) expect_classes(children[r], {"SX", "XS"});
  // The split child wrote nothing over its parent's dump (no %c in the name).
  // Rank 0 wrote the graph; it reads back into the same graph.
  const std::string written = slurp(dump);
  EXPECT_EQ(written, xml[0]);
  TopoFile back;
  ASSERT_TRUE(topo_read_file(dump, &back).ok());
  SystemGraph g;
  g.hosts = back.hosts;
  g.ranks = back.ranks;
  EXPECT_EQ(topo_to_xml(g), written);
}

TEST(TopoComm, DumpPerCommunicator) {
  EXPECT_EQ(topo_dump_name("/t/g.xml", 0xab, false), "/t/g.xml");
  EXPECT_EQ(topo_dump_name("/t/g.xml", 0xab, true), "");
  EXPECT_EQ(topo_dump_name("/t/g-%c.xml", 0xab, true), "/t/g-00000000000000ab.xml");
  EXPECT_EQ(topo_dump_name("%c%c", 1, false), "00000000000000010000000000000001");
  TempDir tmp;
  const std::string dir = tmp.dir();
  ScopedEnv env(
      {{"MESHCCL_TOPO_FILE", TOPO_DATA_DIR "/two_numa_4ranks.xml"}, {"MESHCCL_TOPO_DUMP_FILE", dir + "/g-%c.xml"}});
  std::string parent_file, child_file;
  run_ranks(4, [&](ncclComm_t comm, int rank) {
    ncclComm_t child = nullptr;
    ASSERT_EQ(ncclCommSplit(comm, rank % 2, rank, &child, nullptr), ncclSuccess);
    if (rank == 0) {
      parent_file = topo_dump_name(dir + "/g-%c.xml", comm->comm_hash, false);
      child_file = topo_dump_name(dir + "/g-%c.xml", child->comm_hash, true);
    }
    EXPECT_EQ(ncclCommDestroy(child), ncclSuccess);
  });
  TopoFile whole, part;
  ASSERT_TRUE(topo_read_file(parent_file, &whole).ok());
  ASSERT_TRUE(topo_read_file(child_file, &part).ok());
  EXPECT_EQ(whole.ranks.size(), 4u);
  ASSERT_EQ(part.ranks.size(), 2u);  // ranks 0 and 2 of the parent
  EXPECT_EQ(part.ranks[1].numa, 1);
}

TEST(TopoComm, TwoHostsFromFile) {
  TempDir tmp;
  const std::string file =
      tmp.file("hosts.xml",
               "<meshccl_topology version=\"1\">\n"
               "  <host name=\"a\"><numa id=\"0\" cpus=\"0-3\"/><numa id=\"1\" cpus=\"4-7\"/></host>\n"
               "  <host name=\"b\"><numa id=\"0\" cpus=\"0-7\"/></host>\n"
               "  <rank id=\"0\" host=\"0\" numa=\"0\" net_gbs=\"12.5\"/>\n"
               "  <rank id=\"1\" host=\"0\" numa=\"1\" net_gbs=\"12.5\"/>\n"
               "  <rank id=\"2\" host=\"1\" numa=\"0\" net_gbs=\"3\"/>\n"
               "</meshccl_topology>\n");
  ScopedEnv env({{"MESHCCL_TOPO_FILE", file}});
  run_ranks(3, [&](ncclComm_t comm, int) {
    const SystemGraph& g = comm->topo;
    expect_classes(g, {"SXW", "XSW", "WWS"});
    EXPECT_EQ(g.link(0, 2).bw_gbs, 3);
    EXPECT_EQ(g.ranks_on_host(0), (std::vector<int>{0, 1}));
    EXPECT_EQ(g.ranks_on_host(1), (std::vector<int>{2}));
  });
}

TEST(TopoComm, Discovered) {
  ScopedEnv env({{"MESHCCL_TOPO_FILE", ""}});
  run_ranks(3, [&](ncclComm_t comm, int rank) {
    const SystemGraph& g = comm->topo;
    ASSERT_EQ(g.hosts.size(), 1u);  // threads of one process: one host
    EXPECT_EQ(g.hosts[0].name, comm->peers[rank].host_id);
    EXPECT_FALSE(g.hosts[0].numa.empty());
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(g.ranks[r].ifname, "lo");  // MESHCCL_SOCKET_IFNAME=lo
      EXPECT_NE(g.link(rank, r).cls, LinkClass::kNetwork);
      EXPECT_FALSE(g.ranks[r].cpus.empty());
      if (g.hosts[0].numa.size() == 1) EXPECT_EQ(g.ranks[r].numa, g.hosts[0].numa[0].id);
    }
  });
}

// Ranks as forked processes on emulated hosts (MESHCCL_HOSTID per process),
// with discovery: each host's description travels from its lowest rank.
TEST(TopoComm, DiscoveredAcrossEmulatedHosts) {
  TempDir tmp;
  const std::string dump = tmp.file("hosts.xml");
  ScopedEnv env({{"MESHCCL_TOPO_FILE", ""}, {"MESHCCL_TOPO_DUMP_FILE", dump}});
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  const int n = 3;  // ranks 0 and 2 on host a, rank 1 on host b
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> kids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0) << std::strerror(errno);
    if (pid == 0) {
      setenv("MESHCCL_HOSTID", r == 1 ? "topo-host-b" : "topo-host-a", 1);
      ncclComm_t comm = nullptr;
      int code = 0;
      if (ncclCommInitRank(&comm, n, id, r) != ncclSuccess) _exit(2);
      const SystemGraph& g = comm->topo;
      if (g.hosts.size() != 2 || g.link(0, 1).cls != LinkClass::kNetwork || g.link(2, 1).cls != LinkClass::kNetwork ||
          g.link(0, 2).cls == LinkClass::kNetwork)
        code = 3;
      if (ncclCommDestroy(comm) != ncclSuccess) code = 4;
      std::fflush(stdout);
      _exit(code);
    }
    kids.push_back(pid);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (pid_t pid : kids) {
    int st = 0;
    pid_t got = 0;
    while ((got = waitpid(pid, &st, WNOHANG)) == 0) {
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(60)) {
        kill(pid, SIGKILL);
        got = waitpid(pid, &st, 0);
        ADD_FAILURE() << "rank process " << pid << " did not finish in 60 s";
        break;
      }
      usleep(10000);
    }
    ASSERT_EQ(got, pid);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
  }
  TopoFile f;
  ASSERT_TRUE(topo_read_file(dump, &f).ok());
  ASSERT_EQ(f.hosts.size(), 2u);
  EXPECT_EQ(f.hosts[0].name, "topo-host-a");
  EXPECT_EQ(f.hosts[1].name, "topo-host-b");
  ASSERT_EQ(f.ranks.size(), 3u);
  EXPECT_EQ(f.ranks[0].host, 0);
  EXPECT_EQ(f.ranks[1].host, 1);
  EXPECT_EQ(f.ranks[2].host, 0);
  // Both hosts are this machine, described alike.
  EXPECT_EQ(f.hosts[0].numa.size(), f.hosts[1].numa.size());
  EXPECT_EQ(f.hosts[0].cores.size(), f.hosts[1].cores.size());
}

// Every rank's init fails with ncclInvalidArgument and a message containing `what`.
void expect_init_fails(int n, const std::string& what) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ncclComm_t comm = nullptr;
      EXPECT_EQ(ncclCommInitRank(&comm, n, id, r), ncclInvalidArgument);
      const std::string err = ncclGetLastError(nullptr);
      EXPECT_NE(err.find(what), std::string::npos) << err;
      if (comm != nullptr) (void)ncclCommDestroy(comm);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(TopoComm, MalformedFileFailsInitOnEveryRank) {
  TempDir tmp;
  const std::string file = tmp.file("bad.xml", "<system version=\"1\">\n  <cpu numaid=\"one\"/>\n</system>\n");
  ScopedEnv env({{"MESHCCL_TOPO_FILE", file}});
  expect_init_fails(2, file + ":2: bad number 'one' for attribute 'numaid' of <cpu>");
}

TEST(TopoComm, FileWithOtherRankCount) {
  ScopedEnv env({{"MESHCCL_TOPO_FILE", TOPO_DATA_DIR "/two_numa_4ranks.xml"}});
  expect_init_fails(2, "places 4 rank(s) but this communicator has 2");
}

TEST(TopoComm, NcclFileForAGpuServer) {
  // Ranks without GPUs on a described 8-GPU server: local rank i drives GPU i.
  ScopedEnv env({{"MESHCCL_TOPO_FILE", TOPO_DATA_DIR "/nccl_2socket_8gpu.xml"}});
  run_ranks(6, [&](ncclComm_t comm, int) {
    expect_classes(comm->topo, {"SNNNXX", "NSNNXX", "NNSNXX", "NNNSXX", "XXXXSN", "XXXXNS"});
    EXPECT_EQ(comm->topo.hosts[0].gpu_count(), 8);
  });
}

TEST(TopoComm, GraphLoggedAtInit) {
  TempDir tmp;
  const std::string log = tmp.file("log.txt");
  {
    ScopedEnv env({{"MESHCCL_TOPO_FILE", TOPO_DATA_DIR "/two_numa_4ranks.xml"},
                   {"MESHCCL_DEBUG", "INFO"},
                   {"MESHCCL_DEBUG_SUBSYS", "GRAPH"},
                   {"MESHCCL_DEBUG_FILE", log}});
    log_reset();
    run_ranks(4, [&](ncclComm_t, int) {});
  }
  log_reset();
  const std::string text = slurp(log);
  EXPECT_NE(text.find("Topology 4 rank(s) on 1 host(s)"), std::string::npos) << text;
  EXPECT_NE(text.find("Topology   0: SNXX"), std::string::npos) << text;
  EXPECT_NE(text.find("Topology rank 3: host numa2, numa 1"), std::string::npos) << text;
  EXPECT_EQ(text.find("Init COMPLETE"), std::string::npos);  // INIT is not among the subsystems asked for
}

}  // namespace
}  // namespace meshccl
