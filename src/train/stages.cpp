// Pipeline stages in a run (session.h PipelineStages): the split, the
// stage's parameters and optimizer, the stage balancer and the gather of
// every stage's quantizer state.
#include <cstring>
#include <set>

#include "session.h"

#include <fmt/ranges.h>

#include "snip/dist/pipeline.h"
#include "snip/io/json.h"
#include "snip/recipes/gemm.h"
#include "snip/train/checkpoint.h"
#include "snip/train/optimizer.h"
#include "stage_cost.h"
#include "snip/core/error.h"

namespace snip {

using json = nlohmann::json;

PipelineStages::PipelineStages(TrainSession& s) : s_(s) {
  const int S = s.S, DP = s.DP;
  const DistConfig& dopt = s.dopt();
  pc.layout.stages = S;
  pc.layout.replicas = DP;
  const auto [block_cost, head] = block_costs({});  // no plan yet: every layer at factor 1
  pc.layout.bounds = dist::stage_bounds(dopt.stage_split, s.mcfg.num_hidden_layers, S, block_cost, 0.0, head);
  // A resumed run keeps the split its checkpoint had (a rebalance moved it)
  // when the stage count and the rule are the same.
  if (!s.resume_ckpt.empty() && dopt.stage_split == "balanced") {
    const TrainerState& saved = s.resume_typed;
    if (saved.pipeline && saved.pipeline->stages == S && saved.pipeline->bounds.back() == s.mcfg.num_hidden_layers)
      pc.layout.bounds = saved.pipeline->bounds;
  }
  pc.stage = pc.layout.stage_of(s.world.rank);
  pc.replica = pc.layout.replica_of(s.world.rank);
  pc.schedule = dopt.pipeline_schedule;
  pc.micro_batches = s.accum;
  pc.fp8_boundary = dopt.boundary_comm == BoundaryComm::kFp8;
  pc.tied = s.mcfg.tie_word_embeddings;
  assign_stage_params();
  s.optimizer = make_optimizer(pc.stage_params, s.tc());
  pipe_comm = s.comm->subgroup(pc.layout.pipeline_ranks(pc.replica), "pipeline" + std::to_string(pc.replica));
  if (DP > 1) dp_comm = s.comm->subgroup(pc.layout.replica_ranks(pc.stage), "replicas" + std::to_string(pc.stage));
  pc.pipe = pipe_comm.get();
  pc.dp = dp_comm.get();
  pc.world = s.comm.get();
  const std::vector<double> costs = dist::stage_costs(pc.layout.bounds, block_cost, 0.0, head);
  if (!s.quiet)
    spdlog::info("dist: {} pipeline stages x {} replica{} ({} schedule, {} micro-batches, boundaries in {}); "
                 "blocks per stage {}; estimated stage imbalance {:.3f} (slowest / mean); this rank: stage {}, "
                 "replica {}", S, DP, DP == 1 ? "" : "s", to_string(pc.schedule), s.accum, to_string(dopt.boundary_comm),
                 pc.layout.describe(), dist::imbalance(costs), pc.stage, pc.replica);
  imbalance_now_ = std::get<0>(balance({}));
}

// The parameters of each stage under pc.layout.bounds: pc.stage_params,
// pc.norm_part and stage_part.
void PipelineStages::assign_stage_params() {
  std::vector<std::string> names;
  std::vector<torch::Tensor> ps;
  std::vector<int> owner_stage, owner_rank;
  pc.stage_params.clear();
  for (const auto& np : s_.model->named_parameters()) {
    names.push_back(np.key());
    ps.push_back(np.value());
    owner_stage.push_back(pc.layout.stage_of_param(np.key()));
    owner_rank.push_back(pc.layout.rank_of(owner_stage.back(), 0));
    if (owner_stage.back() == pc.stage || (pc.tied && pc.stage == s_.S - 1 && np.key() == "model.embed_tokens.weight"))
      pc.stage_params.push_back(np.value());
  }
  pc.norm_part = dist::owner_partition(names, ps, owner_stage, s_.S);
  stage_part = dist::owner_partition(names, ps, owner_rank, s_.R);
}

// The estimated time of each block under `assign` (relative units: FLOPs x
// the option's cost factor, dist.stage_cost; a layer without a plan at
// factor 1), plus the attention products; and lm_head's, on the last stage.
std::pair<std::vector<double>, double> PipelineStages::block_costs(
    const std::map<PlanKey, std::string>& assign) const {
  const LlamaConfig& mcfg = s_.mcfg;
  const double N = double(s_.B * s_.T), C = double(mcfg.hidden_size);
  std::vector<double> block_cost(size_t(mcfg.num_hidden_layers), 12.0 * N * double(s_.T) * C);
  std::vector<std::string> options{"bf16"};
  for (const auto& [item, o] : assign) options.push_back(o);
  const std::map<std::string, double> f = s_.dopt().stage_cost == "measured"
                                              ? measured_factors_
                                              : dist::stage_cost_factors(s_.rc.recipes, s_.dopt().stage_cost, options);
  auto factor = [&](const std::string& o) {  // an option without a factor costs as BF16
    const auto it = f.find(o);
    return it == f.end() ? 1.0 : it->second;
  };
  for (const QuantLinear& l : s_.model->linear_layers()) {
    const int64_t blk = dist::block_of(l->name);
    const double gemm = 2.0 * N * double(l->in_features) * double(l->out_features);
    if (assign.empty()) block_cost[size_t(blk)] += 3.0 * gemm;
    if (const auto it = assign.find(PlanKey{l->name, std::nullopt}); it != assign.end())  // a layer's option
      block_cost[size_t(blk)] += gemm * factor(it->second) * 3.0;
    for (Gemm g : kAllGemms)  // or each GEMM's
      if (const auto it = assign.find(PlanKey{l->name, g}); it != assign.end())
        block_cost[size_t(blk)] += gemm * factor(it->second);
  }
  return std::make_pair(block_cost, 6.0 * N * C * double(mcfg.vocab_size));
}

// The stages' estimated imbalance under the assignment in force, the
// balanced split for it and that split's imbalance.
std::tuple<double, std::vector<int64_t>, double> PipelineStages::balance(
    const std::map<PlanKey, std::string>& assign) const {
  const auto [block_cost, head] = block_costs(assign);
  const std::vector<double> now = dist::stage_costs(pc.layout.bounds, block_cost, 0.0, head);
  const std::vector<int64_t> best = dist::balanced_split(block_cost, s_.S, 0.0, head);
  const std::vector<double> then = dist::stage_costs(best, block_cost, 0.0, head);
  return std::make_tuple(dist::imbalance(now), best, dist::imbalance(then));
}

void PipelineStages::measure_costs() {
  const RunConfig& rc = s_.rc;
  std::vector<std::string> options{"bf16"};
  for (const std::string& o : rc.precision.options)
    if (o != "bf16") options.push_back(o);
  for (const std::string& o : {rc.precision.warmup_precision, rc.precision.final_precision, rc.precision.uniform_option})
    if (!o.empty() && o != "bf16" && o != "none") options.push_back(o);
  if (rc.guard.enabled && rc.guard.raise_option != "bf16") options.push_back(rc.guard.raise_option);
  std::sort(options.begin(), options.end());
  options.erase(std::unique(options.begin(), options.end()), options.end());
  const auto m = measure_stage_cost_factors(rc.recipes, options, s_.B * s_.T, s_.mcfg.hidden_size, s_.mcfg.intermediate_size,
                                            s_.gemm);
  std::vector<double> v;
  for (const std::string& o : options) v.push_back(m.at(o));
  torch::Tensor t = torch::tensor(v, torch::kDouble);
  s_.comm->broadcast(t, 0);
  for (size_t i = 0; i < options.size(); ++i) measured_factors_[options[i]] = t[int64_t(i)].item<double>();
  if (!s_.quiet) {
    std::string line;
    for (const auto& [o, f] : measured_factors_) line += fmt::format("{}{}={:.3g}", line.empty() ? "" : ", ", o, f);
    spdlog::info("pipeline: GEMM cost per option, measured on rank 0 (dist.stage_cost = measured): {}", line);
  }
}

void PipelineStages::set_controller_stages() {
  std::vector<int> stage_of_layer;
  for (const QuantLinear& l : s_.model->linear_layers()) stage_of_layer.push_back(pc.layout.stage_of_param(l->name));
  s_.ctl->set_pipeline(std::move(stage_of_layer), pc.stage, s_.dopt().stage_boundary);
}

json PipelineStages::quantizer_state(const json& mine, bool own) {
  dist::Communicator& comm = *s_.comm;
  const std::string bytes = mine.dump();
  const std::vector<torch::Tensor> lens = comm.allgather(torch::tensor({int64_t(bytes.size())}, torch::kLong));
  int64_t longest = 0;
  for (const torch::Tensor& l : lens) longest = std::max(longest, l.item<int64_t>());
  torch::Tensor buf = torch::zeros({longest}, torch::kUInt8);
  if (!bytes.empty()) std::memcpy(buf.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  const std::vector<torch::Tensor> all = comm.allgather(buf);
  const std::vector<int>& stage_of_layer = s_.ctl->stage_of_layer();
  json out = json::object();
  for (int r = 0; r < s_.R; ++r) {
    const int stage = pc.layout.stage_of(r);
    if (own ? (stage == pc.stage ? r != s_.world.rank : pc.layout.replica_of(r) != 0) : pc.layout.replica_of(r) != 0)
      continue;
    const json q = io::parse_json(std::string(reinterpret_cast<const char*>(all[size_t(r)].data_ptr<uint8_t>()),
                                              size_t(lens[size_t(r)].item<int64_t>())),
                                  str_cat("rank ", r, "'s quantizer state"));
    for (const auto& [option, st] : q.items()) {
      if (!st.is_object()) continue;
      json& o = out[option];
      if (o.is_null()) {
        o = st;
        for (const char* key : {"delayed", "residuals"})
          if (o.contains(key)) o[key] = json::array();
      }
      for (const char* key : {"delayed", "residuals"})
        if (st.contains(key))
          for (const json& e : st[key]) {
            const int64_t layer = e.at("layer").get<int64_t>();
            if (layer >= 0 && size_t(layer) < stage_of_layer.size() && stage_of_layer[size_t(layer)] == stage)
              o[key].push_back(e);
          }
    }
  }
  json kept = json::object();  // as PrecisionController::state(): options with some state
  for (const auto& [option, st] : out.items())
    if (!st.value("delayed", json::array()).empty() || !st.value("residuals", json::array()).empty()) kept[option] = st;
  return kept;
}

void PipelineStages::record(StepRecord& rec, const StepResult& r) {
  if (rebalanced_to_) rec.rebalanced_to = std::exchange(rebalanced_to_, std::nullopt);
  if (r.pipe_bubble < 0) return;
  rec.pipe_bubble = r.pipe_bubble;
  rec.boundary_bytes = r.boundary_bytes;
  if (!r.precision.metrics.contains("stats_seconds")) bubble_sum_ += r.pipe_bubble, ++bubble_steps_;
  boundary_bytes_ = r.boundary_bytes;
  if (r.precision.decided) after_plan(rec);
}

void PipelineStages::after_plan(StepRecord& rec) {
  const auto [imb, best, best_imb] = balance(s_.ctl->assignment().options);
  imbalance_now_ = imb;
  rec.stage_imbalance = imb;
  const bool better = best != pc.layout.bounds && best_imb < imb * 0.99;
  if (better && s_.dopt().rebalance && s_.dopt().stage_split == "balanced") {
    pending_bounds_ = best;
    if (!s_.quiet)
      spdlog::info("pipeline: under the plan before step {} the stages' estimated imbalance is {:.3f} "
                   "(slowest / mean); blocks move to bounds [{}] ({:.3f}) at the next checkpoint "
                   "(dist.rebalance)", s_.step, imb, fmt::join(best, ", "), best_imb);
  } else if (better && !s_.quiet) {
    spdlog::info("pipeline: under the plan before step {} the stages' estimated imbalance is {:.3f} "
                 "(slowest / mean); a split at block bounds [{}] would give {:.3f} (dist.stage_split at "
                 "a resume, or dist.rebalance with a balanced split)", s_.step, imb, fmt::join(best, ", "), best_imb);
  }
}

// dist.rebalance: blocks move between stages through the checkpoint just
// written (every rank holds every weight and every stage's quantizer state
// after it): each rank's AdamW is rebuilt for its new stage's parameters
// and loads their state from the checkpoint's shards by name. A step's
// arithmetic does not depend on the split; the next plan's stage rows and
// boundary pins do.
void PipelineStages::rebalance_if_pending(const std::string& checkpoint) {
  if (pending_bounds_.empty()) return;
  const std::vector<int64_t> from = pc.layout.bounds;
  pc.layout.bounds = pending_bounds_;
  pending_bounds_.clear();
  assign_stage_params();
  {  // the gradients of blocks that left this stage are not kept
    torch::NoGradGuard ng;
    std::set<const c10::TensorImpl*> mine;
    for (const torch::Tensor& t : pc.stage_params) mine.insert(t.unsafeGetTensorImpl());
    for (torch::Tensor& t : s_.params)
      if (!mine.count(t.unsafeGetTensorImpl())) t.mutable_grad() = torch::Tensor();
  }
  torch::optim::AdamW& optimizer = *s_.optimizer;
  optimizer.param_groups().clear();
  optimizer.state().clear();
  const auto fresh = make_optimizer(pc.stage_params, s_.tc());  // the groups of the new stage's parameters
  for (const auto& g : fresh->param_groups())
    optimizer.add_param_group(torch::optim::OptimizerParamGroup(g.params(), g.options().clone()));
  load_checkpoint_optimizer(checkpoint, verify_checkpoint(checkpoint), optimizer, s_.model, s_.tc(), s_.step,
                            s_.shard_part);
  set_controller_stages();
  imbalance_now_ = std::get<0>(balance(s_.ctl->assignment().options));
  if (!s_.quiet)
    spdlog::info("pipeline: rebalanced after step {}: blocks per stage {} -> {} (estimated imbalance {:.3f})",
                 s_.step, dist::PipelineLayout{s_.S, s_.DP, from}.describe(), pc.layout.describe(), imbalance_now_);
  rebalanced_to_ = pc.layout.bounds;  // in the next step's record
}

void PipelineStages::check_replica_weights(const std::string& when) {
  if (!dp_comm) return;  // the replicas of a stage hold the same stage weights
  std::vector<std::string> names;
  std::vector<torch::Tensor> mine;
  for (size_t i = 0; i < stage_part.params.size(); ++i)
    if (pc.layout.stage_of_param(stage_part.names[i]) == pc.stage) {
      names.push_back(stage_part.names[i]);
      mine.push_back(stage_part.params[i]);
    }
  dist::check_same_weights(*dp_comm, names, mine, str_cat(when, " (stage ", pc.stage, ")"));
}

json PipelineStages::summary() const {
  return {{"stages", s_.S}, {"replicas", s_.DP}, {"schedule", to_string(pc.schedule)},
          {"micro_batches", s_.accum}, {"bounds", pc.layout.bounds},
          {"boundary_comm", to_string(s_.dopt().boundary_comm)}, {"boundary_bytes_per_step", boundary_bytes_},
          {"bubble", bubble_steps_ ? json(bubble_sum_ / double(bubble_steps_)) : json(nullptr)},
          {"ideal_bubble", dist::ideal_bubble(s_.S, int(s_.accum))}, {"stage_imbalance", imbalance_now_}};
}

}  // namespace snip
