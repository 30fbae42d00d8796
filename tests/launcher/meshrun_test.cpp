// meshrun, end to end: the test runs the real binary on launcher_helper and
// checks what the ranks saw, what came out, the exit status, and that no
// process outlived the job. The option parser and line splitter are also
// tested directly.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "options.h"
#include "output.h"
#include "run_util.h"

namespace {

using namespace launcher_test;

// rank -> its "env" line, parsed into key=value fields.
std::map<int, std::map<std::string, std::string>> parse_env(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> ranks;
  std::regex line_re(R"(^\[(\d+)\] (rank=.*)$)");
  for (const auto& line : lines_of(out)) {
    std::smatch m;
    if (!std::regex_match(line, m, line_re)) continue;
    std::map<std::string, std::string> fields;
    std::istringstream in(m[2].str());
    std::string kv;
    while (in >> kv) {
      auto eq = kv.find('=');
      fields[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    ranks[std::stoi(m[1].str())] = fields;
  }
  return ranks;
}

// --- the option parser ---------------------------------------------------

std::string parse(std::vector<std::string> args, meshrun::Options* opt) {
  std::vector<const char*> argv = {"meshrun"};
  for (auto& a : args) argv.push_back(a.c_str());
  return meshrun::parse_options(static_cast<int>(argv.size()), argv.data(), opt);
}

TEST(MeshrunOptions, ParsesEveryOption) {
  meshrun::Options o;
  ASSERT_EQ(parse({"-n", "4", "--hostid-per-rank", "2", "--timeout", "1.5", "-x", "A=1", "-xB=x=y", "--tag-output",
                   "--no-prefix", "prog", "-n", "9"},
                  &o),
            "");
  EXPECT_EQ(o.nranks, 4);
  EXPECT_EQ(o.hostid_per_rank, 2);
  EXPECT_DOUBLE_EQ(o.timeout_s, 1.5);
  EXPECT_FALSE(o.prefix);
  ASSERT_EQ(o.env.size(), 2u);
  EXPECT_EQ(o.env[1].first, "B");
  EXPECT_EQ(o.env[1].second, "x=y");
  // Everything after the program belongs to it.
  EXPECT_EQ(o.command, (std::vector<std::string>{"prog", "-n", "9"}));
}

TEST(MeshrunOptions, AcceptsAttachedAndLongForms) {
  meshrun::Options o;
  ASSERT_EQ(parse({"-n3", "--timeout=2", "--hostid-per-rank=1", "--", "-prog"}, &o), "");
  EXPECT_EQ(o.nranks, 3);
  EXPECT_EQ(o.hostid_per_rank, 1);
  EXPECT_EQ(o.command, std::vector<std::string>{"-prog"});
  ASSERT_EQ(parse({"--np", "2", "p"}, &o), "");
  EXPECT_EQ(o.nranks, 2);
  ASSERT_EQ(parse({"-np", "5", "p"}, &o), "");
  EXPECT_EQ(o.nranks, 5);
}

TEST(MeshrunOptions, RejectsBadArguments) {
  meshrun::Options o;
  for (const auto& args : std::vector<std::vector<std::string>>{
           {},
           {"prog"},
           {"-n"},
           {"-n", "0", "p"},
           {"-n", "-2", "p"},
           {"-n", "2x", "p"},
           {"-n", "99999", "p"},
           {"-n", "2"},
           {"-n", "2", "--hostid-per-rank", "0", "p"},
           {"-n", "2", "--timeout", "0", "p"},
           {"-n", "2", "--timeout", "-1", "p"},
           {"-n", "2", "--timeout", "soon", "p"},
           {"-n", "2", "-x", "MESHRUN_TEST_SURELY_UNSET", "p"},
           {"-n", "2", "-x", "1BAD=v", "p"},
           {"-n", "2", "--bogus", "p"},
       }) {
    std::string joined;
    for (auto& a : args) joined += a + " ";
    EXPECT_NE(parse(args, &o), "") << "accepted: " << joined;
  }
}

TEST(MeshrunOptions, ParsesHostOptions) {
  meshrun::Options o;
  ASSERT_EQ(parse({"--cluster", "c1", "--hosts", "h0,h2", "--ranks-per-host", "2", "--bind", "numa",
                   "--report-bindings", "-n", "3", "p"},
                  &o),
            "");
  EXPECT_EQ(o.cluster, "c1");
  EXPECT_EQ(o.hosts, (std::vector<std::string>{"h0", "h2"}));
  EXPECT_EQ(o.ranks_per_host, 2);
  EXPECT_EQ(o.bind, meshrun::Bind::Numa);
  EXPECT_TRUE(o.report_bindings);
  ASSERT_EQ(parse({"--hosts=a", "--bind=core", "-n", "1", "p"}, &o), "");
  EXPECT_EQ(o.hosts, std::vector<std::string>{"a"});
  EXPECT_EQ(o.bind, meshrun::Bind::Core);
  EXPECT_TRUE(o.cluster.empty());
  ASSERT_EQ(parse({"--bind", "none", "-n", "1", "p"}, &o), "");
  EXPECT_EQ(o.bind, meshrun::Bind::None);
}

TEST(MeshrunOptions, RejectsBadHostOptions) {
  meshrun::Options o;
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"-n", "2", "--cluster", "", "p"},
           {"-n", "2", "--cluster", "Big", "p"},
           {"-n", "2", "--cluster", "a-b", "p"},
           {"-n", "2", "--cluster", "thirteenchars", "p"},
           {"-n", "2", "--hosts", "", "p"},
           {"-n", "2", "--hosts", "a,,b", "p"},
           {"-n", "2", "--hosts", "a,", "p"},
           {"-n", "2", "--hosts", "a,a", "p"},
           {"-n", "2", "--hosts", "../x", "p"},
           {"-n", "2", "--cluster", "c", "--ranks-per-host", "0", "p"},
           {"-n", "2", "--ranks-per-host", "1", "p"},  // no hosts to place on
           {"-n", "2", "--cluster", "c", "--hostid-per-rank", "1", "p"},
           {"-n", "5", "--hosts", "a,b", "--ranks-per-host", "2", "p"},
           {"-n", "2", "--bind", "gpu", "p"},
           {"-n", "2", "--bind", "p"},
       }) {
    std::string joined;
    for (auto& a : args) joined += a + " ";
    EXPECT_NE(parse(args, &o), "") << "accepted: " << joined;
  }
}

