// meshcclSparseAllReduce: the all-reduce of a row-sparse tensor, with a dense
// result. Each rank holds nnz rows of row_len elements (values) with their
// row numbers (indices); a row a rank does not hold counts as zeros there.
//
// The run works in two phases. First every rank sends every other a header
// (its row count, its arguments, the first problem it found in its indices),
// so every rank sees the same headers and reaches the same verdict: a bad
// argument on any rank fails the call on every rank, before any data moves,
// and the communicator stays usable. Then, by MESHCCL_SPARSE_ALGO or the cost
// model applied to the row counts, one of two strategies:
//   dense:  each rank densifies its rows, then a direct reduce-scatter (each
//           rank owns a block and reduces every rank's part of it in rank
//           order) and a direct all-gather;
//   gather: each rank sends its indices and rows to every other, and each
//           reduces the union of rows locally in rank order.
// Both compute, per element, c_0 op c_1 op ... op c_{n-1} from left to right,
// where c_i is rank i's contribution: its rows with that number combined with
// op in the order given (Sum for Avg and PreMulSum), times its PreMulSum
// scalar, or a zero row (times the scalar). Avg divides the result by n at
// the end. The two strategies therefore agree bitwise on every rank.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collectives/algorithms.h"
#include "sched/engine.h"
#include "util/log.h"
#include "util/param.h"

