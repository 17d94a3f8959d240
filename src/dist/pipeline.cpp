// Pipeline layout, schedules and stage balance (see dist/pipeline.h).
#include "snip/dist/pipeline.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <sstream>
#include <unordered_set>

#include "snip/formats/fake_quant.h"
#include "snip/recipes/recipe.h"
#include "snip/core/error.h"

namespace snip::dist {

std::vector<int> PipelineLayout::pipeline_ranks(int replica) const {
  std::vector<int> out;
  for (int s = 0; s < stages; ++s) out.push_back(rank_of(s, replica));
  return out;
}

std::vector<int> PipelineLayout::replica_ranks(int stage) const {
  std::vector<int> out;
  for (int d = 0; d < replicas; ++d) out.push_back(rank_of(stage, d));
  return out;
}

int PipelineLayout::stage_of_block(int64_t block) const {
  for (int s = 0; s < stages; ++s)
    if (block >= bounds[size_t(s)] && block < bounds[size_t(s) + 1]) return s;
  fail("pipeline: block ", block, " is outside the ", bounds.back(), " blocks");
}

int64_t block_of(const std::string& name) {
  static const std::string layers = "model.layers.";
  if (name.rfind(layers, 0) != 0) return -1;
  const size_t dot = name.find('.', layers.size());
  const std::string idx = name.substr(layers.size(), dot == std::string::npos ? std::string::npos : dot - layers.size());
  if (idx.empty() || idx.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(idx);
}

int PipelineLayout::stage_of_param(const std::string& name) const {
  if (const int64_t b = block_of(name); b >= 0) return stage_of_block(b);
  if (name == "model.embed_tokens.weight") return 0;
  if (name == "model.norm.weight" || name == "lm_head.weight") return stages - 1;
  fail("pipeline: parameter '", name, "' belongs to no stage");
}

std::string PipelineLayout::describe() const {
  std::ostringstream os;
  for (int s = 0; s < stages; ++s)
    os << (s ? " | " : "") << bounds[size_t(s)] << "-" << bounds[size_t(s) + 1] - 1;
  return os.str();
}

std::vector<double> stage_costs(const std::vector<int64_t>& bounds, const std::vector<double>& block_cost,
                                double first_extra, double last_extra) {
  const size_t S = bounds.size() - 1;
  std::vector<double> c(S, 0.0);
  for (size_t s = 0; s < S; ++s)
    for (int64_t b = bounds[s]; b < bounds[s + 1]; ++b) c[s] += block_cost[size_t(b)];
  c[0] += first_extra;
  c[S - 1] += last_extra;
  return c;
}

double imbalance(const std::vector<double>& costs) {
  if (costs.empty()) return 1.0;
  const double mean = std::accumulate(costs.begin(), costs.end(), 0.0) / double(costs.size());
  return mean > 0 ? *std::max_element(costs.begin(), costs.end()) / mean : 1.0;
}

std::vector<int64_t> balanced_split(const std::vector<double>& cost, int S, double first_extra, double last_extra) {
  const int64_t L = int64_t(cost.size());
  SNIP_CHECK(S >= 1 && S <= L, "balanced_split: ", S, " stages for ", L, " blocks");
  std::vector<double> pre(size_t(L) + 1, 0.0);
  for (int64_t i = 0; i < L; ++i) pre[size_t(i) + 1] = pre[size_t(i)] + cost[size_t(i)];
  // Cost of a stage holding blocks [a, b) as stage k of S.
  auto seg = [&](int64_t a, int64_t b, int k) {
    return pre[size_t(b)] - pre[size_t(a)] + (k == 0 ? first_extra : 0.0) + (k == S - 1 ? last_extra : 0.0);
  };
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][a]: the smallest largest cost splitting blocks [a, L) into stages k..S-1.
  std::vector<std::vector<double>> best(size_t(S) + 1, std::vector<double>(size_t(L) + 1, inf));
  best[size_t(S)][size_t(L)] = 0.0;
  for (int k = S - 1; k >= 0; --k)
    for (int64_t a = 0; a < L; ++a)
      for (int64_t b = a + 1; b <= L; ++b)
        best[size_t(k)][size_t(a)] =
            std::min(best[size_t(k)][size_t(a)], std::max(seg(a, b, k), best[size_t(k) + 1][size_t(b)]));
  const double target = best[0][0] * (1.0 + 1e-12) + 1e-300;
  // From the front, each stage as large as the optimum allows (for equal
  // costs: the first stages get the extra blocks, as the even split).
  std::vector<int64_t> bounds{0};
  int64_t a = 0;
  for (int k = 0; k < S; ++k) {
    int64_t pick = -1;
    for (int64_t b = L - (S - k - 1); b > a; --b)
      if (seg(a, b, k) <= target && best[size_t(k) + 1][size_t(b)] <= target) {
        pick = b;
        break;
      }
    SNIP_CHECK(pick > a, "balanced_split: no split at stage ", k);
    bounds.push_back(pick);
    a = pick;
  }
  return bounds;
}

std::vector<int64_t> stage_bounds(const std::string& split, int64_t L, int S, const std::vector<double>& block_cost,
                                  double first_extra, double last_extra) {
  if (S < 1 || S > L)
    fail("dist.pipeline_stages: expected between 1 and the model's ", L, " decoder blocks, got ", S,
         " (every stage needs a block)");
  if (split == "balanced") return balanced_split(block_cost, S, first_extra, last_extra);
  std::vector<int64_t> counts;
  if (split == "even") {
    for (int s = 0; s < S; ++s) counts.push_back(L / S + (s < L % S ? 1 : 0));
  } else {
    if (!split.empty() && split.back() == ',')
      fail("dist.stage_split: expected balanced, even or positive block counts such as \"3,2\", got \"", split, "\"");
    std::stringstream ss(split);
    std::string item;
    while (std::getline(ss, item, ',')) {
      char* end = nullptr;
      const long long v = std::strtoll(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || v < 1)
        fail("dist.stage_split: expected balanced, even or positive block counts such as \"3,2\", got \"", split,
             "\"");
      counts.push_back(v);
    }
    if (int64_t(counts.size()) != S || std::accumulate(counts.begin(), counts.end(), int64_t{0}) != L)
      fail("dist.stage_split: expected ", S, " block counts (dist.pipeline_stages) summing to the model's ", L,
           " blocks, got \"", split, "\"");
  }
  std::vector<int64_t> bounds{0};
  for (int64_t c : counts) bounds.push_back(bounds.back() + c);
  return bounds;
}

std::map<std::string, double> stage_cost_factors(const recipes::RecipeSet& recipes, const std::string& spec,
                                                 const std::vector<std::string>& options) {
  std::map<std::string, double> out;
  for (const std::string& o : options) {
    double f = 1.0;
    if (o != "bf16" && o != "none") {
      try {
        int bits = 16;
        for (const auto& s : recipes.find(o).operands) bits = std::min(bits, s.element.bits);
        f = double(bits) / 16.0;
      } catch (const UserError&) {
        f = 1.0;  // not a recipe (a custom option): full cost
      }
    }
    out[o] = f;
  }
  if (spec == "bits") return out;
  std::set<std::string> seen;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t eq = item.find('=');
    char* end = nullptr;
    const double v = eq == std::string::npos ? 0.0 : std::strtod(item.c_str() + eq + 1, &end);
    if (eq == std::string::npos || eq == 0 || !end || *end != '\0' || !(v > 0) || !std::isfinite(v))
      fail("dist.stage_cost: expected \"bits\", \"measured\" or a list such as \"fp4=0.25,fp8=0.5,bf16=1\" (factors > 0), got \"",
           spec, "\"");
    const std::string name = item.substr(0, eq);
    if (!seen.insert(name).second)
      fail("dist.stage_cost: option '", name, "' given twice in \"", spec, "\"");
    if (name != "bf16") {
      try {
        recipes.find(name);
      } catch (const UserError&) {
        fail("dist.stage_cost: '", name, "' is not a precision option (a recipe of `snip formats --recipes`, or bf16)");
      }
    }
    out[name] = v;
  }
  return out;
}

