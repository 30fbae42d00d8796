// One rank's piece of the GPT: the layers of its pipeline stage, sliced along
// the tensor-parallel dimension (Megatron 1D). Parameters and gradients each
// live in one arena, ordered so that backward finishes them from the end of the
// arena towards the start (lets data-parallel buckets be contiguous ranges).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm.h"
#include "grid.h"

namespace meshtrain {

// How a logical (rows, cols) tensor is cut across tensor-parallel ranks.
enum class Split {
  None,     // replicated
  Rows,     // contiguous row blocks (column-parallel weights, vocab-parallel tables)
  Cols,     // contiguous column blocks (row-parallel weights)
  QkvRows,  // rows are [Q | K | V], each cut into row blocks by heads
};

struct ParamSpec {
  std::string name;       // "wte", "h3.qkvw", ...
  uint64_t key = 0;       // initialisation stream
  int rows = 0, cols = 0; // logical shape
  Split split = Split::None;
  float init_std = 0.0f;  // normal(0, std) when > 0, else init_value everywhere
  float init_value = 0.0f;
  bool decay = false;     // AdamW weight decay applies (matrices only)
  bool in_norm = true;    // this copy counts once in the global gradient norm
  size_t offset = 0, size = 0;
  int local_rows = 0, local_cols = 0;
};

// Index in the logical tensor of element `local` of this rank's slice.
size_t global_index(const ParamSpec& s, size_t local, int tp_rank, int tp);

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
  size_t act_size() const { return static_cast<size_t>(B_) * T_ * C_; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const LayerRange& layers() const { return range_; }

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
  float forward(int slot, const int32_t* tokens, const int32_t* targets);
  // Backward of the micro-batch held in slot; accumulates parameter gradients.
  // loss_scale is dLoss/d(mean loss of this micro-batch). ready(lo) is called as
  // soon as grads[lo, end) will not change any more in this backward.
  void backward(int slot, float loss_scale, const std::function<void(size_t)>& ready);

  // This rank's slice of the logits of one token position (last stage): entries
  // [vocab_lo(), vocab_lo() + vocab_valid()) of the vocabulary.
  const float* logits(int slot, int b, int t) const;
  int vocab_lo() const { return vocab_lo_; }
  int vocab_valid() const { return vocab_valid_; }

  void zero_grads();

  std::vector<float> params, grads;
  Comm* tp_comm = nullptr;  // null when tp == 1

 private:
  struct LayerActs {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *out;
  };
  struct Slot {
    std::vector<float> mem;
    float* input = nullptr;
    std::vector<LayerActs> layers;
    float *lnf, *lnf_mean, *lnf_rstd, *logits, *rowmax, *ce, *losses;
    std::vector<int32_t> tokens, targets;
  };

  void add_param(const std::string& name, uint64_t key, int rows, int cols, Split split,
                 float std, float value, bool decay, bool in_norm);
  void build_slot(Slot& s);
  void init_params();
  void tp_sum(float* buf, size_t n);

  ModelConfig cfg_;
  Layout layout_;
  Coords me_;
  LayerRange range_;
  int B_, T_, C_, Cl_, NHl_, Fl_, Vl_, vocab_lo_, vocab_valid_;

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
