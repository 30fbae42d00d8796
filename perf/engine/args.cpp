#include "args.h"

#include <getopt.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <strings.h>

#include "format.h"

namespace perf {

namespace {

const char kUsage[] =
    "USAGE: %s \n\t"
    "[-t,--nthreads <num threads>] \n\t"
    "[-g,--ngpus <gpus per thread>] \n\t"
    "[-b,--minbytes <min size in bytes>] \n\t"
    "[-e,--maxbytes <max size in bytes>] \n\t"
    "[-i,--stepbytes <increment size>] \n\t"
    "[-f,--stepfactor <increment factor>] \n\t"
    "[-n,--iters <iteration count>] \n\t"
    "[-m,--agg_iters <aggregated iteration count>] \n\t"
    "[-w,--warmup_iters <warmup iteration count>] \n\t"
    "[-N,--run_cycles <cycle count> run & print each cycle (default: 1; 0=infinite)] \n\t"
    "[-p,--parallel_init <0/1>] \n\t"
    "[-c,--check <check iteration count>] \n\t"
    "[-o,--op <sum/prod/min/max/avg/mulsum/all>] \n\t"
    "[-d,--datatype <nccltype/all>] \n\t"
    "[-r,--root <root>] \n\t"
    "[-z,--blocking <0/1/2/3>] \n\t"
    "[-y,--stream_null <0/1>] \n\t"
    "[-T,--timeout <time in seconds>] \n\t"
    "[-G,--cudagraph <num graph launches>] \n\t"
    "[-C,--report_cputime <0/1>] \n\t"
    "[-S,--report_timestamps <0/1> report timestamps (default 0)] \n\t"
    "[-J,--output_file <file> write output to filepath, if accessible. Infer type from suffix (only json supported "
    "presently.)] \n\t"
    "[-a,--average <0/1/2/3> report average iteration time <0=RANK0/1=AVG/2=MIN/3=MAX>] \n\t"
    "[-R,--local_register <0/1/2> enable local (1) or symmetric (2) buffer registration on send/recv buffers (default: "
    "disable (0))] \n\t"
    "[-x,--cta_policy <0/1/2> set CTA policy (NCCL_CTA_POLICY_DEFAULT (0), NCCL_CTA_POLICY_EFFICIENCY (1), "
    "NCCL_CTA_POLICY_ZERO (2)) (default: do not set)] \n\t"
    "[-D,--device_implementation <implementation number> enable device implementation (default: 0, use NCCL "
    "implementation; requires -R 2 if > 0)] \n\t"
    "[-V,--device_cta_count <number> set number of CTAs for device implementation (default: 16)] \n\t"
    "[-M,--memory_report <0/1> enable memory usage report (default: 0)] \n\t"
    "[-u,--unalign <num elements>] \n\t"
    "[-I,--per_iter_timing <0/1> enable per-iteration timing (default: 0)] \n\t"
    "[-K,--per_iter_skip <num iterations> skip first N iterations in per-iteration stats (default: 0)] \n\t"
    "[-h,--help]\n";

const struct option kLongOpts[] = {
    {"nthreads", required_argument, nullptr, 't'},
    {"ngpus", required_argument, nullptr, 'g'},
    {"minbytes", required_argument, nullptr, 'b'},
    {"maxbytes", required_argument, nullptr, 'e'},
    {"stepbytes", required_argument, nullptr, 'i'},
    {"stepfactor", required_argument, nullptr, 'f'},
    {"iters", required_argument, nullptr, 'n'},
    {"agg_iters", required_argument, nullptr, 'm'},
    {"warmup_iters", required_argument, nullptr, 'w'},
    {"run_cycles", required_argument, nullptr, 'N'},
    {"parallel_init", required_argument, nullptr, 'p'},
    {"check", required_argument, nullptr, 'c'},
    {"op", required_argument, nullptr, 'o'},
    {"datatype", required_argument, nullptr, 'd'},
    {"root", required_argument, nullptr, 'r'},
    {"blocking", required_argument, nullptr, 'z'},
    {"stream_null", required_argument, nullptr, 'y'},
    {"timeout", required_argument, nullptr, 'T'},
    {"cudagraph", required_argument, nullptr, 'G'},
    {"report_cputime", required_argument, nullptr, 'C'},
    {"report_timestamps", required_argument, nullptr, 'S'},
    {"output_file", required_argument, nullptr, 'J'},
    {"average", required_argument, nullptr, 'a'},
    {"local_register", required_argument, nullptr, 'R'},
    {"cta_policy", required_argument, nullptr, 'x'},
    {"device_implementation", required_argument, nullptr, 'D'},
    {"device_cta_count", required_argument, nullptr, 'V'},
    {"memory_report", required_argument, nullptr, 'M'},
    {"unalign", required_argument, nullptr, 'u'},
    {"per_iter_timing", required_argument, nullptr, 'I'},
    {"per_iter_skip", required_argument, nullptr, 'K'},
    {"help", no_argument, nullptr, 'h'},
    {nullptr, 0, nullptr, 0},
};

int Int(const char* s) { return static_cast<int>(strtol(s, nullptr, 0)); }

void Appendf(std::string* out, const char* fmt, const char* a, const char* b = "") {
  char buf[4096];
  snprintf(buf, sizeof buf, fmt, a, b);
  *out += buf;
}

}  // namespace

ParseResult ParseArgs(int argc, char** argv, Options* o, std::string* out) {
  const char* prog = argc > 0 ? argv[0] : "perf";
  optind = 0;  // full reset, so tests and repeated calls parse from scratch
  opterr = 0;
  o->types.clear();
  bool types_set = false;
  for (;;) {
    int index = 0;
    const int c =
        getopt_long(argc, argv, "t:g:b:e:i:f:n:m:w:N:p:c:o:d:r:z:y:T:G:C:S:J:a:R:x:D:V:M:u:I:K:h", kLongOpts, &index);
    if (c == -1) break;
    size_t sz = 0;
    switch (c) {
      case 't': o->nthreads = Int(optarg); break;
      case 'g': o->ngpus = Int(optarg); break;
      case 'b':
        if (!ParseSize(optarg, &sz)) {
          Appendf(out, "invalid size specified for '%s'\n", "minbytes");
          return ParseResult::kExitUsage;
        }
        o->min_bytes = sz;
        break;
      case 'e':
        if (!ParseSize(optarg, &sz)) {
          Appendf(out, "invalid size specified for '%s'\n", "maxbytes");
          return ParseResult::kExitUsage;
        }
        o->max_bytes = sz;
        break;
      case 'i':
        if (!ParseSize(optarg, &sz)) {
          Appendf(out, "invalid size specified for '%s'\n", "stepbytes");
          return ParseResult::kExitUsage;
        }
        o->step_bytes = sz;
        break;
      case 'f': o->step_factor = strtoul(optarg, nullptr, 0); break;
      case 'n': o->iters = Int(optarg); break;
      case 'm': o->agg_iters = Int(optarg); break;
      case 'w': o->warmup_iters = Int(optarg); break;
      case 'N': o->run_cycles = Int(optarg); break;
      case 'p': o->parallel_init = Int(optarg); break;
      case 'c': o->check = Int(optarg); break;
      case 'o': {
        o->ops.clear();
        Op op;
        if (strcmp(optarg, "all") == 0) {
          for (Op x : {Op::kSum, Op::kProd, Op::kMax, Op::kMin, Op::kAvg, Op::kMulSum}) o->ops.push_back(x);
        } else if (FindOp(optarg, &op)) {
          o->ops.push_back(op);
        } else {
          Appendf(out, "invalid op %s, defaulting to %s .. \n", optarg, "sum");
          o->ops.push_back(Op::kSum);
        }
        break;
      }
      case 'd': {
        o->types.clear();
        types_set = true;
        if (strcmp(optarg, "all") == 0) {
          for (int i = 0; i < NumTypes(); i++) o->types.push_back(&TypeAt(i));
        } else if (const TypeInfo* t = FindType(optarg)) {
          o->types.push_back(t);
        } else {
          Appendf(out, "invalid type %s, defaulting to %s .. \n", optarg, "float");
          o->types.push_back(FindType("float"));
        }
        break;
      }
      case 'r': o->root = Int(optarg); break;
      case 'z': o->blocking = Int(optarg); break;
      case 'y': o->stream_null = Int(optarg); break;
      case 'T': o->timeout_s = Int(optarg); break;
      case 'G': o->graph = Int(optarg); break;
      case 'C': o->report_cputime = Int(optarg); break;
      case 'S': o->report_timestamps = Int(optarg); break;
      case 'J': o->json_path = optarg; break;
      case 'a': o->average = Int(optarg); break;
      case 'R': o->local_register = Int(optarg); break;
      case 'x': o->cta_policy = Int(optarg); break;
      case 'D': o->device_impl = Int(optarg); break;
      case 'V': o->device_cta_count = Int(optarg); break;
      case 'M': o->memory_report = Int(optarg); break;
      case 'u': o->unalign = Int(optarg); break;
      case 'I': o->per_iter_timing = Int(optarg); break;
      case 'K': o->per_iter_skip = Int(optarg); break;
      case 'h': Appendf(out, kUsage, prog); return ParseResult::kExitSuccess;
      default: {
        char opt[2] = {static_cast<char>(optopt ? optopt : '?'), '\0'};
        Appendf(out, "invalid option '%s'\n", opt);
        Appendf(out, kUsage, prog);
        return ParseResult::kExitSuccess;
      }
    }
  }
  if (!types_set) o->types.push_back(FindType("float"));
  if (o->min_bytes > o->max_bytes) {
    char buf[256];
    snprintf(buf, sizeof buf, "invalid sizes for 'minbytes' and 'maxbytes': %zu > %zu\n", o->min_bytes, o->max_bytes);
    *out += buf;
    return ParseResult::kExitUsage;
  }
  if (o->device_impl > 0 && o->local_register != 2) {
    *out += "device implementation (-D > 0) requires enabling symmetric memory registration (-R 2)\n";
    return ParseResult::kExitUsage;
  }
  return ParseResult::kRun;
}

std::vector<size_t> SweepSizes(const Options& o) {
  std::vector<size_t> sizes;
  for (size_t s = o.min_bytes; s <= o.max_bytes;) {
    sizes.push_back(s);
    const size_t next = o.step_factor > 1 ? s * o.step_factor : s + o.step_bytes;
    if (next <= s) break;  // size 0 with a factor, or a zero step: one row only
    s = next;
  }
  return sizes;
}

bool SplitColor(const char* spec, int proc, int* color) {
  while (*spec == ' ') spec++;
  struct {
    const char* word;
    char sym;
  } const kOps[] = {{"AND", '&'}, {"OR", '|'}, {"MOD", '%'}, {"DIV", '/'}};
  char op = 0;
  for (const auto& o : kOps) {
    const size_t n = strlen(o.word);
    if (strncasecmp(spec, o.word, n) == 0) {
      op = o.sym;
      spec += n;
      break;
    }
    if (*spec == o.sym) {
      op = o.sym;
      spec++;
      break;
    }
  }
  if (op == 0) return false;
  while (*spec == ' ') spec++;
  int base = 10;
  if (spec[0] == '0' && (spec[1] == 'x' || spec[1] == 'X')) {
    base = 16;
    spec += 2;
  } else if (spec[0] == '0' && (spec[1] == 'b' || spec[1] == 'B')) {
    base = 2;
    spec += 2;
  }
  char* end = nullptr;
  const long v = strtol(spec, &end, base);
  if (end == spec || *end != '\0' || v < 0) return false;
  if ((op == '%' || op == '/') && v == 0) return false;
  switch (op) {
    case '&': *color = static_cast<int>(proc & v); break;
    case '|': *color = static_cast<int>(proc | v); break;
    case '%': *color = static_cast<int>(proc % v); break;
    default: *color = static_cast<int>(proc / v); break;
  }
  return true;
}

}  // namespace perf
