// Cost tables (parsing, errors, per-layer view of per-GEMM costs), plan
// JSON, atomic writes and Llama layer shapes.
#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "snip/plan/cost_table.h"
#include "snip/io/json.h"
#include "snip/core/error.h"

using namespace snip::plan;
using nlohmann::json;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const snip::UserError& e) {
    return e.what();
  }
  return "(no UserError)";
}

std::string parse_error(const std::string& text) {
  return error_of([&] { parse_cost_table(json::parse(text), "costs.json"); });
}

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/snip_plan_test_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::vector<std::string> list() const {
    std::vector<std::string> names;
    DIR* d = opendir(path.c_str());
    while (dirent* e = readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..")
        names.push_back(e->d_name);
    closedir(d);
    return names;
  }
};

const char* kGemmTable = R"({"model": "tiny", "layers": [
  {"name": "model.layers.0.mlp.up_proj", "stage": 1, "gemms": {
     "fprop": {"flops": 100, "q": {"fp4": 0.5, "fp8": 0.01, "bf16": 0}, "rel_err": {"fp4": 0.2}},
     "dgrad": {"flops": 100, "q": {"fp4": 0.25, "fp8": 0.02}, "rel_err": {"fp4": 0.1}},
     "wgrad": {"flops": 200, "q": {"fp4": 0.125, "fp8": 0.03}, "rel_err": {"fp4": 0.4}}}}]})";

}  // namespace

TEST(CostTable, ParsesTheLayerForm) {
  const CostTable t = parse_cost_table(json::parse(R"({"layers": [
    {"name": "a", "flops": 1e12, "q": {"fp4": 0.5, "fp8": 0.01, "bf16": 0}},
    {"name": "b", "flops": 2e12, "q": {"fp8": 0.25}, "stage": 3, "rel_err": {"fp4": 0.1}}]})"),
                                      "costs.json");
  ASSERT_EQ(t.layers.size(), 2u);
  EXPECT_FALSE(t.per_gemm());
  EXPECT_EQ(t.layers[0].name, "a");
  EXPECT_EQ(t.layers[0].stage, -1);
  EXPECT_DOUBLE_EQ(t.layers[0].flops, 1e12);
  EXPECT_EQ(t.layers[0].q.size(), 3u);
  EXPECT_EQ(t.layers[1].stage, 3);
  EXPECT_DOUBLE_EQ(t.layers[1].rel_err.at("fp4"), 0.1);
  const PlanProblem p = make_problem(t, Granularity::layer);
  ASSERT_EQ(p.items.size(), 2u);
  EXPECT_EQ(p.items[1].name, "b");
  EXPECT_EQ(p.items[1].layer, "b");
  EXPECT_EQ(p.items[1].q.count("fp4"), 0u);  // not offered
  EXPECT_NE(error_of([&] { make_problem(t, Granularity::gemm); }).find("expected a \"gemms\" entry"),
            std::string::npos);
}

TEST(CostTable, PerGemmTableInBothGranularities) {
  const CostTable t = parse_cost_table(json::parse(kGemmTable), "costs.json");
  EXPECT_TRUE(t.per_gemm());
  const PlanProblem g = make_problem(t, Granularity::gemm);
  ASSERT_EQ(g.items.size(), 3u);
  EXPECT_EQ(g.items[2].name, "model.layers.0.mlp.up_proj:wgrad");
  EXPECT_EQ(g.items[2].layer, "model.layers.0.mlp.up_proj");
  EXPECT_EQ(g.items[2].gemm, "wgrad");
  EXPECT_DOUBLE_EQ(g.items[2].flops, 200);
  EXPECT_EQ(g.items[0].stage, 1);
  EXPECT_EQ(g.items[0].q.size(), 3u);
  // Per layer: FLOPs 400; Q summed over options all GEMMs offer (bf16 only
  // in fprop: dropped); rel_err FLOPs-weighted: (100*.2+100*.1+200*.4)/400.
  const PlanProblem l = make_problem(t, Granularity::layer);
  ASSERT_EQ(l.items.size(), 1u);
  EXPECT_DOUBLE_EQ(l.items[0].flops, 400);
  EXPECT_EQ(l.items[0].q.size(), 2u);
  EXPECT_DOUBLE_EQ(l.items[0].q.at("fp4"), 0.875);
  EXPECT_DOUBLE_EQ(l.items[0].q.at("fp8"), 0.06);
  EXPECT_DOUBLE_EQ(l.items[0].rel_err.at("fp4"), 0.275);
  EXPECT_EQ(l.items[0].stage, 1);
}

