// `snip plan` through the built snip program (tests/common/program.h).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "program.h"
#include "snip/core/error.h"

using nlohmann::json;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/snip_plan_cli_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string file(const std::string& name, const std::string& text) const {
    const std::string p = path + "/" + name;
    std::filesystem::create_directories(std::filesystem::path(p).parent_path());
    std::ofstream(p) << text;
    return p;
  }
};

using CliResult = snip::test::Ran;

// Runs the built `snip plan <args>` (out: stdout, err: stderr, error: the
// message of its `snip: error:` line).
CliResult run(std::vector<std::string> args) {
  args.insert(args.begin(), "plan");
  return snip::test::run_program(SNIP_EXE, args);
}

// Blocks 0..3, one up_proj each: FLOPs 1, 1, 2, 4 (total 8); Q(fp4) .1 .3
// .2 .5; Q(fp8) 0; rel_err(fp4) .4 .1 .2 .3.
const char* kTable = R"({"layers": [
  {"name": "model.layers.0.mlp.up_proj", "flops": 1, "q": {"fp4": 0.1, "fp8": 0}, "rel_err": {"fp4": 0.4}},
  {"name": "model.layers.1.mlp.up_proj", "flops": 1, "q": {"fp4": 0.3, "fp8": 0}, "rel_err": {"fp4": 0.1}},
  {"name": "model.layers.2.mlp.up_proj", "flops": 2, "q": {"fp4": 0.2, "fp8": 0}, "rel_err": {"fp4": 0.2}},
  {"name": "model.layers.3.mlp.up_proj", "flops": 4, "q": {"fp4": 0.5, "fp8": 0}, "rel_err": {"fp4": 0.3}}]})";

std::string L(int b) { return "model.layers." + std::to_string(b) + ".mlp.up_proj"; }

}  // namespace

// A heuristic's warning reaches the user on stderr and the plan JSON.
// kTable: blocks 1 and 2 hold 3/8 of the FLOPs, so b = 1 forces the first
// and last blocks (0 and 3) low.
TEST(CliPlan, FirstLastFp8WarnsOnStderrAndInTheJson) {
  TempDir d;
  const std::string costs = d.file("costs.json", kTable);
  const std::string out = d.path + "/plan.json";
  const CliResult r = run({"--costs", costs, "--budget", "1", "--heuristic", "first-last-fp8", "--out", out});
  EXPECT_EQ(r.error, "");
  const std::string warning =
      "first-last-fp8: budget 1 cannot be met by the inner blocks alone: it forced 2 of the 2 items in "
      "the first and last blocks (0 and 3) to fp4";
  EXPECT_EQ(r.err, "snip: warning: " + warning + "\n");
  std::ifstream in(out);
  EXPECT_EQ(json::parse(in)["warnings"], json::array({warning}));
  // b = 3/8: the inner blocks suffice; no warning, no "warnings" key.
  EXPECT_EQ(run({"--costs", costs, "--budget", "0.375", "--heuristic", "first-last-fp8", "--out", out}).err, "");
  std::ifstream in2(out);
  EXPECT_FALSE(json::parse(in2).contains("warnings"));
}

