// A set of CPU (processing unit) numbers, as hwloc, sched_getaffinity and
// topology files name them. Value type; bounded to kMaxCpus.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshccl {

class CpuSet {
 public:
  static constexpr int kMaxCpus = 1 << 16;

  void set(int cpu);
  bool test(int cpu) const;
  int count() const;
  bool empty() const { return words_.empty(); }
  int first() const;              // -1 when empty
  void add(const CpuSet& other);  // union
  bool subset_of(const CpuSet& other) const;
  bool intersects(const CpuSet& other) const;
  int overlap(const CpuSet& other) const;  // CPUs in both
  bool operator==(const CpuSet& other) const { return words_ == other.words_; }

  // "0-3,8,10-11"; "" when empty.
  std::string to_list() const;
  // Parses to_list's form. On failure returns false and says why in *err.
  static bool parse_list(std::string_view text, CpuSet* out, std::string* err);
  // Parses a comma-separated hexadecimal mask, most significant 32-bit group
  // first ("000000ff,ffff0000"): the affinity attribute of NCCL's topology XML.
  static bool parse_hex_mask(std::string_view text, CpuSet* out, std::string* err);

 private:
  void trim();
  std::vector<uint64_t> words_;  // no trailing zero words
};

}  // namespace meshccl
