#include "topo/cpuset.h"

#include <algorithm>
#include <bit>
#include <cstdio>

namespace meshccl {

void CpuSet::set(int cpu) {
  if (cpu < 0 || cpu >= kMaxCpus) return;
  const size_t w = static_cast<size_t>(cpu) / 64;
  if (words_.size() <= w) words_.resize(w + 1, 0);
  words_[w] |= uint64_t{1} << (cpu % 64);
}

bool CpuSet::test(int cpu) const {
  if (cpu < 0) return false;
  const size_t w = static_cast<size_t>(cpu) / 64;
  return w < words_.size() && ((words_[w] >> (cpu % 64)) & 1) != 0;
}

int CpuSet::count() const {
  int n = 0;
  for (uint64_t w : words_) n += std::popcount(w);
  return n;
}

int CpuSet::first() const {
  for (size_t i = 0; i < words_.size(); ++i)
    if (words_[i] != 0) return static_cast<int>(i * 64) + std::countr_zero(words_[i]);
  return -1;
}

void CpuSet::add(const CpuSet& o) {
  if (words_.size() < o.words_.size()) words_.resize(o.words_.size(), 0);
  for (size_t i = 0; i < o.words_.size(); ++i) words_[i] |= o.words_[i];
}

bool CpuSet::subset_of(const CpuSet& o) const {
  for (size_t i = 0; i < words_.size(); ++i) {
    const uint64_t theirs = i < o.words_.size() ? o.words_[i] : 0;
    if ((words_[i] & ~theirs) != 0) return false;
  }
  return true;
}

bool CpuSet::intersects(const CpuSet& o) const { return overlap(o) > 0; }

int CpuSet::overlap(const CpuSet& o) const {
  int n = 0;
  for (size_t i = 0; i < std::min(words_.size(), o.words_.size()); ++i) n += std::popcount(words_[i] & o.words_[i]);
  return n;
}

void CpuSet::trim() {
  while (!words_.empty() && words_.back() == 0) words_.pop_back();
}

std::string CpuSet::to_list() const {
  std::string out;
  const int end = static_cast<int>(words_.size() * 64);
  for (int c = 0; c < end; ++c) {
    if (!test(c)) continue;
    int last = c;
    while (last + 1 < end && test(last + 1)) ++last;
    char buf[32];
    if (last == c) std::snprintf(buf, sizeof(buf), "%s%d", out.empty() ? "" : ",", c);
    else std::snprintf(buf, sizeof(buf), "%s%d-%d", out.empty() ? "" : ",", c, last);
    out += buf;
    c = last;
  }
  return out;
}

namespace {

// A decimal CPU number at text[*pos]; advances *pos.
bool parse_cpu(std::string_view text, size_t* pos, int* out) {
  size_t i = *pos;
  long v = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    v = v * 10 + (text[i] - '0');
    if (v >= CpuSet::kMaxCpus) return false;
    ++i;
  }
  if (i == *pos) return false;
  *pos = i;
  *out = static_cast<int>(v);
  return true;
}

}  // namespace

bool CpuSet::parse_list(std::string_view text, CpuSet* out, std::string* err) {
  CpuSet s;
  size_t pos = 0;
  while (pos < text.size()) {
    int a = 0, b = 0;
    if (!parse_cpu(text, &pos, &a)) {
      *err = "bad CPU list '" + std::string(text) + "' (expected e.g. 0-3,8 with CPUs below 65536)";
      return false;
    }
    b = a;
    if (pos < text.size() && text[pos] == '-') {
      ++pos;
      if (!parse_cpu(text, &pos, &b) || b < a) {
        *err = "bad CPU range in '" + std::string(text) + "'";
        return false;
      }
    }
    for (int c = a; c <= b; ++c) s.set(c);
    if (pos < text.size()) {
      if (text[pos] != ',' || pos + 1 == text.size()) {
        *err = "bad CPU list '" + std::string(text) + "' (expected e.g. 0-3,8)";
        return false;
      }
      ++pos;
    }
  }
  *out = std::move(s);
  return true;
}

bool CpuSet::parse_hex_mask(std::string_view text, CpuSet* out, std::string* err) {
  std::vector<uint32_t> groups;  // most significant first
  size_t pos = 0;
  while (true) {
    uint32_t g = 0;
    size_t digits = 0;
    while (pos < text.size() && text[pos] != ',') {
      const char ch = text[pos];
      int d = -1;
      if (ch >= '0' && ch <= '9') d = ch - '0';
      else if (ch >= 'a' && ch <= 'f') d = ch - 'a' + 10;
      else if (ch >= 'A' && ch <= 'F') d = ch - 'A' + 10;
      if (d < 0 || digits == 8) {
        *err = "bad CPU mask '" + std::string(text) + "' (expected comma-separated groups of up to 8 hex digits)";
        return false;
      }
      g = (g << 4) | static_cast<uint32_t>(d);
      ++digits;
      ++pos;
    }
    if (digits == 0) {
      *err = "bad CPU mask '" + std::string(text) + "' (empty group)";
      return false;
    }
    groups.push_back(g);
    if (groups.size() * 32 > static_cast<size_t>(kMaxCpus)) {
      *err = "CPU mask longer than " + std::to_string(kMaxCpus) + " CPUs";
      return false;
    }
    if (pos == text.size()) break;
    ++pos;  // ','
  }
  CpuSet s;
  const int n = static_cast<int>(groups.size());
  for (int i = 0; i < n; ++i) {
    const uint32_t g = groups[n - 1 - i];
    for (int b = 0; b < 32; ++b)
      if ((g >> b) & 1) s.set(i * 32 + b);
  }
  *out = std::move(s);
  return true;
}

}  // namespace meshccl
