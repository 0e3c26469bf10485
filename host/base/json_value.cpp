#include "base/json_value.hpp"

#include <cmath>
#include <cstdlib>

namespace airhost::detail {

namespace {
const JsonValue& null_value() {
  static const JsonValue v;
  return v;
}

void append_utf8(std::string& out, unsigned long cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}
}  // namespace

class JsonParser {
 public:
  explicit JsonParser(std::string_view text) : s_(text) {}

  JsonValue document() {
    JsonValue v = value(0);
    space();
    if (i_ != s_.size()) fail("the end of the text");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& expected) const {
    throw JsonError("invalid JSON at byte " + std::to_string(i_) + ": expected " + expected);
  }

  void space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }

  bool word(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }

  JsonValue value(int depth) {
    if (depth > 64) fail("less nesting");  // our records are flat; a deep text is not one of them
    space();
    if (i_ >= s_.size()) fail("a value");
    JsonValue v;
    const char c = s_[i_];
    if (c == '{') {
      v.type_ = JsonValue::Type::object;
      ++i_;
      space();
      if (i_ < s_.size() && s_[i_] == '}') return ++i_, v;
      while (true) {
        space();
        if (i_ >= s_.size() || s_[i_] != '"') fail("a string key");
        std::string key = string();
        space();
        if (i_ >= s_.size() || s_[i_] != ':') fail("':'");
        ++i_;
        v.object_[key] = value(depth + 1);
        space();
        if (i_ < s_.size() && s_[i_] == ',') { ++i_; continue; }
        if (i_ < s_.size() && s_[i_] == '}') return ++i_, v;
        fail("',' or '}'");
      }
    }
    if (c == '[') {
      v.type_ = JsonValue::Type::array;
      ++i_;
      space();
      if (i_ < s_.size() && s_[i_] == ']') return ++i_, v;
      while (true) {
        v.array_.push_back(value(depth + 1));
        space();
        if (i_ < s_.size() && s_[i_] == ',') { ++i_; continue; }
        if (i_ < s_.size() && s_[i_] == ']') return ++i_, v;
        fail("',' or ']'");
      }
    }
    if (c == '"') {
      v.type_ = JsonValue::Type::string;
      v.string_ = string();
      return v;
    }
    if (word("true")) return v.type_ = JsonValue::Type::boolean, v.bool_ = true, v;
    if (word("false")) return v.type_ = JsonValue::Type::boolean, v;
    if (word("null")) return v;
    if (c == '-' || (c >= '0' && c <= '9')) {
      const std::string text(s_.substr(i_, std::min<std::size_t>(64, s_.size() - i_)));
      char* end = nullptr;
      v.number_ = std::strtod(text.c_str(), &end);
      if (end == text.c_str()) fail("a number");
      i_ += static_cast<std::size_t>(end - text.c_str());
      v.type_ = JsonValue::Type::number;
      return v;
    }
    fail("a value");
  }

  unsigned long hex4() {
    if (i_ + 4 > s_.size()) fail("four hex digits");
    unsigned long cp = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[i_++];
      cp <<= 4;
      if (h >= '0' && h <= '9') cp |= static_cast<unsigned long>(h - '0');
      else if (h >= 'a' && h <= 'f') cp |= static_cast<unsigned long>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') cp |= static_cast<unsigned long>(h - 'A' + 10);
      else fail("a hex digit");
    }
    return cp;
  }

  std::string string() {
    ++i_;  // the opening quote
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("the end of a string");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("an escape");
      const char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned long cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(i_, 2) == "\\u") {
            i_ += 2;
            const unsigned long low = hex4();
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: fail("a known escape");
      }
    }
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

JsonValue JsonValue::parse(std::string_view text) { return JsonParser(text).document(); }

const JsonValue& JsonValue::operator[](const std::string& key) const {
  if (type_ != Type::object) return null_value();
  auto it = object_.find(key);
  return it == object_.end() ? null_value() : it->second;
}

const JsonValue& JsonValue::operator[](std::size_t i) const {
  return type_ == Type::array && i < array_.size() ? array_[i] : null_value();
}

std::string JsonValue::str(const std::string& fallback) const { return type_ == Type::string ? string_ : fallback; }
double JsonValue::num(double fallback) const { return type_ == Type::number ? number_ : fallback; }
long long JsonValue::integer(long long fallback) const {
  return type_ == Type::number ? static_cast<long long>(std::llround(number_)) : fallback;
}
bool JsonValue::boolean(bool fallback) const { return type_ == Type::boolean ? bool_ : fallback; }
std::size_t JsonValue::size() const noexcept {
  return type_ == Type::array ? array_.size() : type_ == Type::object ? object_.size() : 0;
}

}  // namespace airhost::detail
