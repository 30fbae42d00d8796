// A small, strict XML reader for topology files: elements, attributes in
// single or double quotes, comments and an <?xml ...?> prolog; whitespace
// between elements. No DTDs, CDATA, text content or entities other than the
// five predefined ones. Every size is bounded (XmlLimits), recursion included,
// so any input gives a tree or an error with its line, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace meshccl {

struct XmlElement {
  std::string name;
  int line = 0;  // where its start tag begins, 1-based
  std::vector<std::pair<std::string, std::string>> attrs;
  std::vector<XmlElement> children;

  const std::string* attr(std::string_view key) const;
};

struct XmlLimits {
  size_t max_bytes = size_t{16} << 20;
  int max_depth = 32;
  size_t max_name = 64;
  size_t max_value = 4096;
  int max_attrs = 32;
  size_t max_elements = size_t{1} << 20;
};

struct XmlError {
  int line = 0;
  std::string what;
};

// Parses one root element. Returns false and fills *err on malformed input.
bool xml_parse(const char* data, size_t size, XmlElement* root, XmlError* err, const XmlLimits& limits = {});

// Attribute readers. A missing attribute is an error only when `required`
// (else *out is left as it was); a malformed one always is. Errors name the
// attribute and element and carry the element's line.
bool xml_int(const XmlElement& el, const char* key, int64_t lo, int64_t hi, bool required, int64_t* out, XmlError* err);
bool xml_double(const XmlElement& el, const char* key, bool required, double* out, XmlError* err);  // finite, >= 0
bool xml_hex(const XmlElement& el, const char* key, bool required, uint64_t* out,
             XmlError* err);  // "0x20000" or "20000"
bool xml_string(const XmlElement& el, const char* key, bool required, std::string* out, XmlError* err);
// Fails on the first attribute not in `known` (nullptr-terminated).
bool xml_known_attrs(const XmlElement& el, const char* const* known, XmlError* err);

// value with &, <, >, " escaped, for writing attribute values.
std::string xml_escape(std::string_view value);

}  // namespace meshccl
