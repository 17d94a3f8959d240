// `snip train`: the loop (trainer.h). The run is opened by open_session
// (session.h), each step runs through StepRunner (train/step.h or
// train/pipeline_step.h), and what happens between steps belongs to the
// components of session.h: the guard's actions, the evaluator, the
// checkpointer, the stages' balancer, the progress line and the summary.
#include "snip/train/trainer.h"

#include <thread>

#include "session.h"
#include "snip/model/blas.h"
#include "snip/model/matmul.h"
#include "snip/train/checkpoint.h"
#include "snip/train/optimizer.h"
#include "snip/core/error.h"

namespace snip {

using json = nlohmann::json;

void set_threads(int64_t threads) {
  const int n = threads > 0 ? int(threads) : int(std::max(1u, std::thread::hardware_concurrency()));
  torch::set_num_threads(n);
  set_openblas_threads(n);  // the FP32 GEMMs of snip/model/blas.h
}

at::ScalarType gemm_dtype_of(const TrainConfig& t) { return t.gemm_bf16 ? at::kBFloat16 : at::kFloat; }

at::ScalarType prepare_model(LlamaForCausalLM& model, const TrainConfig& t, const torch::Device& device) {
  const at::ScalarType gemm = gemm_dtype_of(t);
  if (!device.is_cpu()) model->to(device);
  set_bf16_gemm_backend(t.gemm_backend, device.is_cuda());
  set_fp8_gemm(parse_fp8_gemm(t.fp8_gemm));
  model->set_precision(LinearPrecision{nullptr, gemm});
  model->set_non_linear_gemm_dtype(gemm);
  model->set_attention_sdpa(
      resolve_attention_sdpa(t.attention, device, t.gemm_bf16 && t.gemm_backend != GemmBackend::kEmulated));
  return gemm;
}

StepRunner::StepRunner(TrainSession& s)
    : s_(s),
      ctx_{s.model, *s.optimizer, *s.loader, s.B, s.T, s.accum, s.tc().grad_clip, s.seed, s.ctl.get(),
           // Under pipeline stages the step talks through PipelineContext, not `comm`.
           s.stages ? nullptr : s.comm.get(), nullptr, s.zpart ? &*s.zpart : nullptr} {
  const TrainConfig& tc = s.tc();
  ctx_.skip_nonfinite = s.guard->enabled();
  ctx_.clip_low_precision = tc.clip_low_precision;
  s.gcomm.allgather = s.dopt().allgather;
  if (ctx_.comm) {
    reducer_ = dist::make_grad_reducer(*ctx_.comm, &s.gcomm, ctx_.zero, s.zero_stage, s.dopt().overlap);
    ctx_.reducer = reducer_.get();
  }
  if (s.opts.faults.grad_inf_step >= 0)
    ctx_.fault = [&s](int64_t step) {
      FaultInjector& f = s.opts.faults;
      if (f.grad_inf_fired || step + 1 != f.grad_inf_step) return;
      f.grad_inf_fired = true;
      torch::NoGradGuard ng;
      for (torch::Tensor& p : s.params)
        if (p.grad().defined()) {
          p.mutable_grad().view(-1)[0] = std::numeric_limits<float>::infinity();
          break;
        }
    };
  if (!s.lora.enabled()) return;
  // LoRA: after each step boundary (a plan may have changed precisions)
  // every base weight frozen for its precision, the FP32 copies released.
  LoraSetup& lora = s.lora;
  ctx_.after_boundary = [&s, &lora] {
    if (lora.frozen_base->sync(s.model->linear_layers()) > 0)
      lora.held_max = std::max(lora.held_max, lora.frozen_base->memory(s.model->linear_layers()).stored_bytes);
  };
  lora.frozen_base->sync(s.model->linear_layers());
  const FrozenMemory fm = lora.frozen_base->memory(s.model->linear_layers());
  lora.held_max = fm.stored_bytes;
  int64_t n_train = 0;
  for (const auto& t : lora.trainable) n_train += t.numel();
  const LoraConfig& lc = s.rc.lora;
  if (!s.quiet)
    spdlog::info("lora: rank {}, alpha {} (scale {:.4g}) on {} layers; {} trainable parameters ({:.3f}% of {}); "
                 "base linear weights {:.2f} MiB in FP32, {:.2f} MiB as stored now ({})",
                 lc.rank, lc.alpha, lc.scale(), lora.ref["adapted_layers"].get<int64_t>(), n_train,
                 100.0 * double(n_train) / double(s.mcfg.num_parameters()), s.mcfg.num_parameters(),
                 double(fm.fp32_bytes) / (1 << 20), double(fm.stored_bytes) / (1 << 20),
                 lc.pack_base ? "packed in each layer's precision, re-packed when a plan changes it"
                              : "lora.pack_base = false");
  if (!s.quiet && s.rc.precision.needs_stats())
    spdlog::info("lora: the stats step measures the loss divergence alone on the frozen base (precision.alpha "
                 "is not used; docs/lora.md)");
  lora.ref["trainable_parameters"] = n_train;
}

double StepRunner::learning_rate() {
  const TrainConfig& tc = s_.tc();
  double lr = lr_at(s_.step, s_.max_steps, tc.warmup_steps, tc.lr, tc.min_lr_ratio);
  FaultInjector& f = s_.opts.faults;
  if (f.lr_spike_step >= 0 && !f.lr_spike_fired && s_.step + 1 == f.lr_spike_step) {
    lr *= f.lr_factor;
    f.lr_spike_fired = true;
  }
  return lr;
}

StepResult StepRunner::run(double lr) {
  return s_.stages ? pipeline_step(ctx_, s_.stages->pc, s_.step, lr) : train_step(ctx_, s_.step, lr);
}

void StepRunner::after_step() {
  const FaultInjector& f = s_.opts.faults;
  if (s_.comm && s_.world.rank == f.perturb_rank && s_.step == f.perturb_step) {
    torch::NoGradGuard ng;
    s_.params.back().view(-1)[0].add_(1e-3);
  }
}

namespace {

// The ranks agree on stopping (any rank's signal stops all after this step)
// and on a time-based checkpoint (rank 0's clock decides).
void agree_on_stop(TrainSession& s, int& stopped_by, bool& by_time) {
  if (!s.comm) return;
  const auto flags = s.comm->allgather(torch::tensor({int64_t(stopped_by), int64_t(by_time)}, torch::kLong));
  int64_t any_stop = 0;
  for (const auto& f : flags) any_stop = std::max(any_stop, f[0].item<int64_t>());
  if (!stopped_by && any_stop) stopped_by = int(any_stop);
  by_time = flags[0][1].item<int64_t>() != 0;
}

}  // namespace

TrainSummary train(const Config& cfg, const TrainOptions& opts) {
  const std::unique_ptr<TrainSession> session = open_session(cfg, opts);
  TrainSession& s = *session;
  const TrainConfig& tc = s.tc();
  History history;
  if (s.metrics) history.replay(s.metrics->earlier());
  Evaluator evaluator(s);
  StepRunner runner(s);
  Checkpointer checkpointer(s, history, evaluator);
  GuardActions guard_actions(s, history, checkpointer);
  Progress progress(s);
  s.t0 = std::chrono::steady_clock::now();
  StopOnSignal stop_signal;  // Ctrl-C / Slurm's SIGTERM: finish the step, checkpoint, stop
  StallWatchdog watchdog(s);
  int stopped_by = 0;
  int64_t steps_done = 0;  // steps this invocation ran (a rollback sets s.step back, not this)
  // Fine-tuning (--init-from): the loaded model's validation loss before the
  // first step, on the windows every later evaluation uses, so the run's
  // losses have their baseline (summary.json "init_val_loss").
  if (!opts.init_from.empty() && s.start_step == 0 && tc.eval_interval > 0) {
    s.sync_weights();
    s.init_val = evaluator.validation_loss();
    if (s.chatty)
      std::fprintf(stderr, "step %6d/%lld | val %.4f (%lld-token windows): the --init-from model before training\n",
                   0, static_cast<long long>(s.max_steps), s.init_val, static_cast<long long>(s.T));
  }
  while (s.step < s.max_steps) {
    if (opts.stop_after > 0 && steps_done >= opts.stop_after) break;
    const auto ts = std::chrono::steady_clock::now();
    watchdog.step_started();
    const double lr = runner.learning_rate();
    const StepResult r = runner.run(lr);
    watchdog.step_ended();
    ++s.step, ++steps_done;
    s.tokens_trained += s.tokens_per_step;
    if (steps_done == 1) progress.measure_memory();
    if (s.comm && r.precision.decided) s.check_same_plan();
    runner.after_step();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    history.add_loss(s.step, r.loss);
    StepRecord rec = progress.record(r, lr, dt);
    // The guard (train/guard.h): every step, before anything is evaluated or saved.
    const GuardOutcome g = guard_actions.after_step(r, rec, dt, steps_done);
    const bool eval_step =
        !g.rolled_back && g.stop_reason.empty() && (s.step % tc.eval_interval == 0 || s.step == s.max_steps);
    if (eval_step) {
      s.sync_weights();
      history.add_val(s.step, evaluator.validation_loss());
      rec.val_loss = history.last_val;
      rec.val_ppl = std::exp(history.last_val);
    }
    if (g.rolled_back) {
      // step-k is written again with what the guard did (its count, the
      // raised budget, the loader position past the skipped data) before the
      // rollback's record: the rename of the new step-k commits the rollback.
      // Killed before it, the run resumes from the old step-k as the run
      // before the rollback (and meets the same rollback again); killed
      // after it, as the rolled-back run, and the resume writes the record
      // the new step-k carries if it is not in metrics.jsonl yet.
      checkpointer.rollback_record = rec.to_json();
      checkpointer.write(true, false, &g.rollback_checkpoint);
      checkpointer.rollback_record = nullptr;
      test_kill_point("rewrite-before-record");  // tests/cli/rollback_crash.py: kill -9 between the two
    }
    if (s.metrics) s.metrics->append(rec);
    if (s.exporter) {
      s.exporter->update(rec);
      s.exporter->set_guard_state(int(s.guard->state));
    }
    if (!g.stop_reason.empty())  // advice for the condition: a slow step is not a loss problem
      fail("guard: stopped at step ", s.step, ": ", g.stop_reason,
           g.stop_reason.rfind("throughput_drop", 0) == 0
               ? " (another job on the machine, a slow rank or a full disk? set guard.on_throughput_drop = warn to "
                 "train on; "
               : " (lower train.lr or raise the precision; ",
           "docs/operations.md \"The guard\")");
    if (g.rolled_back) continue;  // the step after the checkpoint runs next; nothing else of this one
    if (s.chatty && (s.step % tc.log_interval == 0 || s.step == s.max_steps || eval_step)) {
      progress.print(r, lr, steps_done, eval_step, history.last_val);
      if (eval_step) evaluator.print_sample();
    }
    stopped_by = stop_signal.received();
    bool by_time = tc.checkpoint_minutes > 0 && s.elapsed() - checkpointer.last_s >= 60.0 * tc.checkpoint_minutes;
    agree_on_stop(s, stopped_by, by_time);
    // Only the checkpoints of the schedule are rollback targets: one a
    // signal or the clock wrote would make a resumed run roll back elsewhere
    // than the uninterrupted one.
    const bool scheduled =
        (tc.checkpoint_interval > 0 && s.step % tc.checkpoint_interval == 0) || s.step == s.max_steps;
    const bool ckpt = scheduled || by_time || stopped_by;
    if (s.comm && (ckpt || (s.dopt().check_interval > 0 && s.step % s.dopt().check_interval == 0))) {
      if (!s.stages) dist::check_same_weights(*s.comm, s.param_names, s.params, str_cat("step ", s.step));
      else s.stages->check_replica_weights(str_cat("step ", s.step));
    }
    if (ckpt) checkpointer.write(scheduled, eval_step, nullptr);
    if (ckpt) test_kill_point("after-checkpoint@" + std::to_string(s.step));  // tests/cli/kill_resume.py
    if (stopped_by) break;
    if (ckpt && s.stages) s.stages->rebalance_if_pending(checkpointer.last);
  }
  progress.finish();
  return progress.summarize(history, checkpointer, steps_done, stopped_by);
}

}  // namespace snip