TEST(MeshrunPlacement, RoundRobinAndBlocked) {
  std::vector<meshrun::Placement> p;
  ASSERT_EQ(meshrun::place_ranks(5, 2, 0, &p), "");  // round-robin: 0 2 4 | 1 3
  std::vector<int> host, local, size, slot;
  for (auto& x : p)
    host.push_back(x.host), local.push_back(x.local_rank), size.push_back(x.local_size), slot.push_back(x.slot);
  EXPECT_EQ(host, (std::vector<int>{0, 1, 0, 1, 0}));
  EXPECT_EQ(local, (std::vector<int>{0, 0, 1, 1, 2}));
  EXPECT_EQ(size, (std::vector<int>{3, 2, 3, 2, 3}));
  EXPECT_EQ(slot, (std::vector<int>{0, 3, 1, 4, 2}));  // host by host

  ASSERT_EQ(meshrun::place_ranks(4, 2, 3, &p), "");  // blocked 3 + 1
  host.clear(), local.clear(), size.clear(), slot.clear();
  for (auto& x : p)
    host.push_back(x.host), local.push_back(x.local_rank), size.push_back(x.local_size), slot.push_back(x.slot);
  EXPECT_EQ(host, (std::vector<int>{0, 0, 0, 1}));
  EXPECT_EQ(local, (std::vector<int>{0, 1, 2, 0}));
  EXPECT_EQ(size, (std::vector<int>{3, 3, 3, 1}));
  EXPECT_EQ(slot, (std::vector<int>{0, 1, 2, 3}));

  ASSERT_EQ(meshrun::place_ranks(2, 3, 0, &p), "");  // fewer ranks than hosts
  EXPECT_EQ(p[1].host, 1);
  EXPECT_EQ(p[1].local_size, 1);
  ASSERT_EQ(meshrun::place_ranks(3, 1, 0, &p), "");  // one host: local = global
  EXPECT_EQ(p[2].local_rank, 2);
  EXPECT_EQ(p[2].local_size, 3);
  EXPECT_NE(meshrun::place_ranks(7, 2, 3, &p), "");
  EXPECT_NE(meshrun::place_ranks(1, 0, 0, &p), "");
}