namespace meshccl {

namespace {

constexpr uint32_t kTagHeader = 0, kTagIndices = 1, kTagValues = 2, kTagScatter = 3, kTagGather = 4;
// A message's piece number under its tag: step tags here are tag << kPieceBits | piece
// (five tags of 2^20 pieces, below the plan's control tags).
constexpr int kPieceBits = 20;
static_assert((kTagGather + 1) << kPieceBits <= kControlTag, "pieces of every tag stay below the control tags");

// A message in pieces of at most op.chunk_bytes (tag << kPieceBits | piece),
// as the other plans cut theirs: transfers of a few MiB in one step are
// several times slower on the shm transport. Returns the last step (a send)
// or adds every piece to *steps (a receive).
size_t piece_bytes(const OpDesc& op, size_t bytes) {
  return std::max({op.chunk_bytes, (bytes >> kPieceBits) + 1, size_t{1}});
}
Plan::StepId send_pieces(Plan* plan, const OpDesc& op, int peer, uint32_t tag, const void* src, size_t bytes,
                         Plan::StepId dep = Plan::kNoStep) {
  Plan::StepId last = Plan::kNoStep;
  const size_t piece = piece_bytes(op, bytes);
  for (size_t off = 0, k = 0; off < bytes; off += piece, ++k)
    last = plan->send(peer, tag << kPieceBits | static_cast<uint32_t>(k), static_cast<const char*>(src) + off,
                      std::min(piece, bytes - off), {dep});
  return last;
}
void recv_pieces(Plan* plan, const OpDesc& op, int peer, uint32_t tag, void* dst, size_t bytes,
                 std::vector<Plan::StepId>* steps = nullptr) {
  const size_t piece = piece_bytes(op, bytes);
  for (size_t off = 0, k = 0; off < bytes; off += piece, ++k) {
    Plan::StepId s = plan->recv(peer, tag << kPieceBits | static_cast<uint32_t>(k), static_cast<char*>(dst) + off,
                                std::min(piece, bytes - off));
    if (steps != nullptr) steps->push_back(s);
  }
}

enum Problem : uint8_t { kNoProblem = 0, kIndexRange = 1, kOverlap = 2, kBadSetting = 3 };

// What each rank tells every other before any data moves.
struct Header {
  uint64_t nnz = 0, rows = 0, row_len = 0;
  int32_t dtype = 0;
  uint8_t op = 0, avg = 0, premul = 0, strategy = 0;
  uint8_t problem = kNoProblem;
  uint8_t pad[7] = {};
  int64_t bad_index = 0;  // kIndexRange: the index and its position
  uint64_t bad_pos = 0;
  unsigned char scalar[8] = {};
};

SparseStrategy strategy_setting(const OpDesc& op, bool* ok) {
  const std::string& v = settings_of(op).sparse_algo;
  *ok = true;
  if (v.empty() || v == "auto") return SparseStrategy::Auto;
  if (v == "dense") return SparseStrategy::Dense;
  if (v == "gather") return SparseStrategy::Gather;
  *ok = false;
  return SparseStrategy::Auto;
}

bool overlaps(const void* a, size_t abytes, const void* b, size_t bbytes) {
  if (abytes == 0 || bbytes == 0) return false;
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bbytes && y < x + abytes;
}

Header local_header(const OpDesc& op) {
  Header h;
  h.nnz = op.nnz;
  h.rows = op.rows;
  h.row_len = op.row_len;
  h.dtype = static_cast<int32_t>(op.dtype);
  h.op = static_cast<uint8_t>(op.op);
  h.avg = op.avg;
  h.premul = op.premul;
  std::memcpy(h.scalar, op.scalar, sizeof h.scalar);
  bool ok = true;
  h.strategy = static_cast<uint8_t>(strategy_setting(op, &ok));
  if (!ok) h.problem = kBadSetting;
  const size_t rb = op.row_len * op.elem();
  if (h.problem == kNoProblem && (overlaps(op.sendbuff, op.nnz * rb, op.recvbuff, op.rows * rb) ||
                                  overlaps(op.indices, op.nnz * sizeof(int64_t), op.recvbuff, op.rows * rb)))
    h.problem = kOverlap;
  for (size_t k = 0; h.problem == kNoProblem && k < op.nnz; ++k) {
    const int64_t r = op.indices[k];
    if (r < 0 || static_cast<uint64_t>(r) >= op.rows) {
      h.problem = kIndexRange;
      h.bad_index = r;
      h.bad_pos = k;
    }
  }
  return h;
}

// The same verdict on every rank: the first problem in rank order.
Status verdict(const std::vector<Header>& hs) {
  const Header& a = hs[0];
  for (size_t i = 0; i < hs.size(); ++i) {
    const Header& h = hs[i];
    if (h.problem == kBadSetting)
      return MC_ERROR(ncclInvalidArgument,
                      "meshcclSparseAllReduce : rank %zu: MESHCCL_SPARSE_ALGO is not auto, dense or gather", i);
    if (h.problem == kOverlap)
      return MC_ERROR(ncclInvalidArgument,
                      "meshcclSparseAllReduce : rank %zu: recvbuff overlaps the values or the indices", i);
    if (h.problem == kIndexRange)
      return MC_ERROR(ncclInvalidArgument,
                      "meshcclSparseAllReduce : rank %zu: indices[%llu] = %lld is outside [0, rows = %llu)", i,
                      static_cast<unsigned long long>(h.bad_pos), static_cast<long long>(h.bad_index),
                      static_cast<unsigned long long>(h.rows));
    if (h.rows != a.rows || h.row_len != a.row_len || h.dtype != a.dtype || h.op != a.op || h.avg != a.avg ||
        h.premul != a.premul || h.strategy != a.strategy)
      return MC_ERROR(
          ncclInvalidArgument,
          "meshcclSparseAllReduce : ranks disagree: rank 0 has rows %llu rowLen %llu datatype %d op %d%s strategy %d, "
          "rank %zu rows %llu rowLen %llu datatype %d op %d%s strategy %d",
          static_cast<unsigned long long>(a.rows), static_cast<unsigned long long>(a.row_len), a.dtype, a.op,
          a.avg      ? " (avg)"
          : a.premul ? " (premulsum)"
                     : "",
          a.strategy, i, static_cast<unsigned long long>(h.rows), static_cast<unsigned long long>(h.row_len), h.dtype,
          h.op,
          h.avg      ? " (avg)"
          : h.premul ? " (premulsum)"
                     : "",
          h.strategy);
  }
  return kOk;
}

// Adds rows (idx[k], vals row k) into the contribution: the first row of a
// number is copied to slot_of(number), later ones are combined into it with op.
template <typename SlotOf>
void coalesce(Executor& ex, const OpDesc& op, const int64_t* idx, const char* vals, size_t nnz, char* base,
              std::vector<uint8_t>& seen, SlotOf slot_of) {
  const size_t rb = op.row_len * op.elem();
  for (size_t k = 0; k < nnz; ++k) {
    const size_t s = slot_of(idx[k]);
    char* dst = base + s * rb;
    if (!seen[s]) {
      seen[s] = 1;
      std::memcpy(dst, vals + k * rb, rb);
    } else {
      ex.reduce2(op.dtype, op.op, dst, dst, vals + k * rb, op.row_len);
    }
  }
}

class SparseRun final : public Run {
 public:
  SparseRun(const TuneModel& model, const OpDesc& op, uint64_t tag_base)
      : model_(model), op_(op), tag_base_(tag_base), headers_(static_cast<size_t>(op.nranks)) {}

