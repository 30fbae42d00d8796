#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "args.h"

namespace perf {
namespace {

ParseResult Parse(std::vector<std::string> words, Options* o, std::string* out) {
  words.insert(words.begin(), "all_reduce_perf");
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  return ParseArgs(static_cast<int>(words.size()), argv.data(), o, out);
}

TEST(ParseArgs, DefaultsMatchNcclTests) {
  Options o;
  std::string out;
  ASSERT_EQ(Parse({}, &o, &out), ParseResult::kRun);
  EXPECT_EQ(o.min_bytes, 32u << 20);
  EXPECT_EQ(o.max_bytes, 32u << 20);
  EXPECT_EQ(o.step_bytes, 1u << 20);
  EXPECT_EQ(o.step_factor, 1u);
  EXPECT_EQ(o.iters, 20);
  EXPECT_EQ(o.warmup_iters, 1);
  EXPECT_EQ(o.check, 1);
  EXPECT_EQ(o.average, 1);
  ASSERT_EQ(o.types.size(), 1u);
  EXPECT_STREQ(o.types[0]->name, "float");
  ASSERT_EQ(o.ops.size(), 1u);
  EXPECT_EQ(o.ops[0], Op::kSum);
  EXPECT_TRUE(out.empty());
}

TEST(ParseArgs, ShortAndLongFlags) {
  Options o;
  std::string out;
  ASSERT_EQ(Parse({"-b", "8",  "-e",        "128M",       "-f",    "2",   "-t", "2",        "-g",   "1",  "-n", "5",
                   "-w", "0",  "-c",        "0",          "-o",    "max", "-d", "bfloat16", "-r",   "-1", "-z", "1",
                   "-a", "3",  "--iters=7", "--datatype", "int32", "-m",  "4",  "-N",       "2",    "-y", "1",  "-T",
                   "9",  "-u", "1",         "-S",         "1",     "-C",  "1",  "-i",       "0x100"},
                  &o, &out),
            ParseResult::kRun);
  EXPECT_EQ(o.min_bytes, 8u);
  EXPECT_EQ(o.max_bytes, 128u << 20);
  EXPECT_EQ(o.step_factor, 2u);
  EXPECT_EQ(o.step_bytes, 256u);
  EXPECT_EQ(o.nthreads, 2);
  EXPECT_EQ(o.iters, 7);
  EXPECT_EQ(o.warmup_iters, 0);
  EXPECT_EQ(o.check, 0);
  EXPECT_EQ(o.ops[0], Op::kMax);
  ASSERT_EQ(o.types.size(), 1u);
  EXPECT_STREQ(o.types[0]->name, "int32");
  EXPECT_EQ(o.root, -1);
  EXPECT_EQ(o.blocking, 1);
  EXPECT_EQ(o.average, 3);
  EXPECT_EQ(o.agg_iters, 4);
  EXPECT_EQ(o.run_cycles, 2);
  EXPECT_EQ(o.stream_null, 1);
  EXPECT_EQ(o.timeout_s, 9);
  EXPECT_EQ(o.unalign, 1);
  EXPECT_EQ(o.report_timestamps, 1);
  EXPECT_EQ(o.report_cputime, 1);
}

TEST(ParseArgs, AllOpsAndTypes) {
  Options o;
  std::string out;
  ASSERT_EQ(Parse({"-o", "all", "-d", "all"}, &o, &out), ParseResult::kRun);
  EXPECT_EQ(o.ops.size(), 6u);
  EXPECT_EQ(o.types.size(), 12u);
}

TEST(ParseArgs, UnknownOpAndTypeFallBackWithNcclTestsMessages) {
  Options o;
  std::string out;
  ASSERT_EQ(Parse({"-o", "xor", "-d", "quad"}, &o, &out), ParseResult::kRun);
  EXPECT_EQ(o.ops[0], Op::kSum);
  EXPECT_STREQ(o.types[0]->name, "float");
  EXPECT_NE(out.find("invalid op xor, defaulting to sum .. \n"), std::string::npos);
  EXPECT_NE(out.find("invalid type quad, defaulting to float .. \n"), std::string::npos);
}

TEST(ParseArgs, BadSizesExitBeforeRunning) {
  Options o;
  std::string out;
  EXPECT_EQ(Parse({"-b", "lots"}, &o, &out), ParseResult::kExitUsage);
  EXPECT_NE(out.find("invalid size specified for 'minbytes'"), std::string::npos);
  Options o2;
  out.clear();
  EXPECT_EQ(Parse({"-b", "1M", "-e", "1K"}, &o2, &out), ParseResult::kExitUsage);
  Options o3;
  out.clear();
  EXPECT_EQ(Parse({"-D", "1"}, &o3, &out), ParseResult::kExitUsage);
}

TEST(ParseArgs, HelpAndUnknownOptionExitZeroWithUsage) {
  Options o;
  std::string out;
  EXPECT_EQ(Parse({"-h"}, &o, &out), ParseResult::kExitSuccess);
  EXPECT_EQ(out.rfind("USAGE: all_reduce_perf", 0), 0u);
  out.clear();
  Options o2;
  EXPECT_EQ(Parse({"-Q"}, &o2, &out), ParseResult::kExitSuccess);
  EXPECT_EQ(out.rfind("invalid option 'Q'\nUSAGE:", 0), 0u);
}

TEST(SweepSizes, FactorStepAndInclusiveEnd) {
  Options o;
  o.min_bytes = 8;
  o.max_bytes = 64;
  o.step_factor = 2;
  EXPECT_EQ(SweepSizes(o), (std::vector<size_t>{8, 16, 32, 64}));
  o.step_factor = 1;
  o.step_bytes = 20;
  EXPECT_EQ(SweepSizes(o), (std::vector<size_t>{8, 28, 48}));
  o.min_bytes = 0;
  o.step_factor = 2;
  EXPECT_EQ(SweepSizes(o), (std::vector<size_t>{0}));
}

}  // namespace
}  // namespace perf

namespace perf {
namespace {

TEST(SplitColor, OperatorsAndBases) {
  int c = -1;
  EXPECT_TRUE(SplitColor("AND 0x1", 3, &c));
  EXPECT_EQ(c, 1);
  EXPECT_TRUE(SplitColor("&0b10", 6, &c));
  EXPECT_EQ(c, 2);
  EXPECT_TRUE(SplitColor("MOD 4", 9, &c));
  EXPECT_EQ(c, 1);
  EXPECT_TRUE(SplitColor("%4", 9, &c));
  EXPECT_EQ(c, 1);
  EXPECT_TRUE(SplitColor("DIV 2", 5, &c));
  EXPECT_EQ(c, 2);
  EXPECT_TRUE(SplitColor("or 8", 1, &c));
  EXPECT_EQ(c, 9);
  EXPECT_FALSE(SplitColor("XOR 1", 1, &c));
  EXPECT_FALSE(SplitColor("MOD 0", 1, &c));
  EXPECT_FALSE(SplitColor("AND", 1, &c));
  EXPECT_FALSE(SplitColor("AND 12zz", 1, &c));
}

}  // namespace
}  // namespace perf
