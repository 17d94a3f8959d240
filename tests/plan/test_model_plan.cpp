// snip/plan/model_plan.h: FLOPs per layer type of a model's shapes and Q
// carried over from another run, against hand-derived values.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "snip/plan/model_plan.h"
#include "snip/core/error.h"

using namespace snip::plan;

namespace {

const char* kRoles[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                         "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const snip::UserError& e) {
    return e.what();
  }
  return "";
}

// A source table of `blocks` Llama blocks whose Q(fp4) encodes where it
// came from: 100·(block+1) + role index; Q(fp8) a tenth of it, rel_err(fp4)
// = block + role/10 (unscaled by the transfer).
CostTable source_table(int blocks, bool per_gemm = false) {
  CostTable t;
  t.source = "src.json";
  for (int b = 0; b < blocks; ++b)
    for (int r = 0; r < 7; ++r) {
      LayerCost c;
      c.name = "model.layers." + std::to_string(b) + "." + kRoles[r];
      const double q = 100.0 * (b + 1) + r;
      if (per_gemm) {
        c.has_gemms = true;
        for (int g = 0; g < 3; ++g) {
          c.gemms[g].flops = 1;
          c.gemms[g].q = {{"fp4", q * (g + 1)}, {"fp8", q * (g + 1) / 10}, {"bf16", 0}};
        }
      } else {
        c.flops = 1;
        c.q = {{"fp4", q}, {"fp8", q / 10}, {"bf16", 0}};
        c.rel_err = {{"fp4", b + r / 10.0}};
      }
      t.layers.push_back(c);
    }
  return t;
}

}  // namespace

TEST(ModelPlan, LayerRole) {
  const LayerRole a = layer_role("model.layers.12.mlp.up_proj");
  EXPECT_EQ(a.block, 12);
  EXPECT_EQ(a.role, "mlp.up_proj");
  const LayerRole b = layer_role("lm_head");
  EXPECT_EQ(b.block, -1);
  EXPECT_EQ(b.role, "lm_head");
}

// TinyLlama-1.1B (C 2048, F 5632, 32/4 heads: k/v project to 4·64 = 256): per
// block 2·2048² + 2·2048·256 + 3·2048·5632 = 44,040,192 weights; q and o are
// 4,194,304 each = 2/21 of them, k and v 524,288 = 1/84, gate/up/down
// 11,534,336 = 11/42. FLOPs per step: 3 GEMMs · 2·T·in·out per layer.
TEST(ModelPlan, RoleFlopsOfTinyLlamaAreHandDerived) {
  const int64_t T = 16384;  // configs/tinyllama-1.1b.toml: 8 x 2048
  const std::vector<RoleFlops> r = role_flops(llama_linear_layers(22, 2048, 5632, 32, 4, T));
  ASSERT_EQ(r.size(), 7u);
  const double share[7] = {2.0 / 21, 1.0 / 84, 1.0 / 84, 2.0 / 21, 11.0 / 42, 11.0 / 42, 11.0 / 42};
  const int64_t in[7] = {2048, 2048, 2048, 2048, 2048, 2048, 5632};
  const int64_t out[7] = {2048, 256, 256, 2048, 5632, 5632, 2048};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(r[i].role, kRoles[i]);
    EXPECT_EQ(r[i].count, 22);
    EXPECT_EQ(r[i].in_features, in[i]);
    EXPECT_EQ(r[i].out_features, out[i]);
    EXPECT_DOUBLE_EQ(r[i].flops, 22.0 * 3 * 2 * double(T) * double(in[i]) * double(out[i]));
    EXPECT_NEAR(r[i].share, share[i], 1e-15) << kRoles[i];
  }
}

// Ls = 4 source blocks onto Lt = 22: j = round(i·3/21) = round(i/7), so
// blocks 0-3 -> 0, 4-10 -> 1, 11-17 -> 2, 18-21 -> 3 (first to first, last
// to last). One factor makes Σ Q(fp4) = 1; ratios and rel_err are kept.
TEST(ModelPlan, TransferMapsByRoleAndRelativeDepth) {
  const auto target = llama_linear_layers(22, 2048, 5632, 32, 4, 100);
  const Transfer t = transfer_costs(source_table(4), target, "fp4");
  EXPECT_EQ(t.source_blocks, 4);
  EXPECT_EQ(t.target_blocks, 22);
  ASSERT_EQ(t.table.layers.size(), target.size());
  auto expected_j = [](int i) { return i <= 3 ? 0 : i <= 10 ? 1 : i <= 17 ? 2 : 3; };
  double raw_sum = 0;
  for (int i = 0; i < 22; ++i)
    for (int r = 0; r < 7; ++r) raw_sum += 100.0 * (expected_j(i) + 1) + r;
  EXPECT_NEAR(t.scale, 1.0 / raw_sum, 1e-18);
  double sum = 0;
  for (size_t k = 0; k < target.size(); ++k) {
    const int i = int(k / 7), r = int(k % 7);
    const LayerCost& c = t.table.layers[k];
    EXPECT_EQ(c.name, target[k].name);
    EXPECT_EQ(t.source_block[k], expected_j(i)) << c.name;
    EXPECT_FALSE(c.has_gemms);
    EXPECT_DOUBLE_EQ(c.flops, 3 * target[k].gemm_flops);
    EXPECT_NEAR(c.q.at("fp4"), (100.0 * (expected_j(i) + 1) + r) / raw_sum, 1e-15) << c.name;
    EXPECT_NEAR(c.q.at("fp8"), c.q.at("fp4") / 10, 1e-15);
    EXPECT_EQ(c.q.at("bf16"), 0.0);
    EXPECT_DOUBLE_EQ(c.rel_err.at("fp4"), expected_j(i) + r / 10.0);
    sum += c.q.at("fp4");
  }
  EXPECT_NEAR(sum, 1.0, 1e-12);
}

