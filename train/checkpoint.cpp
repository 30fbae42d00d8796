#include "checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'M', 'T', 'C', 'K', 'P', 'T', '1', '\0'};
constexpr int32_t kVersion = 4;  // 3: the tokenizer's fingerprint; 4: steps done, the schedule
constexpr int32_t kOldVersion = 3;

// Format 3's header: format 4's without the schedule. Its checkpoints are
// named after the 0-based index of their last step.
struct HeaderV3 {
  char magic[8];
  int32_t version, dp, pp, tp, rank;
  int32_t vocab, seq, layers, d_model, heads, tied;
  uint64_t seed;
  int32_t step, tp_mode;
  int32_t layer_lo, layer_hi;
  uint64_t nparams, payload_bytes, tokenizer;
  uint32_t crc, pad;
};
static_assert(offsetof(HeaderV3, crc) == offsetof(ShardHeader, schedule), "format 4 extends format 3");

std::string os_reason(int e) { return std::strerror(e); }

// A file descriptor closed on every path.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void write_all(int fd, const void* p, size_t n, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError("writing " + path + " failed: " + os_reason(errno));
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
}

// Reads exactly n bytes; false at end of file.
bool read_all(int fd, void* p, size_t n, const std::string& path) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, c, std::min<size_t>(n, size_t(1) << 30));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError("reading " + path + " failed: " + os_reason(errno));
    }
    if (r == 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

uint32_t crc_of(uint32_t crc, const void* p, size_t n) {
  const auto* b = static_cast<const Bytef*>(p);
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n, size_t(1) << 30));
    crc = static_cast<uint32_t>(crc32(crc, b, chunk));
    b += chunk;
    n -= chunk;
  }
  return crc;
}

template <typename Header>
uint32_t header_crc(Header h) {
  h.crc = 0;
  return crc_of(static_cast<uint32_t>(crc32(0, nullptr, 0)), &h, sizeof h);
}

std::string mode_text(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

// Empty when st is this user's and others cannot write it, else why not.
std::string ownership_problem(const struct stat& st) {
  if (st.st_uid != ::geteuid()) { return "belongs to uid " + std::to_string(st.st_uid) + ", not to this user"; }
  if ((st.st_mode & S_IWOTH) != 0) { return "is writable by other users (mode " + mode_text(st.st_mode) + ")"; }
  return "";
}

// Opens a file resuming reads: never through a symbolic link, never waiting
// on a FIFO, and only a regular file of this user that others cannot write.
// what: how the message names it ("checkpoint shard P").
int open_trusted(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return -1;
    throw CheckpointError(
        what + " cannot be opened: " + (e == ELOOP ? std::string("it is a symbolic link (refused)") : os_reason(e)));
  }
  struct stat st {};
  std::string problem;
  if (::fstat(fd, &st) != 0) problem = os_reason(errno);
  else if (!S_ISREG(st.st_mode)) problem = "it is not a regular file";
  else if (const std::string owner = ownership_problem(st); !owner.empty())
    problem = "it " + owner + "; resuming reads only files of this user that others cannot change";
  if (problem.empty() && ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) problem = os_reason(errno);
  if (!problem.empty()) {
    ::close(fd);
    throw CheckpointError(what + " refused: " + problem);
  }
  return fd;
}

// Reads a shard's header, format 3 or 4. Returns its size on disk and the
// CRC-32 of its bytes (crc = 0).
size_t read_header(int fd, const std::string& path, ShardHeader* h, uint32_t* crc) {
  HeaderV3 old{};
  if (!read_all(fd, &old, sizeof old, path) || std::memcmp(old.magic, kMagic, sizeof kMagic) != 0) {
    throw CheckpointError(path + " is not a meshtrain checkpoint shard");
  }
  if (old.version == kOldVersion) {
    std::memset(h, 0, sizeof *h);
    std::memcpy(h, &old, offsetof(HeaderV3, crc));
    h->crc = old.crc;
    *crc = header_crc(old);
    return sizeof old;
  }
  if (old.version != kVersion) {
    throw CheckpointError(path + " has checkpoint format " + std::to_string(old.version) +
                          "; this meshtrain reads formats " + std::to_string(kOldVersion) + " and " +
                          std::to_string(kVersion));
  }
  char bytes[sizeof(ShardHeader)];
  std::memcpy(bytes, &old, sizeof old);
  if (!read_all(fd, bytes + sizeof old, sizeof bytes - sizeof old, path)) {
    throw CheckpointError("checkpoint shard " + path + " is truncated inside its header");
  }
  std::memcpy(h, bytes, sizeof *h);
  *crc = header_crc(*h);
  return sizeof *h;
}