  const char* name() const override { return "SparseAllReduce"; }
  bool finished() const override { return done_; }
  bool can_end_alone() const override { return agreed_failure_; }
  int waiting_on() const override { return sub_ != nullptr ? sub_->waiting_on() : -1; }
  void start(ScratchPool& pool) override {
    op_.read_scalar();
    headers_[static_cast<size_t>(op_.rank)] = local_header(op_);
    auto plan = new_plan("sparse_header");
    for (int j = 0; j < op_.nranks; ++j) {
      if (j == op_.rank) continue;
      plan->send(j, kTagHeader, &headers_[static_cast<size_t>(op_.rank)], sizeof(Header));
      plan->recv(j, kTagHeader, &headers_[static_cast<size_t>(j)], sizeof(Header));
    }
    begin_sub(std::move(plan), pool);
  }
  void release(ScratchPool& pool) override {
    if (sub_ != nullptr) sub_->release(pool);
    sub_.reset();
    if (pooled_ != nullptr) pool.release(pooled_);
    pooled_ = nullptr;
  }
  Status poll(Engine* eng, bool* moved) override {
    bool sub_done = false;
    MC_TRY(poll_sub(eng, moved, &sub_done));
    if (!sub_done) return kOk;
    *moved = true;
    if (phase_ == 0) {
      Status v = verdict(headers_);
      if (!v.ok()) {
        agreed_failure_ = true;
        return v;
      }
      phase_ = 1;
      return begin_data(eng);
    }
    if (gather_) fold(eng->executor());
    done_ = true;
    return kOk;
  }

 private:
  std::unique_ptr<Plan> new_plan(const char* algorithm) const {
    auto plan = std::make_unique<Plan>();
    plan->kind = OpKind::SparseAllReduce;
    plan->algorithm = algorithm;
    plan->dtype = op_.dtype;
    plan->op = op_.op;
    plan->divisor = op_.nranks;
    std::memcpy(plan->scalar, op_.scalar, sizeof plan->scalar);
    return plan;
  }
  void begin_sub(std::unique_ptr<Plan> plan, ScratchPool& pool) {
    sub_ = make_plan_run(std::move(plan), tag_base_);
    sub_->inherit_priority(*this);
    sub_->start(pool);
  }
  Status poll_sub(Engine* eng, bool* moved, bool* done) {
    if (sub_ != nullptr) {
      MC_TRY(sub_->poll(eng, moved));
      if (!sub_->finished()) return kOk;
      sub_->release(eng->scratch());
      sub_.reset();
    }
    *done = true;
    return kOk;
  }
  Status begin_data(Engine* eng);
  void densify(Executor& ex);
  void plan_dense(Plan* plan);
  void plan_gather(Plan* plan);
  void fold(Executor& ex);
  void fold_rank(Executor& ex, int i, const std::vector<int64_t>& uni, char* contrib);
  // The run's buffers, from the communicator's scratch pool: reused from
  // operation to operation, so their pages are not faulted in again each time.
  char* take(ScratchPool& pool, size_t bytes) {
    pooled_ = pool.acquire(std::max<size_t>(bytes, 1));
    return reinterpret_cast<char*>(pooled_->data());
  }

