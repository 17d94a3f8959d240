// snip/plan/model_plan.h: planning for a model from its shapes
// (`snip plan --config MODEL.toml`, docs/planner.md "Planning for a model
// you cannot train here"). LibTorch-free.
//
// A model's FLOPs per training step follow from its shapes alone
// (llama_linear_layers, cost_table.h): a linear layer of in_features IN and
// out_features OUT runs three GEMMs per step (fprop, dgrad, wgrad), each
// 2·T·IN·OUT FLOPs for T tokens per step. What the shapes cannot give is Q,
// the quality loss per option; it comes from a stats file (RUN/stats/
// step-N.json) of another run, usually a small model of the same family,
// carried over by role and relative depth (transfer_costs), or is measured
// on the model itself by one stats step (`snip plan --init-from`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "snip/plan/cost_table.h"
#include "snip/plan/planner.h"

namespace snip::plan {

/// Where a linear layer sits in a Llama model: "model.layers.3.self_attn.q_proj"
/// -> block 3, role "self_attn.q_proj". A name without a block index
/// ("lm_head") has block -1 and the whole name as role.
struct LayerRole {
  int block = -1;
  std::string role;
};
LayerRole layer_role(const std::string& name);

/// A cost table of the shapes alone, for FLOPs accounting and feasibility:
/// per layer "gemms" {fprop, dgrad, wgrad} of gemm_flops each (FLOPs per
/// step) and Q = 0 for every one of `options`. Not a plan input for an
/// optimum (every plan has Σ Q = 0): max_fp4_share and solve()'s
/// feasibility check are what it is for. Throws UserError if `options` is
/// empty.
CostTable shape_cost_table(const std::vector<LinearLayerShape>& layers,
                           const std::vector<std::string>& options);

/// One layer type (role) of a model: its shape, how many blocks have it,
/// the FLOPs per step of all of them (3 GEMMs each) and their share of the
/// FLOPs of every planned layer (a fraction).
struct RoleFlops {
  std::string role;
  int64_t in_features = 0, out_features = 0;
  int count = 0;
  double flops = 0;  // FLOPs per step, all `count` layers, 3 GEMMs each
  double share = 0;  // of Σ flops over every role
};
/// Per role in first-seen order (HF order: q, k, v, o, gate, up, down).
std::vector<RoleFlops> role_flops(const std::vector<LinearLayerShape>& layers);

/// Q carried over from a stats file or cost table of another run.
struct Transfer {
  CostTable table;                // the target's layers, in `target` order
  std::vector<int> source_block;  // per target layer: the source block used
  int source_blocks = 0;          // Ls
  int target_blocks = 0;          // Lt
  double scale = 1;               // factor applied to every Q (see below)
  double low_sum = 0;             // Σ_target Q(low_option) before scaling
};

/// Carries Q (and rel_err) over from `source` (a cost table whose layers
/// have HF names "model.layers.<j>.<role>", blocks 0..Ls-1, every block the
/// same roles) to the layers `target` (llama_linear_layers of the model to
/// plan, blocks 0..Lt-1): target layer (i, role) takes the numbers of
/// source layer (j, role) with j = round(i·(Ls−1)/(Lt−1)) (relative depth;
/// the first block maps to the first, the last to the last; j = 0 when
/// Lt = 1), and its FLOPs from its own shape. Every Q is then multiplied by
/// one factor `scale` so that Σ_target Q(low_option) = 1, the stats step's
/// normalisation (docs/method.md section 3; one factor for all layers and
/// options, so no plan changes); scale = 1 when that sum is 0 or the low
/// option is absent. A per-GEMM source gives per-GEMM entries ("gemms",
/// each GEMM's FLOPs 2·T·IN·OUT), a per-layer source layer entries.
/// Throws UserError naming `source.source` for a source layer without a
/// block index, blocks that are not 0..Ls-1, a role of the target the
/// source lacks at the block used, or a role the source has that the
/// target lacks (another architecture).
Transfer transfer_costs(const CostTable& source, const std::vector<LinearLayerShape>& target,
                        const std::string& low_option);

}  // namespace snip::plan
