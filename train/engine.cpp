#include "engine.h"

#include "checkpoint.h"
#include "planner.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <new>
#include <set>
#include <stdexcept>

namespace meshtrain {

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

LrSchedule schedule_of(const OptimConfig& o) { return LrSchedule{o.total_steps, o.warmup, o.lr, o.min_lr_ratio}; }

double physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

// What a rank that cannot hold its part of the model is told.
std::string memory_error(const TrainConfig& c, int rank, double need, const std::string& why) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "rank %d needs about %.1f GiB for its part of the model (parameters, gradients, AdamW moments "
                "and activations of --d-model %d, --layers %d, --seq %d, --micro-batch %d on dp %d x pp %d x tp "
                "%d): %s; use a smaller model or micro-batch, or more pipeline or tensor-parallel ranks",
                rank, need / 1073741824.0, c.model.d_model, c.model.layers, c.model.seq, c.micro_batch, c.layout.dp,
                c.layout.pp, c.layout.tp, why.c_str());
  return buf;
}

}  // namespace

Engine::Engine(const TrainConfig& cfg, int rank, const Comms& comms, const Corpus& corpus)
    : cfg_(cfg), rank_(rank), me_(coords_of(rank, cfg.layout)), comms_(comms), corpus_(corpus), opt_(0) {
  const Layout& l = cfg_.layout;
  const int world = comms_.world ? comms_.world->size() : l.world();
  if (const std::string e = check_layout(cfg_.model, l, world, cfg_.micro_batch, cfg_.grad_accum); !e.empty()) {
    throw std::invalid_argument(e);
  }
  if (rank < 0 || rank >= l.world()) {
    throw std::invalid_argument("rank " + std::to_string(rank) + " is outside the " + std::to_string(l.world()) +
                                "-rank layout");
  }
  slots_ = std::max(1, max_in_flight(stage_ops(cfg_.schedule, l.pp, me_.pp, cfg_.grad_accum)));
  // Forward-only runs (validation) receive micro-batch i+1 while i is still
  // being sent, so a pipelined stage needs two slots even when training needs one.
  if (l.pp > 1) slots_ = std::max(slots_, 2);
  // A model no machine of this size can hold is refused before any of it is
  // allocated; one that fails to allocate says how much it wanted.
  const double need = memory_bytes(cfg_.model, l.stage_view(me_.pp), cfg_.micro_batch, cfg_.grad_accum);
  const double have = physical_memory_bytes();
  if (have > 0 && need > have) {
    char why[96];
    std::snprintf(why, sizeof why, "this machine has %.1f GiB in all", have / 1073741824.0);
    throw std::invalid_argument(memory_error(cfg_, rank, need, why));
  }
  try {
    stage_ = std::make_unique<Stage>(cfg_.model, l.stage_view(me_.pp), me_, cfg_.micro_batch, slots_);
    opt_ = AdamW(stage_->params.size());
  } catch (const std::bad_alloc&) { throw std::runtime_error(memory_error(cfg_, rank, need, "allocating it failed")); }
  TpComms tc;
  tc.group = comms_.tp;
  for (int a = 0; a < 3; a++) tc.axis[a] = comms_.cube[a];
  stage_->set_tp_comms(tc);
  const Tokenizer& tk = corpus_.tokenizer();
  if (tk.is_words() != cfg_.model.words || tk.size() > cfg_.model.vocab) {
    throw std::invalid_argument("the corpus was tokenized with " + std::string(tk.is_words() ? "words" : "bytes") +
                                " (" + std::to_string(tk.size()) + " ids) but the model expects " +
                                (cfg_.model.words ? "words" : "bytes") + " and a vocabulary of " +
                                std::to_string(cfg_.model.vocab));
  }
  cfg_.model.tokenizer = tk.fingerprint();
  // With words, the data-parallel reduction sends the token embedding's
  // gradient row-sparse: on the first stage it holds only the rows of the
  // tokens seen (unless the same stage's output head shares it).
  for (const ParamSpec& sp : stage_->specs()) {
    if (sp.name == "wte" && stage_->first() && cfg_.model.words && comms_.dp && (!cfg_.model.tied || l.pp > 1) &&
        sp.offset == 0 && static_cast<size_t>(sp.local_rows) * sp.local_cols == sp.size) {
      sparse_spec_ = &sp;
    }
  }
  if (cfg_.overlap_update && (cfg_.optim.clip > 0 || l.tp_mode != TpMode::OneD)) {
    throw std::invalid_argument(
        "--overlap-update needs --clip 0 (the clip factor needs every bucket's gradients before any update) and "
        "--tp-mode 1d (3D sums replicated gradients after the buckets)");
  }
  const size_t N = static_cast<size_t>(cfg_.micro_batch) * cfg_.model.seq;
  tokens_.assign(N, 0);
  targets_.assign(N, 0);
}