  size_t row_bytes() const { return op_.row_len * op_.elem(); }

  TuneModel model_;
  OpDesc op_;
  uint64_t tag_base_;
  std::vector<Header> headers_;
  std::unique_ptr<Run> sub_;
  int phase_ = 0;
  bool gather_ = false;
  bool done_ = false;
  bool agreed_failure_ = false;
  std::vector<unsigned char>* pooled_ = nullptr;
  char* dense_ = nullptr;               // dense: this rank's contribution
  char* slots_ = nullptr;               // dense: the other ranks' parts of this rank's block
  std::vector<int64_t*> peer_indices_;  // gather: every other rank's rows
  std::vector<char*> peer_values_;
  char* contrib_ = nullptr;  // gather: one rank's rows of the union
};

Status SparseRun::begin_data(Engine* eng) {
  size_t total = 0;
  for (const Header& h : headers_) total += h.nnz;
  const auto forced = static_cast<SparseStrategy>(headers_[0].strategy);
  if (forced == SparseStrategy::Auto) gather_ = sparse_gather_cost(model_, op_, total) < sparse_dense_cost(model_, op_);
  else gather_ = forced == SparseStrategy::Gather;
  MC_INFO(kTune, "SparseAllReduce: %zu rows of %zu elements of %s, %zu rows sent in all -> %s", op_.rows, op_.row_len,
          dtype_name(op_.dtype), total, gather_ ? "gather" : "dense");
  auto plan = new_plan(gather_ ? "sparse_gather" : "sparse_dense");
  const size_t rb = row_bytes();
  if (gather_) {
    char* m = take(eng->scratch(), total * (sizeof(int64_t) + 2 * rb));
    peer_indices_.assign(static_cast<size_t>(op_.nranks), nullptr);
    peer_values_.assign(static_cast<size_t>(op_.nranks), nullptr);
    for (int j = 0; j < op_.nranks; ++j) {
      peer_indices_[static_cast<size_t>(j)] = reinterpret_cast<int64_t*>(m);
      m += headers_[static_cast<size_t>(j)].nnz * sizeof(int64_t);
    }
    for (int j = 0; j < op_.nranks; ++j) {
      peer_values_[static_cast<size_t>(j)] = m;
      m += headers_[static_cast<size_t>(j)].nnz * rb;
    }
    contrib_ = m;
    plan_gather(plan.get());
  } else {
    const size_t mine =
        detail::block_begin(op_.count, op_.nranks, op_.rank + 1) - detail::block_begin(op_.count, op_.nranks, op_.rank);
    dense_ = take(eng->scratch(), op_.count * op_.elem() + static_cast<size_t>(op_.nranks) * mine * op_.elem());
    slots_ = dense_ + op_.count * op_.elem();
    densify(eng->executor());
    plan_dense(plan.get());
  }
  begin_sub(std::move(plan), eng->scratch());
  return kOk;
}

// This rank's contribution as a dense tensor: zeros, its rows combined, scaled.
void SparseRun::densify(Executor& ex) {
  const size_t rb = row_bytes();
  std::memset(dense_, 0, op_.rows * rb);
  std::vector<uint8_t> seen(op_.rows, 0);
  coalesce(ex, op_, op_.indices, static_cast<const char*>(op_.sendbuff), op_.nnz, dense_, seen,
           [](int64_t r) { return static_cast<size_t>(r); });
  if (op_.premul) ex.scale(op_.dtype, dense_, dense_, op_.count, op_.scalar);
}

// Direct reduce-scatter in rank order, then direct all-gather, into recvbuff.
void SparseRun::plan_dense(Plan* plan) {
  const int n = op_.nranks, me = op_.rank;
  const size_t es = op_.elem();
  auto lo = [&](int b) { return detail::block_begin(op_.count, n, b); };
  auto len = [&](int b) { return lo(b + 1) - lo(b); };
  const size_t mine = len(me);
  char* out = detail::at(op_.recvbuff, lo(me), es);
  std::vector<std::vector<Plan::StepId>> got(static_cast<size_t>(n));
  std::vector<const char*> part(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    const auto u = static_cast<size_t>(j);
    part[u] = j == me ? detail::at(dense_, lo(me), es) : slots_ + u * mine * es;
    if (j == me) continue;
    send_pieces(plan, op_, j, kTagScatter, detail::at(dense_, lo(j), es), len(j) * es);
    recv_pieces(plan, op_, j, kTagScatter, slots_ + u * mine * es, mine * es, &got[u]);
  }
  for (int j = 0; j < n; ++j)
    if (j != me) recv_pieces(plan, op_, j, kTagGather, detail::at(op_.recvbuff, lo(j), es), len(j) * es);
  if (mine == 0) return;
  // The fold; the step that first reads part j waits for its pieces.
  std::vector<Plan::StepId> reads(static_cast<size_t>(n));
  Plan::StepId acc = n == 1 ? plan->copy(out, part[0], mine * es) : plan->reduce(out, part[0], part[1], mine);
  reads[0] = acc;
  if (n > 1) reads[1] = acc;
  for (int j = 2; j < n; ++j)
    reads[static_cast<size_t>(j)] = acc = plan->reduce(out, out, part[static_cast<size_t>(j)], mine, {acc});
  for (int j = 0; j < n; ++j)
    for (Plan::StepId s : got[static_cast<size_t>(j)]) plan->add_dep(reads[static_cast<size_t>(j)], s);
  if (op_.avg) acc = plan->divide(out, out, mine, {acc});
  for (int j = 0; j < n; ++j)
    if (j != me) send_pieces(plan, op_, j, kTagGather, out, mine * es, acc);
}

// Every rank's indices and rows to every other.
void SparseRun::plan_gather(Plan* plan) {
  const int n = op_.nranks, me = op_.rank;
  const size_t rb = row_bytes();
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    const size_t theirs = headers_[static_cast<size_t>(j)].nnz;
    send_pieces(plan, op_, j, kTagIndices, op_.indices, op_.nnz * sizeof(int64_t));
    send_pieces(plan, op_, j, kTagValues, op_.sendbuff, op_.nnz * rb);
    recv_pieces(plan, op_, j, kTagIndices, peer_indices_[static_cast<size_t>(j)], theirs * sizeof(int64_t));
    recv_pieces(plan, op_, j, kTagValues, peer_values_[static_cast<size_t>(j)], theirs * rb);
  }
}

// Folds rank i's contribution into the rows of uni (sorted row numbers) of
// recvbuff: rank 0's is copied, later ones combined with op.
void SparseRun::fold_rank(Executor& ex, int i, const std::vector<int64_t>& uni, char* contrib) {
  const size_t rb = row_bytes(), es = op_.elem();
  const bool own = i == op_.rank;
  const int64_t* idx = own ? op_.indices : peer_indices_[static_cast<size_t>(i)];
  const char* vals = own ? static_cast<const char*>(op_.sendbuff) : peer_values_[static_cast<size_t>(i)];
  const Header& h = headers_[static_cast<size_t>(i)];
  std::vector<uint8_t> seen(uni.size(), 0);
  auto pos = [&](int64_t r) { return static_cast<size_t>(std::lower_bound(uni.begin(), uni.end(), r) - uni.begin()); };
  std::memset(contrib, 0, uni.size() * rb);
  coalesce(ex, op_, idx, vals, h.nnz, contrib, seen, pos);
  if (op_.premul) ex.scale(op_.dtype, contrib, contrib, uni.size() * op_.row_len, h.scalar);
  for (size_t u = 0; u < uni.size(); ++u) {
    char* out = detail::at(op_.recvbuff, static_cast<size_t>(uni[u]) * op_.row_len, es);
    if (i == 0) std::memcpy(out, contrib + u * rb, rb);
    else ex.reduce2(op_.dtype, op_.op, out, out, contrib + u * rb, op_.row_len);
  }
}

// The gather strategy's local reduction into recvbuff.
void SparseRun::fold(Executor& ex) {
  const int n = op_.nranks;
  const size_t rb = row_bytes(), es = op_.elem();
  std::vector<int64_t> uni(op_.indices, op_.indices + op_.nnz);
  for (int j = 0; j < n; ++j)
    if (j != op_.rank)
      uni.insert(uni.end(), peer_indices_[static_cast<size_t>(j)],
                 peer_indices_[static_cast<size_t>(j)] + headers_[static_cast<size_t>(j)].nnz);
  std::sort(uni.begin(), uni.end());
  uni.erase(std::unique(uni.begin(), uni.end()), uni.end());
  // A row no rank holds: the fold of every rank's zero row, the same for all.
  std::vector<char> empty(rb, 0), zero(rb);
  for (int i = 0; i < n; ++i) {
    std::fill(zero.begin(), zero.end(), 0);
    if (op_.premul) ex.scale(op_.dtype, zero.data(), zero.data(), op_.row_len, headers_[static_cast<size_t>(i)].scalar);
    if (i == 0) empty = zero;
    else ex.reduce2(op_.dtype, op_.op, empty.data(), empty.data(), zero.data(), op_.row_len);
  }
  if (op_.avg) ex.divide(op_.dtype, empty.data(), empty.data(), op_.row_len, n);
  const bool zeros = std::all_of(empty.begin(), empty.end(), [](char c) { return c == 0; });
  if (zeros) std::memset(op_.recvbuff, 0, op_.rows * rb);
  for (size_t r = 0, u = 0; !zeros && r < op_.rows; ++r) {
    if (u < uni.size() && uni[u] == static_cast<int64_t>(r)) ++u;
    else std::memcpy(detail::at(op_.recvbuff, r * op_.row_len, es), empty.data(), rb);
  }
  for (int i = 0; i < n; ++i) fold_rank(ex, i, uni, contrib_);
  if (op_.avg)
    for (int64_t r : uni) {
      char* out = detail::at(op_.recvbuff, static_cast<size_t>(r) * op_.row_len, es);
      ex.divide(op_.dtype, out, out, op_.row_len, n);
    }
}

}  // namespace