std::vector<std::pair<bool, int>> schedule_ops(PipelineSchedule schedule, int S, int s, int M) {
  std::vector<std::pair<bool, int>> ops;
  if (schedule == PipelineSchedule::kGpipe) {
    for (int m = 0; m < M; ++m) ops.emplace_back(true, m);
    for (int m = 0; m < M; ++m) ops.emplace_back(false, m);
    return ops;
  }
  const int warm = std::min(S - s - 1, M);
  int f = 0, b = 0;
  for (; f < warm; ++f) ops.emplace_back(true, f);
  while (f < M) {
    ops.emplace_back(true, f++);
    ops.emplace_back(false, b++);
  }
  while (b < M) ops.emplace_back(false, b++);
  return ops;
}

double ideal_bubble(int S, int M) { return double(S - 1) / double(M + S - 1); }

ZeroPartition owner_partition(const std::vector<std::string>& names, const std::vector<torch::Tensor>& params,
                              const std::vector<int>& owner, int world) {
  SNIP_CHECK(names.size() == params.size() && owner.size() == params.size(), "owner_partition: sizes differ");
  ZeroPartition part;
  part.world = world;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (size_t i = 0; i < params.size(); ++i)
    if (seen.insert(params[i].unsafeGetTensorImpl()).second) {
      SNIP_CHECK(owner[i] >= 0 && owner[i] < world, "owner_partition: owner ", owner[i], " of ", names[i]);
      part.names.push_back(names[i]);
      part.params.push_back(params[i]);
      part.owner.push_back(owner[i]);
    }
  part.elements.assign(size_t(world), 0);
  part.offset.assign(part.params.size(), 0);
  for (size_t i = 0; i < part.params.size(); ++i) {
    part.offset[i] = part.elements[size_t(part.owner[i])];
    part.elements[size_t(part.owner[i])] += part.params[i].numel();
  }
  return part;
}