// `snip plan show` (format_plan_table, also what `snip train` prints): Q
// columns only for the options the plan chose among ("options"), though the
// q_table carries the bf16 reference; per-GEMM rows: the fprop row shows the
// layer's fprop error, dgrad/wgrad rows "-" (the plan file has fprop only),
// never the fprop error under another GEMM's name.
TEST(CliPlan, ShowHasQColumnsForThePlansOptionsAndPerGemmFpropErrors) {
  TempDir d;
  const std::string L0 = "model.layers.0.mlp.up_proj";
  ASSERT_EQ(std::system(("mkdir -p '" + d.path + "/run/plans'").c_str()), 0);
  json pj = {{"step", 2}, {"policy", "snip"}, {"phase", "plan"}, {"method", "ilp"}, {"status", "optimal"},
             {"low_option", "fp4"}, {"budget", 0.5}, {"fp4_share", 0.5}, {"objective", 0.3},
             {"options", {"fp4", "fp8"}},
             {"items", {{{"name", L0 + ":fprop"}, {"flops", 100}, {"option", "fp4"}, {"q", 0.1}},
                        {{"name", L0 + ":dgrad"}, {"flops", 100}, {"option", "fp8"}, {"q", 0.01}}}},
             {"q_table", {{L0 + ":fprop", {{"fp4", 0.1}, {"fp8", 0.02}, {"bf16", 0}}},
                          {L0 + ":dgrad", {{"fp4", 0.3}, {"fp8", 0.01}, {"bf16", 0}}}}},
             {"rel_err_fprop", {{L0, {{"fp4", 0.125}, {"fp8", 0.0625}, {"bf16", 0}}}}}};
  d.file("run/plans/step-2.json", pj.dump());
  const CliResult r = run({"show", d.path + "/run"});
  ASSERT_EQ(r.error, "");
  EXPECT_NE(r.out.find("Q(fp4)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Q(fp8)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Q(bf16)"), std::string::npos) << r.out;
  auto line_of = [&](const std::string& item) {
    const size_t at = r.out.find(item + " ");
    return at == std::string::npos ? std::string() : r.out.substr(at, r.out.find('\n', at) - at);
  };
  const std::string fprop = line_of(L0 + ":fprop"), dgrad = line_of(L0 + ":dgrad");
  ASSERT_GT(fprop.size(), 6u);
  EXPECT_EQ(fprop.substr(fprop.size() - 6), " 0.125") << fprop;  // the last column: rel. err
  EXPECT_EQ(dgrad.substr(dgrad.size() - 2), " -") << dgrad;
  EXPECT_EQ(dgrad.find("0.0625"), std::string::npos) << "dgrad row shows the fprop error: " << dgrad;
}

TEST(CliPlan, JsonPlanIsTheHandDerivedOptimum) {
  TempDir d;
  const std::string costs = d.file("costs.json", kTable);
  // b = 3/8: L0+L2 (Q .3) beats L1+L2 (.5) and L3 (.5).
  const CliResult r = run({"--costs", costs, "--budget", "0.375", "--json"});
  ASSERT_EQ(r.error, "");
  const json j = json::parse(r.out);
  EXPECT_EQ(j["assignments"], json({{L(0), "fp4"}, {L(1), "fp8"}, {L(2), "fp4"}, {L(3), "fp8"}}));
  EXPECT_EQ(j["status"], "optimal");
  EXPECT_EQ(j["proven_optimal"], true);
  EXPECT_DOUBLE_EQ(j["fp4_share"].get<double>(), 0.375);
  EXPECT_NEAR(j["objective"].get<double>(), 0.3, 1e-15);
  EXPECT_EQ(j["granularity"], "layer");
  EXPECT_EQ(j["budget"], 0.375);
  // The gap: proven, so the bound is the objective.
  EXPECT_EQ(j["algorithm"], "cbc");
  EXPECT_EQ(j["lower_bound"], j["objective"]);
  EXPECT_EQ(j["gap"], 0.0);
  EXPECT_EQ(j["relative_gap"], 0.0);
}

