#include "topo/xml.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace meshccl {

const std::string* XmlElement::attr(std::string_view key) const {
  for (const auto& [k, v] : attrs)
    if (k == key) return &v;
  return nullptr;
}

namespace {

bool attr_error(const XmlElement& el, const char* key, const std::string& what, XmlError* err) {
  err->line = el.line;
  err->what = what + " attribute '" + key + "' of <" + el.name + ">";
  return false;
}

// The attribute's value, nullptr when absent; err set when required.
const std::string* get(const XmlElement& el, const char* key, bool required, bool* ok, XmlError* err) {
  const std::string* v = el.attr(key);
  *ok = v != nullptr || !required;
  if (v == nullptr && required) attr_error(el, key, "missing", err);
  return v;
}

std::string quoted(const std::string& v) { return "'" + (v.size() > 40 ? v.substr(0, 40) + "..." : v) + "'"; }

}  // namespace

bool xml_int(const XmlElement& el, const char* key, int64_t lo, int64_t hi, bool required, int64_t* out,
             XmlError* err) {
  bool ok;
  const std::string* v = get(el, key, required, &ok, err);
  if (v == nullptr) return ok;
  const char* s = v->c_str();
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(s, &end, 10);
  if (v->empty() || end != s + v->size() || errno != 0 || *s == ' ' || *s == '+')
    return attr_error(el, key, "bad number " + quoted(*v) + " for", err);
  if (x < lo || x > hi)
    return attr_error(
        el, key, "number " + quoted(*v) + " out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "] for",
        err);
  *out = x;
  return true;
}

bool xml_double(const XmlElement& el, const char* key, bool required, double* out, XmlError* err) {
  bool ok;
  const std::string* v = get(el, key, required, &ok, err);
  if (v == nullptr) return ok;
  const char* s = v->c_str();
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(s, &end);
  if (v->empty() || end != s + v->size() || errno != 0 || !std::isfinite(x) || x < 0 || *s == ' ')
    return attr_error(el, key, "bad number " + quoted(*v) + " (want a finite number >= 0) for", err);
  *out = x;
  return true;
}

bool xml_hex(const XmlElement& el, const char* key, bool required, uint64_t* out, XmlError* err) {
  bool ok;
  const std::string* v = get(el, key, required, &ok, err);
  if (v == nullptr) return ok;
  size_t i = v->size() > 2 && (*v)[0] == '0' && ((*v)[1] == 'x' || (*v)[1] == 'X') ? 2 : 0;
  if (i == v->size() || v->size() - i > 16)
    return attr_error(el, key, "bad hexadecimal number " + quoted(*v) + " for", err);
  uint64_t x = 0;
  for (; i < v->size(); ++i) {
    const char c = (*v)[i];
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) return attr_error(el, key, "bad hexadecimal number " + quoted(*v) + " for", err);
    x = (x << 4) | static_cast<uint64_t>(d);
  }
  *out = x;
  return true;
}

bool xml_string(const XmlElement& el, const char* key, bool required, std::string* out, XmlError* err) {
  bool ok;
  const std::string* v = get(el, key, required, &ok, err);
  if (v != nullptr) *out = *v;
  return ok;
}

bool xml_known_attrs(const XmlElement& el, const char* const* known, XmlError* err) {
  for (const auto& [k, v] : el.attrs) {
    bool found = false;
    for (const char* const* q = known; *q != nullptr && !found; ++q) found = k == *q;
    if (!found) return attr_error(el, k.c_str(), "unknown", err);
  }
  return true;
}