double sparse_dense_cost(const TuneModel& model, const OpDesc& op) {
  const double n = op.nranks, bytes = static_cast<double>(op.count * op.elem());
  if (op.nranks == 1) return bytes * model.gamma();
  return 2 * (n - 1) * model.alpha() + 2 * (n - 1) / n * bytes * model.beta() +
         (1 + (n - 1) / n) * bytes * model.gamma();
}

double sparse_gather_cost(const TuneModel& model, const OpDesc& op, size_t total_nnz) {
  const double n = op.nranks, rb = static_cast<double>(op.row_len * op.elem());
  const double t = static_cast<double>(total_nnz), uni = std::min(t, static_cast<double>(op.rows));
  const double local = (static_cast<double>(op.rows) * rb + n * uni * rb) * model.gamma();
  if (op.nranks == 1) return local;
  return 2 * (n - 1) * model.alpha() + (n - 1) / n * t * (rb + sizeof(int64_t)) * model.beta() + local;
}

double sparse_allreduce_cost(const TuneModel& model, const OpDesc& op) {
  return std::min(sparse_dense_cost(model, op), sparse_gather_cost(model, op, op.nnz * static_cast<size_t>(op.nranks)));
}

std::unique_ptr<Run> make_sparse_allreduce_run(const TuneModel& model, const OpDesc& op, uint64_t tag_base) {
  return std::make_unique<SparseRun>(model, op, tag_base);
}

}  // namespace meshccl