TEST(CostTable, ErrorsNameFilePathExpectedAndFound) {
  struct Case {
    const char* json;
    const char* message;
  };
  const Case cases[] = {
      {"[]", "costs.json: (top level): expected an object {\"layers\": [...]}, got []"},
      {"{}", "costs.json: layers: expected an array of layer entries, got nothing"},
      {R"({"layers": {}})", "costs.json: layers: expected an array of layer entries, got {}"},
      {R"({"layers": []})", "costs.json: layers: expected at least one layer entry, got []"},
      {R"({"layers": [1]})",
       "costs.json: layers[0]: expected an object {\"name\": .., \"flops\": .., \"q\": {..}}, "
       "got 1"},
      {R"({"layers": [{"flops": 1, "q": {"fp4": 0}}]})",
       "costs.json: layers[0].name: expected a non-empty string, got nothing"},
      {R"({"layers": [{"name": "a", "flops": 0, "q": {"fp4": 0}}]})",
       "costs.json: layers[0].flops: expected a finite number > 0, got 0"},
      {R"({"layers": [{"name": "a", "q": {"fp4": 0}}]})",
       "costs.json: layers[0].flops: expected FLOPs per step (or \"gemms\"), got nothing"},
      {R"({"layers": [{"name": "a", "flops": 1, "q": {"fp4": 0}},
                      {"name": "b", "flops": 1, "q": {"fp4": 0}},
                      {"name": "c", "flops": 1, "q": {"fp4": 0}},
                      {"name": "d", "flops": 1, "q": {"fp4": "abc"}}]})",
       "costs.json: layers[3].q.fp4: expected a finite number >= 0, got \"abc\""},
      {R"({"layers": [{"name": "a", "flops": 1, "q": {"fp4": -0.5}}]})",
       "costs.json: layers[0].q.fp4: expected a finite number >= 0, got -0.5"},
      {R"({"layers": [{"name": "a", "flops": 1, "q": {}}]})",
       "costs.json: layers[0].q: expected at least one option, got {}"},
      {R"({"layers": [{"name": "a", "flops": 1, "q": [0.5]}]})",
       "costs.json: layers[0].q: expected an object {\"<option>\": <number>, ...}, got [0.5]"},
      {R"({"layers": [{"name": "a", "flop": 1, "q": {"fp4": 0}}]})",
       "costs.json: layers[0]: expected only the keys name, flops, q, stage, rel_err, gemms, "
       "got 'flop'"},
      {R"({"layers": [{"name": "a", "flops": 1, "q": {"fp4": 0}},
                      {"name": "a", "flops": 1, "q": {"fp4": 0}}]})",
       "costs.json: layers[1].name: expected a unique layer name, got \"a\""},
      {R"({"layers": [{"name": "a", "flops": 1, "q": {"fp4": 0}, "stage": -1}]})",
       "costs.json: layers[0].stage: expected an integer >= 0, got -1"},
      {R"({"layers": [{"name": "a", "flops": 1, "q": {"fp4": 0}, "stage": 1.5}]})",
       "costs.json: layers[0].stage: expected an integer >= 0, got 1.5"},
      {R"({"layers": [{"name": "a", "flops": 1, "q": {"fp4": 0}, "rel_err": {"fp4": "x"}}]})",
       "costs.json: layers[0].rel_err.fp4: expected a finite number >= 0, got \"x\""},
      {R"({"layers": [{"name": "a", "flops": 1, "gemms": {}}]})",
       "costs.json: layers[0]: expected either \"gemms\" or \"flops\"/\"q\"/\"rel_err\", got both"},
      {R"({"layers": [{"name": "a", "gemms": {"fprop": {"flops": 1, "q": {"fp4": 0}},
                                               "dgrad": {"flops": 1, "q": {"fp4": 0}}}}]})",
       "costs.json: layers[0].gemms.wgrad: expected an entry for every GEMM, got nothing"},
      {R"({"layers": [{"name": "a", "gemms": {"fprop": {"flops": 1, "q": {"fp4": 0}},
                                               "dgrad": {"flops": 1, "q": {"fp4": 0}},
                                               "wgrad": {"flops": 1, "q": {"fp8": null}}}}]})",
       "costs.json: layers[0].gemms.wgrad.q.fp8: expected a finite number >= 0, got null"},
      {R"({"layers": [{"name": "a", "gemms": {"fprop": {"flops": 1, "q": {"fp4": 0}},
                                               "dgrad": {"flops": 1, "q": {"fp4": 0}},
                                               "wgrad": {"flops": 1, "q": {"fp4": 0}},
                                               "xgrad": {}}}]})",
       "costs.json: layers[0].gemms: expected only the keys fprop, dgrad, wgrad, got 'xgrad'"},
  };
  for (const Case& c : cases) EXPECT_EQ(parse_error(c.json), c.message) << c.json;
}