TEST(MeshrunOptions, Seconds) {
  double s = -1;
  EXPECT_TRUE(meshrun::parse_seconds("3", &s));
  EXPECT_DOUBLE_EQ(s, 3);
  EXPECT_TRUE(meshrun::parse_seconds("0.25", &s));
  EXPECT_DOUBLE_EQ(s, 0.25);
  for (const char* bad : {"", "-1", "1e3", "inf", "nan", "3s", " 3", "."})
    EXPECT_FALSE(meshrun::parse_seconds(bad, &s)) << bad;
}

// --- the line splitter ---------------------------------------------------

TEST(MeshrunOutput, PrefixesWholeLinesAcrossReads) {
  meshrun::LineSplitter s("[7] ");
  EXPECT_EQ(s.feed("ab", 2), "");
  EXPECT_EQ(s.feed("c\nde\n\nf", 7), "[7] abc\n[7] de\n[7] \n");
  EXPECT_EQ(s.finish(), "[7] f\n");
  EXPECT_EQ(s.finish(), "");
}

TEST(MeshrunOutput, CutsOverlongLines) {
  meshrun::LineSplitter s("> ");
  std::string big(meshrun::LineSplitter::kMaxLine + 10, 'x');
  std::string out = s.feed(big.data(), big.size());
  EXPECT_EQ(out, "> " + std::string(meshrun::LineSplitter::kMaxLine, 'x') + "\n");
  EXPECT_EQ(s.pending(), 10u);
  EXPECT_EQ(s.finish(), "> " + std::string(10, 'x') + "\n");
}

// --- the launcher, end to end --------------------------------------------

TEST(Meshrun, HelpAndBadArguments) {
  Result h = run({"-h"});
  EXPECT_EQ(h.status, 0);
  EXPECT_NE(h.out.find("usage: meshrun"), std::string::npos);

  for (const auto& args : std::vector<std::vector<std::string>>{
           {}, {"-n", "0", g_helper}, {"-n", "2"}, {"--frobnicate", "-n", "2", g_helper}}) {
    Result r = run(args);
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(r.err.rfind("meshrun: ", 0), 0u) << r.err;
  }
  Result g = run({"--tag-output", "-n", "1", g_helper, "exit", "0"}, {"MESHCCL_KILL_GRACE=later"});
  EXPECT_EQ(g.status, 2);
  EXPECT_NE(g.err.find("MESHCCL_KILL_GRACE"), std::string::npos);
}

TEST(Meshrun, ProgramNotFoundOrNotExecutable) {
  Result r = run({"--tag-output", "-n", "2", "meshrun-no-such-program"});
  EXPECT_EQ(r.status, 127);
  EXPECT_NE(r.err.find("command not found"), std::string::npos);

  ScratchDir dir;
  std::string file = dir.path() + "/not-exec";
  std::ofstream(file) << "#!/bin/sh\n";
  Result p = run({"--tag-output", "-n", "2", file});
  EXPECT_EQ(p.status, 126);
  ::unlink(file.c_str());
}

class MeshrunEnv : public ::testing::TestWithParam<int> {};

TEST_P(MeshrunEnv, EveryRankGetsItsEnvironment) {
  int n = GetParam();
  // Values inherited from an enclosing job must not leak into this one.
  Result r = run({"--tag-output", "-n", std::to_string(n), g_helper, "env"}, {"MESHCCL_RANK=99", "MESHCCL_NRANKS=99"});
  ASSERT_EQ(r.status, 0) << r.err;
  auto ranks = parse_env(r.out);
  ASSERT_EQ(static_cast<int>(ranks.size()), n) << r.out;
  std::string commdir = ranks[0]["commdir"];
  for (int i = 0; i < n; ++i) {
    auto& f = ranks[i];
    EXPECT_EQ(f["rank"], std::to_string(i));
    EXPECT_EQ(f["nranks"], std::to_string(n));
    EXPECT_EQ(f["local_rank"], std::to_string(i));
    EXPECT_EQ(f["local_size"], std::to_string(n));
    EXPECT_EQ(f["hostid"], "(unset)");
    EXPECT_EQ(f["commdir"], commdir);  // one job, one directory
    EXPECT_EQ(f["commdir_exists"], "1");
  }
  // The private directory is gone with the job.
  struct stat st {};
  EXPECT_NE(::stat(commdir.c_str(), &st), 0) << commdir << " left behind";
}

