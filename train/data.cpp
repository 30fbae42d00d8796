#include "data.h"

#include <fstream>
#include <iterator>
#include <stdexcept>

namespace meshtrain {

namespace {
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void window(const std::vector<int32_t>& b, size_t start, int T, int32_t* tokens, int32_t* targets) {
  for (int t = 0; t < T; t++) {
    tokens[t] = b[start + t];
    targets[t] = b[start + t + 1];
  }
}
}  // namespace

Corpus Corpus::load(const std::string& path, int seq, int word_vocab) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    throw std::runtime_error("cannot open corpus '" + path +
                             "' (scripts/get_corpus.sh writes the KJV text there)");
  }
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return from_bytes(std::move(bytes), seq, word_vocab);
}

Corpus Corpus::from_bytes(std::vector<uint8_t> bytes, int seq, int word_vocab) {
  Corpus c;
  if (word_vocab > 0) c.tok_ = Tokenizer::words(bytes, word_vocab);
  c.tokens_ = c.tok_.encode(bytes.data(), bytes.size());
  c.text_bytes_ = bytes.size();
  c.split_ = c.tokens_.size() / 10 * 9;
  const size_t need = static_cast<size_t>(seq) + 2;
  if (c.split_ < need || c.tokens_.size() - c.split_ < need) {
    throw std::runtime_error("corpus of " + std::to_string(c.tokens_.size()) +
                             " tokens is too short for sequences of " + std::to_string(seq) +
                             " (each of the 90%/10% parts needs seq + 2 tokens)");
  }
  return c;
}

void Corpus::train_sequence(uint64_t seed, int step, int index, int T, int32_t* tokens,
                            int32_t* targets) const {
  const uint64_t h = mix(seed ^ mix(static_cast<uint64_t>(step) * 0x100000001ull + index));
  const size_t positions = split_ - T - 1;
  window(tokens_, h % positions, T, tokens, targets);
}

void Corpus::val_sequence(int index, int count, int T, int32_t* tokens, int32_t* targets) const {
  const size_t positions = tokens_.size() - split_ - T - 1;
  const size_t start = split_ + positions * static_cast<size_t>(index) / (count > 0 ? count : 1);
  window(tokens_, start, T, tokens, targets);
}

}  // namespace meshtrain
