// Byte-level language-modelling data: a text file read whole, split by position
// into training (first 90%) and validation (last 10%) parts. Which window a
// sequence reads is a pure function of (seed, step, index), so every layout
// sees the same global batch and a resumed run the same future batches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

class Corpus {
 public:
  // Throws std::runtime_error with a readable message when the file is missing
  // or too short for the context length.
  static Corpus load(const std::string& path, int seq);
  static Corpus from_bytes(std::vector<uint8_t> bytes, int seq);

  size_t size() const { return bytes_.size(); }
  size_t split() const { return split_; }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

  // Sequence `index` of training step `step`: T inputs and the T next bytes.
  void train_sequence(uint64_t seed, int step, int index, int T, int32_t* tokens,
                      int32_t* targets) const;
  // Validation sequence `index` of `count`, evenly spaced over the held-out part.
  void val_sequence(int index, int count, int T, int32_t* tokens, int32_t* targets) const;

 private:
  std::vector<uint8_t> bytes_;
  size_t split_ = 0;
};

}  // namespace meshtrain