INSTANTIATE_TEST_SUITE_P(Sizes, MeshrunEnv, ::testing::Values(1, 3, 8));

TEST(Meshrun, HostIdPerRankFormsEmulatedHosts) {
  struct Case {
    int n, k;
  };
  for (Case c : {Case{4, 2}, Case{5, 2}, Case{3, 1}}) {
    Result r =
        run({"--tag-output", "-n", std::to_string(c.n), "--hostid-per-rank", std::to_string(c.k), g_helper, "env"});
    ASSERT_EQ(r.status, 0) << r.err;
    auto ranks = parse_env(r.out);
    ASSERT_EQ(static_cast<int>(ranks.size()), c.n);
    for (int i = 0; i < c.n; ++i) {
      int host = i / c.k;
      int size = std::min(c.k, c.n - host * c.k);  // the last host may be partial
      EXPECT_EQ(ranks[i]["hostid"], "host" + std::to_string(host)) << "n=" << c.n << " k=" << c.k;
      EXPECT_EQ(ranks[i]["local_rank"], std::to_string(i % c.k));
      EXPECT_EQ(ranks[i]["local_size"], std::to_string(size));
    }
  }
}

// The cpus meshrun reports for each rank (--report-bindings) are the ones
// the rank may run on.
TEST(Meshrun, BindPinsRanksThroughHwloc) {
#if MESHRUN_HWLOC
  for (const char* how : {"core", "numa"}) {
    Result r = run({"--tag-output", "-n", "3", "--bind", how, "--report-bindings", g_helper, "env"});
    ASSERT_EQ(r.status, 0) << r.err;
    auto ranks = parse_env(r.out);
    ASSERT_EQ(ranks.size(), 3u);
    std::regex re(R"(^meshrun: rank (\d+) bound to (core|cpu|NUMA node) (\d+) \(cpus ([0-9,-]+)\)$)");
    int seen = 0;
    std::set<std::string> objects;
    for (const auto& line : lines_of(r.err)) {
      std::smatch m;
      if (!std::regex_match(line, m, re)) continue;
      ++seen;
      int rank = std::stoi(m[1].str());
      EXPECT_EQ(ranks[rank]["cpus"], m[4].str()) << how << " rank " << rank;
      objects.insert(m[3].str());
    }
    EXPECT_EQ(seen, 3) << r.err;
    if (std::string(how) == "core") { EXPECT_EQ(objects.count("0"), 1u) << "rank 0 on core 0"; }
  }
#else
  Result r = run({"--tag-output", "-n", "1", "--bind", "core", g_helper, "env"});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("without it"), std::string::npos) << r.err;
#endif
  Result none = run({"--tag-output", "-n", "2", "--bind", "none", "--report-bindings", g_helper, "env"});
  ASSERT_EQ(none.status, 0) << none.err;
  EXPECT_NE(none.err.find("rank 1 not bound"), std::string::npos) << none.err;
  auto ranks = parse_env(none.out);
  EXPECT_EQ(ranks[0]["cpus"], ranks[1]["cpus"]);
}

