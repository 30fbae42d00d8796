// The tools' text must match nccl-tests 2.19.6 byte for byte; the expected
// strings below are lines of a captured nccl-tests run.
#include <gtest/gtest.h>

#include "format.h"

namespace perf {
namespace {

TEST(FloatStr, PicksPrecisionByIntegerDigits) {
  EXPECT_EQ(FloatStr(11.93, 7), "  11.93");
  EXPECT_EQ(FloatStr(0.0, 6), "  0.00");
  EXPECT_EQ(FloatStr(1110.4, 7), "1110.40");
  EXPECT_EQ(FloatStr(12345.6, 7), "12345.6");
  EXPECT_EQ(FloatStr(123456.4, 7), " 123456");
  EXPECT_EQ(FloatStr(1234567.0, 7), "1234567");
  EXPECT_EQ(FloatStr(12345678.0, 7), "1.2e+07");
  EXPECT_EQ(FloatStr(181.31, 6), "181.31");
  EXPECT_EQ(FloatStr(1813.1, 6), "1813.1");
  EXPECT_EQ(FloatStr(181310.0, 6), "181310");
  EXPECT_EQ(FloatStr(1813100.0, 6), " 2e+06");
  EXPECT_EQ(FloatStr(0.004, 6), "  0.00");
}

TEST(FloatStr, NonFiniteValuesDoNotHang) { EXPECT_EQ(FloatStr(1.0 / 0.0, 7).size(), 7u); }

TEST(Preamble, MatchesNcclTests) {
  PreambleInfo p;
  p.program = "all_reduce_perf";
  p.nccl_headers = 22809;
  p.nccl_library = 22809;
  p.nthreads = 1;
  p.ngpus = 4;
  p.min_bytes = 8;
  p.max_bytes = 134217728;
  p.step_factor = 2;
  p.step_bytes = 1048576;
  p.warmup_iters = 1;
  p.iters = 20;
  p.agg_iters = 1;
  p.check = 1;
  EXPECT_EQ(Preamble(p),
            "# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22809\n"
            "# Collective test starting: all_reduce_perf\n"
            "# nThread 1 nGpus 4 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 1 "
            "iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0\n"
            "#\n");
  p.step_factor = 1;
  p.blocking = 1;
  p.parallel_init = true;
  const std::string s = Preamble(p);
  EXPECT_NE(s.find("step: 1048576(bytes)"), std::string::npos);
  EXPECT_NE(s.find("# Blocking Enabled: wait for completion and barrier after each collective \n"), std::string::npos);
  EXPECT_NE(s.find("# Parallel Init Enabled: threads call into NcclInitRank concurrently \n"), std::string::npos);
}

TEST(DeviceLine, MatchesNcclTests) {
  EXPECT_EQ(DeviceLine(0, 0, 41234, "node01", 0, 0, 0x18, 0, "NVIDIA H100 80GB HBM3"),
            "#  Rank  0 Group  0 Pid  41234 on     node01 device  0 [0000:18:00] NVIDIA H100 80GB HBM3\n");
}

TEST(TableHeader, MatchesNcclTests) {
  EXPECT_EQ(TableHeader(false, false, false),
            "#\n"
            "#                                                              out-of-place                       "
            "in-place          \n"
            "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   "
            "busbw  #wrong \n"
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  "
            "(GB/s)         \n");
}

TEST(TableHeader, CpuTimeAndTimestampColumns) {
  const std::string h = TableHeader(true, true, false);
  EXPECT_NE(h.find("  cputime  "), std::string::npos);
  EXPECT_NE(h.find("#wrong           timestamp\n"), std::string::npos);
  EXPECT_NE(h.find("   %Y-%m-%d %H:%M:%S\n"), std::string::npos);
}

TEST(Row, MatchesNcclTests) {
  EXPECT_EQ(RowStart(8, 2, "float", "sum", -1) + RowBody(11.93, 0.0, 0.0, 0) + RowBody(11.71, 0.0, 0.0, 0),
            "           8             2     float     sum      -1    11.93    0.00    0.00       0"
            "    11.71    0.00    0.00       0");
  EXPECT_EQ(RowStart(134217728, 33554432, "float", "sum", -1) + RowBody(1110.40, 120.87, 181.31, 0) +
                RowBody(1108.90, 121.04, 181.56, 0),
            "   134217728      33554432     float     sum      -1  1110.40  120.87  181.31       0"
            "  1108.90  121.04  181.56       0");
}

TEST(Row, UncheckedAndWrongCounts) {
  EXPECT_EQ(RowBody(5.0, 1.0, 2.0, -1), "     5.00    1.00    2.00    N/A");
  EXPECT_EQ(RowBody(5.0, 1.0, 2.0, 1234567), "     5.00    1.00    2.00  1.23457e+06");
  EXPECT_EQ(RowStart(1024, 256, "bfloat16", "mulsum", 3), "        1024           256  bfloat16  mulsum       3");
}

TEST(Footer, MatchesNcclTests) {
  EXPECT_EQ(Footer(0, 45.6789, -1, "all_reduce_perf"),
            "# Out of bounds values : 0 OK\n"
            "# Avg bus bandwidth    : 45.6789 \n"
            "#\n"
            "# Collective test concluded: all_reduce_perf\n");
  EXPECT_EQ(Footer(2, 10, 20, "x").substr(0, 68),
            "# Out of bounds values : 2 FAILED\n# Avg bus bandwidth    : 10 FAILED");
  EXPECT_NE(Footer(0, 19, 20, "x").find(": 19 OK\n"), std::string::npos);
}

TEST(ParseSize, SuffixesAndErrors) {
  size_t v = 0;
  EXPECT_TRUE(ParseSize("8", &v));
  EXPECT_EQ(v, 8u);
  EXPECT_TRUE(ParseSize("64K", &v));
  EXPECT_EQ(v, 65536u);
  EXPECT_TRUE(ParseSize("256m", &v));
  EXPECT_EQ(v, 256u << 20);
  EXPECT_TRUE(ParseSize("1.5G", &v));
  EXPECT_EQ(v, 3u << 29);
  EXPECT_FALSE(ParseSize("", &v));
  EXPECT_FALSE(ParseSize("abc", &v));
  EXPECT_FALSE(ParseSize("12Q", &v));
  EXPECT_FALSE(ParseSize("-4", &v));
}

}  // namespace
}  // namespace perf

namespace perf {
namespace {

TEST(MemoryLine, MatchesNcclTests) {
  EXPECT_EQ(MemString(0), "0.00 B");
  EXPECT_EQ(MemString(512), "512 B");
  EXPECT_EQ(MemString(1536), "1.50 KB");
  EXPECT_EQ(MemString(50.0 * 1024 * 1024), "50.0 MB");
  EXPECT_EQ(MemString(3.0 * 1024 * 1024 * 1024), "3.00 GB");
  EXPECT_EQ(MemoryLine(1024, 2048, 0),
            "# GPU memory usage     : Initialization 1.00 KB | User-Allocated 2.00 KB | "
            "Collective 0.00 B | Total  3.00 KB\n");
}

}  // namespace
}  // namespace perf
