// Topology files: NCCL samples, meshccl dumps round-tripping, malformed input.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>

#include "topo/discover.h"
#include "topo/topo_file.h"
#include "topo/xml.h"
#include "util/log.h"

namespace meshccl {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string data(const char* name) { return slurp(std::string(TOPO_DATA_DIR) + "/" + name); }

// The error for `text`, or "" when it parses.
std::string error_of(const std::string& text, TopoFile* out = nullptr) {
  TopoFile f;
  std::string err;
  if (topo_parse("t.xml", text.data(), text.size(), out ? out : &f, &err)) return "";
  return err;
}

TEST(NcclXml, TwoSocketEightGpus) {
  TopoFile f;
  ASSERT_EQ(error_of(data("nccl_2socket_8gpu.xml"), &f), "");
  EXPECT_EQ(f.format, TopoFile::Format::kNccl);
  ASSERT_EQ(f.hosts.size(), 1u);
  EXPECT_TRUE(f.ranks.empty());
  const HostTopo& h = f.hosts[0];
  ASSERT_EQ(h.numa.size(), 2u);
  EXPECT_EQ(h.numa[0].id, 0);
  EXPECT_EQ(h.numa[0].cpus.to_list(), "0-15");
  EXPECT_EQ(h.numa[1].cpus.to_list(), "16-31");
  EXPECT_EQ(h.cpu_count(), 32);
  EXPECT_EQ(h.gpu_count(), 8);
  int nics = 0;
  for (const TopoPci& p : h.pci) {
    if (p.kind == TopoPci::Kind::kGpu) {
      EXPECT_EQ(p.numa, p.gpu_dev < 4 ? 0 : 1) << p.busid;
      EXPECT_EQ(p.gpu_rank, p.gpu_dev);
      EXPECT_EQ(p.pci_class, 0x030200u);
    } else {
      ++nics;
      EXPECT_EQ(p.name, "mlx5_" + std::to_string(nics - 1));
      EXPECT_EQ(p.speed_gbs, 25.0);  // 200000 Mbit/s
      EXPECT_EQ(p.numa, nics <= 2 ? 0 : 1);
      EXPECT_EQ(p.pci_class, 0x020700u);
    }
  }
  EXPECT_EQ(nics, 4);
  EXPECT_EQ(h.pci[0].busid, "0000:18:00.0");
  // Its description reads back through meshccl's format unchanged.
  SystemGraph g;
  g.hosts = f.hosts;
  const std::string once = topo_to_xml(g);
  TopoFile again;
  ASSERT_EQ(error_of(once, &again), "");
  g.hosts = again.hosts;
  EXPECT_EQ(topo_to_xml(g), once);
}

TEST(NcclXml, CpuOnlyHost) {
  TopoFile f;
  ASSERT_EQ(error_of(data("nccl_cpu_only.xml"), &f), "");
  const HostTopo& h = f.hosts[0];
  ASSERT_EQ(h.numa.size(), 1u);
  EXPECT_EQ(h.numa[0].cpus.to_list(), "0-7");
  EXPECT_EQ(h.gpu_count(), 0);
  ASSERT_EQ(h.pci.size(), 1u);
  EXPECT_EQ(h.pci[0].name, "enp65s0f0");
  EXPECT_EQ(h.pci[0].speed_gbs, 3.125);
  EXPECT_EQ(h.pci[0].busid, "0000:41:00.0");
}

TEST(NcclXml, BareDevicesByClass) {
  // Hand-written files list GPUs and NICs as bare <pci> under switches.
  TopoFile f;
  ASSERT_EQ(error_of("<system version=\"1\"><cpu numaid=\"3\" affinity=\"ff\">\n"
                     "<pci busid=\"ffff:ff:01.0\" class=\"0x060400\">\n"
                     "  <pci busid=\"0000:10:1c.0\" class=\"0x030200\"/>\n"
                     "  <pci busid=\"0000:10:1b.0\" class=\"0x020000\"/>\n"
                     "</pci></cpu></system>",
                     &f),
            "");
  const HostTopo& h = f.hosts[0];
  ASSERT_EQ(h.pci.size(), 2u);
  EXPECT_EQ(h.pci[0].kind, TopoPci::Kind::kGpu);
  EXPECT_EQ(h.pci[0].gpu_dev, 0);
  EXPECT_EQ(h.pci[0].numa, 3);
  EXPECT_EQ(h.pci[1].kind, TopoPci::Kind::kNic);
  EXPECT_EQ(h.pci[1].speed_gbs, 0);
}

TEST(MeshcclFormat, RoundTripExact) {
  TopoFile f;
  const std::string text = data("two_numa_4ranks.xml");
  ASSERT_EQ(error_of(text, &f), "");
  ASSERT_EQ(f.ranks.size(), 4u);
  SystemGraph g;
  g.hosts = f.hosts;
  g.ranks = f.ranks;
  EXPECT_EQ(g.link(0, 1).cls, LinkClass::kSameNuma);
  EXPECT_EQ(g.link(0, 1).bw_gbs, 20);
  EXPECT_EQ(g.link(1, 2).cls, LinkClass::kCrossNuma);
  EXPECT_EQ(g.link(1, 2).bw_gbs, 8);
  const std::string dump = topo_to_xml(g);
  TopoFile back;
  ASSERT_EQ(error_of(dump, &back), "") << dump;
  SystemGraph g2;
  g2.hosts = back.hosts;
  g2.ranks = back.ranks;
  EXPECT_EQ(topo_to_xml(g2), dump);
  EXPECT_EQ(g2.hosts[0].bw_source, "measured with stream");
  EXPECT_EQ(g2.hosts[0].pci[0].speed_gbs, 12.5);
  EXPECT_EQ(g2.ranks[3].cpus.to_list(), "6-7");
}

TEST(MeshcclFormat, DiscoveredHostRoundTrips) {
  SystemGraph g;
  g.hosts = {local_host_topo()};
  g.hosts[0].numa_gbs = 1.0 / 3;  // a value with no short decimal form
  for (int r = 0; r < 3; ++r) {
    RankPlace p;
    p.cpus = current_binding();
    p.numa = g.hosts[0].numa_of(p.cpus);
    p.ifname = "lo";
    g.ranks.push_back(p);
  }
  const std::string dump = topo_to_xml(g);
  TopoFile back;
  ASSERT_EQ(error_of(dump, &back), "") << dump;
  EXPECT_EQ(back.hosts[0].numa_gbs, 1.0 / 3);
  SystemGraph g2;
  g2.hosts = back.hosts;
  g2.ranks = back.ranks;
  EXPECT_EQ(topo_to_xml(g2), dump);
  EXPECT_EQ(g2.hosts[0].cores.size(), g.hosts[0].cores.size());
  EXPECT_EQ(g2.hosts[0].caches.size(), g.hosts[0].caches.size());
}

TEST(MeshcclFormat, LinksMustMatchPlacements) {
  std::string text = data("two_numa_4ranks.xml");
  const size_t at = text.find("</meshccl_topology>");
  const std::string good =
      text.substr(0, at) + "  <link a=\"0\" b=\"2\" class=\"cross_numa\" bw_gbs=\"8\"/>\n" + text.substr(at);
  EXPECT_EQ(error_of(good), "");
  const std::string bad =
      text.substr(0, at) + "  <link a=\"0\" b=\"2\" class=\"same_numa\" bw_gbs=\"8\"/>\n" + text.substr(at);
  EXPECT_EQ(error_of(bad), "t.xml:14: link 0-2 says same_numa 8 GB/s but the rank placements give cross_numa 8 GB/s");
}

struct BadCase {
  const char* text;
  const char* error;
};

TEST(Malformed, ErrorsNameLineAndProblem) {
  const BadCase cases[] = {
      {"", "t.xml:1: no root element (empty file)"},
      {"<system version=\"1\">\n  <cpu numaid=\"0\">\n", "t.xml:2: <cpu> is never closed (truncated file?)"},
      {"<system>\n<cpu numaid=\"0\" affinity=\"ff",
       "t.xml:2: unterminated value of attribute 'affinity' (truncated file?)"},
      {"<system>\n<cpu numa", "t.xml:2: file ends inside the tag <cpu> (truncated file?)"},
      {"<system>\n\n<cpu numaid=\"zero\"/></system>", "t.xml:3: bad number 'zero' for attribute 'numaid' of <cpu>"},
      {"<system><cpu numaid=\"-1\"/></system>",
       "t.xml:1: number '-1' out of range [0, 1048576] for attribute 'numaid' of <cpu>"},
      {"<system><cpu numaid=\"99999999999999999999\"/></system>",
       "t.xml:1: bad number '99999999999999999999' for attribute 'numaid' of <cpu>"},
      {"<system><cpu/></system>", "t.xml:1: missing attribute 'numaid' of <cpu>"},
      {"<system><cpu numaid=\"0\" affinity=\"xyz\"/></system>",
       "t.xml:1: bad CPU mask 'xyz' (expected comma-separated groups of up to 8 hex digits) in attribute 'affinity' of "
       "<cpu>"},
      {"<system>\n<cpu numaid=\"0\">\n<gpux/>\n</cpu></system>",
       "t.xml:3: unknown element <gpux> in <cpu> (NCCL topology allows <pci>, <nic>)"},
      {"<system><cpu numaid=\"0\"><pci class=\"0x0302zz\"/></cpu></system>",
       "t.xml:1: bad hexadecimal number '0x0302zz' for attribute 'class' of <pci>"},
      {"<system><cpu numaid=\"0\"><nic><net speed=\"fast\"/></nic></cpu></system>",
       "t.xml:1: bad number 'fast' (want a finite number >= 0) for attribute 'speed' of <net>"},
      {"<system><cpu numaid=\"0\"/><cpu numaid=\"0\"/></system>", "t.xml:1: numaid 0 given to two <cpu> elements"},
      {"<system></system>", "t.xml:1: <system> has no <cpu> element (no NUMA node described)"},
      {"<topology/>", "t.xml:1: unknown root element <topology> (want <meshccl_topology> or NCCL's <system>)"},
      {"<system>\n</cpu>", "t.xml:2: end tag </cpu> does not match <system> opened at line 1"},
      {"<system>hello</system>", "t.xml:1: unexpected text inside <system> (only elements are allowed)"},
      {"<system a=\"1\" a=\"2\"/>", "t.xml:1: attribute 'a' given twice in <system>"},
      {"<system a=1/>", "t.xml:1: value of attribute 'a' must be quoted"},
      {"<system a=\"&nbsp;\"/>", "t.xml:1: unknown entity in the value of attribute 'a'"},
      {"<!DOCTYPE x><system/>", "t.xml:1: DOCTYPE, CDATA and other '<!' constructs are not supported"},
      {"<system/><system/>", "t.xml:1: content after the root element </system>"},
      {"<system>\n<!-- open", "t.xml:2: unterminated comment '<!--' (truncated file?)"},
      {"<meshccl_topology version=\"2\"/>", "t.xml:1: unsupported meshccl_topology version 2 (this build reads 1)"},
      {"<meshccl_topology version=\"1\"/>", "t.xml:1: <meshccl_topology> describes no <host>"},
      {"<meshccl_topology version=\"1\">\n<host name=\"h\"/>\n</meshccl_topology>",
       "t.xml:2: <host name=\"h\"> has no <numa> node"},
      {"<meshccl_topology version=\"1\">\n<host name=\"h\" color=\"red\"/>\n</meshccl_topology>",
       "t.xml:2: unknown attribute 'color' of <host>"},
      {"<meshccl_topology version=\"1\"><host name=\"h\"><numa id=\"0\" cpus=\"0-x\"/></host></meshccl_topology>",
       "t.xml:1: bad CPU range in '0-x' in attribute 'cpus' of <numa>"},
      {"<meshccl_topology version=\"1\"><host name=\"h\"><numa id=\"0\" cpus=\"0\"/></host>\n"
       "<rank id=\"0\" host=\"1\" numa=\"0\"/></meshccl_topology>",
       "t.xml:2: rank 0 is on host 1 but the file has 1 host(s)"},
      {"<meshccl_topology version=\"1\"><host name=\"h\"><numa id=\"0\" cpus=\"0\"/></host>\n"
       "<rank id=\"1\" host=\"0\" numa=\"0\"/></meshccl_topology>",
       "t.xml:2: rank 1 out of order (ranks are listed 0, 1, 2, ...; expected 0)"},
      {"<meshccl_topology version=\"1\"><host name=\"h\"><numa id=\"0\" cpus=\"0\"/></host>\n"
       "<rank id=\"0\" host=\"0\" numa=\"3\"/></meshccl_topology>",
       "t.xml:2: rank 0 is on NUMA node 3, which host h does not have"},
      {"<meshccl_topology version=\"1\"><host name=\"h\"><numa id=\"0\" "
       "cpus=\"0\"/>\n<disk/></host></meshccl_topology>",
       "t.xml:2: unknown element <disk> in <host> (want package, numa, core, cache, gpu, nic)"},
      {"<meshccl_topology version=\"1\"><host name=\"h\"><numa id=\"0\" cpus=\"0\"/></host>\n"
       "<link a=\"0\" b=\"1\" class=\"fast\" bw_gbs=\"1\"/></meshccl_topology>",
       "t.xml:2: unknown link class 'fast' (want self, same_numa, cross_numa or network)"},
      {"<meshccl_topology version=\"1\"><host name=\"h\" numa_gbs=\"nan\"><numa id=\"0\" "
       "cpus=\"0\"/></host></meshccl_topology>",
       "t.xml:1: bad number 'nan' (want a finite number >= 0) for attribute 'numa_gbs' of <host>"},
  };
  for (const BadCase& c : cases) EXPECT_EQ(error_of(c.text), c.error) << c.text;
}

TEST(Malformed, DeepNesting) {
  std::string text = "<system><cpu numaid=\"0\">\n";
  for (int i = 0; i < 40; ++i) text += "<pci>\n";
  EXPECT_EQ(error_of(text), "t.xml:32: elements nested deeper than 32");
  // Far deeper input costs no stack: the limit stops it first.
  std::string deep = "<system>";
  for (int i = 0; i < 200000; ++i) deep += "<pci>";
  EXPECT_EQ(error_of(deep), "t.xml:1: elements nested deeper than 32");
}

TEST(Malformed, HugeAttributes) {
  const std::string big(5000, 'f');
  EXPECT_EQ(error_of("<system>\n<cpu numaid=\"0\" affinity=\"" + big + "\"/></system>"),
            "t.xml:2: value of attribute 'affinity' longer than 4096 bytes");
  EXPECT_EQ(error_of("<system " + std::string(100, 'a') + "=\"1\"/>"),
            "t.xml:1: an attribute name longer than 64 characters");
  std::string many = "<system";
  for (int i = 0; i < 40; ++i) many += " a" + std::to_string(i) + "=\"1\"";
  EXPECT_EQ(error_of(many + "/>"), "t.xml:1: more than 32 attributes in <system>");
  // The longest mask a value may hold names 14560 CPUs, well inside the bound.
  std::string mask;
  for (int i = 0; i < 455; ++i) mask += (i ? ",ffffffff" : "ffffffff");
  TopoFile f;
  ASSERT_EQ(error_of("<system><cpu numaid=\"0\" affinity=\"" + mask + "\"/></system>", &f), "");
  EXPECT_EQ(f.hosts[0].cpu_count(), 455 * 32);
  EXPECT_EQ(error_of(std::string("<system>\0</system>", 18)), "t.xml:1: NUL byte in file");
}

// Every prefix of a valid file either parses or names a line within it.
TEST(Malformed, EveryTruncation) {
  for (const char* name : {"nccl_2socket_8gpu.xml", "two_numa_4ranks.xml"}) {
    const std::string text = data(name);
    const int lines = static_cast<int>(std::count(text.begin(), text.end(), '\n')) + 1;
    for (size_t n = 0; n < text.size(); n += 7) {
      const std::string err = error_of(text.substr(0, n));
      ASSERT_FALSE(err.empty()) << name << " cut at " << n;
      const int line = std::atoi(err.c_str() + 6);
      EXPECT_GE(line, 1) << err;
      EXPECT_LE(line, lines) << err;
    }
  }
}

// Random byte edits of the samples: parse or fail cleanly (the fuzzing entry
// point, with a fixed seed).
TEST(Malformed, Mutations) {
  std::mt19937 rng(12345);
  const char alphabet[] = "<>/=\"' \n-!?&;0123456789abcxyz";
  for (const char* name : {"nccl_2socket_8gpu.xml", "nccl_cpu_only.xml", "two_numa_4ranks.xml"}) {
    const std::string base = data(name);
    for (int iter = 0; iter < 1500; ++iter) {
      std::string text = base;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) {
        const size_t at = rng() % text.size();
        switch (rng() % 3) {
          case 0: text[at] = alphabet[rng() % (sizeof(alphabet) - 1)]; break;
          case 1: text.erase(at, 1 + rng() % 8); break;
          default: text.insert(at, 1, alphabet[rng() % (sizeof(alphabet) - 1)]);
        }
        if (text.empty()) text = "<";
      }
      TopoFile f;
      std::string err;
      if (topo_parse("m.xml", text.data(), text.size(), &f, &err)) {
        EXPECT_FALSE(f.hosts.empty());
        EXPECT_FALSE(f.hosts[0].numa.empty());
      } else {
        EXPECT_EQ(err.rfind("m.xml:", 0), 0u) << err;
        EXPECT_GE(std::atoi(err.c_str() + 6), 1) << err;
      }
    }
  }
}