TEST(CostTable, NoOptionCommonToAllGemms) {
  const CostTable t = parse_cost_table(json::parse(R"({"layers": [{"name": "a", "gemms": {
      "fprop": {"flops": 1, "q": {"fp4": 0}}, "dgrad": {"flops": 1, "q": {"fp8": 0}},
      "wgrad": {"flops": 1, "q": {"fp4": 0}}}}]})"),
                                      "t.json");
  EXPECT_EQ(error_of([&] { make_problem(t, Granularity::layer); }),
            "t.json: layers[0].gemms: expected an option all three GEMMs offer, got none in "
            "common");
}

TEST(CostTable, LoadFromFile) {
  TempDir dir;
  const std::string good = dir.path + "/costs.json";
  std::ofstream(good) << kGemmTable;
  EXPECT_EQ(load_cost_table(good).layers.size(), 1u);
  EXPECT_EQ(load_cost_table(good).source, good);

  const std::string missing = dir.path + "/nope.json";
  EXPECT_EQ(error_of([&] { load_cost_table(missing); }),
            missing + ": cannot open the cost table (No such file or directory)");

  const std::string bad = dir.path + "/bad.json";
  std::ofstream(bad) << "{\"layers\": [\n  {\"name\": \"a\",\n}]}";
  const std::string msg = error_of([&] { load_cost_table(bad); });
  EXPECT_EQ(msg.rfind(bad + ": expected valid JSON, got a syntax error: ", 0), 0u) << msg;
  EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;  // one line
}

// Measured defects: 65,968 nested arrays as "layers", or nested objects as a
// layer's "name", crashed `snip plan` (SIGSEGV: the error message printed the
// value recursively); 1e309 escaped as nlohmann's out_of_range (an internal
// error). Now one UserError naming file and path.
TEST(CostTable, DeepNestingAndOverflowingNumbersAreUserErrors) {
  TempDir dir;
  const std::string deep = dir.path + "/deep.json";
  std::ofstream(deep) << R"({"layers": )" << std::string(65968, '[') << std::string(65968, ']') << "}";
  std::string msg = error_of([&] { load_cost_table(deep); });
  EXPECT_EQ(msg.rfind(deep + ": layers[0][0][0]", 0), 0u) << msg.substr(0, 200);
  EXPECT_NE(msg.find("expected at most 128 nested arrays/objects, got more"), std::string::npos);

  const std::string name = dir.path + "/name.json";
  {
    std::ofstream f(name);
    f << R"({"layers": [{"name": )";
    for (int i = 0; i < 65968; ++i) f << R"({"a": )";
    f << "1" << std::string(65968, '}') << R"(, "flops": 1, "q": {"fp4": 0}}]})";
  }
  msg = error_of([&] { load_cost_table(name); });
  EXPECT_EQ(msg.rfind(name + ": layers[0].name.a.a.a", 0), 0u) << msg.substr(0, 200);

  // A shallow bad name is shown as a short excerpt.
  EXPECT_EQ(parse_error(R"({"layers": [{"name": )" + std::string(24, '[') + "1" + std::string(24, ']') +
                        R"(, "flops": 1, "q": {"fp4": 0}}]})"),
            "costs.json: layers[0].name: expected a non-empty string, got " + std::string(24, '[') + "1" + std::string(12, ']') + "...");

  const std::string big = dir.path + "/big.json";
  std::ofstream(big) << R"({"layers": [{"name": "a", "flops": 1e309, "q": {"fp4": 0}}]})";
  EXPECT_EQ(error_of([&] { load_cost_table(big); }),
            big + ": layers[0].flops: expected a number a double can hold (|x| <= 1.8e308), got 1e309");
}