TEST(ModelPlan, TransferEdgeCases) {
  // Same depth: block for block.
  const auto same = llama_linear_layers(4, 64, 128, 4, 2, 10);
  const Transfer a = transfer_costs(source_table(4), same, "fp4");
  for (size_t k = 0; k < same.size(); ++k) EXPECT_EQ(a.source_block[k], int(k / 7));
  // One target block takes block 0; deeper source blocks are unused.
  const Transfer b = transfer_costs(source_table(3), llama_linear_layers(1, 64, 128, 4, 2, 10), "fp4");
  for (int j : b.source_block) EXPECT_EQ(j, 0);
  // A shallower target from one source block: all from it.
  const Transfer c = transfer_costs(source_table(1), llama_linear_layers(5, 64, 128, 4, 2, 10), "fp4");
  for (int j : c.source_block) EXPECT_EQ(j, 0);
  // No low option in the table: Q unscaled.
  const Transfer d = transfer_costs(source_table(2), same, "mxfp4");
  EXPECT_EQ(d.scale, 1.0);
  EXPECT_EQ(d.table.layers[0].q.at("fp4"), 100.0);
}

// Per-GEMM sources give per-GEMM entries, each GEMM with its own FLOPs.
TEST(ModelPlan, TransferPerGemm) {
  const auto target = llama_linear_layers(2, 64, 128, 4, 2, 10);
  const Transfer t = transfer_costs(source_table(2, true), target, "fp4");
  ASSERT_TRUE(t.table.per_gemm());
  double raw = 0;
  for (int b = 0; b < 2; ++b)
    for (int r = 0; r < 7; ++r) raw += (100.0 * (b + 1) + r) * (1 + 2 + 3);
  for (size_t k = 0; k < target.size(); ++k)
    for (int g = 0; g < 3; ++g) {
      EXPECT_DOUBLE_EQ(t.table.layers[k].gemms[g].flops, target[k].gemm_flops);
      EXPECT_NEAR(t.table.layers[k].gemms[g].q.at("fp4"), (100.0 * (k / 7 + 1) + k % 7) * (g + 1) / raw, 1e-15);
    }
}

TEST(ModelPlan, TransferErrorsNameWhatIsWrong) {
  const auto target = llama_linear_layers(2, 64, 128, 4, 2, 10);
  CostTable no_block = source_table(1);
  no_block.layers[0].name = "lm_head";
  EXPECT_NE(error_of([&] { transfer_costs(no_block, target, "fp4"); }).find("src.json: layer 'lm_head' has no block index"),
            std::string::npos);
  CostTable gap = source_table(3);
  gap.layers.erase(gap.layers.begin() + 7, gap.layers.begin() + 14);  // block 1 gone
  EXPECT_NE(error_of([&] { transfer_costs(gap, target, "fp4"); }).find("expected blocks 0..2, got none at block 1"),
            std::string::npos);
  CostTable missing = source_table(2);
  missing.layers.erase(missing.layers.begin() + 8);  // model.layers.1.self_attn.k_proj
  EXPECT_NE(error_of([&] { transfer_costs(missing, target, "fp4"); })
                .find("src.json: has no layer model.layers.1.self_attn.k_proj to carry Q over to "
                      "model.layers.1.self_attn.k_proj"),
            std::string::npos);
  CostTable other = source_table(2);
  other.layers[0].name = "model.layers.0.mlp.w3";
  EXPECT_NE(error_of([&] { transfer_costs(other, target, "fp4"); }).find("role 'mlp.w3'"), std::string::npos);
  EXPECT_NE(error_of([] { shape_cost_table({}, {}); }).find("at least one option"), std::string::npos);
}

// Feasibility from the shapes alone: pinning every MLP layer to fp8 caps the
// FP4 share at the attention's 4·(1/84 + 2/21)... = 1 - 3·11/42 = 3/14.
TEST(ModelPlan, ShapeTableGivesTheMaxShareUnderPins) {
  const CostTable t = shape_cost_table(llama_linear_layers(22, 2048, 5632, 32, 4, 16384), {"fp4", "fp8"});
  for (Granularity g : {Granularity::layer, Granularity::gemm}) {
    const PlanProblem p = make_problem(t, g);
    PlanOptions o;
    EXPECT_NEAR(max_fp4_share(p, o), 1.0, 1e-15);
    o.pins.push_back(parse_pin("*.mlp.*=fp8"));
    EXPECT_NEAR(max_fp4_share(p, o), 3.0 / 14, 1e-12);
  }
}
