#include "data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

std::vector<uint8_t> read_input_file(const std::string& path, size_t max_bytes, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + what + " '" + path + "': " + std::strerror(errno));
  struct stat st {};
  std::string problem;
  if (::fstat(fd, &st) != 0) problem = std::strerror(errno);
  else if (!S_ISREG(st.st_mode)) problem = "not a regular file (a device, FIFO or directory has no end to read to)";
  else if (static_cast<uint64_t>(st.st_size) > max_bytes)
    problem = "it is " + std::to_string(st.st_size) + " bytes, more than the " + std::to_string(max_bytes) +
              " this input may have";
  std::vector<uint8_t> bytes;
  if (problem.empty()) {
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < bytes.size()) {
      const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        problem = n < 0 ? std::strerror(errno) : "it shrank while being read";
        break;
      }
      got += static_cast<size_t>(n);
    }
  }
  ::close(fd);
  if (!problem.empty()) throw std::runtime_error(what + " '" + path + "' refused: " + problem);
  return bytes;
}

Corpus Corpus::load(const std::string& path, int seq, int word_vocab) {
  // A corpus beyond 4 GiB would not fit the token index either.
  return from_bytes(read_input_file(path, size_t{4} << 30, "corpus"), seq, word_vocab);
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

void Corpus::train_sequence(uint64_t seed, int step, int index, int T, int32_t* tokens, int32_t* targets) const {
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
