// Language-modelling data: a text file read whole and tokenized (bytes, or
// words with a byte fallback: tokenizer.h), split by token position into
// training (first 90%) and validation (last 10%) parts. Which window a
// sequence reads is a pure function of (seed, step, index), so every layout
// sees the same global batch and a resumed run the same future batches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer.h"

namespace meshtrain {

// The bytes of an input file (the corpus, a planner profile): a regular file
// (a link to one is fine), opened without waiting on a FIFO, at most
// max_bytes long; anything else is refused with a message naming `what`.
std::vector<uint8_t> read_input_file(const std::string& path, size_t max_bytes, const std::string& what);

class Corpus {
 public:
  // Throws std::runtime_error with a readable message when the file is missing
  // or too short for the context length.
  // word_vocab > 0: the word tokenizer with that vocabulary (> 256), else bytes.
  static Corpus load(const std::string& path, int seq, int word_vocab = 0);
  static Corpus from_bytes(std::vector<uint8_t> bytes, int seq, int word_vocab = 0);

  size_t size() const { return tokens_.size(); }  // tokens
  size_t text_bytes() const { return text_bytes_; }
  size_t split() const { return split_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const Tokenizer& tokenizer() const { return tok_; }

  // Sequence `index` of training step `step`: T inputs and the T next tokens.
  void train_sequence(uint64_t seed, int step, int index, int T, int32_t* tokens, int32_t* targets) const;
  // Validation sequence `index` of `count`, evenly spaced over the held-out part.
  void val_sequence(int index, int count, int T, int32_t* tokens, int32_t* targets) const;

 private:
  Tokenizer tok_;
  std::vector<int32_t> tokens_;
  size_t text_bytes_ = 0;
  size_t split_ = 0;
};

}  // namespace meshtrain
