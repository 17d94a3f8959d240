// `snip plan` (src/cli/cmd_plan.cpp) driven through CLI11, as main() would.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "snip/util/error.h"

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
    std::ofstream(p) << text;
    return p;
  }
};

struct CliResult {
  std::string out;    // stdout
  std::string error;  // UserError message, "" when none
};

// Runs `snip plan <args>`; stdout captured, UserError caught.
CliResult run(std::vector<std::string> args) {
  CLI::App app{"snip"};
  snip::cli::add_plan_commands(app);
  args.insert(args.begin(), "plan");
  args.insert(args.begin(), "snip");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream captured;
  std::streambuf* old = std::cout.rdbuf(captured.rdbuf());
  CliResult r;
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const snip::UserError& e) {
    r.error = e.what();
  } catch (...) {
    std::cout.rdbuf(old);
    throw;
  }
  std::cout.rdbuf(old);
  r.out = captured.str();
  return r;
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
  std::ostringstream err;
  std::streambuf* old = std::cerr.rdbuf(err.rdbuf());
  const CliResult r = run({"--costs", costs, "--budget", "1", "--heuristic", "first-last-fp8", "--out", out});
  std::cerr.rdbuf(old);
  EXPECT_EQ(r.error, "");
  const std::string warning =
      "first-last-fp8: budget 1 cannot be met by the inner blocks alone: it forced 2 of the 2 items in "
      "the first and last blocks (0 and 3) to fp4";
  EXPECT_EQ(err.str(), "snip: warning: " + warning + "\n");
  std::ifstream in(out);
  EXPECT_EQ(json::parse(in)["warnings"], json::array({warning}));
  // b = 3/8: the inner blocks suffice; no warning, no "warnings" key.
  err.str("");
  old = std::cerr.rdbuf(err.rdbuf());
  run({"--costs", costs, "--budget", "0.375", "--heuristic", "first-last-fp8", "--out", out});
  std::cerr.rdbuf(old);
  EXPECT_EQ(err.str(), "");
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
            "snip plan: expected one of --budget or --cost-budget, got both");
  EXPECT_EQ(run({"--budget", "0.5"}).error,
            "snip plan: expected exactly one of --costs FILE or --stats FILE, got neither");
  EXPECT_EQ(run({"--costs", costs, "--budget", "1.5"}).error,
            "budget: expected an FP4 FLOPs share in [0, 1], got 1.5");
  EXPECT_EQ(run({"--costs", costs, "--cost-budget", "2", "--cost", "fp8"}).error,
            "--cost: expected OPTION=COST with COST >= 0 (e.g. fp8=2), got 'fp8'");
  EXPECT_NE(run({"--costs", costs, "--budget", "0.5", "--per-gemm"})
                .error.find("per-GEMM planning expected a \"gemms\" entry"),
            std::string::npos);
  // Issue 17: an empty number was read as 0 (`--budget ''` planned for a
  // share of 0), and an option no layer offers was silently dropped.
  for (const char* o : {"--budget", "--cost-budget", "--time-limit", "--stages", "--seed", "--steps"}) {
    std::string what;
    try {
      run({"--costs", costs, o, ""});
    } catch (const CLI::ParseError& e) {
      what = e.what();
    }
    EXPECT_EQ(what, std::string(o) + ": expected a number, got ''") << o;
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
  // A saved plan is user input too: the strict parser's checks (issue 17).
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
