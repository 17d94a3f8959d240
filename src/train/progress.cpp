// A run's step records, progress line and end-of-run summary (session.h
// Progress).
#include <unistd.h>

#include "session.h"

#include "snip/io/atomic_file.h"
#include "snip/model/matmul.h"
#include "snip/report/report.h"

namespace snip {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// "4m05s", or "1h07m" from an hour on; "?" for a negative or non-finite time.
std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = int64_t(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", long(t / 3600), long(t / 60 % 60));
  else std::snprintf(buf, sizeof buf, "%ldm%02lds", long(t / 60), long(t % 60));
  return buf;
}

}  // namespace

void write_run_report(const std::string& run_dir) {
  try {
    report::write_report(run_dir);
  } catch (const std::exception& e) {
    spdlog::warn("run report not written: {}", e.what());
  }
}

Progress::Progress(TrainSession& s)
    : s_(s), tty_(s.chatty && isatty(STDERR_FILENO)), recorded_(s.ctl->assignment().options) {}

StepRecord Progress::record(const StepResult& r, double lr, double dt) {
  TrainSession& s = s_;
  const TrainConfig& tc = s.tc();
  StepRecord rec;
  rec.step = s.step;
  rec.loss = r.loss;
  rec.lr = lr;
  rec.grad_norm = r.grad_norm;
  rec.tokens_per_s = double(s.tokens_per_step) / dt;
  rec.elapsed_s = s.elapsed0 + s.elapsed();
  rec.fp4_share = s.ctl->fp4_share();
  rec.step_s = dt;
  if (r.grad_comm_bytes >= 0) rec.grad_comm_bytes = r.grad_comm_bytes;
  if (r.grad_comm_sent_bytes >= 0) rec.grad_comm_sent_bytes = r.grad_comm_sent_bytes;
  if (r.comm_s >= 0) rec.comm_s = r.comm_s;
  if (s.stages) s.stages->record(rec, r);
  rec.quant_err = quant_error_record(s.model->linear_layers(), r);
  if (!r.precision.metrics.is_null()) rec.merge(r.precision.metrics, "the precision decision's record");
  // A precision change without a decision (the guard's fp8-layer action, a
  // rollback's restored plan) is recorded at the first step it runs, so
  // /metrics and the report follow what ran.
  if (const auto& now = s.ctl->assignment().options; now != recorded_) {
    if (!rec.precision) rec.merge({{"precision", s.ctl->assignment().to_json()}}, "the precision in force");
    recorded_ = now;
  }
  if (r.grad_clip != clip_in_force_) {
    if (clip_in_force_ >= 0 && !s.quiet)
      spdlog::info("train.grad_clip in force from step {}: {:.4g} ({})", s.step, r.grad_clip,
                   r.grad_clip < tc.grad_clip ? "a layer runs below FP8: x train.clip_low_precision"
                                              : "no layer below FP8");
    if (tc.clip_low_precision != 1.0) rec.grad_clip = r.grad_clip;
    clip_in_force_ = r.grad_clip;
  }
  return rec;
}

void Progress::measure_memory() {
  // Measured from the tensors held (parameters, allocated .grad, AdamW m and v).
  TrainSession& s = s_;
  const dist::RankMemory m = dist::rank_memory(s.params, *s.optimizer);
  torch::Tensor mine = torch::tensor({m.params, m.grads, m.optimizer}, torch::kLong);
  const std::vector<torch::Tensor> all = s.comm ? s.comm->allgather(mine) : std::vector<torch::Tensor>{mine};
  memory_per_rank_ = json::array();
  for (size_t k = 0; k < all.size(); ++k) {
    const int64_t* v = all[k].data_ptr<int64_t>();
    memory_per_rank_.push_back({{"rank", k}, {"params_bytes", v[0]}, {"grads_bytes", v[1]}, {"optimizer_bytes", v[2]}});
    if (!s.quiet && s.comm)
      spdlog::debug("memory rank {} (train.zero_stage {}): parameters {} B, gradients {} B, AdamW state {} B", k,
                    s.zero_stage, v[0], v[1], v[2]);
  }
}

void Progress::print(const StepResult& r, double lr, int64_t steps_done, bool eval_step, double val) {
  TrainSession& s = s_;
  const double tps = double(steps_done * s.tokens_per_step) / s.elapsed();
  const double eta = double((s.max_steps - s.step) * s.tokens_per_step) / tps;
  std::string line = fmt::format("step {:>6}/{} | loss {:.4f} | lr {:.2e} | gnorm {:.2f} | {:.0f} tok/s | ETA {}",
                                 s.step, s.max_steps, r.loss, lr, r.grad_norm, tps, fmt_duration(eta));
  if (eval_step) line += fmt::format(" | val {:.4f} ({}-token windows)", val, s.T);
  if (tty_) std::fprintf(stderr, "\r%s\033[K", line.c_str());
  else std::fprintf(stderr, "%s\n", line.c_str());
  if (tty_ && eval_step) std::fprintf(stderr, "\n");
}

void Progress::finish() const {
  if (tty_) std::fprintf(stderr, "\n");
}