double Engine::comm_seconds() const {
  double t = 0.0;
  std::set<const CommCounters*> seen;
  for (const CommCounters* c :
       std::initializer_list<const CommCounters*>{comms_.world, comms_.dp, comms_.pp, comms_.tp, comms_.embed,
                                                  comms_.cube[0], comms_.cube[1], comms_.cube[2]}) {
    if (c && seen.insert(c).second) t += c->wait_seconds;
  }
  return t;
}

void Engine::load_micro(bool train, int step, int micro, int m, int32_t* tokens, int32_t* targets) {
  const int B = cfg_.micro_batch, T = cfg_.model.seq;
  for (int b = 0; b < B; b++) {
    const int index = (me_.dp * m + micro) * B + b;
    if (train) {
      corpus_.train_sequence(cfg_.data_seed, step, index, T, tokens + b * T, targets + b * T);
    } else {
      corpus_.val_sequence(index, cfg_.layout.dp * m * B, T, tokens + b * T, targets + b * T);
    }
  }
}

void Engine::run_schedule(PipeSchedule sched, int m, bool train, int step, double* loss_sum) {
  const int p = cfg_.layout.pp, s = me_.pp;
  Stage& st = *stage_;
  const auto ops = stage_ops(sched, p, s, m);
  const auto groups = stage_groups(ops, p, s);
  int last_backward = -1;
  for (size_t k = 0; k < ops.size(); k++) {
    if (!ops[k].forward) last_backward = static_cast<int>(k);
  }
  std::vector<int> slot_of(m, -1);
  std::vector<int> free_slots;
  for (int i = slots_ - 1; i >= 0; i--) free_slots.push_back(i);
  auto take_slot = [&](int micro) {
    if (slot_of[micro] < 0) {
      if (free_slots.empty()) throw std::logic_error("pipeline schedule exceeds its slots");
      slot_of[micro] = free_slots.back();
      free_slots.pop_back();
    }
    return slot_of[micro];
  };
  auto release = [&](int micro) {
    free_slots.push_back(slot_of[micro]);
    slot_of[micro] = -1;
  };

  auto ready = [&](size_t lo) {
    if (!comms_.dp) return;
    lo = std::max(lo, dense_lo());
    if (launched_lo_ - lo >= cfg_.bucket_elems) {
      launch_bucket(lo);
      launched_lo_ = lo;
    }
  };

  // --overlap-update: layer L's forward waits only for layer L's update.
  auto need = [this](size_t hi) {
    if (pending_) update_until(hi);
  };

  std::vector<P2POp> p2p;
  std::vector<int> release_after;  // forward-only: slots whose output is being sent
  for (size_t k = 0; k <= ops.size(); k++) {
    p2p.clear();
    for (const PipeMsg& msg : groups[k]) {
      P2POp op;
      op.send = msg.send;
      op.count = st.act_size();
      op.peer = msg.peer;
      if (msg.send) {
        op.buf = msg.grad ? const_cast<float*>(st.grad_out()) : const_cast<float*>(st.output(slot_of[msg.micro]));
      } else {
        op.buf = msg.grad ? st.grad_in_buffer() : st.input_buffer(take_slot(msg.micro));
      }
      p2p.push_back(op);
    }
    if (!p2p.empty()) comms_.pp->exchange(p2p.data(), static_cast<int>(p2p.size())).wait();
    for (int micro : release_after) release(micro);
    release_after.clear();
    if (k == ops.size()) break;

    const PipeOp& op = ops[k];
    if (op.forward) {
      const int slot = take_slot(op.micro);
      load_micro(train, step, op.micro, m, tokens_.data(), targets_.data());
      const float loss = st.forward(slot, tokens_.data(), targets_.data(), need);
      if (st.last()) *loss_sum += loss;
      if (sched == PipeSchedule::ForwardOnly) release_after.push_back(op.micro);
    } else {
      update_until(st.params.size());  // backward accumulates into zeroed gradients
      const bool final_pass = static_cast<int>(k) == last_backward;
      st.backward(slot_of[op.micro], 1.0f / m,
                  final_pass ? std::function<void(size_t)>(ready) : std::function<void(size_t)>());
      release(op.micro);
    }
  }
  // Transfers the pipeline left in flight (activations sent in the
  // background) finish within the schedule that started them.
  if (comms_.pp) comms_.pp->flush().wait();
}

