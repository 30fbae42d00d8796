// Tokenizers of meshtrain's corpus. Bytes: token = byte (vocabulary 256). Words:
// ids 0-255 stay the bytes, and ids from 256 are the corpus's most frequent
// words, each a run of ASCII letters, digits and apostrophes with or without
// one leading space (" God", "said"); a word outside the vocabulary, and
// everything that is not a word, is spelt in bytes. Built from the corpus alone,
// so every rank that reads the same file builds the same vocabulary; the
// fingerprint (kept in checkpoints) tells vocabularies apart.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace meshtrain {

class Tokenizer {
 public:
  Tokenizer() = default;  // bytes
  // The 256 bytes plus the (vocab - 256) most frequent words of text (ties:
  // the words in byte order); fewer when the text has fewer distinct words.
  static Tokenizer words(const std::vector<uint8_t>& text, int vocab);

  bool is_words() const { return words_mode_; }
  // Ids in use: 256 + the words.
  int size() const { return 256 + static_cast<int>(words_.size()); }
  std::vector<int32_t> encode(const uint8_t* text, size_t n) const;
  std::vector<int32_t> encode(const std::string& text) const {
    return encode(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  }
  std::string decode(int32_t id) const;
  // 0 for bytes; otherwise a 64-bit hash of the word list (never 0).
  uint64_t fingerprint() const;
  const std::vector<std::string>& word_list() const { return words_; }

 private:
  bool words_mode_ = false;
  std::vector<std::string> words_;
  std::unordered_map<std::string, int32_t> ids_;
};

}  // namespace meshtrain
