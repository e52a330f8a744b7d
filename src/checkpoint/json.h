// A strict JSON reader for the files a checkpoint directory holds: the safetensors header, and
// config.json, model.safetensors.index.json and hf_quant_config.json.
//
// JsonReader is the one lexer: the safetensors header parser drives it token by token (so it can
// check the header's fixed structure as it goes), and parse_json() builds a JsonValue tree from
// it for the other files. Every error is a moe_ep::Error (kInvalidArgument) that names the source
// (the file), the byte offset and what was expected. Nesting is bounded (kMaxJsonDepth), so no
// input recurses without limit.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace moe_ep::io {

constexpr int kMaxJsonDepth = 64;

struct JsonReader {
  const std::string& s;
  std::string context;  // "safetensors file X: malformed header", "X: malformed JSON"
  size_t i = 0;

  [[noreturn]] void fail(const std::string& what) const;
  void ws();
  void expect(char c);
  bool peek(char c);
  std::string str();
  // A JSON integer (no fraction, no exponent) that fits int64; `what` names the field.
  int64_t integer(const std::string& what);
  std::vector<int64_t> int_array(const std::string& what);
  // An object: '{', then for each member its key string and ':' before on_member(key) reads the
  // value, members separated by ',', then '}'.
  template <class OnMember>
  void members(OnMember on_member) {
    expect('{');
    for (bool first = true; !peek('}'); first = false) {
      if (!first) expect(',');
      const std::string key = str();
      expect(':');
      on_member(key);
    }
    expect('}');
  }
  static std::string printable(char c);
};

class JsonValue {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::kNull; }
  bool is_number() const { return kind_ == Kind::kNumber; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }
  static const char* kind_name(Kind k);

  bool boolean() const { return b_; }
  double number() const { return num_; }
  // The number's text as written (for messages, and to tell 3 from 3.0).
  const std::string& text() const { return text_; }
  bool is_integer() const { return kind_ == Kind::kNumber && integral_; }
  const std::vector<JsonValue>& items() const { return items_; }
  // Object members in file order; find() returns null when `key` is absent.
  const std::vector<std::pair<std::string, JsonValue>>& members() const { return members_; }
  const JsonValue* find(const std::string& key) const;

  // Leaf constructors (parse_json builds the rest).
  static JsonValue make_null();
  static JsonValue make_bool(bool v);
  static JsonValue make_number(double v, std::string text, bool integral);
  static JsonValue make_string(std::string v);
  static JsonValue make_array(std::vector<JsonValue> v);
  static JsonValue make_object(std::vector<std::pair<std::string, JsonValue>> v);

 private:
  Kind kind_ = Kind::kNull;
  bool b_ = false, integral_ = false;
  double num_ = 0;
  std::string text_;  // string value, or the number's text
  std::vector<JsonValue> items_;
  std::vector<std::pair<std::string, JsonValue>> members_;
};

// Parses one JSON document (any value at the top; duplicate object keys and trailing text are
// errors). `source` names it in messages.
JsonValue parse_json(const std::string& text, const std::string& source);
// Reads and parses a file (at most `max_bytes`).
JsonValue read_json_file(const std::string& path, uint64_t max_bytes = 64u << 20);

// Typed access to an object's fields, with messages that name the source, the key, the value
// found and what was expected.
class JsonFields {
 public:
  JsonFields(const JsonValue& object, std::string source);
  bool has(const std::string& key) const;  // present and not null
  const JsonValue* get(const std::string& key) const;
  int64_t integer(const std::string& key) const;  // required
  std::optional<int64_t> integer_or(const std::string& key) const;
  double number(const std::string& key) const;
  std::optional<double> number_or(const std::string& key) const;
  std::string string(const std::string& key) const;
  std::optional<std::string> string_or(const std::string& key) const;
  std::optional<bool> boolean_or(const std::string& key) const;
  std::vector<int64_t> int_list_or_empty(const std::string& key) const;
  const std::string& source() const { return source_; }
  [[noreturn]] void bad(const std::string& key, const std::string& why) const;

 private:
  const JsonValue& obj_;
  std::string source_;
};

}  // namespace moe_ep::io