// The data-parallel bucket [lo, launched_lo_) of the gradients: backward
// makes them from the last layer to the first, the next forward needs them
// from the first, so the lower the bucket the more urgent (comm_priority).
void Engine::launch_bucket(size_t lo) {
  Stage& st = *stage_;
  double position = static_cast<double>(lo) / static_cast<double>(std::max<size_t>(st.grads.size(), 1));
  // The tied embedding's copy on the last stage, summed with the first
  // stage's, is what the first stage's next forward needs first.
  for (const ParamSpec& sp : st.specs()) {
    if (comms_.embed && sp.name == "wte" && sp.offset < launched_lo_ && lo < sp.offset + sp.size) position = 0.0;
  }
  buckets_.push_back(Bucket{
      lo, launched_lo_,
      comms_.dp->all_reduce(st.grads.data() + lo, launched_lo_ - lo, ReduceOp::Avg,
                            Urgency::background(comm_priority(cfg_.comm_sched, CommKind::DataParallel, position)))});
}

void Engine::wait_range(size_t lo, size_t hi) {
  for (Bucket& b : buckets_) {
    if (!b.done && b.lo < hi && lo < b.hi) {
      b.work.wait();
      b.done = true;
    }
  }
}

void Engine::update_until(size_t hi) {
  if (!pending_) return;
  Stage& st = *stage_;
  const auto& specs = st.specs();
  const float lr = lr_at(cfg_.optim, pending_step_);
  while (next_spec_ < specs.size() && specs[next_spec_].offset < hi) {
    const ParamSpec& sp = specs[next_spec_];
    wait_range(sp.offset, sp.offset + sp.size);
    const float part = spec_grad_sq(st.grads, sp);
    parts_[next_spec_] = part;
    // A non-finite gradient stops all updates of this rank; the norm check
    // at the end of the step then stops every rank.
    if (!std::isfinite(part)) poisoned_ = true;
    if (!poisoned_) opt_.update_spec(st.params, st.grads, sp, cfg_.optim, lr, pending_step_ + 1, 1.0f);
    next_spec_++;
  }
  if (next_spec_ == specs.size()) {
    for (Bucket& b : buckets_) {  // buckets of nothing a spec covers (none today)
      if (!b.done) b.work.wait();
    }
    buckets_.clear();
    st.zero_grads();
    pending_ = false;
  }
}

double Engine::reduce_pending_norm() {
  // Summed as local_grad_sq sums: the tensors' parts in spec order, in double.
  const auto& specs = stage_->specs();
  double total = 0.0;
  for (size_t i = 0; i < specs.size(); i++) {
    if (specs[i].in_norm) total += parts_[i];
  }
  float sq = static_cast<float>(total);
  if (comms_.tp) comms_.tp->all_reduce(&sq, 1, ReduceOp::Sum, Urgency::critical()).wait();
  if (comms_.pp) comms_.pp->sum(&sq, 1).wait();
  norm_pending_ = false;
  const double norm = std::sqrt(static_cast<double>(sq));
  if (!std::isfinite(norm) || poisoned_) {
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "step %d: the gradient norm is not finite (%g); training stopped, this rank's tensors from the "
                  "first non-finite gradient on not updated (try a lower --lr)",
                  pending_step_ + 1, norm);
    throw std::runtime_error(buf);
  }
  return norm;
}

double Engine::settle() {
  if (!norm_pending_) return std::nan("");
  update_until(stage_->params.size());
  return reduce_pending_norm();
}

