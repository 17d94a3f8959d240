// model_plan.cpp: FLOPs of a model's shapes and Q carried over from another
// run (snip/plan/model_plan.h).
#include "snip/plan/model_plan.h"

#include <cmath>
#include <map>
#include <set>

#include "snip/core/error.h"

namespace snip::plan {

LayerRole layer_role(const std::string& name) {
  LayerRole r;
  r.block = block_index(name);
  r.role = name;
  if (r.block < 0) return r;
  const std::string key = "layers." + std::to_string(r.block) + ".";
  const size_t at = name.find(key);
  if (at != std::string::npos) r.role = name.substr(at + key.size());
  return r;
}

CostTable shape_cost_table(const std::vector<LinearLayerShape>& layers,
                           const std::vector<std::string>& options) {
  if (options.empty()) fail("shape cost table: expected at least one option, got none");
  CostTable t;
  t.source = "the model's shapes";
  for (const LinearLayerShape& s : layers) {
    LayerCost c;
    c.name = s.name;
    c.has_gemms = true;
    for (GemmCost& g : c.gemms) {
      g.flops = s.gemm_flops;
      for (const std::string& o : options) g.q[o] = 0.0;
    }
    t.layers.push_back(std::move(c));
  }
  return t;
}

std::vector<RoleFlops> role_flops(const std::vector<LinearLayerShape>& layers) {
  std::vector<RoleFlops> out;
  std::map<std::string, size_t> at;
  double total = 0;
  for (const LinearLayerShape& s : layers) {
    const std::string role = layer_role(s.name).role;
    auto it = at.find(role);
    if (it == at.end()) {
      it = at.emplace(role, out.size()).first;
      out.push_back(RoleFlops{role, s.in_features, s.out_features, 0, 0, 0});
    }
    RoleFlops& r = out[it->second];
    r.count += 1;
    r.flops += 3.0 * s.gemm_flops;
    total += 3.0 * s.gemm_flops;
  }
  for (RoleFlops& r : out) r.share = total > 0 ? r.flops / total : 0;
  return out;
}

Transfer transfer_costs(const CostTable& source, const std::vector<LinearLayerShape>& target,
                        const std::string& low_option) {
  const std::string& src = source.source;
  // Source layers by (block, role).
  std::map<std::pair<int, std::string>, const LayerCost*> by;
  std::set<std::string> source_roles;
  int max_block = -1;
  for (const LayerCost& c : source.layers) {
    const LayerRole r = layer_role(c.name);
    if (r.block < 0)
      fail(src, ": layer '", c.name,
           "' has no block index (model.layers.N...): Q can only be carried over between Llama blocks");
    by[{r.block, r.role}] = &c;
    source_roles.insert(r.role);
    max_block = std::max(max_block, r.block);
  }
  if (source.layers.empty()) fail(src, ": expected layers to carry Q over from, got none");
  const int ls = max_block + 1;
  for (int j = 0; j < ls; ++j) {
    bool any = false;
    for (const std::string& role : source_roles) any = any || by.count({j, role});
    if (!any) fail(src, ": expected blocks 0..", ls - 1, ", got none at block ", j);
  }
  Transfer t;
  t.source_blocks = ls;
  std::set<std::string> target_roles;
  for (const LinearLayerShape& s : target) {
    const LayerRole r = layer_role(s.name);
    if (r.block < 0) fail("model layer '", s.name, "' has no block index");
    t.target_blocks = std::max(t.target_blocks, r.block + 1);
    target_roles.insert(r.role);
  }
  for (const std::string& role : source_roles)
    if (!target_roles.count(role))
      fail(src, ": has layers of role '", role, "' the model to plan does not have (another architecture?)");
  const bool per_gemm = source.per_gemm();
  const int lt = t.target_blocks;
  t.table.source = src + " (carried over by role and relative depth)";
  for (const LinearLayerShape& s : target) {
    const LayerRole r = layer_role(s.name);
    const int j = lt == 1 ? 0
                          : static_cast<int>(std::lround(static_cast<double>(r.block) * (ls - 1) /
                                                         static_cast<double>(lt - 1)));
    auto it = by.find({j, r.role});
    if (it == by.end())
      fail(src, ": has no layer model.layers.", j, ".", r.role, " to carry Q over to ", s.name);
    const LayerCost& from = *it->second;
    LayerCost c;
    c.name = s.name;
    if (per_gemm) {
      c.has_gemms = true;
      for (size_t g = 0; g < c.gemms.size(); ++g) {
        c.gemms[g].flops = s.gemm_flops;
        c.gemms[g].q = from.gemms[g].q;
        c.gemms[g].rel_err = from.gemms[g].rel_err;
      }
    } else {
      c.flops = 3.0 * s.gemm_flops;
      if (from.has_gemms) {
        // A table of mixed forms is not per_gemm(): sum the GEMMs (make_problem's rule).
        std::map<std::string, int> n;
        for (const GemmCost& g : from.gemms)
          for (const auto& [o, q] : g.q) c.q[o] += q, n[o] += 1;
        for (auto it2 = c.q.begin(); it2 != c.q.end();)
          it2 = n[it2->first] == 3 ? std::next(it2) : c.q.erase(it2);
        for (const GemmCost& g : from.gemms)
          for (const auto& [o, e] : g.rel_err) c.rel_err[o] += e / 3.0;
      } else {
        c.q = from.q;
        c.rel_err = from.rel_err;
      }
    }
    c.stage = -1;
    t.source_block.push_back(j);
    t.table.layers.push_back(std::move(c));
  }
  // One factor so that Σ Q(low) = 1 over the target's layers.
  double sum = 0;
  for (const LayerCost& c : t.table.layers) {
    if (c.has_gemms) {
      for (const GemmCost& g : c.gemms) {
        auto q = g.q.find(low_option);
        if (q != g.q.end()) sum += q->second;
      }
    } else {
      auto q = c.q.find(low_option);
      if (q != c.q.end()) sum += q->second;
    }
  }
  t.low_sum = sum;
  if (sum > 0 && std::isfinite(sum)) {
    t.scale = 1.0 / sum;
    for (LayerCost& c : t.table.layers) {
      for (auto& [o, q] : c.q) q *= t.scale;
      if (c.has_gemms)
        for (GemmCost& g : c.gemms)
          for (auto& [o, q] : g.q) q *= t.scale;
    }
  }
  return t;
}

}  // namespace snip::plan