// Writes a small text or binary file durably under path.tmp, then renames it.
void write_durably(const std::string& path, const std::vector<std::pair<const void*, size_t>>& parts) {
  const std::string tmp = path + ".tmp";
  try {
    Fd f;
    f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f.fd < 0) throw CheckpointError("cannot create " + tmp + ": " + os_reason(errno));
    for (const auto& [p, n] : parts) write_all(f.fd, p, n, tmp);
    // The data is durable before the name appears, so even a machine crash
    // cannot leave a complete-looking name over partial data.
    if (::fsync(f.fd) != 0) throw CheckpointError("fsync of " + tmp + " failed: " + os_reason(errno));
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      throw CheckpointError("renaming " + tmp + " to " + path + " failed: " + os_reason(errno));
    }
    // And the new name itself survives a machine crash: sync the directory.
    // (A killed process needs neither: the rename is atomic.)
    Fd d;
    d.fd = ::open(fs::path(path).parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d.fd >= 0) (void)::fsync(d.fd);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

}  // namespace

std::string schedule_text(const LrSchedule& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "--steps %d (warmup %d, lr %g, min-lr-ratio %g)", s.total_steps, s.warmup,
                static_cast<double>(s.lr), static_cast<double>(s.min_lr_ratio));
  return buf;
}

ShardHeader make_shard_header(const ModelConfig& mc, const Layout& l, int rank, int steps_done, uint64_t nparams,
                              int layer_lo, int layer_hi) {
  ShardHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.dp = l.dp, h.pp = l.pp, h.tp = l.tp, h.rank = rank;
  h.vocab = mc.vocab, h.seq = mc.seq, h.layers = mc.layers, h.d_model = mc.d_model;
  h.heads = mc.heads, h.tied = mc.tied, h.seed = mc.seed;
  h.step = steps_done;
  h.tp_mode = static_cast<int32_t>(l.tp_mode);
  h.layer_lo = layer_lo, h.layer_hi = layer_hi;
  h.nparams = nparams;
  h.payload_bytes = 3 * nparams * sizeof(float);
  h.tokenizer = mc.tokenizer;
  return h;
}

std::string step_dir_name(int steps_done) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08d", steps_done);
  return buf;
}

std::string rank_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank_%05d.bin", rank);
  return buf;
}

int parse_step_dir(const std::string& name) {
  if (name.size() != 13 || name.compare(0, 5, "step_") != 0) return -1;
  int step = 0;
  for (size_t i = 5; i < name.size(); i++) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

void check_dir_usable(const std::string& dir, int rank) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw CheckpointError("--ckpt-dir " + dir + " cannot be created: " + ec.message());
  check_dir_trusted(dir);
  const std::string probe = (fs::path(dir) / (".write_test_" + rank_file_name(rank))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) { throw CheckpointError("--ckpt-dir " + dir + " is not writable: " + os_reason(errno)); }
  ::close(fd);
  ::unlink(probe.c_str());
}

void check_dir_trusted(const std::string& dir) {
  // Resuming loads what the directory holds: another user able to write there
  // could plant shards or `latest`.
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) throw CheckpointError("no checkpoint to resume from in " + dir + " (it does not exist)");
    throw CheckpointError("cannot stat --ckpt-dir " + dir + ": " + os_reason(errno));
  }
  if (!S_ISDIR(st.st_mode)) throw CheckpointError("--ckpt-dir " + dir + " is not a directory");
  const std::string problem = ownership_problem(st);
  if (!problem.empty()) {
    throw CheckpointError("--ckpt-dir " + dir + " " + problem +
                          ((st.st_mode & S_IWOTH) != 0 && st.st_uid == ::geteuid()
                               ? ": remove that right (chmod o-w) or choose another directory"
                               : ": checkpoints are kept only in a directory of one's own"));
  }
}

