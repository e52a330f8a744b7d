#include "checkpoint/json.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>

#include "moe_ep/status.h"

namespace moe_ep::io {

void JsonReader::fail(const std::string& what) const {
  throw Error(ErrorCode::kInvalidArgument, context + " at byte " + std::to_string(i) + " of " +
                                               std::to_string(s.size()) + ": " + what);
}

void JsonReader::ws() {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
}

std::string JsonReader::printable(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7f) return std::string(1, c);
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02x", u);
  return buf;
}

void JsonReader::expect(char c) {
  ws();
  if (i >= s.size()) fail(std::string("expected '") + c + "', found the end of the text");
  if (s[i] != c) fail(std::string("expected '") + c + "', found '" + printable(s[i]) + "'");
  ++i;
}

bool JsonReader::peek(char c) {
  ws();
  return i < s.size() && s[i] == c;
}

namespace {

void put_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xe0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  }
}

}  // namespace

std::string JsonReader::str() {
  expect('"');
  std::string out;
  for (;;) {
    if (i >= s.size()) fail("a string is not terminated");
    const char c = s[i++];
    if (c == '"') return out;
    if (static_cast<unsigned char>(c) < 0x20) fail("a control character inside a string");
    if (c != '\\') {
      out += c;
      continue;
    }
    if (i >= s.size()) fail("a string ends inside an escape");
    const char e = s[i++];
    switch (e) {
      case '"':
        out += '"';
        break;
      case '\\':
        out += '\\';
        break;
      case '/':
        out += '/';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'u': {
        if (s.size() - i < 4) fail("a \\u escape needs four hex digits");
        uint32_t cp = 0;
        for (int k = 0; k < 4; ++k) {
          const char h = s[i++];
          cp <<= 4;
          if (h >= '0' && h <= '9')
            cp |= uint32_t(h - '0');
          else if (h >= 'a' && h <= 'f')
            cp |= uint32_t(h - 'a' + 10);
          else if (h >= 'A' && h <= 'F')
            cp |= uint32_t(h - 'A' + 10);
          else
            fail("a \\u escape needs four hex digits");
        }
        put_utf8(out, cp);
        break;
      }
      default:
        fail("unknown escape '\\" + printable(e) + "'");
    }
  }
}

int64_t JsonReader::integer(const std::string& what) {
  ws();
  const size_t start = i;
  bool neg = false;
  if (i < s.size() && s[i] == '-') neg = true, ++i;
  if (i >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i])))
    fail("expected an integer in " + what);
  uint64_t v = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    const uint64_t d = uint64_t(s[i] - '0');
    if (v > (uint64_t(std::numeric_limits<int64_t>::max()) - d) / 10)
      fail("the integer in " + what + " starting '" + s.substr(start, 24) +
           "' does not fit 64 bits");
    v = v * 10 + d;
    ++i;
  }
  if (i < s.size() && (s[i] == '.' || s[i] == 'e' || s[i] == 'E'))
    fail("expected an integer in " + what + ", found a fraction or exponent");
  return neg ? -int64_t(v) : int64_t(v);
}

std::vector<int64_t> JsonReader::int_array(const std::string& what) {
  std::vector<int64_t> v;
  expect('[');
  if (peek(']')) {
    ++i;
    return v;
  }
  for (;;) {
    if (v.size() >= 64) fail(what + " has more than 64 entries");
    v.push_back(integer(what));
    if (peek(',')) {
      ++i;
      continue;
    }
    expect(']');
    return v;
  }
}

// ---------------------------------------------------------------------------------------------

const char* JsonValue::kind_name(Kind k) {
  switch (k) {
    case Kind::kNull:
      return "null";
    case Kind::kBool:
      return "a boolean";
    case Kind::kNumber:
      return "a number";
    case Kind::kString:
      return "a string";
    case Kind::kArray:
      return "an array";
    case Kind::kObject:
      return "an object";
  }
  return "?";
}

const JsonValue* JsonValue::find(const std::string& key) const {
  for (auto& [k, v] : members_)
    if (k == key) return &v;
  return nullptr;
}