// nlohmann::json keeps the last of duplicate keys; a cost table must not
// silently drop the first "flops" (or a whole "layers" array).
TEST(CostTable, DuplicateKeysAreErrorsNamingFilePathAndKey) {
  TempDir dir;
  struct Case {
    const char* json;
    const char* where;  // the object holding the duplicate
    const char* key;
  };
  const Case cases[] = {
      {R"({"layers": [{"name": "a", "flops": 1, "q": {"fp4": 0}}],
           "layers": [{"name": "b", "flops": 2, "q": {"fp4": 0}}]})",
       "(top level)", "layers"},
      {R"({"layers": [{"name": "a", "flops": 1, "q": {"fp4": 0}},
                      {"name": "b", "flops": 1, "flops": 2, "q": {"fp4": 0}}]})",
       "layers[1]", "flops"},
      {R"({"layers": [{"name": "a", "flops": 1, "q": {"fp4": 0.5, "fp8": 0, "fp4": 0.1}}]})",
       "layers[0].q", "fp4"},
      {R"({"layers": [{"name": "a", "gemms": {
             "fprop": {"flops": 1, "q": {"fp4": 0}},
             "dgrad": {"flops": 1, "q": {"fp4": 0}, "rel_err": {"fp4": 0.1, "fp4": 0.2}},
             "wgrad": {"flops": 1, "q": {"fp4": 0}}}}]})",
       "layers[0].gemms.dgrad.rel_err", "fp4"},
      {R"({"layers": [{"name": "a", "gemms": {
             "fprop": {"flops": 1, "q": {"fp4": 0}},
             "fprop": {"flops": 1, "q": {"fp4": 0}},
             "dgrad": {"flops": 1, "q": {"fp4": 0}},
             "wgrad": {"flops": 1, "q": {"fp4": 0}}}}]})",
       "layers[0].gemms", "fprop"},
      // Arrays nested in entries and values before the duplicate keep the
      // index right: the third entry is layers[2].
      {R"({"other": [[1, {"x": 1}], 2], "layers": [
             {"name": "a", "flops": 1, "q": {"fp4": 0}},
             {"name": "b", "flops": 1, "q": {"fp4": 0}, "rel_err": {}},
             {"name": "c", "name": "d", "flops": 1, "q": {"fp4": 0}}]})",
       "layers[2]", "name"},
  };
  for (const Case& c : cases) {
    const std::string path = dir.path + "/dup.json";
    std::ofstream(path) << c.json;
    EXPECT_EQ(error_of([&] { load_cost_table(path); }),
              path + ": " + c.where + ": expected each key once, got \"" + c.key + "\" twice")
        << c.json;
  }
  // The same keys in different objects are fine.
  const std::string ok = dir.path + "/ok.json";
  std::ofstream(ok) << R"({"layers": [{"name": "a", "flops": 1, "q": {"fp4": 0}},
                                      {"name": "b", "flops": 1, "q": {"fp4": 0}}]})";
  EXPECT_EQ(load_cost_table(ok).layers.size(), 2u);
}

// Every entry's FLOPs is finite, but their sum overflows to inf: shares
// would be F/inf = 0 or inf/inf = NaN. Rejected when the table is read.
TEST(CostTable, TotalFlopsOverflowIsAnError) {
  const std::string expected = "costs.json: total FLOPs overflow (sum of entry flops is not finite)";
  // 1e308 + 1e308 = 2e308 > DBL_MAX (~1.797e308).
  EXPECT_EQ(parse_error(R"({"layers": [{"name": "a", "flops": 1e308, "q": {"fp4": 0}},
                                        {"name": "b", "flops": 1e308, "q": {"fp4": 0}}]})"),
            expected);
  // One per-GEMM entry whose three GEMMs sum past DBL_MAX.
  EXPECT_EQ(parse_error(R"({"layers": [{"name": "a", "gemms": {
                  "fprop": {"flops": 1e308, "q": {"fp4": 0}},
                  "dgrad": {"flops": 1e308, "q": {"fp4": 0}},
                  "wgrad": {"flops": 1, "q": {"fp4": 0}}}}]})"),
            expected);
  // Large but finite sums stay valid: 2 x 8e307 = 1.6e308 < DBL_MAX.
  EXPECT_EQ(parse_error(R"({"layers": [{"name": "a", "flops": 8e307, "q": {"fp4": 0}},
                                        {"name": "b", "flops": 8e307, "q": {"fp4": 0}}]})"),
            "(no UserError)");
}