// --method mckp: the same optimum, proven, with the algorithm named (bounds
// against enumeration: test_planner_exhaustive.cpp); an unknown method is a
// one-line error.
TEST(CliPlan, MethodMckpStatesItsGap) {
  TempDir d;
  const std::string costs = d.file("costs.json", kTable);
  CliResult r = run({"--costs", costs, "--budget", "0.375", "--json", "--method", "mckp"});
  ASSERT_EQ(r.error, "");
  const json j = json::parse(r.out);
  EXPECT_NEAR(j["objective"].get<double>(), 0.3, 1e-15);
  EXPECT_EQ(j["proven_optimal"], true);
  EXPECT_EQ(j["gap"], 0.0);
  EXPECT_EQ(j["algorithm"].get<std::string>().rfind("mckp", 0), 0u) << j["algorithm"];
  r = run({"--costs", costs, "--budget", "0.375", "--method", "mckp"});
  EXPECT_NE(r.out.find("bound:     sum Q >= 0.3 (gap 0, 0%)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("solver:    mckp"), std::string::npos) << r.out;
  EXPECT_NE(run({"--costs", costs, "--budget", "0.375", "--method", "simplex"}).error.find(
                "expected one of auto, milp, mckp, got 'simplex'"),
            std::string::npos);
}

TEST(CliPlan, TableOutputAndOutFile) {
  TempDir d;
  const std::string costs = d.file("costs.json", kTable);
  const std::string out = d.path + "/plan.json";
  const CliResult r = run({"--costs", costs, "--budget", "0.375", "--out", out});
  ASSERT_EQ(r.error, "");
  EXPECT_NE(r.out.find(L(3) + "  fp8        50.00%"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Q(fp4)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("achieved:  FP4 share 0.3750, cost 1.6250 per FLOP"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("objective: sum Q = 0.3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bound:     sum Q >= 0.3 (gap 0, 0%)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("solver:    cbc optimal (proven) in "), std::string::npos) << r.out;
  std::ifstream in(out);
  const json j = json::parse(in);
  EXPECT_EQ(j["assignments"][L(0)], "fp4");
}

TEST(CliPlan, PinsStagesHeuristicsAndSweep) {
  TempDir d;
  const std::string costs = d.file("costs.json", kTable);
  // Pin L2 to fp8: b = 3/8 now needs L3 (Q .5) or L0+L1 (.4 but only 2/8).
  CliResult r = run({"--costs", costs, "--budget", "0.375", "--pin", "layers.2.*=fp8", "--json"});
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(json::parse(r.out)["assignments"][L(3)], "fp4");
  // min-rel-err: L1 (1/8), L2 (3/8): done.
  r = run({"--costs", costs, "--budget", "0.375", "--heuristic", "min-rel-err", "--json"});
  ASSERT_EQ(r.error, "");
  json j = json::parse(r.out);
  EXPECT_EQ(j["method"], "min-rel-err");
  EXPECT_EQ(j["status"], "heuristic");
  EXPECT_EQ(j["assignments"], json({{L(0), "fp8"}, {L(1), "fp4"}, {L(2), "fp4"}, {L(3), "fp8"}}));
  // Two stages (blocks 0-1, 2-3), each with share >= 0.5 and its first and
  // last layer pinned fp8 -> every layer pinned: infeasible.
  r = run({"--costs", costs, "--budget", "0.5", "--stages", "2"});
  EXPECT_NE(r.error.find("budget 0.5 is infeasible: stage-boundary pins to fp8 (4 layers, "
                         "100.0% of FLOPs) cap the FP4 share at 0.000"),
            std::string::npos)
      << r.error;
  r = run({"--costs", costs, "--budget", "0.5", "--stages", "2", "--stage-boundary", "none",
           "--json"});
  ASSERT_EQ(r.error, "");
  j = json::parse(r.out);
  EXPECT_EQ(j["stage_fp4_share"].size(), 2u);
  EXPECT_GE(j["stage_fp4_share"][0].get<double>(), 0.5);
  EXPECT_GE(j["stage_fp4_share"][1].get<double>(), 0.5);
  // Sweep over 0, .25, .5, .75, 1 (JSON).
  r = run({"--costs", costs, "--sweep", "--steps", "4", "--json"});
  ASSERT_EQ(r.error, "");
  j = json::parse(r.out);
  ASSERT_EQ(j["points"].size(), 5u);
  EXPECT_DOUBLE_EQ(j["points"][2]["fp4_share"].get<double>(), 0.5);
  r = run({"--costs", costs, "--sweep", "--steps", "4"});
  EXPECT_NE(r.out.find("Pareto front"), std::string::npos) << r.out;
  // The --stats hook reads the cost-table layout for now.
  r = run({"--stats", costs, "--budget", "0.375", "--json"});
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(json::parse(r.out)["assignments"][L(2)], "fp4");
}

TEST(CliPlan, UserErrors) {
  TempDir d;
  const std::string costs = d.file("costs.json", kTable);
  const std::string out = d.path + "/plan.json";
  EXPECT_EQ(run({"--costs", costs}).error,
            "snip plan: expected --budget B (FP4 FLOPs share in [0,1]) or --cost-budget C, got "
            "neither");
  EXPECT_EQ(run({"--costs", costs, "--budget", "0.5", "--cost-budget", "2"}).error,
            "snip plan: expected one of --budget, --cost-budget or --time-budget, got --budget and --cost-budget");
  EXPECT_EQ(run({"--budget", "0.5"}).error,
            "snip plan: expected exactly one of --costs FILE, --stats FILE or --config MODEL.toml, got none");
  EXPECT_EQ(run({"--costs", costs, "--budget", "1.5"}).error,
            "budget: expected an FP4 FLOPs share in [0, 1], got 1.5");
  EXPECT_EQ(run({"--costs", costs, "--cost-budget", "2", "--cost", "fp8"}).error,
            "--cost: expected OPTION=COST with COST >= 0 (e.g. fp8=2), got 'fp8'");
  EXPECT_NE(run({"--costs", costs, "--budget", "0.5", "--per-gemm"})
                .error.find("per-GEMM planning expected a \"gemms\" entry"),
            std::string::npos);
  // An empty number was read as 0 (`--budget ''` planned for a share of 0), and
  // an option no layer offers was silently dropped.
  for (const char* o : {"--budget", "--cost-budget", "--time-limit", "--stages", "--seed", "--steps"}) {
    EXPECT_EQ(run({"--costs", costs, o, ""}).error, std::string(o) + ": expected a number, got '' (see --help)") << o;
  }
  EXPECT_EQ(run({"--costs", costs, "--budget", "0.5", "--options", "fp4,zz"}).error,
            "--options: expected options the cost table " + costs + " gives a Q for (fp4, fp8), got 'zz'");
  EXPECT_EQ(run({"--costs", costs, "--budget", "0.5", "--options", "fp4,fp8"}).error, "");
  // An infeasible budget writes nothing.
  const CliResult r =
      run({"--costs", costs, "--budget", "0.9", "--pin", "*.up_proj=fp8", "--out", out});
  EXPECT_EQ(r.error,
            "budget 0.9 is infeasible: pin '*.up_proj=fp8' (4 layers, 100.0% of FLOPs) caps the "
            "FP4 share at 0.000");
  EXPECT_FALSE(std::ifstream(out).good());
}

TEST(CliPlan, CostBudget) {
  TempDir d;
  const std::string costs = d.file("costs.json", kTable);
  // Mean cost <= 1.75 with fp4 = 1, fp8 = 2: FP4 share >= 0.25, i.e. the
  // b = 2/8 optimum: L2 (Q .2) beats L0+L1 (.4).
  const CliResult r = run({"--costs", costs, "--cost-budget", "1.75", "--json"});
  ASSERT_EQ(r.error, "");
  const json j = json::parse(r.out);
  EXPECT_EQ(j["assignments"], json({{L(0), "fp8"}, {L(1), "fp8"}, {L(2), "fp4"}, {L(3), "fp8"}}));
  EXPECT_TRUE(j["budget"].is_null());
  EXPECT_EQ(j["cost_budget"], 1.75);
  // With fp8 at 3 per FLOP the cost is 24 - 2*(FLOPs low) <= 14: at least 5
  // FLOPs low. L3+L0 (Q .6) beats L3+L1 (.8), L3+L2 (.7) and larger sets.
  const CliResult r2 =
      run({"--costs", costs, "--cost-budget", "1.75", "--cost", "fp8=3", "--json"});
  ASSERT_EQ(r2.error, "");
  EXPECT_EQ(json::parse(r2.out)["assignments"],
            json({{L(0), "fp4"}, {L(1), "fp8"}, {L(2), "fp8"}, {L(3), "fp4"}}));
}

// `snip plan show RUN [--step N] [--json]` on plans written the way
// `snip train` writes them (a plan JSON plus step, policy, phase, q_table).
TEST(CliPlan, ShowPrintsASavedPlan) {
  TempDir d;
  const std::string costs = d.file("costs.json", kTable);
  std::system(("mkdir -p '" + d.path + "/run/plans'").c_str());
  for (int step : {3, 7}) {
    const std::string p = d.path + "/run/plans/step-" + std::to_string(step) + ".json";
    ASSERT_EQ(run({"--costs", costs, "--budget", step == 3 ? "0.375" : "0.5", "--out", p}).error, "");
    std::ifstream in(p);
    json j = json::parse(in);
    j["step"] = step;
    j["policy"] = "snip";
    j["phase"] = "plan";
    j["q_table"] = {{L(0), {{"fp4", 0.1}, {"fp8", 0}}}, {L(1), {{"fp4", 0.3}, {"fp8", 0}}},
                    {L(2), {{"fp4", 0.2}, {"fp8", 0}}}, {L(3), {{"fp4", 0.5}, {"fp8", 0}}}};
    std::ofstream(p) << j.dump();
  }
  CliResult r = run({"show", d.path + "/run"});  // the latest: step 7, b = 1/2 -> L3 (Q .5 = L0+L1+L2 .6)
  ASSERT_EQ(r.error, "");
  EXPECT_NE(r.out.find("precision plan at step 7: policy snip, phase plan"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(L(3) + "  fp4        50.00%"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("achieved:  FP4 share 0.5000"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("budget:    FP4 FLOPs share >= 0.5"), std::string::npos) << r.out;
  r = run({"show", d.path + "/run", "--step", "3"});
  ASSERT_EQ(r.error, "");
  EXPECT_NE(r.out.find("at step 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(L(0) + "  fp4        12.50%"), std::string::npos) << r.out;
  r = run({"show", d.path + "/run", "--step", "3", "--json"});
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(json::parse(r.out)["step"], 3);
  // Step 5: no plan was made there; the one made at 3 is in force (until 7).
  r = run({"show", d.path + "/run", "--step", "5", "--json"});
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(json::parse(r.out)["step"], 3);
  EXPECT_EQ(json::parse(run({"show", d.path + "/run", "--step", "7", "--json"}).out)["step"], 7);
  EXPECT_EQ(json::parse(run({"show", d.path + "/run", "--step", "1000", "--json"}).out)["step"], 7);
  // Before the first plan: none in force, and the message lists the plans.
  EXPECT_EQ(run({"show", d.path + "/run", "--step", "2"}).error,
            "snip plan show: no plan was in force at step 2 in " + d.path +
                "/run (plans were made at steps 3, 7; before the first, the warmup precision ran)");
  EXPECT_EQ(run({"show", d.path + "/nothing"}).error,
            "snip plan show: run folder " + d.path + "/nothing does not exist");
  // A run that makes no plan (precision.policy = none, the main job's) says why.
  d.file("none/config.toml", "[precision]\npolicy = \"none\"\n");
  EXPECT_EQ(run({"show", d.path + "/none"}).error,
            "snip plan show: " + d.path + "/none made no plan: its precision.policy is none (every layer at "
            "train.gemm_dtype); a run with precision.policy = snip, or a baseline, writes plans/step-N.json");
  d.file("default/config.toml", "[train]\nmax_steps = 3\n");  // no [precision]: the default policy, none
  EXPECT_NE(run({"show", d.path + "/default"}).error.find("made no plan: its precision.policy is none"),
            std::string::npos);
  d.file("snip/config.toml", "[precision]\npolicy = \"snip\"\n");
  EXPECT_EQ(run({"show", d.path + "/snip"}).error,
            "snip plan show: " + d.path + "/snip/plans does not exist (no plan was made in " + d.path + "/snip)");
  // A saved plan is user input too: the strict parser's checks.
  const std::string p9 = d.path + "/run/plans/step-9.json";
  std::ofstream(p9) << R"({"phase": "plan", "items": [], "items": []})";
  EXPECT_EQ(run({"show", d.path + "/run"}).error, p9 + ": (top level): expected each key once, got \"items\" twice");
  // "step": 1e300 was cast to int64 (undefined behaviour; fuzz_plan_file).
  std::ofstream(p9) << R"({"phase": "plan", "step": 1e300, "items": [], "fp4_share": 0})";
  EXPECT_EQ(run({"show", d.path + "/run", "--step", "9"}).error,
            "plan JSON: step: expected an integer >= 0, got number");
  std::ofstream(p9) << std::string(100000, '[') << std::string(100000, ']');
  EXPECT_NE(run({"show", d.path + "/run", "--step", "9"}).error.find("expected at most 128 nested arrays/objects"), std::string::npos);
}

// `--stats FILE`: the options the stats step measured are the default
// --options, so the bf16 reference (Q = 0) does not take the free layers.
TEST(CliPlan, StatsFileDefaultsToTheMeasuredOptions) {
  TempDir d;
  const std::string stats = d.file("stats.json", R"({"layers": [
    {"name": "model.layers.0.mlp.up_proj", "flops": 1, "q": {"fp4": 0.1, "fp8": 0.05, "bf16": 0}},
    {"name": "model.layers.1.mlp.up_proj", "flops": 1, "q": {"fp4": 0.3, "fp8": 0.05, "bf16": 0}}],
    "details": {"options": ["fp4", "fp8"], "reference": "bf16"}})");
  CliResult r = run({"--stats", stats, "--budget", "0.5", "--json"});
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(json::parse(r.out)["assignments"], json({{L(0), "fp4"}, {L(1), "fp8"}}));
  r = run({"--stats", stats, "--budget", "0.5", "--options", "fp4,fp8,bf16", "--json"});  // explicit: bf16 allowed
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(json::parse(r.out)["assignments"][L(1)], "bf16");
}

// `snip plan --config MODEL.toml`: TinyLlama-1.1B's shapes
// (configs/tinyllama-1.1b.toml's [model] and [train]); shares per role
// 2/21 (q, o), 1/84 (k, v), 11/42 (gate, up, down), see test_model_plan.cpp.
namespace {
const char* kTinyLlama = R"([model]
vocab_size = 32000
hidden_size = 2048
intermediate_size = 5632
num_hidden_layers = 22
num_attention_heads = 32
num_key_value_heads = 4
tie_word_embeddings = false
[train]
batch_size = 8
seq_len = 2048
)";
}  // namespace

TEST(CliPlan, ConfigAloneGivesFlopsSharesAndFeasibility) {
  TempDir d;
  const std::string cfg = d.file("tinyllama.toml", kTinyLlama);
  CliResult r = run({"--config", cfg});
  ASSERT_EQ(r.error, "");
  EXPECT_NE(r.out.find("vocabulary 32000, 1100048384 parameters"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens:    16384 per step (batch_size 8 x seq_len 2048 x grad_accum 1)"), std::string::npos)
      << r.out;
  // 154 layers; per step 6·T·(22·44,040,192) = 9.5232e13·... FLOPs.
  const double linear = 6.0 * 16384 * 22 * 44040192.0;
  char want[64];
  std::snprintf(want, sizeof want, "FLOPs:     %.4g per step in the 154 planned", linear);
  EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("self_attn.q_proj      2048 x 2048      22"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  9.52%"), std::string::npos) << r.out;   // q_proj 2/21
  EXPECT_NE(r.out.find("  26.19%"), std::string::npos) << r.out;  // gate 11/42
  EXPECT_NE(r.out.find("budget:    FP4 share >= 0.75 (precision.budget of " + cfg + "): feasible"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("Q:         not given, so no plan"), std::string::npos) << r.out;

  // JSON: the same numbers, and the cap of MLP pins: 1 - 3·11/42 = 3/14.
  r = run({"--config", cfg, "--pin", "*.mlp.*=fp8", "--budget", "0.2", "--json"});
  ASSERT_EQ(r.error, "");
  const json j = json::parse(r.out);
  EXPECT_EQ(j["tokens_per_step"], 16384);
  EXPECT_DOUBLE_EQ(j["linear_flops"].get<double>(), linear);
  EXPECT_NEAR(j["max_low_share"].get<double>(), 3.0 / 14, 1e-12);
  EXPECT_EQ(j["feasible"], true);
  EXPECT_EQ(j["roles"].size(), 7u);
  EXPECT_NEAR(j["roles"][6]["share"].get<double>(), 11.0 / 42, 1e-15);
  EXPECT_EQ(j["model"]["parameters"], 1100048384);  // TinyLlama-1.1B's published count

  // Infeasible under the pins: the planner's one line, after the table.
  r = run({"--config", cfg, "--pin", "*.mlp.*=fp8", "--budget", "0.5", "--tokens-per-step", "4096"});
  EXPECT_NE(r.error.find("budget 0.5 is infeasible"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("pin '*.mlp.*=fp8' (66 layers, 78.6% of FLOPs) caps the FP4 share at 0.214"),
            std::string::npos)
      << r.error;
  EXPECT_NE(r.out.find("at most 0.2143"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens:    4096 per step (--tokens-per-step)"), std::string::npos) << r.out;

  // Mistakes: one line each.
  EXPECT_NE(run({"--config", cfg, "--costs", cfg}).error.find("expected one of --costs FILE or --config"),
            std::string::npos);
  EXPECT_EQ(run({"--config", cfg, "--data", d.path}).error,
            "--data: needs --init-from HF_DIR (the checkpoint to measure Q on)");
  EXPECT_EQ(run({"--config", cfg, "--init-from", d.path}).error,
            "--init-from: needs --data DIR (the prepared text to measure Q on)");
  EXPECT_EQ(run({"--config", cfg, "--init-from", d.path, "--data", d.path}).error,
            d.path + " is not a Hugging Face model folder: it has no config.json");
  EXPECT_EQ(run({"--costs", cfg, "--tokens-per-step", "5"}).error,
            "snip plan: --tokens-per-step needs --config MODEL.toml (the model to plan)");
  EXPECT_NE(run({"--config", cfg, "--set", "model.hidden_size=2047"}).error.find("hidden_size"), std::string::npos);
  // model.vocab_size = 0 (the tokenizer's): data.dir's meta.json gives it, so
  // the parameters are TinyLlama's published count again.
  ASSERT_EQ(std::system(("mkdir -p '" + d.path + "/data'").c_str()), 0);
  d.file("data/meta.json", R"({"vocab_size": 32000})");
  r = run({"--config", cfg, "--set", "model.vocab_size=0", "--set", "data.dir=" + d.path + "/data", "--json"});
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(json::parse(r.out)["model"]["parameters"], 1100048384);
  r = run({"--config", cfg, "--set", "model.vocab_size=0", "--set", "data.dir=" + d.path + "/none"});
  EXPECT_NE(r.out.find("vocabulary from the tokenizer (model.vocab_size = 0"), std::string::npos) << r.out;
  // Found by review: values that were accepted silently or after the table.
  EXPECT_EQ(run({"--config", cfg, "--tokens-per-step", "0"}).error,
            "--tokens-per-step: expected a number of tokens per training step in [1, 2^50], got 0");
  EXPECT_EQ(run({"--config", cfg, "--budget", "nan"}).error, "budget: expected an FP4 FLOPs share in [0, 1], got nan");
  for (const char* b : {"1.5", "nan"}) EXPECT_EQ(run({"--config", cfg, "--budget", b}).out, "") << b;
  EXPECT_EQ(run({"--config", cfg, "--stats-batch", "2"}).error,
            "--stats-batch: needs --init-from HF_DIR --data DIR (it is about the measured stats step)");
  EXPECT_EQ(run({"--config", cfg, "--sweep"}).error,
            "--sweep: needs Q, per layer and option: add --stats RUN/stats/step-N.json or --init-from HF_DIR --data DIR");
  EXPECT_EQ(run({"--config", cfg, "--heuristic", "layer-type"}).out, "");
  // An infeasible budget writes no --out file.
  const std::string out = d.path + "/infeasible.json";
  EXPECT_NE(run({"--config", cfg, "--budget", "0.9", "--conservative", "--json", "--out", out}).error.find("infeasible"),
            std::string::npos);
  EXPECT_FALSE(std::ifstream(out).good());
  EXPECT_NE(run({"--config", d.path + "/none.toml"}).error.find("none.toml"), std::string::npos);
}

// Q from a stats file of a 2-block model carried over to 4 blocks: block i
// takes block round(i/3), so blocks 0, 1 take block 0's Q and 2, 3 block 1's.
// Block 0's down_proj is the only layer with a large FP4 Q, so at a budget
// the other layers can meet, exactly model.layers.{0,1}.mlp.down_proj stay
// at fp8.
TEST(CliPlan, ConfigWithStatsCarriesQOverByDepth) {
  TempDir d;
  const std::string cfg = d.file("m.toml", R"([model]
hidden_size = 64
intermediate_size = 128
num_hidden_layers = 4
num_attention_heads = 4
num_key_value_heads = 2
[train]
batch_size = 2
seq_len = 16
)");
  json layers = json::array();
  const char* roles[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                          "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  for (int b = 0; b < 2; ++b)
    for (const char* r : roles) {
      const bool big = b == 0 && std::string(r) == "mlp.down_proj";
      layers.push_back({{"name", "model.layers." + std::to_string(b) + "." + r},
                        {"flops", 7},
                        {"q", {{"fp4", big ? 1.0 : 0.01}, {"fp8", 0.001}, {"bf16", 0}}}});
    }
  const std::string stats =
      d.file("step-10.json", json{{"layers", layers}, {"details", {{"options", {"fp4", "fp8"}}}}}.dump());
  // Shares: per block 2·64² + 2·64·32 + 3·64·128 = 36,864 weights; down_proj
  // 8,192 of them = 2/9, so 2 of 4 blocks' down_proj are 1/9 of the FLOPs.
  const CliResult r = run({"--config", cfg, "--stats", stats, "--budget", "0.88", "--json"});
  ASSERT_EQ(r.error, "");
  const json p = json::parse(r.out);
  for (int b = 0; b < 4; ++b)
    for (const char* role : roles) {
      const std::string n = "model.layers." + std::to_string(b) + "." + role;
      const bool fp8 = b <= 1 && std::string(role) == "mlp.down_proj";
      EXPECT_EQ(p["assignments"][n], fp8 ? "fp8" : "fp4") << n;
    }
  EXPECT_NEAR(p["fp4_share"].get<double>(), 8.0 / 9, 1e-12);
  // --out onto the stats file it plans from is refused (it would destroy it).
  EXPECT_EQ(run({"--config", cfg, "--stats", stats, "--budget", "0.88", "--out", stats}).error,
            "--out " + stats + ": is the input " + stats + "; write the plan to another file");
  // The config's own options are the candidates, bf16 included when listed
  // (as snip train plans): Q(bf16) = 0 < Q(fp8), so the two down_proj take it.
  const CliResult b = run({"--config", cfg, "--set", "precision.options=fp4,fp8,bf16", "--stats", stats, "--budget",
                           "0.88", "--json"});
  ASSERT_EQ(b.error, "");
  const json pb = json::parse(b.out);
  EXPECT_EQ(pb["options"], json::array({"bf16", "fp4", "fp8"}));  // sorted by name
  EXPECT_EQ(pb["assignments"]["model.layers.0.mlp.down_proj"], "bf16");
  EXPECT_EQ(pb["assignments"]["model.layers.1.mlp.down_proj"], "bf16");
  // The items carry the model's own FLOPs: 3·2·T·in·out, T = 2·16.
  for (const json& it : p["items"])
    if (it["name"] == "model.layers.3.mlp.down_proj") EXPECT_DOUBLE_EQ(it["flops"].get<double>(), 6.0 * 32 * 128 * 64);
}