JsonValue JsonValue::make_null() { return {}; }
JsonValue JsonValue::make_bool(bool v) {
  JsonValue j;
  j.kind_ = Kind::kBool;
  j.b_ = v;
  return j;
}
JsonValue JsonValue::make_number(double v, std::string text, bool integral) {
  JsonValue j;
  j.kind_ = Kind::kNumber;
  j.num_ = v;
  j.text_ = std::move(text);
  j.integral_ = integral;
  return j;
}
JsonValue JsonValue::make_string(std::string v) {
  JsonValue j;
  j.kind_ = Kind::kString;
  j.text_ = std::move(v);
  return j;
}
JsonValue JsonValue::make_array(std::vector<JsonValue> v) {
  JsonValue j;
  j.kind_ = Kind::kArray;
  j.items_ = std::move(v);
  return j;
}
JsonValue JsonValue::make_object(std::vector<std::pair<std::string, JsonValue>> v) {
  JsonValue j;
  j.kind_ = Kind::kObject;
  j.members_ = std::move(v);
  return j;
}

namespace {

bool word_at(JsonReader& r, const char* w) {
  const size_t n = std::char_traits<char>::length(w);
  if (r.s.compare(r.i, n, w) != 0) return false;
  r.i += n;
  return true;
}

JsonValue parse_number(JsonReader& r) {
  const size_t start = r.i;
  auto digits = [&] {
    const size_t d0 = r.i;
    while (r.i < r.s.size() && std::isdigit(static_cast<unsigned char>(r.s[r.i]))) ++r.i;
    return r.i - d0;
  };
  if (r.s[r.i] == '-') ++r.i;
  if (r.i >= r.s.size() || !std::isdigit(static_cast<unsigned char>(r.s[r.i])))
    r.fail("expected a digit in a number");
  if (r.s[r.i] == '0' && r.i + 1 < r.s.size() &&
      std::isdigit(static_cast<unsigned char>(r.s[r.i + 1])))
    r.fail("a number has a leading zero");
  digits();
  bool integral = true;
  if (r.i < r.s.size() && r.s[r.i] == '.') {
    ++r.i;
    integral = false;
    if (digits() == 0) r.fail("expected a digit after '.' in a number");
  }
  if (r.i < r.s.size() && (r.s[r.i] == 'e' || r.s[r.i] == 'E')) {
    ++r.i;
    integral = false;
    if (r.i < r.s.size() && (r.s[r.i] == '+' || r.s[r.i] == '-')) ++r.i;
    if (digits() == 0) r.fail("expected a digit in a number's exponent");
  }
  const std::string text = r.s.substr(start, r.i - start);
  double v = 0;
  const auto res = std::from_chars(text.data(), text.data() + text.size(), v);
  if (res.ec != std::errc() || !std::isfinite(v))
    r.fail("the number '" + text.substr(0, 32) + "' is out of range");
  return JsonValue::make_number(v, text, integral);
}

JsonValue parse_value(JsonReader& r, int depth) {
  if (depth > kMaxJsonDepth)
    r.fail("nesting deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  r.ws();
  if (r.i >= r.s.size()) r.fail("expected a value, found the end of the text");
  const char c = r.s[r.i];
  if (c == '{') {
    ++r.i;
    std::vector<std::pair<std::string, JsonValue>> m;
    if (r.peek('}')) {
      ++r.i;
      return JsonValue::make_object(std::move(m));
    }
    for (;;) {
      r.ws();
      const size_t key_at = r.i;
      std::string k = r.str();
      for (auto& [seen, v] : m)
        if (seen == k) {
          r.i = key_at;
          r.fail("key '" + k + "' appears twice in one object");
        }
      r.expect(':');
      JsonValue v = parse_value(r, depth + 1);
      m.emplace_back(std::move(k), std::move(v));
      if (r.peek(',')) {
        ++r.i;
        continue;
      }
      r.expect('}');
      return JsonValue::make_object(std::move(m));
    }
  }
  if (c == '[') {
    ++r.i;
    std::vector<JsonValue> a;
    if (r.peek(']')) {
      ++r.i;
      return JsonValue::make_array(std::move(a));
    }
    for (;;) {
      a.push_back(parse_value(r, depth + 1));
      if (r.peek(',')) {
        ++r.i;
        continue;
      }
      r.expect(']');
      return JsonValue::make_array(std::move(a));
    }
  }
  if (c == '"') return JsonValue::make_string(r.str());
  if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) return parse_number(r);
  if (word_at(r, "true")) return JsonValue::make_bool(true);
  if (word_at(r, "false")) return JsonValue::make_bool(false);
  if (word_at(r, "null")) return JsonValue::make_null();
  // Python's json writes these for non-finite floats; they are not JSON.
  r.fail("unexpected '" + JsonReader::printable(c) +
         "' where a value should start (NaN and Infinity are not JSON)");
}

}  // namespace