StepStats Engine::train_step(int step) {
  const double t0 = now();
  const double c0 = comm_seconds();
  Stage& st = *stage_;
  const int m = cfg_.grad_accum;
  if (!pending_) {  // else the previous step's buckets are still being applied
    st.zero_grads();
    buckets_.clear();
  }
  launched_lo_ = st.grads.size();

  double loss_sum = 0.0;
  run_schedule(cfg_.schedule, m, true, step, &loss_sum);

  if (comms_.dp) {
    const size_t lo = dense_lo();
    if (launched_lo_ > lo) launch_bucket(lo);
    if (sparse_spec_ != nullptr) {  // the least urgent kind: on the least urgent stream
      buckets_.push_back(
          Bucket{sparse_spec_->offset, sparse_spec_->offset + sparse_spec_->size,
                 comms_.dp->sparse_all_reduce(st.grads.data() + sparse_spec_->offset,
                                              static_cast<size_t>(sparse_spec_->local_rows),
                                              static_cast<size_t>(sparse_spec_->local_cols), ReduceOp::Avg,
                                              Urgency::background(comm_priority(cfg_.comm_sched, CommKind::Sparse)))});
    }
    if (!cfg_.overlap_update) {
      for (Bucket& b : buckets_) b.work.wait();
      buckets_.clear();
    }
  }
  if (cfg_.overlap_update) return finish_overlapped(step, t0, c0, loss_sum);
  st.finish_grads();
  if (comms_.embed) {
    for (const auto& s : st.specs()) {
      if (s.name == "wte") {
        comms_.embed->all_reduce(st.grads.data() + s.offset, s.size, ReduceOp::Sum, Urgency::critical()).wait();
      }
    }
  }

  // Global gradient norm: tensor-parallel slices and stages hold disjoint parts;
  // data-parallel replicas hold the same (averaged) gradients.
  float sq = static_cast<float>(local_grad_sq(st.grads, st.specs()));
  if (comms_.tp) comms_.tp->all_reduce(&sq, 1, ReduceOp::Sum, Urgency::critical()).wait();
  if (comms_.pp) comms_.pp->sum(&sq, 1).wait();
  const double norm = std::sqrt(static_cast<double>(sq));
  float loss = st.last() ? static_cast<float>(loss_sum / m) : 0.0f;
  if (comms_.pp) comms_.pp->sum(&loss, 1).wait();
  if (comms_.dp) comms_.dp->all_reduce(&loss, 1, ReduceOp::Avg, Urgency::critical()).wait();
  // Every rank holds the same loss and norm, so all stop together, before the
  // update can spread the damage into the parameters.
  if (!std::isfinite(loss) || !std::isfinite(norm)) {
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "step %d: the %s is not finite (loss %g, gradient norm %g); training stopped "
                  "before the update (try a lower --lr or --clip)",
                  step + 1, std::isfinite(loss) ? "gradient norm" : "loss", loss, norm);
    throw std::runtime_error(buf);
  }
  const float lr = lr_at(cfg_.optim, step);
  opt_.update(st.params, st.grads, st.specs(), cfg_.optim, lr, step + 1, clip_scale(cfg_.optim, norm));

  StepStats r;
  r.step = step;
  r.loss = loss;
  r.lr = lr;
  r.grad_norm = static_cast<float>(norm);
  r.norm_step = step;
  r.seconds = now() - t0;
  r.comm_wait = comm_seconds() - c0;
  r.tokens_per_s = cfg_.global_batch() * static_cast<double>(cfg_.model.seq) / r.seconds;
  return r;
}

// --overlap-update: the buckets stay in flight; the previous step's norm and
// this step's loss are summed and checked at this same point on every rank, and
// this step's update runs during the next forward (update_until).
StepStats Engine::finish_overlapped(int step, double t0, double c0, double loss_sum) {
  Stage& st = *stage_;
  const int m = cfg_.grad_accum;
  if (comms_.embed) {  // both stages reach this point; their forwards could not meet
    for (const auto& s : st.specs()) {
      if (s.name == "wte") {
        wait_range(s.offset, s.offset + s.size);
        comms_.embed->all_reduce(st.grads.data() + s.offset, s.size, ReduceOp::Sum, Urgency::critical()).wait();
      }
    }
  }
  StepStats r;
  r.step = step;
  r.grad_norm = std::nanf("");
  r.norm_step = -1;
  if (norm_pending_) {
    r.norm_step = pending_step_;
    r.grad_norm = static_cast<float>(reduce_pending_norm());
  }
  float loss = st.last() ? static_cast<float>(loss_sum / m) : 0.0f;
  if (comms_.pp) comms_.pp->sum(&loss, 1).wait();
  if (comms_.dp) comms_.dp->all_reduce(&loss, 1, ReduceOp::Avg, Urgency::critical()).wait();
  if (!std::isfinite(loss)) {
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "step %d: the loss is not finite (%g); training stopped before the update (try a lower --lr)",
                  step + 1, loss);
    throw std::runtime_error(buf);
  }
  pending_ = norm_pending_ = true;
  poisoned_ = false;
  pending_step_ = step;
  next_spec_ = 0;
  parts_.assign(st.specs().size(), 0.0f);

  r.loss = loss;
  r.lr = lr_at(cfg_.optim, step);
  r.seconds = now() - t0;
  r.comm_wait = comm_seconds() - c0;
  r.tokens_per_s = cfg_.global_batch() * static_cast<double>(cfg_.model.seq) / r.seconds;
  return r;
}