TEST(Meshrun, HostsThatDoNotExistAreAnError) {
  Result r = run({"--tag-output", "-n", "2", "--hosts", "meshrun-test-no-such-namespace", g_helper, "env"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("no network namespace 'meshrun-test-no-such-namespace'"), std::string::npos) << r.err;
  r = run({"--tag-output", "-n", "2", "--cluster", "nosuch0", g_helper, "env"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("cluster 'nosuch0' is not up"), std::string::npos) << r.err;
}

TEST(Meshrun, ExportsExtraVariables) {
  Result r = run({"--tag-output", "-n", "2", "-x", "MESHRUN_TEST_A=hello world", "-x", "MESHRUN_TEST_B=", g_helper,
                  "env", "MESHRUN_TEST_A", "MESHRUN_TEST_B"});
  ASSERT_EQ(r.status, 0) << r.err;
  for (int i = 0; i < 2; ++i) {
    std::string p = "[" + std::to_string(i) + "] ";
    EXPECT_NE(r.out.find(p + "MESHRUN_TEST_A=hello world\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(p + "MESHRUN_TEST_B=\n"), std::string::npos) << r.out;
  }
}

TEST(Meshrun, PrefixesEveryLineOfEachStream) {
  const int n = 3, k = 200;
  Result r = run({"--tag-output", "-n", std::to_string(n), g_helper, "lines", std::to_string(k)});
  ASSERT_EQ(r.status, 0) << r.err;
  for (bool err : {false, true}) {
    const std::string& text = err ? r.err : r.out;
    std::vector<int> next(n, 0);
    std::regex re(err ? R"(^\[(\d+)\] err (\d+) (\d+)$)" : R"(^\[(\d+)\] out (\d+) (\d+)$)");
    for (const auto& line : lines_of(text)) {
      std::smatch m;
      ASSERT_TRUE(std::regex_match(line, m, re)) << "unexpected line: '" << line << "'";
      int rank = std::stoi(m[1].str());
      ASSERT_EQ(m[2].str(), m[1].str()) << "line attributed to the wrong rank";
      ASSERT_EQ(std::stoi(m[3].str()), next[rank]++) << "lines of rank " << rank << " out of order";
    }
    for (int i = 0; i < n; ++i) EXPECT_EQ(next[i], k);
  }
}

TEST(Meshrun, FlushesPartialLastLines) {
  Result r = run({"--tag-output", "-n", "2", g_helper, "partial"});
  ASSERT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("[0] tail-0\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[1] tail-1\n"), std::string::npos) << r.out;
}

// As mpirun: output passes through unchanged unless --tag-output asks for the
// rank prefix (nccl-tests parsers read meshrun's output as they read mpirun's);
// --no-prefix, once the way to get this, is still accepted.
TEST(Meshrun, OutputPassesThroughByDefault) {
  for (const char* first : {"-n", "--no-prefix"}) {
    std::vector<std::string> args{first};
    if (std::string(first) != "-n") args.push_back("-n");
    for (const char* a : {"2", g_helper.c_str(), "lines", "2"}) args.push_back(a);
    Result r = run(args);
    ASSERT_EQ(r.status, 0);
    auto out = lines_of(r.out);
    std::sort(out.begin(), out.end());
    EXPECT_EQ(out, (std::vector<std::string>{"out 0 0", "out 0 1", "out 1 0", "out 1 1"}));
    EXPECT_EQ(r.err.find('['), std::string::npos) << r.err;
  }
}

// Open MPI's -x NAME passes mpirun's own value; an unset NAME is an error.
TEST(Meshrun, ExportsItsOwnVariableByName) {
  Result r = run({"--tag-output", "-n", "2", "-x", "MESHRUN_TEST_OWN", g_helper, "env", "MESHRUN_TEST_OWN"},
                 {"MESHRUN_TEST_OWN=from meshrun"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("[1] MESHRUN_TEST_OWN=from meshrun\n"), std::string::npos) << r.out;
  Result bad = run({"-n", "2", "-x", "MESHRUN_TEST_UNSET_VAR", g_helper, "env"});
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("MESHRUN_TEST_UNSET_VAR is not set"), std::string::npos) << bad.err;
}

TEST(Meshrun, PrintsItsVersion) {
  Result r = run({"--version"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out.rfind("meshrun (meshccl) ", 0), 0u) << r.out;
}

TEST(Meshrun, StdinGoesToRankZeroOnly) {
  Result r = run({"--tag-output", "-n", "2", g_helper, "stdin"}, {}, "to rank zero\n");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("[0] to rank zero\n[0] eof\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[1] eof\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[1] to rank zero"), std::string::npos) << r.out;
}

TEST(Meshrun, CommFileDirectoryIsPrivateAndRemoved) {
  Result r = run({"--tag-output", "-n", "3", g_helper, "commfile"});
  ASSERT_EQ(r.status, 0) << r.err;
  for (int i = 0; i < 3; ++i)
    EXPECT_NE(r.out.find("[" + std::to_string(i) + "] published\n"), std::string::npos) << r.out;
}

TEST(Meshrun, SuccessIsZero) {
  Result r = run({"--tag-output", "-n", "3", g_helper, "exit", "0"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.err, "");
}

TEST(Meshrun, FailingRankStopsTheOthersAndSetsTheStatus) {
  ScratchDir dir;
  Result r = run({"--tag-output", "-n", "4", g_helper, "fail", "2", "7", dir.path()});
  EXPECT_EQ(r.status, 7);
  EXPECT_NE(r.out.find("[2] rank 2 failing"), std::string::npos);
  auto err = lines_of(r.err);
  ASSERT_EQ(err.size(), 1u) << r.err;
  EXPECT_NE(err[0].find("rank 2"), std::string::npos);
  EXPECT_NE(err[0].find("exited with status 7"), std::string::npos);
  EXPECT_EQ(dir.count("pid"), 4);
  EXPECT_EQ(dir.count("done"), 0) << "a rank ran to completion after another failed";
  expect_all_gone(dir);
}

TEST(Meshrun, KeepGoingLetsTheOthersFinishAndReportsTheFailure) {
  ScratchDir dir;
  Result r =
      run({"--tag-output", "--keep-going", "-n", "4", g_helper, "kill", "2", std::to_string(SIGKILL), dir.path(), "1"});
  EXPECT_EQ(r.status, 128 + SIGKILL);
  auto err = lines_of(r.err);
  ASSERT_EQ(err.size(), 1u) << r.err;
  EXPECT_NE(err[0].find("rank 2"), std::string::npos) << r.err;
  EXPECT_NE(err[0].find("keep going"), std::string::npos) << r.err;
  EXPECT_EQ(dir.count("done"), 3) << "the other ranks were stopped";
  expect_all_gone(dir);
}

TEST(Meshrun, RankKilledBySignalGives128PlusSignal) {
  for (int sig : {SIGUSR1, SIGKILL}) {
    ScratchDir dir;
    Result r = run({"--tag-output", "-n", "3", g_helper, "kill", "1", std::to_string(sig), dir.path()});
    EXPECT_EQ(r.status, 128 + sig);
    EXPECT_NE(r.err.find("rank 1"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(std::string("SIG") + sigabbrev_np(sig)), std::string::npos) << r.err;
    EXPECT_EQ(dir.count("done"), 0);
    expect_all_gone(dir);
  }
}

TEST(Meshrun, RanksIgnoringSigtermAreKilledAfterTheGracePeriod) {
  ScratchDir dir;
  // The timeout leaves the ranks ample time to start, even on a loaded machine.
  Result r = run({"--tag-output", "--timeout", "1.5", "-n", "2", g_helper, "ignore-term", dir.path()},
                 {"MESHCCL_KILL_GRACE=0.5"});
  EXPECT_EQ(r.status, 124);
  EXPECT_EQ(dir.count("pid"), 2);
  EXPECT_EQ(dir.count("done"), 0);
  expect_all_gone(dir);
}

TEST(Meshrun, TimeoutKillsTheJob) {
  ScratchDir dir;
  Result r = run({"--tag-output", "--timeout", "2", "-n", "3", g_helper, "sleep", "30", dir.path()});
  EXPECT_EQ(r.status, 124);
  EXPECT_NE(r.err.find("timeout"), std::string::npos) << r.err;
  EXPECT_EQ(dir.count("pid"), 3);
  EXPECT_EQ(dir.count("done"), 0);
  expect_all_gone(dir);
}

TEST(Meshrun, TimeoutNotReachedLeavesTheJobAlone) {
  ScratchDir dir;
  Result r = run({"--tag-output", "--timeout", "50", "-n", "2", g_helper, "sleep", "0.1", dir.path()});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(dir.count("done"), 2);
}

TEST(Meshrun, ForwardsSigintAndSigterm) {
  for (int sig : {SIGINT, SIGTERM}) {
    ScratchDir dir;
    Meshrun m({"--tag-output", "-n", "3", g_helper, "sleep", "30", dir.path()});
    ASSERT_TRUE(dir.wait_for("pid", 3));
    ::kill(m.pid(), sig);
    Result r = m.wait();
    EXPECT_EQ(r.status, 128 + sig);
    EXPECT_EQ(dir.count("done"), 0);
    expect_all_gone(dir);
  }
}

bool signal_pending(pid_t pid, int sig) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("ShdPnd:", 0) != 0) continue;
    unsigned long long mask = std::stoull(line.substr(7), nullptr, 16);
    return (mask >> (sig - 1)) & 1;
  }
  return false;
}

TEST(Meshrun, SecondSignalKillsAtOnce) {
  ScratchDir dir;
  // The grace period outlasts the ranks' sleep: only the second signal can
  // stop them before they finish.
  Meshrun m({"--tag-output", "-n", "2", g_helper, "ignore-term", dir.path()}, {"MESHCCL_KILL_GRACE=100"});
  ASSERT_TRUE(dir.wait_for("pid", 2));
  ::kill(m.pid(), SIGTERM);
  // Two pending SIGTERMs merge into one: send the second only once meshrun has
  // taken the first (it leaves the process's pending set, ShdPnd).
  for (int i = 0; i < 2000 && signal_pending(m.pid(), SIGTERM); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::kill(m.pid(), SIGTERM);
  Result r = m.wait();
  EXPECT_EQ(r.status, 128 + SIGTERM);
  EXPECT_EQ(dir.count("done"), 0);
  expect_all_gone(dir);
}

TEST(Meshrun, RanksReceiveTheForwardedSignal) {
  ScratchDir dir;
  Meshrun m({"--tag-output", "-n", "3", g_helper, "trap-int", dir.path()});
  ASSERT_TRUE(dir.wait_for("pid", 3));
  ::kill(m.pid(), SIGINT);
  Result r = m.wait();
  EXPECT_EQ(r.status, 128 + SIGINT);
  for (int i = 0; i < 3; ++i)
    EXPECT_NE(r.out.find("[" + std::to_string(i) + "] rank " + std::to_string(i) + " got SIGINT"), std::string::npos)
        << r.out;
}

TEST(Meshrun, ProcessesLeftBehindByARankAreKilled) {
  ScratchDir dir;
  Result r = run({"--tag-output", "-n", "2", g_helper, "orphan", "exit", dir.path()});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(dir.count("child"), 2);
  EXPECT_EQ(dir.count("child-done"), 0);
  expect_all_gone(dir);
}

TEST(Meshrun, ChildrenOfRanksDieWithTheJob) {
  // A grandchild that left the rank's process group (setsid) is still reached.
  for (const char* how : {"sleep", "setsid"}) {
    ScratchDir dir;
    Result r = run({"--tag-output", "--timeout", "2", "-n", "2", g_helper, "orphan", how, dir.path()});
    EXPECT_EQ(r.status, 124) << how;
    EXPECT_EQ(dir.count("child"), 2) << how;
    EXPECT_EQ(dir.count("child-done") + dir.count("done"), 0) << how;
    expect_all_gone(dir);
  }
}

TEST(Meshrun, RanksDieWithAKilledLauncher) {
  ScratchDir dir;
  // Its private directory cannot be removed by a killed meshrun: keep it in ours.
  Meshrun m({"--tag-output", "-n", "3", g_helper, "sleep", "30", dir.path()}, {"TMPDIR=" + dir.path()});
  ASSERT_TRUE(dir.wait_for("pid", 3));
  ::kill(m.pid(), SIGKILL);
  Result r = m.wait();
  EXPECT_EQ(r.status, 128 + SIGKILL);
  // The ranks go through PR_SET_PDEATHSIG; give the kernel a moment to deliver.
  std::vector<pid_t> pids = dir.pids();
  for (int i = 0; i < 2000; ++i) {
    bool alive = false;
    for (pid_t p : pids) alive |= ::kill(p, 0) == 0;
    if (!alive) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  expect_all_gone(dir);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const char* m = std::getenv("MESHRUN");
  const char* h = std::getenv("LAUNCHER_HELPER");
  if (!m || !h) {
    std::fprintf(stderr, "MESHRUN and LAUNCHER_HELPER must name the meshrun and launcher_helper binaries\n");
    return 1;
  }
  launcher_test::g_meshrun = m;
  launcher_test::g_helper = h;
  return RUN_ALL_TESTS();
}