TEST(TopoFile, ReadErrors) {
  TopoFile f;
  EXPECT_EQ(topo_read_file("/nonexistent/topo.xml", &f).code(), ncclInvalidArgument);
  EXPECT_EQ(topo_read_file(TOPO_DATA_DIR, &f).code(), ncclInvalidArgument);  // a directory
}

// MESHCCL_TOPO_FILE steers placement and interface choice: only a regular
// file that no other user could have written is read (docs/security.md). A
// FIFO is refused at once instead of waiting for a writer.
TEST(TopoFileRead, RefusesFilesOthersCouldHaveWritten) {
  char dir[] = "/tmp/meshccl_topo_perm_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/topo.xml";
  {
    std::ofstream out(path);
    out << data("two_numa_4ranks.xml");
  }
  TopoFile f;
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  EXPECT_TRUE(topo_read_file(path, &f).ok());
  ASSERT_EQ(chmod(path.c_str(), 0666), 0);
  EXPECT_EQ(topo_read_file(path, &f).code(), ncclInvalidArgument);
  EXPECT_NE(thread_last_error().find("writable by other users"), std::string::npos) << thread_last_error();
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  if (geteuid() == 0) {  // a file of another user (needs the right to chown)
    ASSERT_EQ(chown(path.c_str(), 65534, 65534), 0);
    EXPECT_EQ(topo_read_file(path, &f).code(), ncclInvalidArgument);
    EXPECT_NE(thread_last_error().find("owned by another user"), std::string::npos) << thread_last_error();
  }
  const std::string fifo = std::string(dir) + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(topo_read_file(fifo, &f).code(), ncclInvalidArgument);
  EXPECT_NE(thread_last_error().find("not a regular file"), std::string::npos) << thread_last_error();
  EXPECT_EQ(topo_read_file(dir, &f).code(), ncclInvalidArgument);  // a directory
  unlink(fifo.c_str());
  unlink(path.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace meshccl