void check_step_dir_trusted(const std::string& dir, int steps_done) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    throw CheckpointError(
        "the checkpoint after step " + std::to_string(steps_done) + " (" + dir + ") cannot be opened: " +
        (e == ELOOP || e == ENOTDIR ? std::string("not a directory (a link or a file: refused)") : os_reason(e)));
  }
  struct stat st {};
  const std::string problem = ::fstat(fd, &st) == 0 ? ownership_problem(st) : os_reason(errno);
  ::close(fd);
  if (!problem.empty()) {
    throw CheckpointError("checkpoint directory " + dir + " refused: it " + problem +
                          "; resuming reads only files of this user that others cannot change");
  }
}

int remove_stale_tmp(const std::string& dir, int rank) {
  int removed = 0;
  std::error_code ec;
  auto drop = [&](const fs::path& p) {
    if (fs::remove(p, ec)) removed++;
  };
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (parse_step_dir(e.path().filename().string()) < 0 || !e.is_directory(ec)) continue;
    drop(e.path() / (rank_file_name(rank) + ".tmp"));
  }
  if (rank == 0) drop(fs::path(dir) / "latest.tmp");
  return removed;
}

void write_shard(const std::string& path, ShardHeader h, const float* params, const float* m, const float* v) {
  const size_t bytes = h.nparams * sizeof(float);
  h.crc = 0;
  uint32_t crc = header_crc(h);
  crc = crc_of(crc, params, bytes);
  crc = crc_of(crc, m, bytes);
  crc = crc_of(crc, v, bytes);
  h.crc = crc;
  write_durably(path, {{&h, sizeof h}, {params, bytes}, {m, bytes}, {v, bytes}});
}

int read_shard(const std::string& path, const ShardHeader& want, std::vector<float>* params, std::vector<float>* m,
               std::vector<float>* v, LrSchedule* schedule) {
  Fd f;
  f.fd = open_trusted(path, "checkpoint shard " + path);
  if (f.fd < 0) throw CheckpointError("checkpoint shard " + path + " cannot be opened: " + os_reason(ENOENT));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw CheckpointError("cannot stat " + path + ": " + os_reason(errno));
  if (static_cast<uint64_t>(st.st_size) < sizeof(HeaderV3)) {
    throw CheckpointError("checkpoint shard " + path + " has " + std::to_string(st.st_size) +
                          " bytes, fewer than a header's " + std::to_string(sizeof(HeaderV3)) +
                          " (truncated or damaged)");
  }
  ShardHeader h{};
  uint32_t crc = 0;
  const size_t header_bytes = read_header(f.fd, path, &h, &crc);
  if (h.dp != want.dp || h.pp != want.pp || h.tp != want.tp || h.rank != want.rank || h.tp_mode != want.tp_mode) {
    throw CheckpointError(path + " was written by rank " + std::to_string(h.rank) + " of a " + std::to_string(h.dp) +
                          "x" + std::to_string(h.pp) + "x" + std::to_string(h.tp) + (h.tp_mode ? " (3d)" : "") +
                          " layout; this run cannot resume from it");
  }
  if (h.layer_lo != want.layer_lo || h.layer_hi != want.layer_hi) {
    throw CheckpointError(path + " holds layers [" + std::to_string(h.layer_lo) + ", " + std::to_string(h.layer_hi) +
                          ") but this rank's stage has [" + std::to_string(want.layer_lo) + ", " +
                          std::to_string(want.layer_hi) + "): the stage split differs");
  }
  if (h.vocab != want.vocab || h.seq != want.seq || h.layers != want.layers || h.d_model != want.d_model ||
      h.heads != want.heads || h.tied != want.tied || h.nparams != want.nparams) {
    throw CheckpointError(path + " holds a different model configuration");
  }
  if (h.tokenizer != want.tokenizer) {
    throw CheckpointError(path + " was trained with another tokenizer (" +
                          (h.tokenizer == 0 ? std::string("bytes") : "a word vocabulary") + "); this run's is " +
                          (want.tokenizer == 0 ? "bytes" : "a word vocabulary") +
                          (h.tokenizer != 0 && want.tokenizer != 0 ? " built from another corpus or --vocab" : ""));
  }
  if (h.payload_bytes != want.payload_bytes) {
    throw CheckpointError("checkpoint shard " + path + "'s header promises a payload of " +
                          std::to_string(h.payload_bytes) + " bytes, but " + std::to_string(want.nparams) +
                          " parameters with their AdamW moments take " + std::to_string(want.payload_bytes) +
                          " (damaged header)");
  }
  const uint64_t expect = header_bytes + h.payload_bytes;
  if (static_cast<uint64_t>(st.st_size) != expect) {
    throw CheckpointError("checkpoint shard " + path + " has " + std::to_string(st.st_size) +
                          " bytes where its header promises " + std::to_string(expect) + " (truncated or damaged)");
  }
  const size_t n = h.nparams;
  std::vector<float> p(n), mm(n), vv(n);
  const size_t bytes = n * sizeof(float);
  if (!read_all(f.fd, p.data(), bytes, path) || !read_all(f.fd, mm.data(), bytes, path) ||
      !read_all(f.fd, vv.data(), bytes, path)) {
    throw CheckpointError("checkpoint shard " + path + " is truncated");
  }
  crc = crc_of(crc, p.data(), bytes);
  crc = crc_of(crc, mm.data(), bytes);
  crc = crc_of(crc, vv.data(), bytes);
  if (crc != h.crc) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " (stored %08x, computed %08x)", h.crc, crc);
    throw CheckpointError("checkpoint shard " + path + " fails its checksum" + buf + ": the file is damaged");
  }
  for (size_t i = 0; i < n; i++) {
    if (!std::isfinite(p[i]) || !std::isfinite(mm[i]) || !std::isfinite(vv[i])) {
      throw CheckpointError("checkpoint shard " + path + " holds non-finite values (element " + std::to_string(i) +
                            "); it was saved from a diverged run");
    }
  }
  *params = std::move(p);
  *m = std::move(mm);
  *v = std::move(vv);
  if (schedule != nullptr && h.version == kVersion) *schedule = h.schedule;
  return h.version == kOldVersion ? h.step + 1 : h.step;
}