float Engine::validate() {
  settle();
  const int B = cfg_.micro_batch;
  const int m = std::max(1, cfg_.val_sequences / (cfg_.layout.dp * B));
  double loss_sum = 0.0;
  run_schedule(PipeSchedule::ForwardOnly, m, false, 0, &loss_sum);
  float loss = stage_->last() ? static_cast<float>(loss_sum / m) : 0.0f;
  if (comms_.pp) comms_.pp->sum(&loss, 1).wait();
  if (comms_.dp) comms_.dp->all_reduce(&loss, 1, ReduceOp::Avg, Urgency::critical()).wait();
  return loss;
}

void Engine::agree(const std::string& error) {
  if (!comms_.world) {
    if (!error.empty()) throw CheckpointError(error);
    return;
  }
  // Every rank learns whether any rank failed, so none waits for a peer that
  // has given up; the highest failing rank is named.
  float failed = error.empty() ? 0.0f : static_cast<float>(rank_ + 1);
  comms_.world->all_reduce(&failed, 1, ReduceOp::Max, Urgency::critical()).wait();
  if (!error.empty()) throw CheckpointError(error);
  if (failed > 0) {
    throw CheckpointError("rank " + std::to_string(static_cast<int>(failed) - 1) +
                          " failed with its checkpoint (see its message)");
  }
}

void Engine::prepare_checkpoints() {
  std::string error;
  try {
    check_dir_usable(cfg_.ckpt_dir, rank_);
    remove_stale_tmp(cfg_.ckpt_dir, rank_);
  } catch (const std::exception& e) { error = e.what(); }
  agree(error);
}

void Engine::save_checkpoint(int step) {
  settle();
  namespace fs = std::filesystem;
  const int done = step + 1;  // named as the progress lines count: after step `done`
  const fs::path dir = fs::path(cfg_.ckpt_dir) / step_dir_name(done);
  std::string error;
  try {
    remove_stale_tmp(cfg_.ckpt_dir, rank_);  // a save killed earlier
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw CheckpointError("cannot create checkpoint directory " + dir.string() + ": " + ec.message());
    ShardHeader h = make_shard_header(cfg_.model, cfg_.layout, rank_, done, stage_->params.size(), stage_->layers().lo,
                                      stage_->layers().hi);
    h.schedule = schedule_of(cfg_.optim);
    write_shard((dir / rank_file_name(rank_)).string(), h, stage_->params.data(), opt_.m.data(), opt_.v.data());
  } catch (const std::exception& e) { error = e.what(); }
  agree(error);  // every shard of this step exists before `latest` names it
  if (rank_ == 0) {
    try {
      write_latest(cfg_.ckpt_dir, done);
      prune_checkpoints(cfg_.ckpt_dir, done, cfg_.ckpt_keep);
    } catch (const std::exception& e) { error = e.what(); }
  }
  agree(error);
}

int Engine::load_checkpoint() { return load_checkpoint(cfg_.layout); }