namespace {

formats::QuantSpec boundary_spec(bool e5m2) {
  formats::QuantSpec spec;
  spec.element = e5m2 ? formats::kE5M2 : formats::kE4M3;
  spec.rule = formats::ScaleRule::kCurrent;
  spec.scale_format = formats::ScaleFormat::kFP32;
  spec.block = formats::BlockShape::tensor();
  spec.rounding = formats::Rounding::kRNE;
  return spec;
}

}  // namespace

torch::Tensor boundary_encode(const torch::Tensor& t, bool e5m2) {
  SNIP_CHECK(t.scalar_type() == torch::kFloat && t.is_contiguous(), "boundary_encode: contiguous FP32 expected");
  const int64_t cols = t.dim() > 0 ? t.size(-1) : 1;
  const int64_t n = t.numel(), rows = n / std::max<int64_t>(cols, 1);
  const formats::QuantizedTensor q =
      formats::quantize_packed(t.data_ptr<float>(), rows, cols, boundary_spec(e5m2), formats::RoundingKey{});
  SNIP_CHECK(int64_t(q.data.size()) == n && q.scales.blocks.size() == 1, "boundary_encode: unexpected layout");
  torch::Tensor out = torch::empty({n + 4}, torch::kUInt8);
  uint8_t* o = out.data_ptr<uint8_t>();
  std::memcpy(o, q.data.data(), size_t(n));
  const uint32_t code = q.scales.blocks[0].code;  // the FP32 bits of the decode scale
  for (int k = 0; k < 4; ++k) o[n + k] = uint8_t(code >> (8 * k));
  return out;
}

void boundary_decode(const torch::Tensor& bytes, bool e5m2, torch::Tensor& out) {
  SNIP_CHECK(out.scalar_type() == torch::kFloat && out.is_contiguous(), "boundary_decode: contiguous FP32 expected");
  const int64_t n = out.numel(), cols = out.dim() > 0 ? out.size(-1) : 1, rows = n / std::max<int64_t>(cols, 1);
  if (bytes.numel() != n + 4)
    fail("pipeline: an FP8 boundary message of ", bytes.numel(), " bytes, expected ", n + 4, " (", n,
         " codes and a 4-byte scale)");
  const uint8_t* p = bytes.data_ptr<uint8_t>();
  formats::QuantizedTensor q;
  q.spec = boundary_spec(e5m2);
  q.rows = rows;
  q.cols = cols;
  q.data.assign(p, p + n);
  uint32_t code = 0;
  for (int k = 0; k < 4; ++k) code |= uint32_t(p[n + k]) << (8 * k);
  float d;
  std::memcpy(&d, &code, 4);
  formats::ScaleArray& sa = q.scales;
  sa.block_rows = rows;
  sa.block_cols = cols;
  sa.grid_rows = sa.grid_cols = 1;
  sa.blocks.assign(1, formats::BlockScale{d, d != 0 ? 1.0f / d : 0.0f, code});
  formats::dequantize(q, out.data_ptr<float>());
}

int64_t boundary_quantize(torch::Tensor& t, bool e5m2) {
  SNIP_CHECK(t.scalar_type() == torch::kFloat && t.is_contiguous(), "boundary_quantize: contiguous FP32 expected");
  const formats::QuantSpec spec = boundary_spec(e5m2);
  const int64_t cols = t.dim() > 0 ? t.size(-1) : 1;
  const int64_t rows = t.numel() / std::max<int64_t>(cols, 1);
  float* p = t.data_ptr<float>();
  formats::fake_quantize(p, p, rows, cols, spec, formats::RoundingKey{});
  return t.numel() + 4;
}

}  // namespace snip::dist
