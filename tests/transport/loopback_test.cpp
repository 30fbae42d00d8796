// A transport added without touching the runtime: the loopback test plugins
// (tests/plugins/loopback), found on MESHCCL_PLUGIN_PATH, each known to the
// core only by its name and the scope its properties declare. "loopback"
// declares network scope, "loopback-node" node scope.
//   - the registry lists them in its order of preference and reads each
//     one's scope when it loads;
//   - selected by name (NCCL_NET, MESHCCL_TRANSPORT) or by preference, ranks
//     as processes on emulated hosts (MESHCCL_HOSTID) run collectives over
//     them, and each pair uses what its scope allows: the node-scope plugin
//     within a host, never between hosts;
//   - asking for the node-scope one between hosts fails on every rank.
#include <dlfcn.h>
#include <link.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "meshccl.h"
#include "meshccl/transport.h"
#include "tests/common/procs.h"
#include "transport/registry.h"
#include "util/param.h"

namespace {

using namespace meshccl_test;

constexpr double kDeadline = 60;  // per forked rank

// The transport plugins mapped into this process, by file name.
std::set<std::string> plugins_mapped() {
  std::set<std::string> found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* arg) {
        const std::string name = info->dlpi_name != nullptr ? info->dlpi_name : "";
        const size_t at = name.find("libmeshccl-transport-");
        if (at != std::string::npos) static_cast<std::set<std::string>*>(arg)->insert(name.substr(at));
        return 0;
      },
      &found);
  return found;
}

void note(Slot& s, const std::string& text) { std::snprintf(s.message, sizeof(s.message), "%s", text.c_str()); }

// Runs n ranks as processes, rank r on host hosts[r] (MESHCCL_HOSTID), with
// the given settings: each makes a communicator, all-reduces, and checks
// that the pair with every other rank uses want(r, peer). "" in want: the
// init must fail with ncclInvalidUsage and a message containing `error`.
// no_plugins: a rank may map no transport plugin but those this process
// had before it forked the ranks.
void run_job(const std::vector<std::string>& hosts, const std::vector<std::pair<const char*, const char*>>& env,
             const std::function<std::string(int, int)>& want, const std::string& error = "", bool no_plugins = false) {
  const int n = static_cast<int>(hosts.size());
  SharedArray<SharedId> sid(1);
  SharedSlots slots(n);
  const std::set<std::string> before = plugins_mapped();
  auto kids = run_procs(n, kDeadline, [&](int rank) {
    setenv("MESHCCL_HOSTID", hosts[rank].c_str(), 1);
    for (const auto& [k, v] : env) setenv(k, v, 1);
    ncclComm_t comm = nullptr;
    ncclResult_t r = shared_init(sid, n, rank, &comm);
    if (!error.empty()) {
      const std::string why = ncclGetLastError(nullptr);
      if (r == ncclInvalidUsage && why.find(error) != std::string::npos) return 0;
      note(slots[rank], "init gave " + std::string(ncclGetErrorString(r)) + ": " + why);
      return 12;
    }
    if (r != ncclSuccess) return fail(10, rank, "init", r);
    std::vector<float> v(300000, static_cast<float>(rank + 1));
    r = ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat, ncclSum, comm, nullptr);
    if (r != ncclSuccess) return fail(11, rank, "all-reduce", r);
    const float sum = static_cast<float>(n * (n + 1) / 2);
    for (float x : v) {
      if (x != sum) {
        note(slots[rank], "wrong sum " + std::to_string(x));
        return 13;
      }
    }
    std::string got;
    int code = 0;
    for (int p = 0; p < n; ++p) {
      if (p == rank) continue;
      const std::string used = comm->mesh->transport_name(p);
      got += " " + std::to_string(p) + ":" + used;
      if (used != want(rank, p)) code = 14;
    }
    for (const std::string& lib : plugins_mapped()) {
      got += " " + lib;
      if (no_plugins && before.count(lib) == 0) code = 15;
    }
    note(slots[rank], got);
    ncclCommDestroy(comm);
    return code;
  });
  for (const Child& k : kids) EXPECT_TRUE(exited_ok(k)) << describe(k) << ": " << slots[k.rank].message;
}