std::string xml_escape(std::string_view value) {
  std::string out;
  for (char c : value) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

class Parser {
 public:
  Parser(const char* data, size_t size, const XmlLimits& limits) : p_(data), end_(data + size), limits_(limits) {}

  bool run(XmlElement* root, XmlError* err) {
    err_ = err;
    if (static_cast<size_t>(end_ - p_) > limits_.max_bytes)
      return fail("file larger than " + std::to_string(limits_.max_bytes) + " bytes");
    if (std::memchr(p_, '\0', static_cast<size_t>(end_ - p_)) != nullptr) {
      for (const char* q = p_; q < end_ && *q != '\0'; ++q) advance_line(*q);
      return fail("NUL byte in file");
    }
    if (end_ - p_ >= 3 && std::memcmp(p_, "\xEF\xBB\xBF", 3) == 0) p_ += 3;  // UTF-8 byte order mark
    if (!skip_misc(true)) return false;
    if (p_ == end_) return fail("no root element (empty file)");
    if (*p_ != '<') return fail("text outside of elements");
    if (!element(root, 1)) return false;
    if (!skip_misc(false)) return false;
    if (p_ != end_) return fail("content after the root element </" + root->name + ">");
    return true;
  }

 private:
  bool fail(std::string what) {
    err_->line = line_;
    err_->what = std::move(what);
    return false;
  }
  void advance_line(char c) {
    if (c == '\n') ++line_;
  }
  void bump() {
    advance_line(*p_);
    ++p_;
  }
  bool starts(const char* s) const {
    const size_t n = std::strlen(s);
    return static_cast<size_t>(end_ - p_) >= n && std::memcmp(p_, s, n) == 0;
  }
  static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
  static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':'; }
  static bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9') || c == '-' || c == '.'; }
  void skip_space() {
    while (p_ < end_ && is_space(*p_)) bump();
  }

  // Whitespace, comments, and (before the root only) one <?xml ...?>.
  bool skip_misc(bool prolog_allowed) {
    while (true) {
      skip_space();
      if (starts("<!--")) {
        if (!comment()) return false;
      } else if (starts("<?")) {
        if (!prolog_allowed) return fail("processing instruction '<?' is only allowed at the start of the file");
        prolog_allowed = false;
        const int at = line_;
        while (p_ < end_ && !starts("?>")) bump();
        if (p_ == end_) {
          line_ = at;
          return fail("unterminated '<?' (truncated file?)");
        }
        p_ += 2;
      } else if (starts("<!")) {
        return fail("DOCTYPE, CDATA and other '<!' constructs are not supported");
      } else {
        return true;
      }
    }
  }

  bool comment() {
    const int at = line_;
    p_ += 4;
    while (p_ < end_ && !starts("-->")) bump();
    if (p_ == end_) {
      line_ = at;
      return fail("unterminated comment '<!--' (truncated file?)");
    }
    p_ += 3;
    return true;
  }

  bool name(std::string* out, const char* what) {
    if (p_ == end_) return fail(std::string("file ends where ") + what + " was expected (truncated file?)");
    if (!is_name_start(*p_)) return fail(std::string("expected ") + what + ", found '" + printable(*p_) + "'");
    const char* s = p_;
    while (p_ < end_ && is_name_char(*p_)) ++p_;
    if (static_cast<size_t>(p_ - s) > limits_.max_name)
      return fail(std::string(what) + " longer than " + std::to_string(limits_.max_name) + " characters");
    out->assign(s, p_);
    return true;
  }

  static std::string printable(char c) {
    if (c >= 0x20 && c < 0x7f) return std::string(1, c);
    char buf[8];
    std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(c));
    return buf;
  }

  bool value(std::string* out, const std::string& key) {
    if (p_ == end_) return fail("file ends inside a tag (truncated file?)");
    const char q = *p_;
    if (q != '"' && q != '\'') return fail("value of attribute '" + key + "' must be quoted");
    const int at = line_;
    ++p_;
    out->clear();
    while (p_ < end_ && *p_ != q) {
      if (*p_ == '<') return fail("'<' inside the value of attribute '" + key + "'");
      if (*p_ == '&') {
        static const struct {
          const char* ent;
          char c;
        } kEnt[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
        bool found = false;
        for (const auto& e : kEnt) {
          if (starts(e.ent)) {
            *out += e.c;
            p_ += std::strlen(e.ent);
            found = true;
            break;
          }
        }
        if (!found) return fail("unknown entity in the value of attribute '" + key + "'");
      } else {
        *out += *p_;
        bump();
      }
      if (out->size() > limits_.max_value)
        return fail("value of attribute '" + key + "' longer than " + std::to_string(limits_.max_value) + " bytes");
    }
    if (p_ == end_) {
      line_ = at;
      return fail("unterminated value of attribute '" + key + "' (truncated file?)");
    }
    ++p_;
    return true;
  }

  // At '<' of a start tag.
  bool element(XmlElement* el, int depth) {
    if (depth > limits_.max_depth) return fail("elements nested deeper than " + std::to_string(limits_.max_depth));
    if (++elements_ > limits_.max_elements)
      return fail("more than " + std::to_string(limits_.max_elements) + " elements");
    el->line = line_;
    ++p_;
    if (!name(&el->name, "an element name")) return false;
    while (true) {
      const bool spaced = p_ < end_ && is_space(*p_);
      skip_space();
      if (p_ == end_) return fail("file ends inside the tag <" + el->name + "> (truncated file?)");
      if (*p_ == '>') {
        ++p_;
        break;
      }
      if (starts("/>")) {
        p_ += 2;
        return true;
      }
      if (!spaced) return fail("expected whitespace, '>' or '/>' in the tag <" + el->name + ">");
      std::string key, val;
      if (!name(&key, "an attribute name")) return false;
      skip_space();
      if (p_ == end_) return fail("file ends inside the tag <" + el->name + "> (truncated file?)");
      if (*p_ != '=') return fail("expected '=' after attribute '" + key + "' of <" + el->name + ">");
      ++p_;
      skip_space();
      if (!value(&val, key)) return false;
      if (el->attr(key) != nullptr) return fail("attribute '" + key + "' given twice in <" + el->name + ">");
      if (static_cast<int>(el->attrs.size()) >= limits_.max_attrs)
        return fail("more than " + std::to_string(limits_.max_attrs) + " attributes in <" + el->name + ">");
      el->attrs.emplace_back(std::move(key), std::move(val));
    }
    // Content: child elements, comments and whitespace, then the end tag.
    while (true) {
      skip_space();
      if (p_ == end_) {
        line_ = el->line;
        return fail("<" + el->name + "> is never closed (truncated file?)");
      }
      if (starts("<!--")) {
        if (!comment()) return false;
        continue;
      }
      if (starts("</")) {
        p_ += 2;
        std::string end_name;
        if (!name(&end_name, "an end-tag name")) return false;
        if (end_name != el->name)
          return fail("end tag </" + end_name + "> does not match <" + el->name + "> opened at line " +
                      std::to_string(el->line));
        skip_space();
        if (p_ == end_ || *p_ != '>') return fail("expected '>' to end </" + end_name + ">");
        ++p_;
        return true;
      }
      if (starts("<!") || starts("<?")) return fail("only elements and comments may appear inside <" + el->name + ">");
      if (*p_ != '<') return fail("unexpected text inside <" + el->name + "> (only elements are allowed)");
      el->children.emplace_back();
      if (!element(&el->children.back(), depth + 1)) return false;
    }
  }

  const char* p_;
  const char* end_;
  const XmlLimits& limits_;
  XmlError* err_ = nullptr;
  int line_ = 1;
  size_t elements_ = 0;
};

}  // namespace

bool xml_parse(const char* data, size_t size, XmlElement* root, XmlError* err, const XmlLimits& limits) {
  *root = XmlElement{};
  return Parser(data, size, limits).run(root, err);
}

}  // namespace meshccl
