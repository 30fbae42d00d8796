#include "comm/id_text.h"

#include <cstdlib>

namespace meshccl {

namespace {

constexpr const char* kIdHeader = "meshccl-id 1";

std::string to_hex(const ncclUniqueId& id) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * sizeof id.internal);
  for (char c : id.internal) {
    auto b = static_cast<unsigned char>(c);
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

bool from_hex(const std::string& hex, ncclUniqueId* id) {
  if (hex.size() != 2 * sizeof id->internal) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < sizeof id->internal; ++i) {
    int hi = nibble(hex[2 * i]);
    int lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    id->internal[i] = static_cast<char>(hi << 4 | lo);
  }
  return true;
}

}  // namespace

std::string id_text(unsigned long generation, const ncclUniqueId& id) {
  return std::string(kIdHeader) + " " + std::to_string(generation) + " " + to_hex(id) + "\n";
}

bool parse_id_text(const std::string& text, unsigned long* generation, ncclUniqueId* id) {
  std::string header = std::string(kIdHeader) + " ";
  size_t sp = text.find(' ', header.size());
  if (text.compare(0, header.size(), header) != 0 || sp == std::string::npos) return false;
  std::string gen_s = text.substr(header.size(), sp - header.size());
  if (gen_s.empty() || gen_s.find_first_not_of("0123456789") != std::string::npos || gen_s.size() > 18) return false;
  *generation = std::strtoul(gen_s.c_str(), nullptr, 10);
  std::string hex = text.substr(sp + 1);
  while (!hex.empty() && (hex.back() == '\n' || hex.back() == '\r')) hex.pop_back();
  return from_hex(hex, id);
}

}  // namespace meshccl
