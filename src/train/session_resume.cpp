// Opening a run (session.h): --resume's checkpoint restored, RUN's files
// created (rank 0), and what the run is about to do said.
#include "session.h"

#include "snip/io/atomic_file.h"
#include "snip/model/matmul.h"
#include "snip/train/checkpoint.h"
#include "snip/train/optimizer.h"
#include "snip/core/error.h"

namespace snip {

namespace fs = std::filesystem;
using json = nlohmann::json;

void restore_checkpoint(TrainSession& s) {
  if (s.resume_ckpt.empty()) return;
  const std::string& ckpt = s.resume_ckpt;
  const json& st = s.resume_state;
  const std::string what = (fs::path(ckpt) / "trainer_state.json").string();
  const TrainerState& ts = s.resume_typed;
  s.step = ts.step;
  if (ts.seed != s.seed)
    fail("--resume: ", ckpt, "/trainer_state.json has seed ", ts.seed, " but train.seed is ", s.seed,
         " (the seed fixes the data order and the initialisation; corrupt?)");
  if (ts.data && ts.data->vocab_size != int64_t(s.data_info.vocab_size))
    fail("--resume: ", ckpt, "/trainer_state.json has data.vocab_size ", ts.data->vocab_size,
         " but data.dir's vocabulary is ", s.data_info.vocab_size, " (corrupt, or another data folder)");
  // The ids mean the pieces of one tokenizer: a run does not continue on
  // data tokenized by another.
  const std::string trained_with = checkpoint_tokenizer_sha256(st);
  if (!trained_with.empty() && trained_with != s.data_info.tokenizer_sha256) {
    if (!s.opts.allow_other_tokenizer)
      fail("--resume: data.dir ", s.data_dir.string(), " was tokenized with another tokenizer (SHA-256 ",
           s.data_info.tokenizer_sha256.substr(0, 12), "...) than ", ckpt, " was trained on (",
           trained_with.substr(0, 12), "...): the token ids would mean other pieces; use that data, or pass "
           "--allow-other-tokenizer");
    spdlog::warn("--allow-other-tokenizer: continuing on data tokenized by another tokenizer than {} was "
                 "trained on", ckpt);
  }
  // A run killed between its last checkpoint and its summary is finished, not refused.
  if (s.step > s.max_steps || (s.step == s.max_steps && fs::exists(s.run / "summary.json")))
    fail("--resume: the checkpoint is at step ", s.step, " and train.max_steps is ", s.max_steps,
         ": nothing to do (raise train.max_steps to train further)");
  load_training_state(s, ckpt, st, s.step, /*resume=*/true);
  if (!ts.guard.is_null())  // what the guard did before (its windows refill)
    s.guard->restore(ts.guard, what);
  const int64_t saved_world = ts.loader_ranks();
  const data::LoaderState ls = checkpoint_position(s, st, ts, what);
  s.loader->restore(ls);
  if (!ts.loader_base.is_null()) s.loader_base = ts.loader_base;
  if (saved_world != s.DP) {
    // Another number of ranks (docs/distributed.md "Resuming on another
    // number of ranks"): the weights and the AdamW state by parameter name
    // are the saved ones; from here a step reads R x accum windows.
    s.loader_base = {{"step", s.step}, {"windows", ls.epoch * s.loader->windows_per_epoch() + ls.cursor}};
    if (!s.quiet)
      spdlog::warn("--resume: {} was written by {} rank{}, this run has {}: {}a step now reads {} tokens instead "
                   "of {}", ckpt, saved_world, saved_world == 1 ? "" : "s", s.DP,
                   s.zero_stage > 0 || ts.zero_stage.value_or(0) != 0
                       ? "the optimizer state is re-sharded by parameter name; "
                       : "",
                   s.B * s.T * s.accum * s.DP, s.B * s.T * s.accum * saved_world);
  }
}

void open_run_files(TrainSession& s) {
  const TrainOptions& opts = s.opts;
  if (s.comm) s.comm->barrier();
  if (s.writer) {
    io::ensure_writable_dir(opts.run_dir);
    if (!s.lock) s.lock = std::make_unique<io::DirLock>(opts.run_dir, "run directory");
    for (const std::string& line : tidy_checkpoints(opts.run_dir, s.tc().keep_good))
      spdlog::info("checkpoints: {}", line);
    if (!s.resume_ckpt.empty() && !fs::exists(s.resume_ckpt)) s.resume_ckpt = latest_checkpoint(opts.run_dir);  // renamed
    // checks what it reads back first
    s.metrics.emplace((s.run / "metrics.jsonl").string(), opts.resume ? s.step : -1,
                      s.resume_ckpt.empty() ? json() : s.resume_typed.rollback_record);
    io::write_file_atomic((s.run / "config.toml").string(), s.cfg.to_toml());
    if (std::string w = recipes::record_run_recipes(opts.run_dir, s.recipe_file, opts.resume); !w.empty())
      spdlog::warn(w);
  }
  if (s.writer) s.ctl->set_output(opts.run_dir, s.chatty);
  s.tokens_per_step = s.B * s.T * s.accum * s.DP;
  // Tokens trained on the trajectory that leads to the weights (a rollback
  // returns to its checkpoint's count), counted step by step: a resume on
  // another number of ranks changes tokens_per_step. Checkpoints before this
  // count was recorded: step x today's tokens per step.
  s.tokens_trained = s.resume_ckpt.empty() ? 0 : s.resume_typed.tokens.value_or(s.step * s.tokens_per_step);
  // The /metrics endpoint (monitor/exporter.h), fed the record of each step.
  s.exporter = monitor::start_exporter(s.monitor_opts, {s.tokens_per_step, s.world.rank, s.R, s.ctl->policy(), {}, s.rc.guard},
                                       s.rc.recipes, s.world.local_rank, !opts.quiet);
  // A resumed run's precision in force (its records name it only at the
  // next change) and the guard's restored streaks (the gauge counts on).
  if (s.exporter && !s.ctl->assignment().empty()) {
    std::map<std::string, std::string> items;
    for (const auto& [k, option] : s.ctl->assignment().options) items[k.str()] = option;
    s.exporter->set_precision(items);
  }
  if (s.exporter) s.exporter->set_operand_streaks(s.guard->quant_streaks());
  // Wall time of the earlier invocations (a resumed run's elapsed_s continues).
  s.elapsed0 = s.resume_ckpt.empty() ? 0.0 : s.resume_typed.elapsed_s.value_or(0.0);
  s.start_step = s.step;
  if (!s.resume_ckpt.empty()) {
    s.resumed_at = s.resume_typed.resumed_at.value_or(std::vector<int64_t>{});
    s.resumed_at.push_back(s.step);
  }
  // A resumed run keeps its baseline (trainer_state.json "init_val_loss").
  if (s.resume_typed.init_val_loss) s.init_val = *s.resume_typed.init_val_loss;
}

void announce(TrainSession& s) {
  if (s.quiet) return;
  const TrainConfig& tc = s.tc();
  if (!s.alias.empty()) spdlog::info("{}", s.alias);
  for (const std::string& n : s.init_notes) spdlog::info("--init-from: {}", n);
  if (tc.warmup_steps > s.max_steps)
    spdlog::warn("train.warmup_steps = {} is larger than train.max_steps = {}: the learning rate never reaches "
                 "train.lr (peak {:.3g} at the last step)", tc.warmup_steps, s.max_steps,
                 lr_at(s.max_steps - 1, s.max_steps, tc.warmup_steps, tc.lr, tc.min_lr_ratio));
  spdlog::info("model: {} parameters ({} layers, C={}, V={}), {} tokens/step, GEMMs in {}, policy {}",
               s.mcfg.num_parameters(), s.mcfg.num_hidden_layers, s.mcfg.hidden_size, s.mcfg.vocab_size,
               s.tokens_per_step, tc.gemm_bf16 ? "bf16" : "fp32", s.ctl->policy());
  spdlog::info("device: {} ({}); GEMMs of per-tensor FP8 operands (fp8_tensor) {} (train.fp8_gemm = {}); "
               "attention {} (train.attention = {})",
               s.device.str(), s.device_reason, native_fp8_gemm(s.device) ? "native (at::_scaled_mm)" : "emulated",
               tc.fp8_gemm, s.model->attention_sdpa() ? "scaled_dot_product_attention" : "explicit products",
               tc.attention);
  if (tc.gemm_bf16) {
    spdlog::info("BF16 GEMMs {} ({})", native_bf16_gemm() ? "native" : "emulated: FP32 GEMMs on BF16-rounded operands",
                 bf16_gemm_reason());
    if (native_bf16_gemm() && s.device.is_cpu() && !libtorch_bf16_gemm_accumulates_fp32())
      spdlog::warn("LibTorch's BF16 GEMM accumulates in BF16 on this CPU: inexact and ~100x slower than the "
                   "emulated path (set train.gemm_backend = auto; `snip doctor` measures both)");
  }
  if (s.step == s.max_steps)
    spdlog::info("{} holds the run's last step {}: writing its summary", s.resume_ckpt, s.step);
  else if (!s.resume_ckpt.empty())
    spdlog::info("resumed from {} at step {}", s.resume_ckpt, s.step);
  else if (s.opts.resume)
    spdlog::info("{} has no checkpoint yet: starting it from step 0 with its saved configuration", s.opts.run_dir);
}

}  // namespace snip