namespace {

// summary.json "lora": what trained, and the base's linear weights as held
// at the end (bytes; FP32 = 4 per weight).
json lora_summary(const TrainSession& s) {
  const FrozenMemory fm = s.lora.frozen_base->memory(s.model->linear_layers());
  const LoraConfig& lc = s.rc.lora;
  const json& ref = s.lora.ref;
  if (!s.quiet)
    spdlog::info("lora: base linear weights held in {:.2f} MiB instead of {:.2f} MiB in FP32 ({:.1f}% saved, {} of {} "
                 "layers packed)", double(fm.stored_bytes) / (1 << 20), double(fm.fp32_bytes) / (1 << 20),
                 100.0 * fm.saved_fraction(), fm.packed_layers, fm.layers);
  if (!s.quiet && fm.packed_layers < fm.layers && lc.pack_base)
    spdlog::info("lora: {} layers kept FP32: their precision quantizes W with delayed scaling, stochastic "
                 "rounding, error feedback or a Hadamard transform, or runs FP32 GEMMs (docs/lora.md)",
                 fm.layers - fm.packed_layers);
  return {{"rank", lc.rank}, {"alpha", lc.alpha}, {"scale", lc.scale()},
          {"adapted_layers", ref["adapted_layers"]}, {"trainable_parameters", ref["trainable_parameters"]},
          {"base", ref["base"]}, {"base_linear_fp32_bytes", fm.fp32_bytes},
          {"base_linear_stored_bytes", fm.stored_bytes}, {"base_linear_saved_fraction", fm.saved_fraction()},
          {"base_linear_stored_bytes_max", std::max(s.lora.held_max, fm.stored_bytes)},
          {"packed_layers", fm.packed_layers}, {"layers", fm.layers}};
}

json num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

}  // namespace

TrainSummary Progress::summarize(const History& h, const Checkpointer& ck, int64_t steps_done, int stopped_by) {
  TrainSession& s = s_;
  const Guard& guard = *s.guard;
  // The summary covers the whole run, every invocation of a resumed one.
  TrainSummary sum;
  sum.run_dir = s.opts.run_dir;
  sum.steps = s.step;
  sum.tokens = s.tokens_trained;
  sum.invocation_seconds = s.elapsed();
  sum.seconds = s.elapsed0 + sum.invocation_seconds;
  sum.tokens_per_s = sum.seconds > 0 ? double(sum.tokens) / sum.seconds : 0;
  sum.invocation_steps = steps_done;
  sum.start_step = s.start_step;
  sum.rollbacks = guard.rollbacks;
  sum.skipped_steps = guard.skipped_steps;
  sum.guard_events = int64_t(guard.events.size());
  std::tie(sum.final_train_loss, sum.train_loss_steps) = h.final_train_loss();
  sum.final_val_loss = h.last_val;
  sum.init_val_loss = s.init_val;
  sum.eval_seq_len = s.T;
  sum.best_val_loss = std::isfinite(h.best_val) ? h.best_val : h.last_val;
  sum.checkpoint = ck.last;
  sum.stopped_by_signal = s.step < s.max_steps ? stopped_by : 0;
  sum.rank = s.world.rank;
  sum.world_size = s.world.size;
  sum.launcher = s.world.source;
  if (sum.stopped_by_signal || !s.writer) return sum;  // not the end of the run, or not rank 0: no summary.json
  const TrainConfig& tc = s.tc();
  json j = {{"steps", sum.steps}, {"tokens", sum.tokens}, {"seconds", sum.seconds},
            {"tokens_per_s", sum.tokens_per_s}, {"final_train_loss", sum.final_train_loss},
            {"final_val_loss", num(h.last_val)}, {"final_val_ppl", num(std::exp(h.last_val))},
            {"best_val_loss", num(sum.best_val_loss)}, {"init_val_loss", num(s.init_val)},
            {"eval_seq_len", s.T},
            {"vocab_size", s.mcfg.vocab_size}, {"ln_vocab", std::log(double(s.mcfg.vocab_size))},
            {"parameters", s.mcfg.num_parameters()}, {"policy", s.ctl->policy()},
            {"gemm_dtype", tc.gemm_bf16 ? "bf16" : "fp32"}, {"elapsed_s", sum.seconds},
            {"device", s.device.str()}, {"device_reason", s.device_reason},
            {"fp8_gemms_native", native_fp8_gemm_count()},
            {"attention", s.model->attention_sdpa() ? "sdpa" : "math"},
            {"tokens_total", sum.tokens}, {"resumed_at", s.resumed_at}, {"world_size", s.R},
            {"zero_stage", s.zero_stage}, {"memory_per_rank", memory_per_rank_},
            {"pipeline", s.stages ? s.stages->summary() : json(nullptr)},
            {"guard", {{"rollbacks", guard.rollbacks}, {"skipped_steps", guard.skipped_steps},
                       {"raises", guard.raises}, {"events", guard.events.size()},
                       {"rolled_back_steps", guard.rolled_back_steps}}},
            // "tokens" is the trajectory's (a rollback returns to its checkpoint's
            // count); the steps the rollbacks discarded were computed too.
            {"tokens_rolled_back", guard.rolled_back_steps * s.tokens_per_step},
            {"tokens_processed", sum.tokens + guard.rolled_back_steps * s.tokens_per_step},
            {"invocation", {{"start_step", s.start_step}, {"steps", sum.invocation_steps},
                            {"tokens", sum.invocation_steps * s.tokens_per_step}, {"seconds", sum.invocation_seconds}}}};
  if (s.lora.enabled()) j["lora"] = lora_summary(s);
  io::write_file_atomic((s.run / "summary.json").string(), j.dump(2) + "\n");
  write_run_report(s.opts.run_dir);
  return sum;
}

}  // namespace snip
