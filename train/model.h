// One rank's piece of the GPT: the layers of its pipeline stage, sliced by the
// tensor-parallel scheme (tp.h), which also does all tensor-parallel
// communication. Parameters and gradients each
// live in one arena, ordered so that backward finishes them from the end of the
// arena towards the start (lets data-parallel buckets be contiguous ranges).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm.h"
#include "grid.h"
#include "param.h"
#include "tp.h"

namespace meshtrain {

struct LayerParams {
  float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
  float *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
};

class Stage {
 public:
  // slots: how many micro-batches may be between forward and backward at once.
  Stage(const ModelConfig& cfg, const Layout& layout, const Coords& me, int micro_batch, int slots);

  bool first() const { return me_.pp == 0; }
  bool last() const { return me_.pp == layout_.pp - 1; }
  int tokens_per_micro() const { return B_ * T_; }
  // Floats of this rank's slice of the residual stream (what stages exchange).
  size_t act_size() const { return static_cast<size_t>(Nr_) * Cr_; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const LayerRange& layers() const { return range_; }
  // Micro-batches whose activations this stage can hold at once (the
  // schedule's most in flight), and the bytes those activations take.
  int slots() const { return static_cast<int>(slots_.size()); }
  size_t activation_bytes() const;

  // Where the previous stage's activations are received for a slot.
  float* input_buffer(int slot) { return slots_[slot].input; }
  // This stage's output for a slot (what the next stage receives).
  const float* output(int slot) const;
  // Where the next stage's gradient is received before backward.
  float* grad_in_buffer() { return grad_in_.data(); }
  // After backward: the gradient with respect to this stage's input.
  const float* grad_out() const { return dres_.data(); }

  // Forward of one micro-batch. tokens/targets are B*T ids (targets used on the
  // last stage, tokens on the first). Returns the mean loss on the last stage.
  // need(hi), when given, is called before params[0, hi) are first read, in
  // rising hi, ending with params.size().
  float forward(int slot, const int32_t* tokens, const int32_t* targets, const std::function<void(size_t)>& need = {});
  // Backward of the micro-batch held in slot; accumulates parameter gradients.
  // loss_scale is dLoss/d(mean loss of this micro-batch). ready(lo) is called as
  // soon as grads[lo, end) will not change any more in this backward.
  void backward(int slot, float loss_scale, const std::function<void(size_t)>& ready);

  // The logits of token (b, t) of the micro-batch in `slot` (last stage),
  // `vocab` of them, on every tensor-parallel rank (collective over them).
  void token_logits(int slot, int b, int t, float* out);

  void zero_grads();
  // Completes gradients that the scheme leaves as partial sums (collective
  // over the tensor-parallel group; after the step's last backward).
  void finish_grads();

  // Tensor-parallel communicators; a Layout{} stage with a one-rank comm
  // behaves as the single-process model.
  void set_tp_comms(const TpComms& c) { tp_->set_comms(c); }
  void set_tp_comm(Comm* group) {
    TpComms c;
    c.group = group;
    tp_->set_comms(c);
  }
  TpScheme& tp() { return *tp_; }

  std::vector<float> params, grads;

 private:
  struct LayerActs {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *out;
    float* saved[4];  // what each linear of the layer keeps for backward (scheme-defined)
  };
  struct Slot {
    std::vector<float> mem;
    float* input = nullptr;
    std::vector<LayerActs> layers;
    float *lnf, *lnf_mean, *lnf_rstd, *logits, *rowmax, *ce, *losses, *head_saved;
    std::vector<int32_t> tokens, targets;
  };

  void add_param(const std::string& name, uint64_t key, int rows, int cols, Tensor t, Linear which, float std,
                 float value, bool decay, bool in_norm);
  void build_slot(Slot& s);
  void init_params();

  ModelConfig cfg_;
  Layout layout_;
  Coords me_;
  LayerRange range_;
  std::unique_ptr<TpScheme> tp_;
  // Micro-batch sequences and length, model width; local residual tokens and
  // width, inner tokens and sequences (see TpShapes).
  int B_, T_, C_, Nr_, Cr_, Ni_, Bi_;

  std::vector<ParamSpec> specs_;
  // Pointers into params (p*) and grads (g*).
  float *wte_ = nullptr, *wpe_ = nullptr, *lnfw_ = nullptr, *lnfb_ = nullptr, *head_ = nullptr;
  float *gwte_ = nullptr, *gwpe_ = nullptr, *glnfw_ = nullptr, *glnfb_ = nullptr, *ghead_ = nullptr;
  std::vector<LayerParams> lp_, lg_;
  std::vector<size_t> layer_offset_;
  size_t final_offset_ = 0;

  std::vector<Slot> slots_;
  // Backward scratch, shared by all slots.
  std::vector<float> dres_, grad_in_, dln_, dqkv_, datt_, datty_, dfch_, dfg_, dlogits_, tmp_;
};

}  // namespace meshtrain