TEST(PlanJson, FieldsAndAssignments) {
  PlanResult r;
  r.granularity = Granularity::gemm;
  r.method = "ilp";
  r.budget = Budget::share(0.75);
  r.items = {{"a:fprop", "fp4", 3.0, 0.5, 0}, {"a:dgrad", "fp8", 1.0, 0.01, 1}};
  r.objective = 0.51;
  r.fp4_share = 0.75;
  r.cost_per_flop = 1.25;
  r.stage_fp4_share = {1.0, 0.0};
  r.status = "optimal";
  r.proven_optimal = true;
  json j = plan_to_json(r);
  EXPECT_EQ(j["granularity"], "gemm");
  EXPECT_EQ(j["budget"], 0.75);
  EXPECT_FALSE(j.contains("cost_budget"));
  EXPECT_EQ(j["status"], "optimal");
  EXPECT_EQ(j["proven_optimal"], true);
  EXPECT_EQ(j["objective"], 0.51);
  EXPECT_EQ(j["fp4_share"], 0.75);
  EXPECT_EQ(j["cost_per_flop"], 1.25);
  EXPECT_EQ(j["assignments"], json({{"a:fprop", "fp4"}, {"a:dgrad", "fp8"}}));
  EXPECT_EQ(j["items"][1], json({{"name", "a:dgrad"}, {"flops", 1.0}, {"option", "fp8"},
                                 {"q", 0.01}, {"stage", 1}}));
  EXPECT_EQ(j["stage_fp4_share"], json({1.0, 0.0}));
  EXPECT_FALSE(j.contains("options"));  // unknown (a hand-made result): left out
  r.options = {"fp4", "fp8"};
  EXPECT_EQ(plan_to_json(r)["options"], json({"fp4", "fp8"}));
  r.budget = Budget::cost(2.5);
  r.cost_per_flop = std::nan("");
  j = plan_to_json(r);
  EXPECT_TRUE(j["budget"].is_null());
  EXPECT_EQ(j["cost_budget"], 2.5);
  EXPECT_TRUE(j["cost_per_flop"].is_null());
}

TEST(PlanJson, AtomicSave) {
  TempDir dir;
  const std::string path = dir.path + "/plan.json";
  snip::io::save_json_atomic(json{{"a", 1}}, path);
  std::ifstream in(path);
  EXPECT_EQ(json::parse(in), json({{"a", 1}}));
  EXPECT_EQ(dir.list(), std::vector<std::string>{"plan.json"});  // no temp file left
  const std::string bad = dir.path + "/missing_dir/plan.json";
  EXPECT_THROW(snip::io::save_json_atomic(json{{"a", 1}}, bad), snip::UserError);
  EXPECT_EQ(dir.list(), std::vector<std::string>{"plan.json"});
}

TEST(LlamaShapes, TinyLlamaAndLlama2_70B) {
  const int64_t T = 4096;
  const auto tiny = llama_linear_layers(22, 2048, 5632, 32, 4, T);
  ASSERT_EQ(tiny.size(), 154u);
  EXPECT_EQ(tiny[0].name, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(tiny[1].name, "model.layers.0.self_attn.k_proj");
  EXPECT_EQ(tiny[153].name, "model.layers.21.mlp.down_proj");
  EXPECT_EQ(tiny[1].out_features, 256);  // 4 KV heads x head_dim 64
  EXPECT_EQ(tiny[6].in_features, 5632);
  EXPECT_DOUBLE_EQ(tiny[0].gemm_flops, 2.0 * 4096 * 2048 * 2048);
  EXPECT_DOUBLE_EQ(tiny[4].gemm_flops, 2.0 * 4096 * 2048 * 5632);
  const auto big = llama_linear_layers(80, 8192, 28672, 64, 8, T);
  ASSERT_EQ(big.size(), 560u);
  EXPECT_EQ(big[2].name, "model.layers.0.self_attn.v_proj");
  EXPECT_EQ(big[2].out_features, 1024);  // 8 KV heads x head_dim 128
  EXPECT_EQ(big[559].in_features, 28672);
  EXPECT_EQ(big[559].out_features, 8192);
  EXPECT_NE(error_of([] { llama_linear_layers(2, 100, 10, 3, 1, 1); }).find("divisible by n_heads"),
            std::string::npos);
  EXPECT_NE(error_of([] { llama_linear_layers(2, 96, 10, 6, 4, 1); }).find("divisible by n_kv_heads"),
            std::string::npos);
  EXPECT_NE(error_of([] { llama_linear_layers(0, 96, 10, 6, 3, 1); }).find("positive sizes"),
            std::string::npos);
}