JsonValue parse_json(const std::string& text, const std::string& source) {
  JsonReader r{text, source + ": malformed JSON"};
  JsonValue v = parse_value(r, 0);
  r.ws();
  if (r.i != text.size()) r.fail("unexpected text after the value");
  return v;
}

JsonValue read_json_file(const std::string& path, uint64_t max_bytes) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw Error(ErrorCode::kInvalidArgument, path + ": cannot be opened");
  const std::streamoff end = f.tellg();
  if (end < 0) throw Error(ErrorCode::kInvalidArgument, path + ": its size cannot be determined");
  if (uint64_t(end) > max_bytes)
    throw Error(ErrorCode::kInvalidArgument, path + ": " + std::to_string(end) +
                                                 " bytes exceeds the limit of " +
                                                 std::to_string(max_bytes) + " for a JSON file");
  std::string text(size_t(end), '\0');
  f.seekg(0);
  f.read(text.data(), end);
  if (!f) throw Error(ErrorCode::kInvalidArgument, path + ": reading failed");
  return parse_json(text, path);
}

// ---------------------------------------------------------------------------------------------

JsonFields::JsonFields(const JsonValue& object, std::string source)
    : obj_(object), source_(std::move(source)) {
  if (!obj_.is_object())
    throw Error(ErrorCode::kInvalidArgument,
                source_ + ": expected a JSON object, found " + JsonValue::kind_name(obj_.kind()));
}

void JsonFields::bad(const std::string& key, const std::string& why) const {
  throw Error(ErrorCode::kInvalidArgument, source_ + " field '" + key + "': " + why);
}

const JsonValue* JsonFields::get(const std::string& key) const {
  const JsonValue* v = obj_.find(key);
  return v && !v->is_null() ? v : nullptr;
}
bool JsonFields::has(const std::string& key) const { return get(key) != nullptr; }

std::optional<int64_t> JsonFields::integer_or(const std::string& key) const {
  const JsonValue* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_integer())
    bad(key, "expected an integer, found " +
                 (v->is_number() ? "'" + v->text() + "'" : JsonValue::kind_name(v->kind())));
  if (std::fabs(v->number()) > 9.0e15) bad(key, "the integer " + v->text() + " is out of range");
  return int64_t(v->number());
}
int64_t JsonFields::integer(const std::string& key) const {
  auto v = integer_or(key);
  if (!v) bad(key, "missing (an integer is required)");
  return *v;
}
std::optional<double> JsonFields::number_or(const std::string& key) const {
  const JsonValue* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_number())
    bad(key, std::string("expected a number, found ") + JsonValue::kind_name(v->kind()));
  return v->number();
}
double JsonFields::number(const std::string& key) const {
  auto v = number_or(key);
  if (!v) bad(key, "missing (a number is required)");
  return *v;
}
std::optional<std::string> JsonFields::string_or(const std::string& key) const {
  const JsonValue* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_string())
    bad(key, std::string("expected a string, found ") + JsonValue::kind_name(v->kind()));
  return v->text();
}
std::string JsonFields::string(const std::string& key) const {
  auto v = string_or(key);
  if (!v) bad(key, "missing (a string is required)");
  return *v;
}
std::optional<bool> JsonFields::boolean_or(const std::string& key) const {
  const JsonValue* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_bool())
    bad(key, std::string("expected true or false, found ") + JsonValue::kind_name(v->kind()));
  return v->boolean();
}
std::vector<int64_t> JsonFields::int_list_or_empty(const std::string& key) const {
  const JsonValue* v = get(key);
  std::vector<int64_t> out;
  if (!v) return out;
  if (!v->is_array())
    bad(key, std::string("expected a list of integers, found ") + JsonValue::kind_name(v->kind()));
  for (const JsonValue& x : v->items()) {
    if (!x.is_integer())
      bad(key,
          "expected a list of integers, found an entry " +
              (x.is_number() ? "'" + x.text() + "'" : std::string(JsonValue::kind_name(x.kind()))));
    out.push_back(int64_t(x.number()));
  }
  return out;
}

}  // namespace moe_ep::io