void write_latest(const std::string& dir, int steps_done) {
  const std::string text = step_dir_name(steps_done) + "\n";
  write_durably((fs::path(dir) / "latest").string(), {{text.data(), text.size()}});
}

int read_latest(const std::string& dir) {
  const std::string path = (fs::path(dir) / "latest").string();
  Fd f;
  f.fd = open_trusted(path, path);
  if (f.fd < 0) { throw CheckpointError("no checkpoint to resume from in " + dir + " (" + path + " does not exist)"); }
  char buf[64];
  ssize_t n = 0;
  do { n = ::read(f.fd, buf, sizeof buf - 1); } while (n < 0 && errno == EINTR);
  if (n < 0) throw CheckpointError("reading " + path + " failed: " + os_reason(errno));
  std::string name(buf, static_cast<size_t>(n));
  if (!name.empty() && name.back() == '\n') name.pop_back();
  const int step = parse_step_dir(name);
  if (step < 0) {
    std::string shown;
    for (char c : name.substr(0, 40)) shown.push_back(c >= 32 && c < 127 ? c : '?');
    throw CheckpointError(path + " holds '" + shown + "', not a checkpoint name (step_ and 8 digits)");
  }
  return step;
}

std::vector<int> prune_checkpoints(const std::string& dir, int current, int keep) {
  std::vector<int> removed;
  if (keep <= 0) return removed;
  std::vector<int> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int s = parse_step_dir(e.path().filename().string());
    if (s >= 0 && s <= current && e.is_directory(ec)) steps.push_back(s);
  }
  std::sort(steps.begin(), steps.end(), std::greater<int>());
  for (size_t i = static_cast<size_t>(keep); i < steps.size(); i++) {
    fs::remove_all(fs::path(dir) / step_dir_name(steps[i]), ec);
    if (ec) throw CheckpointError("removing old checkpoint " + step_dir_name(steps[i]) + " failed: " + ec.message());
    removed.push_back(steps[i]);
  }
  return removed;
}

}  // namespace meshtrain