class Loopback : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("MESHCCL_PLUGIN_PATH", LOOPBACK_DIR, 1);
    unsetenv("MESHCCL_TRANSPORT");
    unsetenv("NCCL_NET");
    meshccl::param_refresh();
  }
};

// The registry finds both plugins on the search path, prefers them to every
// built-in transport (and to plugins of later directories), and reads each
// one's scope from its properties when it loads.
TEST_F(Loopback, TheRegistryListsThemWithTheirScopes) {
  setenv("MESHCCL_PLUGIN_PATH", LOOPBACK_DIR ":" BUILD_PLUGIN_DIR, 1);
  meshccl::param_refresh();
  std::vector<meshccl::TransportInfo> all = meshccl::transport_list();
  auto find = [&](const std::string& name) -> const meshccl::TransportInfo* {
    for (const meshccl::TransportInfo& t : all)
      if (t.name == name) return &t;
    return nullptr;
  };
  const meshccl::TransportInfo* net = find("loopback");
  const meshccl::TransportInfo* node = find("loopback-node");
  ASSERT_NE(net, nullptr);
  ASSERT_NE(node, nullptr);
  EXPECT_NE(net->path.find(LOOPBACK_DIR), std::string::npos) << net->path;
  EXPECT_EQ(net->preference, 0) << "first directory, first name";
  EXPECT_EQ(node->preference, 1);
  for (const char* later : {"ucx", "ofi", "shm", "socket"}) {
    if (const meshccl::TransportInfo* t = find(later)) { EXPECT_GT(t->preference, node->preference) << later; }
  }
  const meshccl_transport_v1_t* api = nullptr;
  std::string why;
  ASSERT_TRUE(meshccl::load_transport("loopback", &api, &why)) << why;
  EXPECT_STREQ(api->name, "loopback");
  EXPECT_EQ(meshccl::transport_scope("loopback"), MESHCCL_SCOPE_NETWORK);
  ASSERT_TRUE(meshccl::load_transport("loopback-node", &api, &why)) << why;
  EXPECT_EQ(meshccl::transport_scope("loopback-node"), MESHCCL_SCOPE_HOST);
  EXPECT_EQ(meshccl::transport_list()[0].name, "shm") << "built-in ones first in the list";
}

// Selected by name between two emulated hosts: every pair over loopback.
TEST_F(Loopback, NcclNetNamesIt) {
  run_job({"h0", "h1", "h2"}, {{"NCCL_NET", "loopback"}}, [](int, int) { return std::string("loopback"); });
}

// Selected by name for every pair, ranks of one host too.
TEST_F(Loopback, MeshcclTransportNamesIt) {
  run_job({"h0", "h0", "h0"}, {{"MESHCCL_TRANSPORT", "loopback"}}, [](int, int) { return std::string("loopback"); });
}

// Nothing named: the registry's preference and the scopes decide. Within a
// host the node-scope plugin (preferred to shm, a built-in), between hosts
// the network one (preferred to socket); never the node-scope one between
// hosts.
TEST_F(Loopback, ScopeAndPreferenceDecide) {
  const std::vector<std::string> hosts = {"h0", "h0", "h1", "h1"};
  run_job(hosts, {}, [&](int a, int b) { return std::string(hosts[a] == hosts[b] ? "loopback-node" : "loopback"); });
}

// A one-host job loads no plugin: shm, which is built in.
TEST_F(Loopback, OneHostLoadsNone) {
  run_job(
      {"h0", "h0"}, {}, [](int, int) { return std::string("shm"); }, "", true);
}

// The node-scope plugin is not a network transport: asked for between hosts,
// init fails on every rank saying so.
TEST_F(Loopback, TheNodeScopeOneIsNoNetworkTransport) {
  run_job({"h0", "h1"}, {{"NCCL_NET", "loopback-node"}}, nullptr, "loopback-node is not a network transport");
}

// Forced for every pair, it connects emulated hosts of one machine (its
// scope is the machine, not the host).
TEST_F(Loopback, TheNodeScopeOneConnectsHostsOfOneMachine) {
  run_job({"h0", "h1"}, {{"MESHCCL_TRANSPORT", "loopback-node"}},
          [](int, int) { return std::string("loopback-node"); });
}

}  // namespace