int Engine::load_checkpoint(const Layout& saved) {
  namespace fs = std::filesystem;
  Coords from = me_;
  int saved_rank = rank_;
  if (saved.dp != cfg_.layout.dp) {
    from.dp = 0;
    saved_rank = rank_of(from, saved);
  }
  std::string error;
  int done = 0;
  std::vector<float> p, m, v;
  LrSchedule schedule = schedule_of(cfg_.optim);
  try {
    // Everything on the way is checked before anything is read from it.
    check_dir_trusted(cfg_.ckpt_dir);
    const int named = read_latest(cfg_.ckpt_dir);
    const fs::path dir = fs::path(cfg_.ckpt_dir) / step_dir_name(named);
    check_step_dir_trusted(dir.string(), named);
    const ShardHeader want = make_shard_header(cfg_.model, saved, saved_rank, named, stage_->params.size(),
                                               stage_->layers().lo, stage_->layers().hi);
    done = read_shard((dir / rank_file_name(saved_rank)).string(), want, &p, &m, &v, &schedule);
  } catch (const std::exception& e) { error = e.what(); }
  agree(error);
  keep_schedule(schedule);
  // Copied, not moved: the stage's tensor pointers point into its arena.
  std::copy(p.begin(), p.end(), stage_->params.begin());
  opt_.m = std::move(m);
  opt_.v = std::move(v);
  return done;
}

// The steps still to come run at the rates the saving run would have used:
// another --steps (or warm-up, rate) would change them all.
void Engine::keep_schedule(const LrSchedule& saved) {
  const LrSchedule mine = schedule_of(cfg_.optim);
  schedule_note_.clear();
  if (saved == mine) return;
  cfg_.optim.total_steps = saved.total_steps;
  cfg_.optim.warmup = saved.warmup;
  cfg_.optim.lr = saved.lr;
  cfg_.optim.min_lr_ratio = saved.min_lr_ratio;
  char tail[160] = "";
  if (cfg_.steps > saved.total_steps) {
    std::snprintf(tail, sizeof tail, "; steps after %d run at its final rate %.3g", saved.total_steps,
                  static_cast<double>(lr_at(cfg_.optim, saved.total_steps)));
  }
  schedule_note_ = "resume: the learning-rate schedule of the checkpointed run is kept, " + schedule_text(saved) +
                   ", not this run's " + schedule_text(mine) + tail;
}

std::string Engine::sample(const std::string& prompt, int length, float temperature, uint64_t seed) {
  settle();
  const int T = cfg_.model.seq, V = cfg_.model.vocab;
  Stage& st = *stage_;
  const Tokenizer& tk = corpus_.tokenizer();
  std::vector<int32_t> ctx = tk.encode(prompt);
  if (ctx.empty()) ctx.push_back('\n');
  std::string out;
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  std::vector<int32_t> zeros(tokens_.size(), 0);
  std::vector<float> logits(V);
  std::vector<double> probs(V);
  for (int i = 0; i < length; i++) {
    // The whole window goes through the pipeline as one micro-batch (row 0);
    // causal attention makes the padding after the context irrelevant.
    const size_t start = ctx.size() > static_cast<size_t>(T) ? ctx.size() - T : 0;
    const int n = static_cast<int>(ctx.size() - start);
    std::fill(tokens_.begin(), tokens_.end(), 0);
    std::copy(ctx.begin() + start, ctx.end(), tokens_.begin());
    P2POp op;
    op.count = st.act_size();
    if (!st.first()) {
      op.send = false, op.buf = st.input_buffer(0), op.peer = me_.pp - 1;
      comms_.pp->exchange(&op, 1).wait();
    }
    st.forward(0, tokens_.data(), zeros.data());
    if (!st.last()) {
      op.send = true, op.buf = const_cast<float*>(st.output(0)), op.peer = me_.pp + 1;
      comms_.pp->exchange(&op, 1).wait();
    }
    float next = 0.0f;
    if (st.last()) {
      // The whole vocabulary, assembled from the tensor-parallel slices.
      st.token_logits(0, 0, n - 1, logits.data());
      int pick = 0;
      if (temperature <= 0.0f) {
        pick = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      } else {
        const float mx = *std::max_element(logits.begin(), logits.end());
        double sum = 0.0;
        for (int v = 0; v < V; v++) sum += probs[v] = std::exp((logits[v] - mx) / temperature);
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        double u = static_cast<double>(state >> 11) * 0x1.0p-53 * sum;
        for (pick = 0; pick < V - 1 && u >= probs[pick]; pick++) u -= probs[pick];
      }
      next = static_cast<float>(pick);
    }
    // The last stage tells the others (it alone contributes a non-zero).
    if (comms_.pp) comms_.pp->sum(&next, 1).wait();
    ctx.push_back(static_cast<int32_t>(next));
    out += tk.decode(static_cast<int32_t>(next));
  }
  return out;
}

}  // namespace meshtrain
