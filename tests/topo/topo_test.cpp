// CPU sets, discovery on this machine, link classes and rank placement.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>

#include "bootstrap/identity.h"
#include "topo/cost_model.h"
#include "topo/discover.h"
#include "topo/exchange.h"
#include "topo/topo_file.h"
#include "topo/topology.h"

namespace meshccl {
namespace {

TEST(CpuSet, ListRoundTrip) {
  for (const char* text : {"", "0", "0-3", "0-3,8", "1,3,5-7,64-130,65535"}) {
    CpuSet s;
    std::string err;
    ASSERT_TRUE(CpuSet::parse_list(text, &s, &err)) << text << ": " << err;
    EXPECT_EQ(s.to_list(), text);
  }
  CpuSet s;
  std::string err;
  for (const char* bad : {"a", "1-", "3-1", "1,", ",1", "1--2", "65536", "0 -1"})
    EXPECT_FALSE(CpuSet::parse_list(bad, &s, &err)) << bad;
}

TEST(CpuSet, HexMask) {
  CpuSet s;
  std::string err;
  ASSERT_TRUE(CpuSet::parse_hex_mask("000000ff,ffff0000,00ffffff", &s, &err)) << err;
  EXPECT_EQ(s.to_list(), "0-23,48-71");
  ASSERT_TRUE(CpuSet::parse_hex_mask("f0", &s, &err));
  EXPECT_EQ(s.to_list(), "4-7");
  EXPECT_FALSE(CpuSet::parse_hex_mask("fg", &s, &err));
  EXPECT_FALSE(CpuSet::parse_hex_mask("ff,,ff", &s, &err));
  EXPECT_FALSE(CpuSet::parse_hex_mask("123456789", &s, &err));  // group wider than 32 bits
  EXPECT_FALSE(CpuSet::parse_hex_mask("", &s, &err));
  std::string huge = "1";
  for (int i = 0; i < 2048; ++i) huge += ",00000000";  // CPU 65536
  EXPECT_FALSE(CpuSet::parse_hex_mask(huge, &s, &err));
  EXPECT_EQ(err, "CPU mask longer than 65536 CPUs");
}

TEST(CpuSet, Relations) {
  CpuSet a, b;
  std::string err;
  ASSERT_TRUE(CpuSet::parse_list("0-3", &a, &err));
  ASSERT_TRUE(CpuSet::parse_list("2-5", &b, &err));
  EXPECT_EQ(a.overlap(b), 2);
  EXPECT_FALSE(a.subset_of(b));
  CpuSet c;
  ASSERT_TRUE(CpuSet::parse_list("1-2", &c, &err));
  EXPECT_TRUE(c.subset_of(a));
  a.add(b);
  EXPECT_EQ(a.to_list(), "0-5");
  EXPECT_EQ(a.first(), 0);
  EXPECT_EQ(CpuSet().first(), -1);
}

// Every CPU the discovered host lists belongs to one NUMA node, cores and
// caches lie inside the host's CPUs, and the calling thread runs on them.
void expect_sane(const HostTopo& h) {
  ASSERT_GE(h.numa.size(), 1u);
  ASSERT_GE(h.packages.size(), 1u);
  ASSERT_GE(h.cores.size(), 1u);
  CpuSet all;
  int numa_cpus = 0;
  for (const TopoNuma& n : h.numa) {
    EXPECT_FALSE(n.cpus.empty()) << "numa " << n.id;
    EXPECT_FALSE(all.intersects(n.cpus)) << "NUMA nodes overlap";
    all.add(n.cpus);
    numa_cpus += n.cpus.count();
  }
  EXPECT_EQ(h.cpu_count(), numa_cpus);
  EXPECT_LE(h.cpu_count(), sysconf(_SC_NPROCESSORS_CONF));
  int core_cpus = 0;
  for (const TopoCore& c : h.cores) {
    EXPECT_TRUE(c.cpus.subset_of(all));
    EXPECT_GE(c.cpus.count(), 1);
    core_cpus += c.cpus.count();
  }
  EXPECT_EQ(core_cpus, h.cpu_count());  // every CPU in exactly one core
  for (const TopoCache& c : h.caches) {
    EXPECT_GE(c.level, 1);
    EXPECT_GT(c.size_kb, 0u);
    EXPECT_TRUE(c.cpus.subset_of(all));
  }
  for (const TopoPci& p : h.pci) EXPECT_TRUE(p.numa == -1 || h.find_numa(p.numa) != nullptr);
  EXPECT_TRUE(current_binding().subset_of(all));
  EXPECT_GT(h.numa_gbs, 0);
  EXPECT_GT(h.cross_numa_gbs, 0);
}

// The network's bandwidth probe: one pair per host, so one flow each way on
// every host's link, whatever the shape.
TEST(CostModel, OnePairPerHostMeasuresTheNetwork) {
  // 2 hosts x 4 ranks, blocked; the greedy matching pairs 0-4, 1-5, 2-6, 3-7.
  EXPECT_EQ(one_pair_per_host({4, 5, 6, 7, 0, 1, 2, 3}, {0, 0, 0, 0, 1, 1, 1, 1}),
            (std::vector<int>{4, -1, -1, -1, 0, -1, -1, -1}));
  // 4 hosts x 2 ranks: 0-2 and 4-6 (hosts 0-1 and 2-3), not 1-3 and 5-7.
  EXPECT_EQ(one_pair_per_host({2, 3, 0, 1, 6, 7, 4, 5}, {0, 0, 1, 1, 2, 2, 3, 3}),
            (std::vector<int>{2, -1, 0, -1, 6, -1, 4, -1}));
  // 4 hosts x 1 rank: both pairs, one per host already.
  EXPECT_EQ(one_pair_per_host({1, 0, 3, 2}, {0, 1, 2, 3}), (std::vector<int>{1, 0, 3, 2}));
  // 3 hosts x 1 rank: the odd host has no partner.
  EXPECT_EQ(one_pair_per_host({1, 0, -1}, {0, 1, 2}), (std::vector<int>{1, 0, -1}));
  // A pair whose second host is taken waits although its first is free.
  EXPECT_EQ(one_pair_per_host({1, 0, 3, 2, -1}, {0, 1, 2, 1, 3}), (std::vector<int>{1, 0, -1, -1, -1}));
  // Every host measures in at most one pair, and a pair is a pair.
  const std::vector<int> host = {0, 0, 1, 1, 1, 2, 2, 3};
  const std::vector<int> match = {2, 3, 0, 1, 5, 4, 7, 6};
  const std::vector<int> got = one_pair_per_host(match, host);
  std::vector<int> in_pairs(4, 0);
  for (size_t r = 0; r < got.size(); ++r) {
    if (got[r] < 0) continue;
    EXPECT_EQ(got[static_cast<size_t>(got[r])], static_cast<int>(r));
    EXPECT_EQ(got[r], match[r]);
    ++in_pairs[static_cast<size_t>(host[r])];
  }
  for (int x : in_pairs) EXPECT_LE(x, 1);
}

TEST(Discover, ThisMachine) {
  const HostTopo& h = local_host_topo();
  expect_sane(h);
  EXPECT_FALSE(h.name.empty());
  std::string why;
  HostTopo hw;
  if (discover_hwloc(&hw, &why)) {
    EXPECT_EQ(hw.source, "hwloc");
    EXPECT_EQ(h.source, "hwloc");
    // hwloc sees the caches of a real or virtual x86/arm machine.
    EXPECT_FALSE(hw.caches.empty());
  } else {
    EXPECT_EQ(h.source, "sysconf") << why;
  }
  // The calling thread's binding is known and on one host's CPUs.
  EXPECT_GE(current_binding().count(), 1);
}

TEST(Discover, Fallback) {
  const HostTopo h = discover_fallback();
  expect_sane(h);
  EXPECT_EQ(h.numa.size(), 1u);
  EXPECT_EQ(static_cast<int>(h.cores.size()), h.cpu_count());
  EXPECT_TRUE(current_binding().subset_of(h.numa[0].cpus));
  EXPECT_GE(h.cpu_count(), static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
}

TEST(Discover, Interfaces) {
  sockaddr_storage ss{};
  auto* in = reinterpret_cast<sockaddr_in*>(&ss);
  in->sin_family = AF_INET;
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(interface_of(ss), "lo");
  in->sin_addr.s_addr = htonl(0xC0000201);  // 192.0.2.1 (TEST-NET-1): on no interface here
  EXPECT_EQ(interface_of(ss), "");
  EXPECT_EQ(nic_speed_gbs(""), 0);
  EXPECT_EQ(nic_speed_gbs("no-such-if-x"), 0);
  EXPECT_GE(nic_speed_gbs("lo"), 0);
}

HostTopo two_numa_host() {
  HostTopo h;
  h.name = "h";
  h.numa_gbs = 20;
  h.cross_numa_gbs = 8;
  std::string err;
  TopoNuma n0, n1;
  n0.id = 0;
  n1.id = 1;
  EXPECT_TRUE(CpuSet::parse_list("0-3", &n0.cpus, &err));
  EXPECT_TRUE(CpuSet::parse_list("4-7", &n1.cpus, &err));
  h.numa = {n0, n1};
  return h;
}

TEST(Graph, LinkClasses) {
  SystemGraph g;
  g.hosts = {two_numa_host(), two_numa_host()};
  g.hosts[1].name = "h2";
  g.hosts[1].numa.pop_back();  // one NUMA node
  g.hosts[1].numa_gbs = 30;
  auto place = [](int host, int numa, double net) {
    RankPlace p;
    p.host = host;
    p.numa = numa;
    p.net_gbs = net;
    return p;
  };
  g.ranks = {place(0, 0, 12.5),  place(0, 0, 12.5), place(0, 1, 12.5),
             place(0, -1, 12.5), place(1, -1, 3),   place(1, 0, 25)};
  EXPECT_EQ(g.link(0, 0).cls, LinkClass::kSelf);
  EXPECT_EQ(g.link(0, 1).cls, LinkClass::kSameNuma);
  EXPECT_EQ(g.link(0, 1).bw_gbs, 20);
  EXPECT_EQ(g.link(1, 2).cls, LinkClass::kCrossNuma);
  EXPECT_EQ(g.link(1, 2).bw_gbs, 8);
  EXPECT_EQ(g.link(0, 3).cls, LinkClass::kCrossNuma);  // unbound on a 2-NUMA host
  EXPECT_EQ(g.link(4, 5).cls, LinkClass::kSameNuma);   // a 1-NUMA host
  EXPECT_EQ(g.link(4, 5).bw_gbs, 30);
  EXPECT_EQ(g.link(0, 4).cls, LinkClass::kNetwork);
  EXPECT_EQ(g.link(0, 4).bw_gbs, 3);  // the slower NIC
  EXPECT_EQ(g.link(5, 2).bw_gbs, 12.5);
  for (int a = 0; a < g.nranks(); ++a)
    for (int b = 0; b < g.nranks(); ++b) EXPECT_EQ(g.link(a, b).cls, g.link(b, a).cls);
  // A split keeps placements and drops hosts without members.
  const SystemGraph s = g.subset({5, 2});
  ASSERT_EQ(s.hosts.size(), 2u);
  EXPECT_EQ(s.hosts[0].name, "h2");
  EXPECT_EQ(s.link(0, 1).cls, LinkClass::kNetwork);
  const SystemGraph t = g.subset({2, 1});
  ASSERT_EQ(t.hosts.size(), 1u);
  EXPECT_EQ(t.link(0, 1).cls, LinkClass::kCrossNuma);
  EXPECT_NE(g.describe().find("0: SNXXWW"), std::string::npos) << g.describe();
}

std::vector<PeerInfo> peers_on_hosts(const std::vector<uint64_t>& host_of_rank) {
  std::vector<PeerInfo> peers(host_of_rank.size());
  for (size_t r = 0; r < peers.size(); ++r) {
    std::memset(&peers[r], 0, sizeof(PeerInfo));
    peers[r].rank = static_cast<int>(r);
    peers[r].host_hash = host_of_rank[r];
    std::snprintf(peers[r].host_id, sizeof(peers[r].host_id), "host%llu",
                  static_cast<unsigned long long>(host_of_rank[r]));
  }
  return peers;
}

TEST(Placement, NcclGpuServerByRank) {
  TopoFile f;
  ASSERT_TRUE(topo_read_file(TOPO_DATA_DIR "/nccl_2socket_8gpu.xml", &f).ok());
  const auto peers = peers_on_hosts({7, 7, 7, 7, 7, 7, 7, 7});
  CpuSet anywhere;  // the binding is of this machine, not the described one
  for (int r = 0; r < 8; ++r) {
    LocalTopo t;
    ASSERT_TRUE(topo_local(r, peers, -1, &f, "x.xml", HostTopo{}, anywhere, "lo", 0, &t).ok());
    EXPECT_EQ(t.place.numa, r < 4 ? 0 : 1) << "rank " << r;  // the GPU the dump marks with the rank
    EXPECT_TRUE(t.from_file);
    EXPECT_EQ(t.place.net_gbs, kNominalNetGbs);
  }
}

TEST(Placement, FileHostsPerRealHost) {
  TopoFile f;
  ASSERT_TRUE(topo_read_file(TOPO_DATA_DIR "/two_hosts_2numa.xml", &f).ok());
  const auto peers = peers_on_hosts({1, 1, 2, 2});
  CpuSet low, high, both;
  std::string err;
  ASSERT_TRUE(CpuSet::parse_list("0-1", &low, &err));
  ASSERT_TRUE(CpuSet::parse_list("5", &high, &err));
  ASSERT_TRUE(CpuSet::parse_list("3-4", &both, &err));
  LocalTopo t0, t2, t3;
  ASSERT_TRUE(topo_local(0, peers, -1, &f, "f", HostTopo{}, low, "eth0", 3, &t0).ok());
  ASSERT_TRUE(topo_local(2, peers, -1, &f, "f", HostTopo{}, high, "eth0", 3, &t2).ok());
  ASSERT_TRUE(topo_local(3, peers, -1, &f, "f", HostTopo{}, both, "eth0", 3, &t3).ok());
  EXPECT_EQ(t0.host.name, "a");
  EXPECT_EQ(t2.host.name, "b");
  EXPECT_NE(t0.host_key, t2.host_key);
  EXPECT_EQ(t2.host_key, t3.host_key);
  EXPECT_EQ(t0.place.numa, 0);
  EXPECT_EQ(t2.place.numa, 1);
  EXPECT_EQ(t3.place.numa, -1);  // spans both nodes
  EXPECT_EQ(t0.place.net_gbs, 3);
  // Three real hosts, two described: refused with the counts.
  const auto three = peers_on_hosts({1, 2, 3});
  LocalTopo t;
  const Status s = topo_local(2, three, -1, &f, "f.xml", HostTopo{}, low, "", 0, &t);
  EXPECT_EQ(s.code(), ncclInvalidArgument);
}

TEST(Placement, Discovered) {
  const HostTopo& h = local_host_topo();
  const auto peers = peers_on_hosts({5, 5, 9});
  LocalTopo t;
  ASSERT_TRUE(topo_local(2, peers, -1, nullptr, "", h, current_binding(), "lo", 0, &t).ok());
  EXPECT_EQ(t.host.name, "host9");
  EXPECT_EQ(t.host_key, 9u);
  EXPECT_FALSE(t.from_file);
  if (h.numa.size() == 1) EXPECT_EQ(t.place.numa, h.numa[0].id);
}

}  // namespace
}  // namespace meshccl
