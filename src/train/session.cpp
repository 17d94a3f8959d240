// Opening a run of `snip train` (session.h): the run folder, --init-from, the
// configuration, the ranks and their layout. The data and the model are
// session_model.cpp, a checkpoint's restore and RUN's files session_resume.cpp.
#include "session.h"

#include <fmt/ranges.h>

#include "snip/dist/pipeline.h"
#include "snip/io/atomic_file.h"
#include "snip/io/json.h"
#include "snip/train/checkpoint.h"
#include "snip/core/error.h"
#include "snip/core/hash.h"

namespace snip {

namespace fs = std::filesystem;
using json = nlohmann::json;

TrainSession::TrainSession() = default;
TrainSession::~TrainSession() = default;

std::unique_ptr<TrainSession> open_session(const Config& cfg, const TrainOptions& opts) {
  auto s = std::make_unique<TrainSession>();
  s->cfg = cfg;
  s->opts = opts;
  if (opts.run_dir.empty()) fail("--run-dir: expected a directory name, got an empty string");
  s->run = fs::path(opts.run_dir);
  // Several processes (dist/world.h): rank 0 alone writes in RUN.
  s->world = dist::World::from_env();
  s->writer = s->world.rank == 0;
  s->quiet = opts.quiet || !s->writer;
  // --quiet / --log-level warning (src/cli/run_app.h): no progress lines,
  // plan tables or samples either; warnings still print.
  s->chatty = !s->quiet && spdlog::should_log(spdlog::level::info);
  // ---- validate everything before touching the run directory
  check_run_dir(*s);
  read_init_folder(*s);
  resolve_config(*s);
  check_resume_config(*s);
  connect_ranks(*s);
  check_layout(*s);
  open_data(*s);
  build_model(*s);
  // ---- only now is anything written (by rank 0 alone; every rank has
  // checked what it reads before rank 0 writes)
  open_run_files(*s);
  announce(*s);
  return s;
}

// One writer per run folder; what --resume continues, or that a new run
// does not overwrite one.
void check_run_dir(TrainSession& s) {
  const TrainOptions& opts = s.opts;
  const fs::path& run = s.run;
  // One writer per run folder: a second trainer stops here, naming the first.
  if (s.writer && fs::is_directory(run)) s.lock = std::make_unique<io::DirLock>(opts.run_dir, "run directory");
  if (opts.resume) {
    s.resume_ckpt = latest_checkpoint(opts.run_dir);
    if (s.resume_ckpt.empty() && !fs::is_regular_file(run / "config.toml"))
      fail("--resume: no complete checkpoint in ", (run / "checkpoints").string());
    if (s.resume_ckpt.empty() && fs::is_directory(run / "checkpoints")) {
      // A run stopped before its first complete checkpoint (a step-N.tmp at
      // most) starts again from step 0: the same steps again. One whose
      // markers name checkpoints lost them: starting again would rewrite its
      // metrics.jsonl.
      std::string trace;
      for (const char* marker : {"last_good.json", "good.json"})
        if (trace.empty() && fs::exists(run / "checkpoints" / marker))
          trace = (run / "checkpoints" / marker).string() + " names checkpoints that are gone";
      if (!trace.empty())
        fail("--resume: ", opts.run_dir, " has no complete checkpoint but ", trace, ": refusing to start it again "
             "from step 0 (that would erase its metrics.jsonl); keep the folder for inspection and train into "
             "another --run-dir");
    }
    // A finished run says so first (before its data folder, which may be gone).
    if (!s.resume_ckpt.empty() && fs::exists(run / "summary.json")) {
      const json st = verify_checkpoint(s.resume_ckpt);
      const int64_t at = st.value("step", int64_t{-1}), want = s.cfg.get_int("train.max_steps");
      if (at >= want)
        fail("--resume: the checkpoint is at step ", at, " and train.max_steps is ", want,
             ": nothing to do (raise train.max_steps to train further)");
    }
  } else if ((fs::exists(run / "metrics.jsonl") && !fs::is_empty(run / "metrics.jsonl")) ||
             fs::exists(run / "checkpoints")) {
    // (an empty metrics.jsonl alone: a start killed before its first step)
    fail("run directory ", opts.run_dir, " already holds a run; continue it with --resume, or choose "
         "another --run-dir (or delete it)");
  }
  for (const char* sub : {"checkpoints", "plans", "stats"})
    if (fs::exists(run / sub) && !fs::is_directory(run / sub))
      fail("run directory ", opts.run_dir, ": ", (run / sub).string(), " is not a folder (move it away)");
}

// --init-from: the folder's config.json is reconciled with the run's
// [model] options field by field (adopt_hf_config: taken where the run
// leaves an option unset, else equal or refused) before the configuration
// is parsed, so the model, the resolved config.toml and every checkpoint
// describe the model the weights belong to.
void read_init_folder(TrainSession& s) {
  const TrainOptions& opts = s.opts;
  // A LoRA run resumed without --init-from adapts the base its checkpoint
  // names (trainer_state.json "lora".base.dir; checked by SHA-256 later).
  std::string init_dir = opts.init_from;
  if (init_dir.empty() && !s.resume_ckpt.empty() && fs::exists(fs::path(s.resume_ckpt) / "adapter_config.json")) {
    const std::string sp = (fs::path(s.resume_ckpt) / "trainer_state.json").string();
    const json st = io::parse_json(io::read_file(sp), sp);
    if (!st.contains("lora") || !st["lora"].contains("base") || !st["lora"]["base"].contains("dir") ||
        !st["lora"]["base"]["dir"].is_string())
      fail("--resume: ", sp, ": expected \"lora\".base.dir, the base model the adapters were trained on (corrupt?)");
    init_dir = st["lora"]["base"]["dir"].get<std::string>();
  }
  // A full run resumed with --init-from: the checkpoint's weights are the
  // ones trained on; the folder only names where they started (a LoRA run's
  // --init-from names where its base moved, and is used).
  if (!opts.init_from.empty() && !s.resume_ckpt.empty() &&
      !fs::exists(fs::path(s.resume_ckpt) / "adapter_config.json") && !s.quiet)
    spdlog::warn("--init-from {}: with --resume the weights are {}'s; the folder is only checked against the "
                 "run's model", opts.init_from, s.resume_ckpt);
  if (!opts.init_from.empty() && fs::exists(fs::path(opts.init_from) / "adapter_config.json"))
    fail("--init-from ", opts.init_from, " holds LoRA adapters, not a whole model: write the adapted model with "
         "`snip export --merge` and start from that folder (or resume the run that trained them)");
  if (init_dir.empty()) return;
  try {
    s.init = read_hf_folder(init_dir);
  } catch (const UserError& e) {
    fail(opts.init_from.empty() ? "--resume: the LoRA base " : "--init-from ", e.what());
  }
  const auto set_before = s.cfg.values();
  s.init_notes = adopt_hf_config(*s.init, s.cfg);
  s.adopted = s.cfg.values() != set_before;
}

// Every option checked and typed, once; the settings the chosen policy
// never reads are said.
void resolve_config(TrainSession& s) {
  Config& cfg = s.cfg;
  // The run's recipes: the built-ins and precision.recipe_file's (RunConfig::recipes).
  // A resumed run whose recipe file is gone uses the copy it trained with.
  const std::string rf = cfg.get_string("precision.recipe_file");
  const fs::path copy = s.run / "recipes.json";
  if (!rf.empty() && s.opts.resume && !fs::exists(rf) && fs::is_regular_file(copy)) {
    s.recipe_file.path = rf;
    s.recipe_file.recipes = recipes::load_recipe_copy(copy.string());
    if (!s.quiet)
      spdlog::warn("--resume: precision.recipe_file {} does not exist; the run goes on with the recipes it trained "
                   "with, {}", rf, copy.string());
  } else if (!rf.empty()) {
    s.recipe_file = recipes::load_recipe_file(rf);
  }
  recipes::RecipeSet recipes = recipes::recipe_set(s.recipe_file);
  s.alias = resolve_precision_alias(cfg, recipes);
  try {
    s.rc = RunConfig::from(cfg, std::move(recipes));
  } catch (const UserError& e) {
    if (!s.adopted) throw;
    fail(e.what(), " (with [model] options taken from ", s.init->config_path, " by --init-from)");
  }
  s.monitor_opts = monitor::monitor_options(s.rc.monitor);  // checked before anything runs
  if (s.quiet) return;
  // Settings the chosen policy never reads are said once, not silently
  // dropped: under none every precision option (nothing is quantized);
  // the stats step's options where no stats step runs; the FP4 budget
  // under a uniform policy (one option everywhere). precision.seed is left
  // out: `snip experiment --seeds` sets it for every arm.
  const PrecisionConfig& pc = s.rc.precision;
  std::vector<std::string> unread;
  for (const OptionSpec& o : option_table()) {
    const std::string& k = o.key;
    if (k.rfind("precision.", 0) != 0 || k == "precision.policy" || k == "precision.recipe" ||
        k == "precision.recipe_file" || k == "precision.seed" || !cfg.differs_from_default(k))
      continue;
    const bool stats_only = k == "precision.smoothing" || k == "precision.alpha" || k == "precision.first_order" ||
                            k == "precision.curvature_probes";
    if (pc.policy == Policy::kNone || (stats_only && !pc.needs_stats()) ||
        (pc.policy == Policy::kUniform && k == "precision.budget"))
      unread.push_back(k + " = " + format_option_value(cfg.values().at(k)));  // set: it differs from the default
  }
  if (!unread.empty())
    spdlog::warn("{} {} no effect under precision.policy = {}{}", fmt::join(unread, ", "),
                 unread.size() == 1 ? "has" : "have", pc.policy_name(),
                 pc.policy == Policy::kNone ? " (nothing is quantized; choose a policy, e.g. snip)" : "");
}

// What fixes the data order and the tokens of a step cannot change within a
// run (its position and token counts would be wrong); what only changes the
// arithmetic may, with a warning.
void check_resume_config(TrainSession& s) {
  const fs::path& run = s.run;
  const Config& cfg = s.cfg;
  const std::string& run_dir = s.opts.run_dir;
  if (!s.opts.resume || !fs::is_regular_file(run / "config.toml")) return;
  Config saved;
  saved.load_toml_file((run / "config.toml").string());
  // Micro-batches per step: train.grad_accum, or dist.micro_batches under pipeline stages.
  auto micro = [](const Config& c) {
    return c.get_int("dist.pipeline_stages") > 1 && c.get_int("dist.micro_batches") > 0 ? c.get_int("dist.micro_batches")
                                                                                         : c.get_int("train.grad_accum");
  };
  if (micro(saved) != micro(cfg)) {
    const bool pp = cfg.get_int("dist.pipeline_stages") > 1 && cfg.get_int("dist.micro_batches") > 0;
    fail("--resume: ", pp ? "dist.micro_batches" : "train.grad_accum", " is ", micro(cfg), " but ", run_dir,
         " was trained with ", micro(saved), " micro-batches per step (it fixes the data order and the tokens per "
         "step); resume with that value, or start a new --run-dir");
  }
  for (const char* key : {"train.seed", "train.batch_size", "train.seq_len"})
    if (saved.get_int(key) != cfg.get_int(key))
      fail("--resume: ", key, " is ", cfg.get_int(key), " but ", run_dir, " was trained with ",
           saved.get_int(key), " (it fixes the data order and the tokens per step); resume with that value, or "
           "start a new --run-dir");
  for (const char* key : {"train.gemm_dtype", "train.gemm_backend", "train.attention"})
    if (saved.get_string(key) != cfg.get_string(key))
      spdlog::warn("--resume: {} is {} but {} was trained with {}: the resumed steps will not be bit-identical "
                   "to an uninterrupted run", key, cfg.get_string(key), run_dir, saved.get_string(key));
  if (saved.get_int("train.threads") != cfg.get_int("train.threads"))
    spdlog::warn("--resume: train.threads is {} but {} was trained with {}: the resumed steps will not be "
                 "bit-identical to an uninterrupted run (GEMM sums are split by thread)",
                 cfg.get_int("train.threads"), run_dir, saved.get_int("train.threads"));
}

// The communicator, and the settings every rank must share: the layout, the
// shapes that travel between ranks and the micro-batches of a step. A rank
// started with others would wait in a collective that never comes (until
// dist.timeout_s) or exchange tensors of another size. One all-gather of
// their FNV-1a hashes, before any process group of a stage exists.
void connect_ranks(TrainSession& s) {
  // Where this rank trains and over which backend (dist/world.h place_rank):
  // refused in one line here, before anything is connected or written.
  const dist::Placement place = dist::place_rank(s.dopt(), s.tc().device, s.world);
  s.device = place.device;
  s.device_reason = place.reason;
  if (s.world.size > 1) {
    dist::DistOptions opt = s.dopt();
    opt.backend = place.backend;  // "auto" resolved
    s.comm = dist::connect(s.world, opt, place.device);
    if (!s.quiet)
      spdlog::info("dist: {} ranks ({}, {} per machine) over {}, rendezvous {}:{}", s.world.size, s.world.source,
                   s.world.local_size, s.comm->backend(), s.world.master_addr, s.world.master_port);
  }
  s.R = s.world.size;
  if (!s.comm) return;
  static const char* const kShared[] = {
      "model.hidden_size", "model.intermediate_size", "model.num_hidden_layers", "model.num_attention_heads",
      "model.num_key_value_heads", "model.tie_word_embeddings", "model.vocab_size", "train.batch_size",
      "train.seq_len", "train.grad_accum", "train.zero_stage", "dist.grad_comm", "dist.grad_comm_path",
      "dist.pipeline_stages", "dist.pipeline_schedule", "dist.micro_batches", "dist.boundary_comm",
      "dist.stage_split", "dist.stage_boundary", "dist.stage_cost", "dist.rebalance"};
  auto value_of = [&](const std::string& key) {
    const auto it = s.cfg.values().find(key);
    if (it != s.cfg.values().end()) return format_option_value(it->second);
    for (const OptionSpec& o : option_table())
      if (o.key == key) return format_option_value(o.def);
    return std::string("?");
  };
  std::vector<int64_t> mine;
  for (const char* k : kShared) mine.push_back(int64_t(fnv1a64(value_of(k))));
  const std::vector<torch::Tensor> all = s.comm->allgather(torch::tensor(mine, torch::kLong));
  for (size_t i = 0; i < mine.size(); ++i)
    for (int r = 0; r < s.R; ++r)
      if (all[size_t(r)][int64_t(i)].item<int64_t>() != all[0][int64_t(i)].item<int64_t>())
        fail("dist: rank ", r, " was started with another ", kShared[i], " than rank 0 (this rank, ", s.world.rank,
             ", has ", value_of(kShared[i]), "); every rank must have the same");
}

// Pipeline stages (dist/pipeline.h): S stages x DP replicas; a step reads DP
// x accum micro-batches. The gradient format, ZeRO and what has no effect.
void check_layout(TrainSession& s) {
  const TrainConfig& tc = s.tc();
  const DistConfig& dopt = s.dopt();
  const int R = s.R, S = dopt.pipeline_stages;
  s.S = S;
  if (S > 1) {
    if (R % S != 0)
      fail("dist.pipeline_stages = ", S, ": the world of ", R, " rank", R == 1 ? "" : "s", " is not a multiple of it "
           "(world = stages x data-parallel replicas; start ", S, " or ", 2 * S, " ranks)");
    if (tc.zero_stage > 0)
      fail("train.zero_stage = ", tc.zero_stage, " with dist.pipeline_stages = ", S, " is not built (each stage "
           "already holds only its own AdamW state); use train.zero_stage = 0");
    if (dopt.grad_comm != "fp32")
      fail("dist.grad_comm = ", dopt.grad_comm, " with dist.pipeline_stages = ", S, " is not built (the replicas "
           "of a stage sum their gradients in FP32); use dist.grad_comm = fp32");
    if (dopt.stage_boundary.empty())
      fail("dist.stage_boundary: expected a precision option (e.g. fp8) or none, got \"\"");
  } else if (!s.quiet) {
    if (dopt.micro_batches > 0)
      spdlog::warn("dist.micro_batches = {} has no effect without pipeline stages (train.grad_accum = {} is the "
                   "micro-batch count)", dopt.micro_batches, tc.grad_accum);
    for (const char* k : {"dist.pipeline_schedule", "dist.boundary_comm", "dist.stage_split", "dist.stage_boundary",
                          "dist.stage_cost", "dist.rebalance"})
      if (s.cfg.differs_from_default(k))  // a resume's config.toml lists every option, defaults included
        spdlog::warn("{} has no effect without pipeline stages (dist.pipeline_stages = 1)", k);
  }
  s.DP = R / S;  // data-parallel ranks: R without stages
  // dist.grad_comm (validated here at any world size; used with several ranks).
  s.gcomm = dist::GradComm{dist::GradCompressor(s.rc.recipes, dopt.grad_comm, dopt.error_feedback), {}};
  if (R == 1 && !s.gcomm.compressor.is_fp32() && !s.quiet)
    spdlog::warn("dist.grad_comm = {} has no effect in one process (no gradient is communicated)", dopt.grad_comm);
  // Residuals of error feedback travel in checkpoints (grad_residuals.safetensors).
  s.keeps_residuals = R > 1 && !s.gcomm.compressor.is_fp32() && s.gcomm.compressor.error_feedback();
  // train.zero_stage (dist/zero.h): with several ranks only.
  s.zero_stage = R > 1 && S == 1 ? int(tc.zero_stage) : 0;
  if (R == 1 && tc.zero_stage > 0 && !s.quiet)
    spdlog::warn("train.zero_stage = {} has no effect in one process (nothing to shard)", tc.zero_stage);
  if (s.zero_stage == 2 && !s.gcomm.compressor.is_fp32())
    fail("dist.grad_comm = ", dopt.grad_comm, " with train.zero_stage = 2 is not built (stage 2 reduces each "
         "gradient to its owner in FP32); use train.zero_stage = 1 or dist.grad_comm = fp32");
}

void TrainSession::sync_weights() {
  if (!stages) return;
  dist::broadcast_from_owners(*comm, stages->stage_part);
  // Every rank evaluates the whole model: each gets the other stages'
  // quantizer state (its own stays as it is).
  if (ctl->active())
    ctl->restore_quantizers(stages->quantizer_state(ctl->quantizer_state(), true), "pipeline quantizer state");
}

void TrainSession::check_same_plan() {
  // Every rank applied rank 0's plan (PrecisionController::set_comm): the
  // assignments in force must be one.
  std::string plan;
  for (const auto& [item, option] : ctl->assignment().options) plan += item.str() + "=" + option + ";";
  const std::vector<uint8_t> bytes(plan.begin(), plan.end());
  const torch::Tensor digest = dist::param_checksums(
      {torch::from_blob(const_cast<uint8_t*>(bytes.data()), {int64_t(bytes.size())}, torch::kUInt8)});
  if (!opts.quiet)
    spdlog::debug("dist: rank {} plan before step {}: digest {:016x}", world.rank, step,
                  uint64_t(digest[0].item<int64_t>()));
  const auto all = comm->allgather(digest);
  for (int k = 1; k < R; ++k)
    if (all[size_t(k)].item<int64_t>() != all[0].item<int64_t>())
      fail("dist: the precision plan decided before step ", step, " differs between rank 0 and rank ", k,
           " (the planner is not deterministic here?)");
}

}  // namespace snip
