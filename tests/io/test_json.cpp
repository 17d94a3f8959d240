// io::parse_json, the strict parser every user JSON file goes through: the
// checks nlohmann::json::parse does not make, each with its message.
#include <gtest/gtest.h>

#include <string>

#include "snip/io/json.h"
#include "snip/core/error.h"

namespace snip::io {
namespace {

// The UserError message of parse_json(text, "f.json"), or "" when it parses.
std::string error_of(const std::string& text) {
  try {
    parse_json(text, "f.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

std::string nested(size_t depth, char open, char close, const std::string& inner = "") {
  return std::string(depth, open) + inner + std::string(depth, close);
}

TEST(ParseJson, ParsesWhatJsonParseDoes) {
  const std::string text = R"({"a": [1, -2, 2.5, true, null, "s", {"b": {}}], "c": 18446744073709551615})";
  EXPECT_EQ(parse_json(text, "f.json"), nlohmann::json::parse(text));
  EXPECT_EQ(parse_json(" 3 ", "f.json"), nlohmann::json(3));
}

TEST(ParseJson, DuplicateKeysNameTheObjectsPath) {
  EXPECT_EQ(error_of(R"({"layers": [], "layers": [1]})"),
            "f.json: (top level): expected each key once, got \"layers\" twice");
  EXPECT_EQ(error_of(R"({"x": [0, [1], {"k": 1, "k": 2}]})"),
            "f.json: x[2]: expected each key once, got \"k\" twice");
  EXPECT_EQ(error_of(R"({"a": {"b": [{"c": 1}, {"c": 1, "d": 2, "c": 3}]}})"),
            "f.json: a.b[1]: expected each key once, got \"c\" twice");
  // The same key in sibling objects is fine.
  EXPECT_EQ(error_of(R"([{"k": 1}, {"k": 2}])"), "");
}

// 1e309 overflows a double: nlohmann throws out_of_range.406 (not a
// parse_error), which reached the CLI as an internal error.
TEST(ParseJson, NumbersPastADoubleNameTheirPath) {
  EXPECT_EQ(error_of(R"({"layers": [{"flops": 1e309}]})"),
            "f.json: layers[0].flops: expected a number a double can hold (|x| <= 1.8e308), got 1e309");
  EXPECT_EQ(error_of("[1, 2, -1e400]"),
            "f.json: [2]: expected a number a double can hold (|x| <= 1.8e308), got -1e400");
  EXPECT_EQ(error_of("1e309"), "f.json: (top level): expected a number a double can hold (|x| <= 1.8e308), got 1e309");
  // The largest double and a subnormal underflow to a value: accepted.
  EXPECT_EQ(parse_json("1.7976931348623157e308", "f.json").get<double>(), 1.7976931348623157e308);
  EXPECT_EQ(parse_json("1e-400", "f.json").get<double>(), 0.0);
}

TEST(ParseJson, NestingIsBounded) {
  // kMaxJsonDepth levels parse; one more is refused with the path to it.
  EXPECT_EQ(error_of(nested(kMaxJsonDepth, '[', ']')), "");
  EXPECT_EQ(error_of(nested(kMaxJsonDepth + 1, '[', ']')),
            "f.json: " + std::string("[0]") + [] {
              std::string s;
              for (size_t i = 1; i < kMaxJsonDepth; ++i) s += "[0]";
              return s;
            }() + ": expected at most 128 nested arrays/objects, got more");
  // The measured crash: 65,968 nested arrays in a cost table (the error
  // message printed the value recursively and overflowed the stack).
  const std::string deep = R"({"layers": )" + nested(65968, '[', ']') + "}";
  EXPECT_NE(error_of(deep).find("f.json: layers[0][0]"), std::string::npos);
  std::string objs;
  for (int i = 0; i < 65968; ++i) objs += R"({"a":)";
  objs += "1" + std::string(65968, '}');
  EXPECT_NE(error_of(R"({"layers": [{"name": )" + objs + "}]}").find("f.json: layers[0].name.a.a"), std::string::npos);
}

TEST(ParseJson, SyntaxErrorsAreOneLineWithThePosition) {
  const std::string msg = error_of("{\"a\": 1,\n\n}");
  EXPECT_EQ(msg.rfind("f.json: expected valid JSON, got a syntax error: ", 0), 0u) << msg;
  EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_NE(error_of(""), "");
  EXPECT_NE(error_of("{} {}"), "");               // one document only
  EXPECT_NE(error_of("{\"a\": 1 /* c */}"), "");  // no comments
  EXPECT_NE(error_of("[\"\xff\"]"), "");          // UTF-8 checked
  // A long bad token is cut: the message stays short.
  EXPECT_LT(error_of("[\"" + std::string(100000, 'x')).size(), 400u);
}

TEST(ParseJson, ReadJsonFileNamesTheKindOfFile) {
  // read_json_file = read_file + parse_json; the kind appears in syntax errors.
  EXPECT_THROW(read_json_file("/nonexistent/x.json", "plan"), UserError);
}

TEST(JsonExcerpt, CutsToMaxCharactersOnOneLine) {
  EXPECT_EQ(json_excerpt(nlohmann::json::parse(R"({"a": [1, 2]})")), R"({"a":[1,2]})");
  EXPECT_EQ(json_excerpt(nlohmann::json(std::string(100, 'x')), 10), "\"xxxxxx...");
  EXPECT_EQ(json_excerpt(nlohmann::json("a\nb")), "\"a\\nb\"");
}

}  // namespace
}  // namespace snip::io
