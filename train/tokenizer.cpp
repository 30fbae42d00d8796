#include "tokenizer.h"

#include <algorithm>
#include <utility>

namespace meshtrain {

namespace {

bool word_char(uint8_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '\'';
}

// Cuts text into pieces: a word (with its leading space, if any) or one byte
// that belongs to no word. f(begin, length, is_word) for each, in order.
template <typename F>
void pieces(const uint8_t* t, size_t n, F&& f) {
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    if (t[j] == ' ' && j + 1 < n && word_char(t[j + 1])) ++j;
    if (!word_char(t[j])) {
      f(i, size_t{1}, false);
      ++i;
      continue;
    }
    while (j < n && word_char(t[j])) ++j;
    f(i, j - i, true);
    i = j;
  }
}

}  // namespace

Tokenizer Tokenizer::words(const std::vector<uint8_t>& text, int vocab) {
  Tokenizer tk;
  tk.words_mode_ = true;
  std::unordered_map<std::string, uint64_t> count;
  pieces(text.data(), text.size(), [&](size_t b, size_t len, bool word) {
    if (word) ++count[std::string(reinterpret_cast<const char*>(text.data() + b), len)];
  });
  std::vector<std::pair<std::string, uint64_t>> all(count.begin(), count.end());
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  const size_t keep = std::min(all.size(), static_cast<size_t>(std::max(vocab - 256, 0)));
  for (size_t k = 0; k < keep; ++k) {
    tk.ids_.emplace(all[k].first, static_cast<int32_t>(256 + k));
    tk.words_.push_back(std::move(all[k].first));
  }
  return tk;
}

std::vector<int32_t> Tokenizer::encode(const uint8_t* t, size_t n) const {
  std::vector<int32_t> out;
  out.reserve(words_mode_ ? n / 3 : n);
  if (!words_mode_) {
    out.assign(t, t + n);
    return out;
  }
  std::string key;
  pieces(t, n, [&](size_t b, size_t len, bool word) {
    if (word) {
      key.assign(reinterpret_cast<const char*>(t + b), len);
      auto it = ids_.find(key);
      if (it != ids_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    for (size_t k = 0; k < len; ++k) out.push_back(t[b + k]);
  });
  return out;
}

std::string Tokenizer::decode(int32_t id) const {
  if (id >= 0 && id < 256) return std::string(1, static_cast<char>(id));
  const size_t w = static_cast<size_t>(id) - 256;
  return id > 0 && w < words_.size() ? words_[w] : std::string();
}

uint64_t Tokenizer::fingerprint() const {
  if (!words_mode_) return 0;
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the words, each ended by a 0 byte
  for (const std::string& w : words_) {
    for (char c : w) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
    h = (h ^ 0u) * 0x100000001b3ull;
  }
  return h == 0 ? 1 : h;
}

}  // namespace meshtrain
