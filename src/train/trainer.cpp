// The training loop and evaluation (see trainer.h). The step itself is
// train/step.h; checkpoints train/checkpoint.h; metrics train/metrics.h.
#include "snip/train/trainer.h"

#include "snip/model/blas.h"

#include "snip/model/lora.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <ctime>
#include <chrono>
#include <cstring>
#include <map>
#include <cstdlib>
#include <csignal>
#include <cmath>
#include <deque>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "snip/data/data_folder.h"
#include "snip/data/loader.h"
#include "snip/data/token_client.h"
#include "snip/dist/data_parallel.h"
#include "snip/dist/pipeline.h"
#include "snip/dist/world.h"
#include "snip/dist/zero.h"
#include "snip/hw/platform.h"
#include "snip/io/atomic_file.h"
#include "snip/io/dir_lock.h"
#include "snip/io/json.h"
#include "snip/io/safetensors.h"
#include "snip/method/controller.h"
#include "snip/model/hf.h"
#include "snip/model/matmul.h"
#include "snip/monitor/exporter.h"
#include "snip/model/quantizers.h"
#include "snip/quant/recipe_file.h"
#include "snip/report/report.h"
#include "snip/train/checkpoint.h"
#include "snip/train/guard.h"
#include "snip/train/memory.h"
#include "snip/train/metrics.h"
#include "snip/train/optimizer.h"
#include "snip/train/pipeline_step.h"
#include "snip/train/stage_cost.h"
#include "snip/train/sample.h"
#include "snip/train/step.h"
#include "snip/util/error.h"
#include "snip/util/hash.h"

namespace snip {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// grad_residuals.safetensors (dist.grad_comm with error feedback): one F32
// tensor "rank<r>" [N] per rank, N = elements of the distinct parameters,
// their residuals concatenated in model order; metadata grad_comm and
// world_size. Gathered to every rank with one all-gather (collective); the
// caller on rank 0 writes the bytes. Why a gather and not a file per rank:
// the checkpoint folder is written by rank 0 as a temporary folder and one
// rename (checkpoint.h); one writer keeps that atomicity and the CRC check
// without a second protocol between ranks for a shared folder. The cost is R
// x N x 4 bytes once per checkpoint.
std::string grad_residuals_file(dist::Communicator& comm, const dist::GradComm& gc, const std::string& format) {
  std::vector<torch::Tensor> flat;
  for (const torch::Tensor& e : gc.residuals) flat.push_back(e.reshape({-1}));
  const torch::Tensor mine = flat.empty() ? torch::zeros({0}, torch::kFloat) : torch::cat(flat);
  const std::vector<torch::Tensor> all = comm.allgather(mine);
  io::SafeTensors st;
  st.metadata["grad_comm"] = format;
  st.metadata["world_size"] = std::to_string(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    io::TensorRecord t;
    t.name = "rank" + std::to_string(r);
    t.dtype = io::DType::F32;
    t.shape = {all[r].numel()};
    t.data.resize(size_t(all[r].numel()) * 4);
    if (!t.data.empty()) std::memcpy(t.data.data(), all[r].data_ptr<float>(), t.data.size());
    st.tensors.push_back(std::move(t));
  }
  return io::serialize_safetensors(st);
}

// This rank's residuals from checkpoint `dir` (grad_residuals_file), shaped
// like the distinct parameters of `params`. Zeros with a warning when the
// checkpoint has none (written with fp32 communication or without error
// feedback), another grad_comm, or another world size.
std::vector<torch::Tensor> load_grad_residuals(const std::string& dir, const json& state,
                                               const std::vector<torch::Tensor>& params, int rank, int R,
                                               const std::string& format) {
  const std::vector<torch::Tensor> distinct = dist::distinct_params(params);
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : distinct) out.push_back(torch::zeros_like(p, torch::kFloat));
  const fs::path f = fs::path(dir) / "grad_residuals.safetensors";
  if (!fs::exists(f)) {
    if (rank == 0)
      spdlog::warn("--resume: {} holds no error-feedback residuals (written with dist.grad_comm = fp32 or "
                   "dist.error_feedback = false): they start from zero", dir);
    return out;
  }
  const json crc = state.value("crc32", json::object()).value("grad_residuals.safetensors", json());
  if (!crc.is_number_unsigned() || crc.get<uint64_t>() != file_crc32(f.string()))
    fail("--resume: ", f.string(), ": CRC-32 does not match trainer_state.json (corrupt)");
  const io::SafeTensors st = io::read_safetensors(f.string());
  const auto meta = [&](const char* k) { return st.metadata.count(k) ? st.metadata.at(k) : std::string(); };
  if (meta("world_size") != std::to_string(R)) {
    if (rank == 0)
      spdlog::warn("--resume: {} holds error-feedback residuals of {} ranks, this run has {}: they start from zero",
                   f.string(), meta("world_size"), R);
    return out;
  }
  if (meta("grad_comm") != format && rank == 0)
    spdlog::warn("--resume: the error-feedback residuals in {} were kept under dist.grad_comm = {}, this run uses "
                 "{}: they are carried over as they are", f.string(), meta("grad_comm"), format);
  const io::TensorRecord* t = st.find("rank" + std::to_string(rank));
  int64_t n = 0;
  for (const torch::Tensor& e : out) n += e.numel();
  if (!t || t->dtype != io::DType::F32 || t->shape != std::vector<int64_t>{n})
    fail("--resume: ", f.string(), ": expected an F32 tensor rank", rank, " of ", n, " elements (corrupt, or "
         "another model)");
  int64_t off = 0;
  for (torch::Tensor& e : out) {
    std::memcpy(e.data_ptr<float>(), t->data.data() + off * 4, size_t(e.numel()) * 4);
    off += e.numel();
  }
  return out;
}


std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = int64_t(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", long(t / 3600), long(t / 60 % 60));
  else std::snprintf(buf, sizeof buf, "%ldm%02lds", long(t / 60), long(t % 60));
  return buf;
}

// The guard's rollback target: the checkpoint last_good.json names. A marker
// that cannot be read or names a missing folder is a warning, and the
// newest checkpoint of good.json that exists is taken instead ("" = none).
std::string rollback_target(const std::string& run_dir) {
  const std::string t = last_good_checkpoint(run_dir);
  const fs::path root = fs::path(run_dir) / "checkpoints";
  if (!t.empty() || !fs::exists(root / "last_good.json")) return t;
  std::string fallback;
  for (int64_t s : good_checkpoint_steps(run_dir))
    if (fs::exists(root / ("step-" + std::to_string(s)) / "trainer_state.json"))
      fallback = (root / ("step-" + std::to_string(s))).string();
  spdlog::warn("guard: {} cannot be read or names a checkpoint that is gone; rolling back to {}",
               (root / "last_good.json").string(), fallback.empty() ? "nothing" : fallback);
  return fallback;
}

// RUN/report.html (report.h); a failure is a warning, never the run's end.
void write_run_report(const std::string& run_dir) {
  try {
    report::write_report(run_dir);
  } catch (const std::exception& e) {
    spdlog::warn("run report not written: {}", e.what());
  }
}

}  // namespace

void set_threads(int64_t threads) {
  const int n = threads > 0 ? int(threads) : int(std::max(1u, std::thread::hardware_concurrency()));
  torch::set_num_threads(n);
  set_openblas_threads(n);  // the FP32 GEMMs of snip/model/blas.h
}

at::ScalarType gemm_dtype_of(const TrainConfig& t) { return t.gemm_bf16 ? at::kBFloat16 : at::kFloat; }

namespace {

// Validation micro-batch losses (loss x tokens, one per batch in shard order;
// 0 for the batches of other ranks: batch i is rank i mod R's). evaluate()
// sums them in order, so R ranks that add their vectors (x + 0 = x exactly)
// and then sum get the one-process value bit for bit.
std::vector<double> eval_batch_losses(LlamaForCausalLM& model, const std::string& val_path, int64_t B, int64_t T,
                                      int64_t batches, EvalCoverage* coverage, int rank, int world) {
  torch::NoGradGuard ng;
  QuantStateFreeze freeze;  // evaluation does not feed amax histories
  data::TokenLoader val(val_path, int(B), int(T), 0);
  if (int64_t(val.vocab_size()) > model->cfg.vocab_size)
    fail(val_path, ": vocabulary ", val.vocab_size(), " is larger than the model's ", model->cfg.vocab_size,
         " (data prepared with another tokenizer?)");
  const uint64_t W = val.num_windows();
  uint64_t n = batches > 0 ? std::min<uint64_t>(W, uint64_t(batches) * B) : W;
  std::vector<int32_t> in, tg, bin, btg;
  std::vector<double> losses;
  uint64_t tokens = 0;
  for (uint64_t i = 0; i < n; i += B) {
    const uint64_t b = std::min<uint64_t>(B, n - i);
    tokens += b * T;
    if (int64_t(losses.size()) % world != rank) {
      losses.push_back(0.0);
      continue;
    }
    bin.clear(), btg.clear();
    for (uint64_t k = 0; k < b; ++k) {
      val.window(i + k, in, tg);
      bin.insert(bin.end(), in.begin(), in.end());
      btg.insert(btg.end(), tg.begin(), tg.end());
    }
    torch::Tensor logits = model(to_ids(bin, b, T));
    losses.push_back(LlamaForCausalLMImpl::loss(logits, to_ids(btg, b, T)).item<double>() * double(b * T));
  }
  if (coverage) {
    coverage->windows = n;
    coverage->windows_total = W;
    coverage->batches = (n + uint64_t(B) - 1) / uint64_t(B);
    coverage->batches_total = (W + uint64_t(B) - 1) / uint64_t(B);
    coverage->tokens = tokens;
  }
  losses.push_back(double(tokens));  // the last entry: the token count
  return losses;
}

double sum_eval_losses(const std::vector<double>& losses) {
  double sum = 0;
  for (size_t i = 0; i + 1 < losses.size(); ++i) sum += losses[i];
  return sum / losses.back();
}

// Validation loss over R ranks: each evaluates every R-th batch (see
// eval_batch_losses); the per-batch vector is summed over the ranks.
double evaluate_dist(LlamaForCausalLM& model, const std::string& val_path, int64_t B, int64_t T, int64_t batches,
                     dist::Communicator* comm) {
  if (!comm) return evaluate(model, val_path, B, T, batches);
  std::vector<double> l = eval_batch_losses(model, val_path, B, T, batches, nullptr, comm->rank(), comm->size());
  l.back() = comm->rank() == 0 ? l.back() : 0.0;  // the token count once
  std::vector<torch::Tensor> t{torch::tensor(l, torch::kDouble)};
  comm->allreduce_sum(t);
  const double* p = t[0].data_ptr<double>();
  return sum_eval_losses(std::vector<double>(p, p + t[0].numel()));
}

}  // namespace

double evaluate(LlamaForCausalLM& model, const std::string& val_path, int64_t B, int64_t T, int64_t batches,
                EvalCoverage* coverage) {
  return sum_eval_losses(eval_batch_losses(model, val_path, B, T, batches, coverage, 0, 1));
}

EvalBatch first_eval_batch(LlamaForCausalLM& model, const std::string& val_path, int64_t B, int64_t T) {
  torch::NoGradGuard ng;
  QuantStateFreeze freeze;
  data::TokenLoader val(val_path, int(B), int(T), 0);
  if (int64_t(val.vocab_size()) > model->cfg.vocab_size)
    fail(val_path, ": vocabulary ", val.vocab_size(), " is larger than the model's ", model->cfg.vocab_size,
         " (data prepared with another tokenizer?)");
  const uint64_t b = std::min<uint64_t>(uint64_t(B), val.num_windows());
  std::vector<int32_t> in, tg, bin;
  for (uint64_t k = 0; k < b; ++k) {
    val.window(k, in, tg);
    bin.insert(bin.end(), in.begin(), in.end());
  }
  EvalBatch e;
  e.input_ids = to_ids(bin, b, T);
  e.logits = model(e.input_ids).to(torch::kFloat).contiguous();
  return e;
}

namespace {

// SIGINT/SIGTERM during training: the first one asks the
// loop to stop after the step in progress, with a checkpoint; a second one
// ends the process at once (the default action, re-raised) — unless it comes
// within kEchoWindowNs of the first: that is the same request arriving twice,
// not a person pressing Ctrl-C again. A terminal's Ctrl-C reaches every
// process of the foreground group, so a rank under torchrun (which forwards
// the signal it got to its workers) or under `snip train --nproc-per-node`
// gets it twice within milliseconds.
std::atomic<int> g_stop_signal{0};
std::atomic<int64_t> g_first_signal_ns{0};
constexpr int64_t kEchoWindowNs = 1'000'000'000;

int64_t monotonic_ns() {  // async-signal-safe (clock_gettime)
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

extern "C" void on_stop_signal(int sig) {
  const int64_t now = monotonic_ns();
  int64_t none = 0;
  if (!g_first_signal_ns.compare_exchange_strong(none, now)) {
    if (now - none < kEchoWindowNs) return;  // the same request, forwarded (`none` holds the first's time)
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_stop_signal = sig;
  static const char msg[] =
      "\nsnip: stopping after this step and writing a checkpoint (press Ctrl-C again to stop at once)\n";
  (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
}

// Installs on_stop_signal for SIGINT and SIGTERM while alive (a signal the
// process ignores on entry, e.g. under nohup, stays ignored), restoring the
// previous handlers after.
class StopOnSignal {
 public:
  StopOnSignal() {
    g_stop_signal = 0;
    g_first_signal_ns = 0;
    for (int i = 0; i < 2; ++i) {
      struct sigaction sa {};
      sa.sa_handler = on_stop_signal;
      sigemptyset(&sa.sa_mask);
      sigaction(kSignals[i], nullptr, &old_[i]);
      if (old_[i].sa_handler != SIG_IGN) sigaction(kSignals[i], &sa, nullptr);
    }
  }
  ~StopOnSignal() {
    for (int i = 0; i < 2; ++i) sigaction(kSignals[i], &old_[i], nullptr);
  }
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;
  /// The first signal received, 0 if none.
  int received() const { return g_stop_signal.load(); }

 private:
  static constexpr int kSignals[2] = {SIGINT, SIGTERM};
  struct sigaction old_[2] {};
};

}  // namespace

TrainSummary train(const Config& cfg_in, const TrainOptions& opts) {
  Config cfg = cfg_in;
  if (opts.run_dir.empty()) fail("--run-dir: expected a directory name, got an empty string");
  const fs::path run(opts.run_dir);
  // Several processes (dist/world.h): rank 0 alone writes in RUN.
  const dist::World world = dist::World::from_env();
  const bool writer = world.rank == 0;
  const bool quiet = opts.quiet || !writer;
  // --quiet / --log-level warning (src/cli/run_app.h): no progress lines,
  // plan tables or samples either; warnings still print.
  const bool chatty = !quiet && spdlog::should_log(spdlog::level::info);
  // One writer per run folder: a second trainer stops here, naming the first.
  std::unique_ptr<io::DirLock> lock;
  if (writer && fs::is_directory(run)) lock = std::make_unique<io::DirLock>(opts.run_dir, "run directory");
  // ---- validate everything before touching the run directory
  std::string resume_ckpt;
  if (opts.resume) {
    resume_ckpt = latest_checkpoint(opts.run_dir);
    if (resume_ckpt.empty() && !fs::is_regular_file(run / "config.toml"))
      fail("--resume: no complete checkpoint in ", (run / "checkpoints").string());
    if (resume_ckpt.empty() && fs::is_directory(run / "checkpoints")) {
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
    if (!resume_ckpt.empty() && fs::exists(run / "summary.json")) {
      const json st = verify_checkpoint(resume_ckpt);
      const int64_t at = st.value("step", int64_t{-1}), want = cfg.get_int("train.max_steps");
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
  // --init-from: the folder's config.json is reconciled with the run's
  // [model] options field by field (adopt_hf_config: taken where the run
  // leaves an option unset, else equal or refused) before the configuration
  // is parsed, so the model, the resolved config.toml and every checkpoint
  // describe the model the weights belong to.
  std::optional<HfFolder> init;
  std::vector<std::string> init_notes;
  bool adopted = false;  // some [model] option was taken from the folder's config.json
  // A LoRA run resumed without --init-from adapts the base its checkpoint
  // names (trainer_state.json "lora".base.dir; checked by SHA-256 below).
  std::string init_dir = opts.init_from;
  if (init_dir.empty() && !resume_ckpt.empty() && fs::exists(fs::path(resume_ckpt) / "adapter_config.json")) {
    const std::string sp = (fs::path(resume_ckpt) / "trainer_state.json").string();
    const json st = io::parse_json(io::read_file(sp), sp);
    if (!st.contains("lora") || !st["lora"].contains("base") || !st["lora"]["base"].contains("dir") ||
        !st["lora"]["base"]["dir"].is_string())
      fail("--resume: ", sp, ": expected \"lora\".base.dir, the base model the adapters were trained on (corrupt?)");
    init_dir = st["lora"]["base"]["dir"].get<std::string>();
  }
  // A full run resumed with --init-from: the checkpoint's weights are the
  // ones trained on; the folder only names where they started (a LoRA run's
  // --init-from names where its base moved, and is used).
  if (!opts.init_from.empty() && !resume_ckpt.empty() &&
      !fs::exists(fs::path(resume_ckpt) / "adapter_config.json") && !quiet)
    spdlog::warn("--init-from {}: with --resume the weights are {}'s; the folder is only checked against the "
                 "run's model", opts.init_from, resume_ckpt);
  if (!opts.init_from.empty() && fs::exists(fs::path(opts.init_from) / "adapter_config.json"))
    fail("--init-from ", opts.init_from, " holds LoRA adapters, not a whole model: write the adapted model with "
         "`snip export --merge` and start from that folder (or resume the run that trained them)");
  if (!init_dir.empty()) {
    try {
      init = read_hf_folder(init_dir);
    } catch (const UserError& e) {
      fail(opts.init_from.empty() ? "--resume: the LoRA base " : "--init-from ", e.what());
    }
    const auto set_before = cfg.values();
    init_notes = adopt_hf_config(*init, cfg);
    adopted = cfg.values() != set_before;
  }
  const quant::RecipeFile recipe_file = quant::register_recipe_file(cfg.get_string("precision.recipe_file"));
  const std::string alias = resolve_precision_alias(cfg);
  const monitor::MonitorOptions monitor_opts = monitor::monitor_options(cfg);  // checked before anything runs
  const RunConfig rc = [&] {  // every option checked and typed, once
    try {
      return RunConfig::from(cfg);
    } catch (const UserError& e) {
      if (!adopted) throw;
      fail(e.what(), " (with [model] options taken from ", init->config_path, " by --init-from)");
    }
  }();
  if (!quiet) {
    // Settings the chosen policy never reads are said once, not silently
    // dropped: under none every precision option (nothing is quantized);
    // the stats step's options where no stats step runs; the FP4 budget
    // under a uniform policy (one option everywhere). precision.seed is left
    // out: `snip experiment --seeds` sets it for every arm.
    const PrecisionConfig& pc = rc.precision;
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
  if (opts.resume && fs::is_regular_file(run / "config.toml")) {
    // What fixes the data order and the tokens of a step cannot change
    // within a run (its position and token counts would be wrong).
    Config saved;
    saved.load_toml_file((run / "config.toml").string());
    // Micro-batches per step: train.grad_accum, or dist.micro_batches under pipeline stages.
    auto micro = [](const Config& c) {
      return c.get_int("dist.pipeline_stages") > 1 && c.get_int("dist.micro_batches") > 0 ? c.get_int("dist.micro_batches")
                                                                                           : c.get_int("train.grad_accum");
    };
    if (micro(saved) != micro(cfg)) {
      const bool pp = cfg.get_int("dist.pipeline_stages") > 1 && cfg.get_int("dist.micro_batches") > 0;
      fail("--resume: ", pp ? "dist.micro_batches" : "train.grad_accum", " is ", micro(cfg), " but ", opts.run_dir,
           " was trained with ", micro(saved), " micro-batches per step (it fixes the data order and the tokens per "
           "step); resume with that value, or start a new --run-dir");
    }
    for (const char* key : {"train.seed", "train.batch_size", "train.seq_len"})
      if (saved.get_int(key) != cfg.get_int(key))
        fail("--resume: ", key, " is ", cfg.get_int(key), " but ", opts.run_dir, " was trained with ",
             saved.get_int(key), " (it fixes the data order and the tokens per step); resume with that value, or "
             "start a new --run-dir");
    // What only changes the arithmetic may change, but then the resumed steps
    // are not bit-identical to an uninterrupted run: say so.
    for (const char* key : {"train.gemm_dtype", "train.gemm_backend"})
      if (saved.get_string(key) != cfg.get_string(key))
        spdlog::warn("--resume: {} is {} but {} was trained with {}: the resumed steps will not be bit-identical "
                     "to an uninterrupted run", key, cfg.get_string(key), opts.run_dir, saved.get_string(key));
    if (saved.get_int("train.threads") != cfg.get_int("train.threads"))
      spdlog::warn("--resume: train.threads is {} but {} was trained with {}: the resumed steps will not be "
                   "bit-identical to an uninterrupted run (GEMM sums are split by thread)",
                   cfg.get_int("train.threads"), opts.run_dir, saved.get_int("train.threads"));
  }
  const TrainConfig& tc = rc.train;
  const dist::DistOptions dopt = dist::DistOptions::from(cfg);
  std::unique_ptr<dist::Communicator> comm;
  if (world.size > 1) {
    comm = dist::connect(world, dopt);
    if (!quiet)
      spdlog::info("dist: {} ranks ({}, {} per machine) over {}, rendezvous {}:{}", world.size, world.source,
                   world.local_size, comm->backend(), world.master_addr, world.master_port);
  }
  const int R = world.size;
  // Settings every rank must share: the layout, the shapes that travel
  // between ranks and the micro-batches of a step. A rank started with
  // others would wait in a collective that never comes (until
  // dist.timeout_s) or exchange tensors of another size. One all-gather of
  // their FNV-1a hashes, before any process group of a stage exists.
  if (comm) {
    static const char* const kShared[] = {
        "model.hidden_size", "model.intermediate_size", "model.num_hidden_layers", "model.num_attention_heads",
        "model.num_key_value_heads", "model.tie_word_embeddings", "model.vocab_size", "train.batch_size",
        "train.seq_len", "train.grad_accum", "train.zero_stage", "dist.grad_comm", "dist.grad_comm_path",
        "dist.pipeline_stages", "dist.pipeline_schedule", "dist.micro_batches", "dist.boundary_comm",
        "dist.stage_split", "dist.stage_boundary", "dist.stage_cost", "dist.rebalance"};
    auto value_of = [&](const std::string& key) {
      const auto it = cfg.values().find(key);
      if (it != cfg.values().end()) return format_option_value(it->second);
      for (const OptionSpec& o : option_table())
        if (o.key == key) return format_option_value(o.def);
      return std::string("?");
    };
    std::vector<int64_t> mine;
    for (const char* k : kShared) {
      mine.push_back(int64_t(fnv1a64(value_of(k))));
    }
    const std::vector<torch::Tensor> all = comm->allgather(torch::tensor(mine, torch::kLong));
    for (size_t i = 0; i < mine.size(); ++i)
      for (int r = 0; r < R; ++r)
        if (all[size_t(r)][int64_t(i)].item<int64_t>() != all[0][int64_t(i)].item<int64_t>())
          fail("dist: rank ", r, " was started with another ", kShared[i], " than rank 0 (this rank, ", world.rank,
               ", has ", value_of(kShared[i]), "); every rank must have the same");
  }
  // Pipeline stages (dist/pipeline.h): S stages x DP replicas; a step reads
  // DP x accum micro-batches (accum = dist.micro_batches when set).
  const int S = dopt.pipeline_stages;
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
  } else if (!quiet) {
    if (dopt.micro_batches > 0)
      spdlog::warn("dist.micro_batches = {} has no effect without pipeline stages (train.grad_accum = {} is the "
                   "micro-batch count)", dopt.micro_batches, tc.grad_accum);
    for (const char* k : {"dist.pipeline_schedule", "dist.boundary_comm", "dist.stage_split", "dist.stage_boundary",
                          "dist.stage_cost", "dist.rebalance"})
      if (cfg.differs_from_default(k))  // a resume's config.toml lists every option, defaults included
        spdlog::warn("{} has no effect without pipeline stages (dist.pipeline_stages = 1)", k);
  }
  const int DP = R / S;  // data-parallel ranks: R without stages
  // dist.grad_comm (validated here at any world size; used with several ranks).
  dist::GradComm gcomm{dist::GradCompressor(dopt.grad_comm, dopt.error_feedback), {}};
  if (R == 1 && !gcomm.compressor.is_fp32() && !quiet)
    spdlog::warn("dist.grad_comm = {} has no effect in one process (no gradient is communicated)", dopt.grad_comm);
  // Residuals of error feedback travel in checkpoints (grad_residuals.safetensors).
  const bool keeps_residuals = R > 1 && !gcomm.compressor.is_fp32() && gcomm.compressor.error_feedback();
  // train.zero_stage (dist/zero.h): with several ranks only.
  const int zero_stage = R > 1 && S == 1 ? int(tc.zero_stage) : 0;
  if (R == 1 && tc.zero_stage > 0 && !quiet)
    spdlog::warn("train.zero_stage = {} has no effect in one process (nothing to shard)", tc.zero_stage);
  if (zero_stage == 2 && !gcomm.compressor.is_fp32())
    fail("dist.grad_comm = ", dopt.grad_comm, " with train.zero_stage = 2 is not built (stage 2 reduces each "
         "gradient to its owner in FP32); use train.zero_stage = 1 or dist.grad_comm = fp32");
  const fs::path data_dir(rc.data.dir);
  const std::string train_bin = (data_dir / "train.bin").string(), val_bin = (data_dir / "val.bin").string();
  for (const auto& p : {train_bin, val_bin})
    if (!fs::exists(p))
      fail("data.dir: ", p, " does not exist (",
           opts.resume ? "moved? continue with --set data.dir=NEW_DIR; else make it with "
                       : "make it with ",
           data::prepare_hint(data_dir.string()), ")");
  // meta.json, tokenizer.model and the shards must agree (vocabulary, dtype,
  // token counts, the tokenizer's SHA-256): samples and exports decode the
  // ids with that tokenizer.
  const data::DataFolderInfo data_info = data::verify_data_folder(data_dir.string(), "data.dir");
  // Which validation set the losses are on (checkpoints record it; `snip
  // report --reference` compares it).
  const std::string val_sha256 = data::sha256_hex(io::read_file(val_bin));
  const int64_t B = tc.batch_size, T = tc.seq_len, max_steps = tc.max_steps;
  const int64_t accum = S > 1 && dopt.micro_batches > 0 ? dopt.micro_batches : tc.grad_accum;
  const uint64_t seed = uint64_t(tc.seed);
  data::TokenLoader loader(train_bin, int(B), int(T), seed);
  {
    data::TokenLoader check_val(val_bin, 1, int(T), 0);
    if (check_val.vocab_size() != loader.vocab_size())
      fail("data.dir: ", val_bin, " has vocabulary ", check_val.vocab_size(), " but ", train_bin, " has ",
           loader.vocab_size(), " (prepared with different tokenizers?)");
  }
  const int64_t shard_vocab = loader.vocab_size();
  const int64_t cfg_vocab = rc.model.vocab_size;
  if (init && init->config.vocab_size < shard_vocab)
    fail("--init-from ", init->config_path, ": vocab_size ", init->config.vocab_size,
         " is smaller than the tokenizer's vocabulary ", shard_vocab, " (", train_bin,
         "): the model has no embedding for its larger token ids");
  // --init-from: the ids mean the pieces of the model's tokenizer. A folder
  // that ships its tokenizer.model (`snip export` writes it, as Hugging Face
  // model folders do) is checked against the data's, as `snip eval` and
  // `snip plan --init-from` check it.
  if (init && !opts.init_from.empty() && resume_ckpt.empty()) {
    const fs::path tok = fs::path(init->dir) / "tokenizer.model";
    if (!fs::is_regular_file(tok)) {
      if (!quiet)
        spdlog::warn("--init-from {} has no tokenizer.model: whether data.dir was tokenized by the model's tokenizer "
                     "cannot be checked", init->dir);
    } else if (const std::string sha = data::sha256_hex(io::read_file(tok.string()));
               sha != data_info.tokenizer_sha256) {
      if (!opts.allow_other_tokenizer)
        fail("--init-from ", init->dir, ": data.dir ", data_dir.string(), " was tokenized with another tokenizer "
             "(SHA-256 ", data_info.tokenizer_sha256.substr(0, 12), "...) than the model (", tok.string(), ": ",
             sha.substr(0, 12), "...): the token ids would mean other pieces; prepare the data with the model's "
             "tokenizer (snip data prepare --tokenizer ", tok.string(), "), or pass --allow-other-tokenizer");
      if (!quiet)
        spdlog::warn("--allow-other-tokenizer: training {} on data tokenized by another tokenizer than its own",
                     init->dir);
    }
  }
  if (init && init->config.vocab_size > shard_vocab)
    init_notes.push_back(str_cat("vocab_size ", init->config.vocab_size, " (", init->config_path,
                                 ") is larger than the tokenizer's vocabulary ", shard_vocab,
                                 ": the embeddings of ids >= ", shard_vocab, " are kept but never trained"));
  if (cfg_vocab > 0 && cfg_vocab < shard_vocab)
    fail("model.vocab_size ", cfg_vocab, " is smaller than the tokenizer's vocabulary ", shard_vocab, " (",
         train_bin, "); set it to 0 to use the tokenizer's");
  // Threads per rank: train.threads, or the cores shared by this machine's ranks.
  set_threads(tc.threads > 0 || world.local_size <= 1
                  ? tc.threads
                  : std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()) / world.local_size));

  torch::manual_seed(seed);
  LlamaConfig mcfg = LlamaConfig::from_run_config(rc.model, shard_vocab);
  check_memory(training_memory(mcfg, B, T), hw::available_memory_bytes(), "snip train");
  LlamaForCausalLM model(mcfg);
  if (init) {
    // Every parameter from the file (shapes and dtypes checked, unused
    // tensors refused), with the file's own tie_word_embeddings deciding
    // what its lm_head.weight means.
    for (std::string& n : load_model_from_safetensors(model, io::read_safetensors(init->weights_path),
                                                      "--init-from " + init->weights_path,
                                                      init->config.tie_word_embeddings))
      init_notes.push_back(std::move(n));
  }
  const at::ScalarType gemm = gemm_dtype_of(tc);
  set_bf16_gemm_backend(parse_bf16_gemm_backend(tc.gemm_backend));
  model->set_precision(LinearPrecision{nullptr, gemm});
  model->set_non_linear_gemm_dtype(gemm);
  auto optimizer = make_optimizer(model, tc);
  // ZeRO: this rank's AdamW holds the parameters it owns, nothing else.
  std::optional<dist::ZeroPartition> zpart;
  if (zero_stage > 0) {
    std::vector<std::string> names;
    std::vector<torch::Tensor> ps;
    for (const auto& np : model->named_parameters()) names.push_back(np.key()), ps.push_back(np.value());
    zpart = dist::zero_partition(names, ps, R);
    optimizer = make_optimizer(zpart->owned(world.rank), tc);
  }
  // Pipeline stages: this rank's stage, its parameters and optimizer, the
  // process groups (dist/pipeline.h). Every rank keeps every stage's weights
  // (evaluation, samples and checkpoints read them; sync_weights refreshes
  // them from the stages); gradients, AdamW state and activations are the
  // stage's own.
  // The checkpoint a resume starts from, verified once (CRC of every file).
  json resume_state;
  if (!resume_ckpt.empty()) resume_state = verify_checkpoint(resume_ckpt);
  // SNIP-LoRA (model/lora.h, docs/lora.md): the base (--init-from, or on a
  // resume the checkpoint's reference, checked by SHA-256) frozen, adapters
  // on lora.target, AdamW over the adapters alone, and the base's linear
  // weights kept in their plan precision (FrozenBase).
  std::shared_ptr<FrozenBase> frozen_base;
  int64_t lora_held_max = 0;  // the most bytes the base's linear weights were held in, over this invocation
  json lora_ref;  // trainer_state.json "lora": the base's reference
  std::vector<torch::Tensor> lora_trainable;
  const bool lora_ckpt = !resume_ckpt.empty() && fs::exists(fs::path(resume_ckpt) / "adapter_config.json");
  if (rc.lora.enabled()) {
    if (S > 1) fail("lora.rank > 0: pipeline stages (dist.pipeline_stages = ", S, ") are not supported with adapters yet");
    if (zero_stage > 0) fail("lora.rank > 0: train.zero_stage = ", zero_stage, " is not supported with adapters yet "
                             "(the optimizer holds the adapters alone; use zero_stage = 0)");
    // The stats step on a frozen base measures LD alone (docs/lora.md).
    if (rc.precision.needs_stats() && rc.precision.per_gemm)
      fail("lora.rank > 0: precision.granularity = gemm is not supported with adapters: a frozen base runs no wgrad "
           "GEMM and the stats step measures the fprop's loss divergence alone (no weight divergence to rank the "
           "dgrad GEMMs by); use precision.granularity = layer");
    if (rc.precision.needs_stats() && rc.precision.curvature_probes == 0 && rc.precision.first_order == FirstOrder::kDrop)
      fail("lora.rank > 0: precision.curvature_probes = 0 with precision.first_order = drop leaves the loss "
           "divergence, the only measure on a frozen base, at 0 for every layer (every plan would be arbitrary); "
           "use curvature_probes >= 1 or first_order = abs");
    std::string base_dir, weights, sha;
    if (!resume_ckpt.empty()) {
      if (!lora_ckpt)
        fail("--resume: ", resume_ckpt, " holds a whole model, not adapters, but lora.rank = ", rc.lora.rank);
      // --init-from on a resume: the same base at another path (its SHA-256 decides).
      const LoraCheckpoint b = lora_checkpoint_base(resume_ckpt, resume_state, "--resume", opts.init_from);
      // The model holds the base already: init is that folder (read above).
      SNIP_CHECK(init, "LoRA resume without its base folder");
      base_dir = b.dir, weights = b.weights, sha = b.sha256;
      // What shapes or scales the trained adapters cannot change within the run.
      const LoraConfig& was = b.config;
      auto refuse = [&](const char* key, const std::string& now, const std::string& then) {
        fail("--resume: lora.", key, " is ", now, " but ", opts.run_dir, " was trained with ", then,
             " (", resume_ckpt, "/adapter_config.json); resume with that value, or start a new --run-dir");
      };
      if (was.rank != rc.lora.rank) refuse("rank", std::to_string(rc.lora.rank), std::to_string(was.rank));
      if (was.alpha != rc.lora.alpha) refuse("alpha", str_cat(rc.lora.alpha), str_cat(was.alpha));
      if (was.train_norms != rc.lora.train_norms)
        refuse("train_norms", rc.lora.train_norms ? "true" : "false", was.train_norms ? "true" : "false");
      if (was.dropout != rc.lora.dropout && !quiet)
        spdlog::warn("--resume: lora.dropout is {} but {} was trained with {}: the resumed steps will not be "
                     "bit-identical to an uninterrupted run", rc.lora.dropout, opts.run_dir, was.dropout);
    } else {
      if (!init)
        fail("lora.rank = ", rc.lora.rank, ": the adapters need a base model to adapt: add --init-from HF_DIR "
             "(e.g. a folder `snip export` wrote)");
      base_dir = fs::absolute(init->dir).lexically_normal().string();
      weights = fs::absolute(init->weights_path).lexically_normal().string();
      sha = base_checksum(weights);
    }
    const std::vector<std::string> adapted = attach_lora(model, rc.lora, seed);
    if (!resume_ckpt.empty()) {
      // The adapted layers are those of the checkpoint (lora.target may be
      // spelled otherwise, not select otherwise).
      const std::string sp = (fs::path(resume_ckpt) / "model.safetensors").string();
      std::set<std::string> saved;
      for (const auto& t : io::read_safetensors(sp).tensors)
        if (t.name.size() > 14 && t.name.compare(t.name.size() - 14, 14, ".lora_A.weight") == 0)
          saved.insert(t.name.substr(0, t.name.size() - 14));
      if (saved != std::set<std::string>(adapted.begin(), adapted.end()))
        fail("--resume: lora.target selects ", adapted.size(), " layers (", adapted.empty() ? "" : adapted.front(),
             ", ...) but ", resume_ckpt, " holds adapters on ", saved.size(), " (",
             saved.empty() ? std::string() : *saved.begin(), ", ...); resume with the lora.target it was trained with");
    }
    for (auto l : model->linear_layers())
      if (l->lora_rank > std::min(l->in_features, l->out_features) && !quiet) {
        spdlog::warn("lora.rank {} is above min(IN, OUT) = {} of {}: such an adapter holds more parameters than a "
                     "full update of the layer", rc.lora.rank, std::min(l->in_features, l->out_features), l->name);
        break;
      }
    for (auto& [n, t] : freeze_base(model, rc.lora)) lora_trainable.push_back(t);
    optimizer = make_optimizer(lora_trainable, tc);
    frozen_base = std::make_shared<FrozenBase>(weights, rc.lora.pack_base);
    for (auto l : model->linear_layers())
      l->refreeze = [fb = frozen_base](QuantLinearImpl& layer) { fb->refreeze(layer); };
    lora_ref = {{"base", {{"dir", base_dir}, {"weights", weights}, {"sha256", sha}}},
                {"rank", rc.lora.rank}, {"alpha", rc.lora.alpha}, {"adapted_layers", adapted.size()}};
  } else if (lora_ckpt) {
    fail("--resume: ", resume_ckpt, " holds LoRA adapters but lora.rank is 0 (set the [lora] options it was "
         "trained with)");
  }
  std::optional<PipelineContext> pipe;
  std::unique_ptr<dist::Communicator> pipe_comm, dp_comm;
  dist::ZeroPartition stage_part;  // owner = world rank of (stage, replica 0): checkpoint shards, sync_weights
  // The parameters of each stage under pc.layout.bounds: pc.stage_params,
  // pc.norm_part and stage_part.
  auto assign_stage_params = [&](PipelineContext& pc) {
    std::vector<std::string> names;
    std::vector<torch::Tensor> ps;
    std::vector<int> owner_stage, owner_rank;
    pc.stage_params.clear();
    for (const auto& np : model->named_parameters()) {
      names.push_back(np.key());
      ps.push_back(np.value());
      owner_stage.push_back(pc.layout.stage_of_param(np.key()));
      owner_rank.push_back(pc.layout.rank_of(owner_stage.back(), 0));
      if (owner_stage.back() == pc.stage || (pc.tied && pc.stage == S - 1 && np.key() == "model.embed_tokens.weight"))
        pc.stage_params.push_back(np.value());
    }
    pc.norm_part = dist::owner_partition(names, ps, owner_stage, S);
    stage_part = dist::owner_partition(names, ps, owner_rank, R);
  };
  // dist.stage_cost = measured: every option's time on this machine (set below).
  std::map<std::string, double> measured_factors;
  // The estimated time of each block under `assign` (relative units: FLOPs
  // x the option's cost factor, dist.stage_cost; a layer without a plan at
  // factor 1), plus the attention products; and lm_head's, on the last stage.
  auto block_costs = [&](const std::map<std::string, std::string>& assign) {
    const double N = double(B * T), C = double(mcfg.hidden_size);
    std::vector<double> block_cost(size_t(mcfg.num_hidden_layers), 12.0 * N * double(T) * C);
    std::vector<std::string> options{"bf16"};
    for (const auto& [item, o] : assign) options.push_back(o);
    const std::map<std::string, double> f =
        dopt.stage_cost == "measured" ? measured_factors : dist::stage_cost_factors(dopt.stage_cost, options);
    auto factor = [&](const std::string& o) {  // an option without a factor costs as BF16
      const auto it = f.find(o);
      return it == f.end() ? 1.0 : it->second;
    };
    for (const QuantLinear& l : model->linear_layers()) {
      const int64_t blk = dist::block_of(l->name);
      const double gemm = 2.0 * N * double(l->in_features) * double(l->out_features);
      if (assign.empty()) block_cost[size_t(blk)] += 3.0 * gemm;
      for (const char* g : {"", ":fprop", ":dgrad", ":wgrad"})  // a layer's option, or each GEMM's
        if (const auto it = assign.find(l->name + g); it != assign.end())
          block_cost[size_t(blk)] += gemm * factor(it->second) * (*g ? 1.0 : 3.0);
    }
    return std::make_pair(block_cost, 6.0 * N * C * double(mcfg.vocab_size));
  };
  if (S > 1) {
    pipe.emplace();
    PipelineContext& pc = *pipe;
    pc.layout.stages = S;
    pc.layout.replicas = DP;
    const auto [block_cost, head] = block_costs({});  // no plan yet: every layer at factor 1
    pc.layout.bounds = dist::stage_bounds(dopt.stage_split, mcfg.num_hidden_layers, S, block_cost, 0.0, head);
    // A resumed run keeps the split its checkpoint had (a rebalance moved it)
    // when the stage count and the rule are the same.
    if (!resume_ckpt.empty() && dopt.stage_split == "balanced") {
      const json saved = resume_state.value("pipeline", json());
      if (saved.is_object() && saved.value("stages", 0) == S && saved.contains("bounds") &&
          saved["bounds"].get<std::vector<int64_t>>().size() == size_t(S) + 1 &&
          saved["bounds"].get<std::vector<int64_t>>().back() == mcfg.num_hidden_layers)
        pc.layout.bounds = saved["bounds"].get<std::vector<int64_t>>();
    }
    pc.stage = pc.layout.stage_of(world.rank);
    pc.replica = pc.layout.replica_of(world.rank);
    pc.schedule = dopt.pipeline_schedule;
    pc.micro_batches = accum;
    pc.fp8_boundary = dopt.boundary_comm == "fp8";
    pc.tied = mcfg.tie_word_embeddings;
    assign_stage_params(pc);
    optimizer = make_optimizer(pc.stage_params, tc);
    pipe_comm = comm->subgroup(pc.layout.pipeline_ranks(pc.replica), "pipeline" + std::to_string(pc.replica));
    if (DP > 1) dp_comm = comm->subgroup(pc.layout.replica_ranks(pc.stage), "replicas" + std::to_string(pc.stage));
    pc.pipe = pipe_comm.get();
    pc.dp = dp_comm.get();
    pc.world = comm.get();
    const std::vector<double> costs = dist::stage_costs(pc.layout.bounds, block_cost, 0.0, head);
    if (!quiet)
      spdlog::info("dist: {} pipeline stages x {} replica{} ({} schedule, {} micro-batches, boundaries in {}); "
                   "blocks per stage {}; estimated stage imbalance {:.3f} (slowest / mean); this rank: stage {}, "
                   "replica {}", S, DP, DP == 1 ? "" : "s", pc.schedule, accum, dopt.boundary_comm,
                   pc.layout.describe(), dist::imbalance(costs), pc.stage, pc.replica);
  }
  // Every stage's weights on every rank, from the stage that trains them
  // (before evaluations, samples and checkpoints).
  // Declared here, set once the quantizer-state gather below exists.
  std::function<void()> sync_quantizers;
  auto sync_weights = [&] {
    if (!pipe) return;
    dist::broadcast_from_owners(*comm, stage_part);
    if (sync_quantizers) sync_quantizers();
  };
  const dist::ZeroPartition* shard_part = zpart ? &*zpart : pipe ? &stage_part : nullptr;
  // dist.stage_cost = measured: every option's time on this machine (rank
  // 0's measurement, broadcast, so that every rank computes the same split).
  if (pipe && dopt.stage_cost == "measured") {
    std::vector<std::string> options{"bf16"};
    for (const std::string& o : rc.precision.options)
      if (o != "bf16") options.push_back(o);
    for (const std::string& o : {rc.precision.warmup_precision, rc.precision.final_precision,
                                 rc.precision.uniform_option})
      if (!o.empty() && o != "bf16" && o != "none") options.push_back(o);
    if (rc.guard.enabled && rc.guard.raise_option != "bf16") options.push_back(rc.guard.raise_option);
    std::sort(options.begin(), options.end());
    options.erase(std::unique(options.begin(), options.end()), options.end());
    const auto m = measure_stage_cost_factors(options, B * T, mcfg.hidden_size, mcfg.intermediate_size, gemm);
    std::vector<double> v;
    for (const std::string& o : options) v.push_back(m.at(o));
    torch::Tensor t = torch::tensor(v, torch::kDouble);
    comm->broadcast(t, 0);
    for (size_t i = 0; i < options.size(); ++i) measured_factors[options[i]] = t[int64_t(i)].item<double>();
    if (!quiet) {
      std::string line;
      for (const auto& [o, f] : measured_factors) line += fmt::format("{}{}={:.3g}", line.empty() ? "" : ", ", o, f);
      spdlog::info("pipeline: GEMM cost per option, measured on rank 0 (dist.stage_cost = measured): {}", line);
    }
  }
  // The stages' estimated imbalance under the assignment in force, the
  // balanced split for it and that split's imbalance.
  auto stage_balance = [&](const std::map<std::string, std::string>& assign) {
    const auto [block_cost, head] = block_costs(assign);
    const std::vector<double> now = dist::stage_costs(pipe->layout.bounds, block_cost, 0.0, head);
    const std::vector<int64_t> best = dist::balanced_split(block_cost, S, 0.0, head);
    const std::vector<double> then = dist::stage_costs(best, block_cost, 0.0, head);
    return std::make_tuple(dist::imbalance(now), best, dist::imbalance(then));
  };
  std::vector<int64_t> pending_bounds;  // dist.rebalance: the split to move to at the next checkpoint
  json rebalanced_to;                   // the split a rebalance moved to (the next step's record)
  double bubble_sum = 0;  // pipeline: measured bubble fractions of this invocation's steps
  int64_t bubble_steps = 0, boundary_bytes = -1;
  double imbalance_now = pipe ? std::get<0>(stage_balance({})) : 1.0;
  // The adaptive precision controller (inactive for policy none). Validates
  // the [precision] options against the layer list, pins and budget included.
  PrecisionController ctl(rc, model->linear_layers(), gemm);
  auto set_controller_stages = [&] {
    std::vector<int> stage_of_layer;
    for (const QuantLinear& l : model->linear_layers()) stage_of_layer.push_back(pipe->layout.stage_of_param(l->name));
    ctl.set_pipeline(std::move(stage_of_layer), pipe->stage, dopt.stage_boundary);
  };
  if (pipe) set_controller_stages();
  if (frozen_base)  // LoRA: loss divergence alone, on the FP32 base read back for the stats step
    ctl.set_frozen_base([&] { frozen_base->materialize(model->linear_layers()); });
  // The guard (train/guard.h): conditions every step, actions on the run.
  Guard guard(rc.guard);

  int64_t step = 0;
  json loader_base;  // where the run last changed its number of ranks (checkpoint_loader_state); null = never
  if (!resume_ckpt.empty()) {
    try {
      load_checkpoint_weights(resume_ckpt, model);
    } catch (const UserError& e) {
      fail("--resume: ", e.what());
    }
    step = resume_state.at("step").get<int64_t>();
    if (resume_state.at("seed").get<uint64_t>() != seed)
      fail("--resume: ", resume_ckpt, "/trainer_state.json has seed ", resume_state.at("seed").get<uint64_t>(),
           " but train.seed is ", seed, " (the seed fixes the data order and the initialisation; corrupt?)");
    if (resume_state.contains("data") && resume_state["data"].contains("vocab_size") &&
        resume_state["data"]["vocab_size"] != json(data_info.vocab_size))
      fail("--resume: ", resume_ckpt, "/trainer_state.json has data.vocab_size ",
           resume_state["data"]["vocab_size"].dump(), " but data.dir's vocabulary is ", data_info.vocab_size,
           " (corrupt, or another data folder)");
    // The ids mean the pieces of one tokenizer: a run does not continue on
    // data tokenized by another.
    const std::string trained_with = checkpoint_tokenizer_sha256(resume_state);
    if (!trained_with.empty() && trained_with != data_info.tokenizer_sha256) {
      if (!opts.allow_other_tokenizer)
        fail("--resume: data.dir ", data_dir.string(), " was tokenized with another tokenizer (SHA-256 ",
             data_info.tokenizer_sha256.substr(0, 12), "...) than ", resume_ckpt, " was trained on (",
             trained_with.substr(0, 12), "...): the token ids would mean other pieces; use that data, or pass "
             "--allow-other-tokenizer");
      spdlog::warn("--allow-other-tokenizer: continuing on data tokenized by another tokenizer than {} was "
                   "trained on", resume_ckpt);
    }
    load_checkpoint_optimizer(resume_ckpt, resume_state, *optimizer, model, tc, step, shard_part);
    // A run killed between its last checkpoint and its summary is finished, not refused.
    if (step > max_steps || (step == max_steps && fs::exists(run / "summary.json")))
      fail("--resume: the checkpoint is at step ", step, " and train.max_steps is ", max_steps,
           ": nothing to do (raise train.max_steps to train further)");
    if (ctl.active() && resume_state.contains("precision"))
      ctl.restore(resume_state["precision"], (fs::path(resume_ckpt) / "trainer_state.json").string());
    if (resume_state.contains("guard"))  // what the guard did before (its windows refill)
      guard.restore(resume_state["guard"], (fs::path(resume_ckpt) / "trainer_state.json").string());
    // Data-parallel ranks of the run that wrote it (its world without
    // pipeline stages; "data_parallel" with them).
    const int64_t saved_world = resume_state.value("data_parallel", resume_state.value("world_size", int64_t{1}));
    // Every rank's loader walks the whole step (step.h): DP x grad_accum
    // micro-batches, DP of the run that wrote the checkpoint.
    const data::LoaderState ls = checkpoint_loader_state(resume_state, B, accum * saved_world,
                                                         loader.windows_per_epoch(),
                                                         (fs::path(resume_ckpt) / "trainer_state.json").string());
    loader.restore(ls);
    if (resume_state.contains("loader_base")) loader_base = resume_state["loader_base"];
    if (saved_world != DP) {
      // Another number of ranks (docs/distributed.md "Resuming on another
      // number of ranks"): the weights and the AdamW state by parameter name
      // are the saved ones; from here a step reads R x grad_accum windows.
      loader_base = {{"step", step}, {"windows", ls.epoch * loader.windows_per_epoch() + ls.cursor}};
      if (!quiet)
        spdlog::warn("--resume: {} was written by {} rank{}, this run has {}: {}a step now reads {} tokens instead "
                     "of {}", resume_ckpt, saved_world, saved_world == 1 ? "" : "s", DP,
                     zero_stage > 0 || (resume_state.contains("zero_stage") && resume_state["zero_stage"] != json(0))
                         ? "the optimizer state is re-sharded by parameter name; "
                         : "",
                     B * T * accum * DP, B * T * accum * saved_world);
    }
  }
  // Every rank starts from the same weights (same seed, same file), or stops here.
  std::vector<std::string> param_names;
  std::vector<torch::Tensor> params;
  for (const auto& np : model->named_parameters()) {
    param_names.push_back(np.key());
    params.push_back(np.value());
  }
  if (comm) dist::check_same_weights(*comm, param_names, params, resume_ckpt.empty() ? "initialisation" : "resume");
  if (keeps_residuals && !resume_ckpt.empty())
    gcomm.residuals = load_grad_residuals(resume_ckpt, resume_state, params, world.rank, R, dopt.grad_comm);
  if (comm && ctl.active()) ctl.set_comm(comm.get());  // stats summed, plans solved by rank 0 and broadcast
  if (zpart && ctl.active())  // the stats step reads every layer's m and v: each owner broadcasts them
    ctl.set_stats_optimizer([&] {
      const double lr = optimizer->param_groups()[0].options().get_lr();
      return dist::gather_adam_state(*comm, *zpart, *optimizer, [&] {
        auto full = make_optimizer(model, tc);
        set_lr(*full, lr);
        return full;
      });
    });

  // ---- the run directory: only now is anything written (by rank 0 alone;
  // every rank has checked what it reads before rank 0 writes)
  if (comm) comm->barrier();
  std::optional<MetricsLog> metrics;
  if (writer) {
    io::ensure_writable_dir(opts.run_dir);
    if (!lock) lock = std::make_unique<io::DirLock>(opts.run_dir, "run directory");
    for (const std::string& line : tidy_checkpoints(opts.run_dir, tc.keep_good)) spdlog::info("checkpoints: {}", line);
    if (!resume_ckpt.empty() && !fs::exists(resume_ckpt)) resume_ckpt = latest_checkpoint(opts.run_dir);  // renamed
    // checks what it reads back first
    metrics.emplace((run / "metrics.jsonl").string(), opts.resume ? step : -1,
                    resume_ckpt.empty() ? json() : resume_state.value("rollback_record", json()));
    io::write_file_atomic((run / "config.toml").string(), cfg.to_toml());
    if (std::string w = quant::record_run_recipes(opts.run_dir, recipe_file, opts.resume); !w.empty()) spdlog::warn(w);
  }
  // (step, training loss) of the last 10 finite steps of the trajectory (the
  // summary's train loss); a rollback drops the abandoned ones, as a resume
  // rebuilding it from metrics.jsonl does.
  std::deque<std::pair<int64_t, double>> recent;
  double best_val = std::numeric_limits<double>::infinity();
  // (step, validation loss) of the trajectory's evaluations: best_val is
  // their minimum; a rollback drops the abandoned ones (as a resume does).
  std::vector<std::pair<int64_t, double>> val_hist;
  double last_val = std::nan("");
  for (const json& r : metrics ? metrics->earlier() : std::vector<json>{}) {
    if (r.contains("loss") && r["loss"].is_number()) recent.emplace_back(r["step"].get<int64_t>(), r["loss"].get<double>());
    if (recent.size() > 10) recent.pop_front();
    if (r.contains("val_loss") && r["val_loss"].is_number()) {
      last_val = r["val_loss"].get<double>();
      best_val = std::min(best_val, last_val);
      val_hist.emplace_back(r["step"].get<int64_t>(), last_val);
    }
  }
  if (writer) ctl.set_output(opts.run_dir, chatty);

  const bool tty = chatty && isatty(STDERR_FILENO);
  const int64_t tokens_per_step = B * T * accum * DP;
  // Tokens trained on the trajectory that leads to the weights (a rollback
  // returns to its checkpoint's count), counted step by step: a resume on
  // another number of ranks changes tokens_per_step. Checkpoints before this
  // count was recorded: step x today's tokens per step.
  int64_t tokens_trained = resume_ckpt.empty() ? 0 : resume_state.value("tokens", step * tokens_per_step);
  const int64_t warmup = tc.warmup_steps;
  // The /metrics endpoint (monitor/exporter.h), fed the record of each step.
  const std::unique_ptr<monitor::Exporter> exporter = monitor::start_exporter(
      monitor_opts,
      {tokens_per_step, world.rank, R, ctl.policy(), {}, rc.guard.quant_error_threshold,
       rc.guard.quant_error_threshold_fp4},
      world.local_rank, !opts.quiet);
  if (!quiet) {
    if (!alias.empty()) spdlog::info("{}", alias);
    for (const std::string& n : init_notes) spdlog::info("--init-from: {}", n);
    if (warmup > max_steps)
      spdlog::warn("train.warmup_steps = {} is larger than train.max_steps = {}: the learning rate never reaches "
                   "train.lr (peak {:.3g} at the last step)", warmup, max_steps,
                   lr_at(max_steps - 1, max_steps, warmup, tc.lr, tc.min_lr_ratio));
    spdlog::info("model: {} parameters ({} layers, C={}, V={}), {} tokens/step, GEMMs in {}, policy {}",
                 mcfg.num_parameters(), mcfg.num_hidden_layers, mcfg.hidden_size, mcfg.vocab_size,
                 tokens_per_step, tc.gemm_bf16 ? "bf16" : "fp32", ctl.policy());
    if (tc.gemm_bf16) {
      spdlog::info("BF16 GEMMs {} ({})", native_bf16_gemm() ? "native" : "emulated: FP32 GEMMs on BF16-rounded operands",
                   bf16_gemm_reason());
      if (native_bf16_gemm() && !libtorch_bf16_gemm_accumulates_fp32())
        spdlog::warn("LibTorch's BF16 GEMM accumulates in BF16 on this CPU: inexact and ~100x slower than the "
                     "emulated path (set train.gemm_backend = auto; `snip doctor` measures both)");
    }
    if (step == max_steps) spdlog::info("{} holds the run's last step {}: writing its summary", resume_ckpt, step);
    else if (!resume_ckpt.empty()) spdlog::info("resumed from {} at step {}", resume_ckpt, step);
    else if (opts.resume)
      spdlog::info("{} has no checkpoint yet: starting it from step 0 with its saved configuration", opts.run_dir);
  }

  // A short sample at each evaluation, to see what the model learned. A
  // sample that cannot be made is a warning, never the run's end.
  std::unique_ptr<data::TokenizerClient> sampler;
  std::vector<int32_t> sample_prompt;
  SampleOptions sample_opts;
  sample_opts.max_new_tokens = tc.sample_tokens;
  if (chatty && sample_opts.max_new_tokens > 0 && !opts.snip_data.empty()) {
    try {
      sampler = std::make_unique<data::TokenizerClient>(opts.snip_data, (data_dir / "tokenizer.model").string());
      sample_prompt = sampler->encode(tc.sample_prompt, /*bos=*/true);
      sample_opts.eos_id = data::TokenizerMeta::read(data_dir.string()).eos_id;
      sample_opts.vocab_limit = int64_t(data_info.vocab_size);  // a larger model vocabulary: its extra ids decode to nothing
    } catch (const std::exception& e) {
      spdlog::warn("no samples at evaluations: {}", e.what());
      sampler.reset();
    }
  }
  auto print_sample = [&] {
    QuantStateFreeze freeze;  // nor does sampling
    try {
      sample_opts.seed = seed + uint64_t(step);
      std::string text = sampler->decode(sample(model, sample_prompt, sample_opts));
      // One line, no terminal control bytes (an untrained model writes any piece).
      for (char& c : text)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
      std::fprintf(stderr, "sample: %s\n", text.c_str());
    } catch (const std::exception& e) {
      spdlog::warn("no more samples: {}", e.what());
      sampler.reset();
    }
  };

  // Under pipeline stages the step talks through PipelineContext, not `comm`.
  StepContext sc{model, *optimizer, loader, B, T, accum, tc.grad_clip, seed, &ctl, pipe ? nullptr : comm.get(),
                 comm && !pipe ? &gcomm : nullptr, zpart ? &*zpart : nullptr, zero_stage};
  sc.overlap = dopt.overlap;
  sc.skip_nonfinite = guard.enabled();
  sc.clip_low_precision = tc.clip_low_precision;
  if (frozen_base) {
    // After each step boundary (a plan may have changed precisions): every
    // base weight frozen for its precision, the FP32 copies released.
    sc.after_boundary = [&] {
      if (frozen_base->sync(model->linear_layers()) > 0)
        lora_held_max = std::max(lora_held_max, frozen_base->memory(model->linear_layers()).stored_bytes);
    };
    frozen_base->sync(model->linear_layers());
    const FrozenMemory fm = frozen_base->memory(model->linear_layers());
    lora_held_max = fm.stored_bytes;
    int64_t n_train = 0;
    for (const auto& t : lora_trainable) n_train += t.numel();
    if (!quiet)
      spdlog::info("lora: rank {}, alpha {} (scale {:.4g}) on {} layers; {} trainable parameters ({:.3f}% of {}); "
                   "base linear weights {:.2f} MiB in FP32, {:.2f} MiB as stored now ({})",
                   rc.lora.rank, rc.lora.alpha, rc.lora.scale(), lora_ref["adapted_layers"].get<int64_t>(), n_train,
                   100.0 * double(n_train) / double(mcfg.num_parameters()), mcfg.num_parameters(),
                   double(fm.fp32_bytes) / (1 << 20), double(fm.stored_bytes) / (1 << 20),
                   rc.lora.pack_base ? "packed in each layer's precision, re-packed when a plan changes it"
                                     : "lora.pack_base = false");
    if (!quiet && rc.precision.needs_stats())
      spdlog::info("lora: the stats step measures the loss divergence alone on the frozen base (precision.alpha "
                   "is not used; docs/lora.md)");
    lora_ref["trainable_parameters"] = n_train;
  }
  gcomm.allgather = dopt.allgather;
  json memory_per_rank;  // bytes each rank holds after this invocation's first step (dist::rank_memory)
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  // Wall time of the earlier invocations (a resumed run's elapsed_s continues).
  const double elapsed0 = resume_ckpt.empty() ? 0.0 : resume_state.value("elapsed_s", 0.0);
  const int64_t start_step = step;
  // The steps at which sessions resumed this run (this one included).
  std::vector<int64_t> resumed_at;
  if (!resume_ckpt.empty()) {
    if (resume_state.contains("resumed_at")) resumed_at = resume_state["resumed_at"].get<std::vector<int64_t>>();
    resumed_at.push_back(step);
  }
  // Pipeline stages: each stage's quantizers hold the state (delayed
  // scaling's amax histories, error-feedback residuals) of its own layers
  // only; rank 0 writes the layers' entries of every stage's first replica
  // (collective: two all-gathers of the state as JSON bytes).
  // `own`: this rank's own stage's entries from `mine` (its replica's
  // activations shaped them), the others' from each stage's first replica.
  auto pipeline_quantizer_state = [&](const json& mine, bool own) {
    const std::string bytes = mine.dump();
    const std::vector<torch::Tensor> lens = comm->allgather(torch::tensor({int64_t(bytes.size())}, torch::kLong));
    int64_t longest = 0;
    for (const torch::Tensor& l : lens) longest = std::max(longest, l.item<int64_t>());
    torch::Tensor buf = torch::zeros({longest}, torch::kUInt8);
    if (!bytes.empty()) std::memcpy(buf.data_ptr<uint8_t>(), bytes.data(), bytes.size());
    const std::vector<torch::Tensor> all = comm->allgather(buf);
    const std::vector<int>& stage_of_layer = ctl.stage_of_layer();
    json out = json::object();
    for (int r = 0; r < R; ++r) {
      const int stage = pipe->layout.stage_of(r);
      if (own ? (stage == pipe->stage ? r != world.rank : pipe->layout.replica_of(r) != 0)
              : pipe->layout.replica_of(r) != 0)
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
  };
  // Every rank evaluates the whole model: each gets the other stages'
  // quantizer state (its own stays as it is).
  if (pipe && ctl.active())
    sync_quantizers = [&] {
      ctl.restore_quantizers(pipeline_quantizer_state(ctl.quantizer_state(), true), "pipeline quantizer state");
    };
  // A resumed run keeps its baseline (trainer_state.json "init_val_loss").
  double init_val = resume_state.is_object() && resume_state.contains("init_val_loss") &&
                            resume_state["init_val_loss"].is_number()
                        ? resume_state["init_val_loss"].get<double>()
                        : std::nan("");
  // The record of a rollback while its target is written again (the rewrite
  // carries it: MetricsLog).
  json rollback_record;
  auto checkpoint_state = [&] {
    auto ls = loader.state();
    json st = {{"step", step}, {"tokens", tokens_trained},
               {"loader", {{"epoch", ls.epoch}, {"cursor", ls.cursor}}}, {"seed", seed},
               {"val_loss", std::isfinite(last_val) ? json(last_val) : json(nullptr)},
               {"elapsed_s", elapsed0 + elapsed()}, {"resumed_at", resumed_at},
               {"data", {{"dir", fs::absolute(data_dir).lexically_normal().string()},
                         {"tokenizer_sha256", data_info.tokenizer_sha256},
                         {"vocab_size", data_info.vocab_size},
                         {"val_sha256", val_sha256},
                         {"tokenizer", tokenizer_record(data_info)},
                         {"seq_len", T}}}};
    if (std::isfinite(init_val)) st["init_val_loss"] = init_val;
    if (ctl.active()) st["precision"] = ctl.state();
    if (ctl.active() && pipe) st["precision"]["quantizers"] = pipeline_quantizer_state(st["precision"]["quantizers"], false);
    if (R > 1) st["world_size"] = R;  // resume checks it (absent = 1)
    if (pipe) {
      st["data_parallel"] = DP;  // the loader's ranks (absent = world_size)
      st["pipeline"] = {{"stages", S}, {"replicas", DP}, {"bounds", pipe->layout.bounds},
                        {"schedule", pipe->schedule}, {"micro_batches", accum}};
    }
    if (zero_stage > 0) st["zero_stage"] = zero_stage;
    if (!loader_base.is_null()) st["loader_base"] = loader_base;
    if (guard.enabled()) st["guard"] = guard.to_json();
    if (!lora_ref.is_null()) st["lora"] = lora_ref;
    if (!rollback_record.is_null()) st["rollback_record"] = rollback_record;
    return st;
  };

  // Test-only fault (tests of the guard, train/guard.h): SNIP_TEST_FAULT =
  // "grad-inf@N" puts +Inf into the first gradient element at step N (the
  // step's record number), "lr-spike@N:F" multiplies step N's learning rate
  // by F. Each fires once per process (a rollback does not re-arm it).
  struct {
    std::string kind;
    int64_t step = -1;
    double factor = 1;
    bool fired = false;
  } fault;
  if (const char* f = std::getenv("SNIP_TEST_FAULT"); f && *f) {
    const std::string v = f;
    const size_t at = v.find('@'), colon = v.find(':');
    fault.kind = v.substr(0, at);
    SNIP_CHECK(at != std::string::npos && (fault.kind == "grad-inf" || fault.kind == "lr-spike"),
               "SNIP_TEST_FAULT: expected grad-inf@N or lr-spike@N:F, got '", v, "'");
    fault.step = std::atoll(v.c_str() + at + 1);
    if (fault.kind == "lr-spike") {
      SNIP_CHECK(colon != std::string::npos, "SNIP_TEST_FAULT: expected lr-spike@N:F, got '", v, "'");
      fault.factor = std::atof(v.c_str() + colon + 1);
    }
  }
  if (fault.kind == "grad-inf")
    sc.fault = [&](int64_t s) {
      if (fault.fired || s + 1 != fault.step) return;
      fault.fired = true;
      torch::NoGradGuard ng;
      for (torch::Tensor& p : params)
        if (p.grad().defined()) {
          p.mutable_grad().view(-1)[0] = std::numeric_limits<float>::infinity();
          break;
        }
    };

  StopOnSignal stop_signal;  // Ctrl-C / Slurm's SIGTERM: finish the step, checkpoint, stop
  int stopped_by = 0;
  // Test-only fault (tests/cli/test_dist.py): SNIP_TEST_PERTURB_RANK=r adds
  // 1e-3 to the first element of the last parameter on rank r after step
  // SNIP_TEST_PERTURB_STEP (default 1), to prove the weight checksum catches it.
  const int perturb_rank = std::getenv("SNIP_TEST_PERTURB_RANK") ? std::atoi(std::getenv("SNIP_TEST_PERTURB_RANK")) : -1;
  const int64_t perturb_step =
      std::getenv("SNIP_TEST_PERTURB_STEP") ? std::atoll(std::getenv("SNIP_TEST_PERTURB_STEP")) : 1;
  std::string last_checkpoint;
  double last_checkpoint_s = elapsed();
  int64_t steps_done = 0;  // steps this invocation ran (a rollback sets `step` back, not this)
  int64_t consecutive_skips = 0;  // steps in a row whose update was skipped (non-finite)
  constexpr int64_t kMaxConsecutiveSkips = 5;  // then the run stops whatever the action (guard.h)
  double clip_in_force = -1;  // the clipping threshold of the last step (logged when it changes)
  // The guard's stall watchdog (guard.stall_minutes): a thread that warns
  // once per step that has run longer than that.
  std::atomic<int64_t> step_started_ns{0};
  std::atomic<bool> watchdog_stop{false};
  std::thread watchdog;
  if (guard.enabled() && rc.guard.stall_minutes > 0) {
    watchdog = std::thread([&, limit = int64_t(rc.guard.stall_minutes * 60e9)] {
      int64_t warned_for = -1;
      while (!watchdog_stop) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        const int64_t t = step_started_ns.load();
        if (t > 0 && t != warned_for && monotonic_ns() - t > limit) {
          warned_for = t;
          spdlog::warn("guard: the step in progress has run for more than {} minutes (guard.stall_minutes): "
                       "stalled? (a rank waiting for another stops after dist.timeout_s)", rc.guard.stall_minutes);
          if (exporter) exporter->set_guard_state(int(GuardState::kWarned));
        }
      }
    });
  }
  struct JoinWatchdog {
    std::atomic<bool>& stop;
    std::thread& t;
    ~JoinWatchdog() {
      stop = true;
      if (t.joinable()) t.join();
    }
  } join_watchdog{watchdog_stop, watchdog};
  // Returns to the last good checkpoint (guard.h "rollback"); the outcome line.
  auto rollback = [&](const std::string& target, const json& st) -> std::pair<int64_t, std::string> {
    const std::string what = (fs::path(target) / "trainer_state.json").string();
    const int64_t to = st.at("step").get<int64_t>();
    load_checkpoint_weights(target, model);
    load_checkpoint_optimizer(target, st, *optimizer, model, tc, to, shard_part);
    if (ctl.active() && st.contains("precision")) ctl.restore(st["precision"], what);
    if (keeps_residuals) gcomm.residuals = load_grad_residuals(target, st, params, world.rank, R, dopt.grad_comm);
    // The data since the checkpoint is skipped: the loader keeps its position
    // (loader_base records it for the loader check of a later resume).
    const data::LoaderState ls = loader.state();
    const uint64_t now = ls.epoch * loader.windows_per_epoch() + ls.cursor;
    const data::LoaderState then = checkpoint_loader_state(st, B, accum * st.value("data_parallel", st.value("world_size", int64_t{1})),
                                                           loader.windows_per_epoch(), what);
    const uint64_t skipped = now - (then.epoch * loader.windows_per_epoch() + then.cursor);
    loader_base = {{"step", to}, {"windows", now}};
    const int64_t from = step;
    step = to;
    tokens_trained = st.value("tokens", to * tokens_per_step);
    last_val = st.contains("val_loss") && st["val_loss"].is_number() ? st["val_loss"].get<double>() : std::nan("");
    while (!recent.empty() && recent.back().first > to) recent.pop_back();
    while (!val_hist.empty() && val_hist.back().first > to) val_hist.pop_back();
    best_val = std::numeric_limits<double>::infinity();
    for (const auto& [s, v] : val_hist) best_val = std::min(best_val, v);
    std::string dropped;
    if (writer)
      for (int64_t s : discard_checkpoints_after(opts.run_dir, to)) dropped += (dropped.empty() ? "" : ", ") + std::to_string(s);
    if (comm) {
      dist::check_same_weights(*comm, param_names, params, str_cat("rollback to step ", to));
      comm->barrier();
    }
    guard.reset_windows();
    ++guard.rollbacks;
    return {to, fmt::format("rolled back from step {} to {} ({}), skipping the {} windows read since{}", from, to,
                            target, skipped, dropped.empty() ? "" : "; deleted the later checkpoints " + dropped)};
  };
  // Writes checkpoint step-`step` (collective with several ranks). It is a
  // rollback target (last_good.json) when `scheduled` and it passes
  // validation (checkpoint.keep_good: finite and within good_margin of the
  // best recorded validation loss; a step without an evaluation evaluates
  // now, which changes no training number and is not recorded). `validated`:
  // the validation of the checkpoint this one rewrites (after a rollback).
  bool not_good_warned = false;
  auto write_checkpoint = [&](bool scheduled, bool eval_step, const json* validated) {
    Retention keep(tc.keep_checkpoints);
    keep.keep_good = tc.keep_good;
    keep.good = scheduled;
    json validation = validated ? *validated : json(nullptr);
    if (tc.keep_good > 0 && scheduled && !validated) {
      if (!eval_step) sync_weights();
      const double v = eval_step ? last_val : evaluate_dist(model, val_bin, B, T, tc.eval_batches, comm.get());
      const double best = std::isfinite(best_val) ? best_val : v;  // no evaluation recorded yet: itself
      keep.good = std::isfinite(v) && v <= best * (1.0 + tc.good_margin);
      validation = {{"val_loss", std::isfinite(v) ? json(v) : json(nullptr)},
                    {"best_val_loss", std::isfinite(best) ? json(best) : json(nullptr)},
                    {"margin", tc.good_margin}, {"good", keep.good}};
      // Warned once; later ones are info lines (an overfitting run would say it
      // at every checkpoint). trainer_state.json "validation" records each.
      if (!keep.good && writer)
        spdlog::log(not_good_warned ? spdlog::level::info : spdlog::level::warn,
                    "checkpoint at step {}: validation loss {:.4f} is not within {:.3g} of the best {:.4f}: kept, "
                    "but not a rollback target (checkpoint.good_margin){}", step, v, tc.good_margin, best,
                    not_good_warned ? "" : "; later such checkpoints are info lines");
      if (!keep.good) not_good_warned = true;
    }
    if (validated) keep.good = validated->is_object() ? validated->value("good", true) : true;
    json state = checkpoint_state();
    if (!validation.is_null()) state["validation"] = validation;
    // The tokenizer travels with the model (checkpoint_tokenizer): a run
    // folder does not depend on data.dir staying put.
    std::map<std::string, std::string> extra =
        writer ? hf_tokenizer_files(HfTokenizer::of_data_folder(data_info), model->cfg.max_position_embeddings)
               : std::map<std::string, std::string>{};
    if (frozen_base)  // PEFT's adapter_config.json: the checkpoint folder is a PEFT adapter folder too
      extra["adapter_config.json"] =
          peft_adapter_config(model, rc.lora, lora_ref["base"]["dir"].get<std::string>()).dump(2) + "\n";
    if (keeps_residuals) {  // every rank's residuals to rank 0, which writes them with the checkpoint
      const std::string bytes = grad_residuals_file(*comm, gcomm, dopt.grad_comm);
      if (writer) extra["grad_residuals.safetensors"] = bytes;
    }
    if (!(tc.keep_good > 0 && scheduled && !validated && !eval_step))  // else synced for the validation above
      sync_weights();  // pipeline stages: rank 0 writes every stage's weights
    if (shard_part) {  // every rank writes its optimizer shard (checkpoint.h)
      const OptimizerShards sh{comm.get(), dist::optimizer_shard_bytes(*optimizer, *shard_part, world.rank),
                               writer ? dist::optimizer_index(*shard_part, zero_stage).dump(2) + "\n" : ""};
      last_checkpoint = save_checkpoint(opts.run_dir, step, model, *optimizer, state, keep, extra, &sh);
      if (writer && step != max_steps) write_run_report(opts.run_dir);
    } else if (writer) {
      last_checkpoint = save_checkpoint(opts.run_dir, step, model, *optimizer, state, keep, extra);
      if (step != max_steps) write_run_report(opts.run_dir);
    } else {
      last_checkpoint = (run / "checkpoints" / ("step-" + std::to_string(step))).string();
    }
    last_checkpoint_s = elapsed();
    if (exporter) exporter->checkpoint_written(step);
    if (comm) comm->barrier();  // the checkpoint exists before any rank goes on (or stops)
  };
  // "replan": budget down, smoothing up, a plan at the next boundary.
  auto raise = [&] {
    if (!ctl.active()) return std::string("no precision plan to raise (precision.policy = none)");
    const double b0 = ctl.budget(), s0 = ctl.smoothing();
    ctl.raise_precision(rc.guard.budget_step, rc.guard.smoothing);
    ++guard.raises;
    return fmt::format("precision.budget {:.3g} -> {:.3g}, smoothing {:.3g} -> {:.3g}, re-plan before step {}", b0,
                       ctl.budget(), s0, ctl.smoothing(), step + 1);
  };
  // Fine-tuning (--init-from): the loaded model's validation loss before the
  // first step, on the windows every later evaluation uses, so the run's
  // losses have their baseline (summary.json "init_val_loss").
  if (!opts.init_from.empty() && start_step == 0 && tc.eval_interval > 0) {
    sync_weights();
    init_val = evaluate_dist(model, val_bin, B, T, tc.eval_batches, comm.get());
    if (chatty)
      std::fprintf(stderr, "step %6d/%lld | val %.4f (%lld-token windows): the --init-from model before training\n",
                   0, static_cast<long long>(max_steps), init_val, static_cast<long long>(T));
  }
  while (step < max_steps) {
    if (opts.stop_after > 0 && steps_done >= opts.stop_after) break;
    const auto ts = std::chrono::steady_clock::now();
    step_started_ns = monotonic_ns();
    double lr = lr_at(step, max_steps, warmup, tc.lr, tc.min_lr_ratio);
    if (fault.kind == "lr-spike" && !fault.fired && step + 1 == fault.step) {
      lr *= fault.factor;
      fault.fired = true;
    }
    const StepResult r = pipe ? pipeline_step(sc, *pipe, step, lr) : train_step(sc, step, lr);
    step_started_ns = 0;
    ++step;
    ++steps_done;
    tokens_trained += tokens_per_step;
    if (steps_done == 1) {
      // Measured from the tensors held (parameters, allocated .grad, AdamW m and v).
      const dist::RankMemory m = dist::rank_memory(params, *optimizer);
      torch::Tensor mine = torch::tensor({m.params, m.grads, m.optimizer}, torch::kLong);
      const std::vector<torch::Tensor> all = comm ? comm->allgather(mine) : std::vector<torch::Tensor>{mine};
      memory_per_rank = json::array();
      for (size_t k = 0; k < all.size(); ++k) {
        const int64_t* v = all[k].data_ptr<int64_t>();
        memory_per_rank.push_back({{"rank", k}, {"params_bytes", v[0]}, {"grads_bytes", v[1]},
                                   {"optimizer_bytes", v[2]}});
        if (!quiet && comm)
          spdlog::debug("memory rank {} (train.zero_stage {}): parameters {} B, gradients {} B, AdamW state {} B",
                       k, zero_stage, v[0], v[1], v[2]);
      }
    }
    if (comm && r.precision.decided) {
      // Every rank applied rank 0's plan (PrecisionController::set_comm): the
      // assignments in force must be one.
      std::string plan;
      for (const auto& [item, option] : ctl.assignments()) plan += item + "=" + option + ";";
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
    if (comm && world.rank == perturb_rank && step == perturb_step) {
      torch::NoGradGuard ng;
      params.back().view(-1)[0].add_(1e-3);
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    if (std::isfinite(r.loss)) {
      recent.emplace_back(step, r.loss);
      if (recent.size() > 10) recent.pop_front();
    }
    json rec = {{"step", step}, {"loss", r.loss}, {"lr", lr}, {"grad_norm", r.grad_norm},
                {"tokens_per_s", double(tokens_per_step) / dt}, {"elapsed_s", elapsed0 + elapsed()},
                {"fp4_share", ctl.fp4_share()}};
    rec["step_s"] = dt;
    if (r.grad_comm_bytes >= 0) rec["grad_comm_bytes"] = r.grad_comm_bytes;
    if (r.grad_comm_sent_bytes >= 0) rec["grad_comm_sent_bytes"] = r.grad_comm_sent_bytes;
    if (r.comm_s >= 0) rec["comm_s"] = r.comm_s;
    if (!rebalanced_to.is_null()) rec["rebalanced_to"] = std::exchange(rebalanced_to, json());
    if (r.pipe_bubble >= 0) {
      rec["pipe_bubble"] = r.pipe_bubble;
      rec["boundary_bytes"] = r.boundary_bytes;
      if (!r.precision.metrics.contains("stats_seconds")) bubble_sum += r.pipe_bubble, ++bubble_steps;
      boundary_bytes = r.boundary_bytes;
      if (r.precision.decided) {
        const auto [imb, best, best_imb] = stage_balance(ctl.assignments());
        imbalance_now = imb;
        rec["stage_imbalance"] = imb;
        const bool better = best != pipe->layout.bounds && best_imb < imb * 0.99;
        if (better && dopt.rebalance && dopt.stage_split == "balanced") {
          pending_bounds = best;
          if (!quiet)
            spdlog::info("pipeline: under the plan before step {} the stages' estimated imbalance is {:.3f} "
                         "(slowest / mean); blocks move to bounds [{}] ({:.3f}) at the next checkpoint "
                         "(dist.rebalance)", step, imb, fmt::join(best, ", "), best_imb);
        } else if (better && !quiet) {
          spdlog::info("pipeline: under the plan before step {} the stages' estimated imbalance is {:.3f} "
                       "(slowest / mean); a split at block bounds [{}] would give {:.3f} (dist.stage_split at "
                       "a resume, or dist.rebalance with a balanced split)", step, imb, fmt::join(best, ", "),
                       best_imb);
        }
      }
    }
    for (auto& [k, v] : r.precision.metrics.items()) rec[k] = v;
    if (r.grad_clip != clip_in_force) {
      if (clip_in_force >= 0 && !quiet)
        spdlog::info("train.grad_clip in force from step {}: {:.4g} ({})", step, r.grad_clip,
                     r.grad_clip < tc.grad_clip ? "a layer runs below FP8: x train.clip_low_precision"
                                                : "no layer below FP8");
      if (tc.clip_low_precision != 1.0) rec["grad_clip"] = r.grad_clip;
      clip_in_force = r.grad_clip;
    }
    // ---- the guard (train/guard.h): every step, before anything is evaluated or saved
    bool rolled_back = false;
    json rollback_checkpoint;  // the rolled-back-to checkpoint's "validation", to write it again
    if (r.skipped) {
      ++guard.skipped_steps;
      rec["skipped"] = true;
      // An error-feedback residual never carries a non-finite value into the next step.
      for (torch::Tensor& e : gcomm.residuals) e.nan_to_num_(0.0, 0.0, 0.0);
    }
    GuardObservation obs;
    obs.step = step;
    obs.loss = r.loss;
    obs.grad_norm = r.grad_norm;
    // Throughput of plain steps only: not the first of an invocation (warm-up),
    // not a stats step (extra passes).
    if (steps_done > 1 && !r.precision.metrics.contains("stats_seconds")) obs.tokens_per_s = double(tokens_per_step) / dt;
    if (r.precision.metrics.contains("rel_err_fprop"))
      for (auto& [layer, v] : r.precision.metrics["rel_err_fprop"].items()) {
        obs.quant_error[layer] = v.is_number() ? v.get<double>() : std::nan("");
        // The element bits of the option the layer's fprop runs (the item is
        // the layer, or "layer:fprop" under precision.granularity = gemm).
        const json& prec = r.precision.metrics.value("precision", json::object());
        const std::string item = prec.contains(layer) ? layer : layer + ":fprop";
        if (prec.contains(item) && prec[item].is_string() && quant::has_recipe(prec[item].get<std::string>())) {
          const quant::Recipe q = quant::find_recipe(prec[item].get<std::string>());
          obs.quant_bits[layer] = std::min(q[Operand::kFpropX].element.bits, q[Operand::kFpropW].element.bits);
        }
      }
    std::vector<GuardEvent> events = guard.observe(obs);
    if (!r.nonfinite_stats.empty())
      for (GuardEvent& e : events)
        if (e.condition == "nonfinite") e.reason = r.nonfinite_stats + " (the step was skipped)";
    consecutive_skips = r.skipped ? consecutive_skips + 1 : 0;
    const GuardAction asked = Guard::strongest(events);
    GuardAction act = asked;
    std::string stop_reason;
    if (!events.empty()) {
      std::string outcome;
      if (act == GuardAction::kRollback && guard.rollbacks >= rc.guard.max_rollbacks) {
        act = GuardAction::kStop;
        outcome = fmt::format("guard.max_rollbacks = {} reached: stopping instead of rolling back; ",
                              rc.guard.max_rollbacks);
      }
      std::string target;
      if (act == GuardAction::kRollback) {
        target = rollback_target(opts.run_dir);
        // Nothing to return to and nothing to raise: a run that cannot get
        // better stops rather than skipping step after step.
        if (target.empty() && !ctl.active()) {
          act = GuardAction::kStop;
          outcome = "no good checkpoint yet to roll back to and no precision plan to raise: ";
        }
      }
      // A skipped update leaves the weights as they were: a run that stays
      // non-finite would skip to its end. Only a real rollback changes that.
      if (consecutive_skips >= kMaxConsecutiveSkips && act != GuardAction::kStop &&
          !(act == GuardAction::kRollback && !target.empty())) {
        act = GuardAction::kStop;
        outcome = fmt::format("{} steps in a row were not finite: ", consecutive_skips);
      }
      if (act == GuardAction::kRollback) {
        if (target.empty()) {
          outcome = "no good checkpoint yet to roll back to: " + raise();
          guard.state = GuardState::kRaised;
        } else {
          const json st = verify_checkpoint(target);
          const json validated = st.value("validation", json(nullptr));
          const auto [to, line] = rollback(target, st);
          rec["rollback_to"] = to;
          outcome = line + "; " + raise();
          rolled_back = true;
          consecutive_skips = 0;
          guard.state = GuardState::kRolledBack;
          rollback_checkpoint = validated.is_null() ? json::object() : validated;
        }
      } else if (act == GuardAction::kReplan) {
        outcome = raise();
        guard.state = GuardState::kRaised;
      } else if (act == GuardAction::kFp8Layer) {
        std::vector<std::string> layers;
        for (const GuardEvent& e : events) layers.insert(layers.end(), e.layers.begin(), e.layers.end());
        if (layers.empty()) layers = ctl.layers_below_fp8();
        const std::vector<std::string> moved = ctl.force_option(layers, rc.guard.raise_option);
        outcome = moved.empty() ? std::string("no layer to move (none below FP8, or no plan yet)")
                                : fmt::format("{} moved to {} until the next plan", fmt::join(moved, ", "), rc.guard.raise_option);
        guard.state = GuardState::kRaised;
      } else if (act == GuardAction::kStop) {
        const std::string last = last_checkpoint.empty() ? latest_checkpoint(opts.run_dir) : last_checkpoint;
        outcome += last.empty() ? std::string("stopping the run; no checkpoint was written yet")
                                : "stopping the run; its last checkpoint is " + last;
        guard.state = GuardState::kStopped;
      } else {
        outcome = "warned";
        if (guard.state == GuardState::kIdle) guard.state = GuardState::kWarned;
      }
      json ev = json::array();
      for (GuardEvent& e : events) {
        e.outcome = e.action == asked ? outcome : std::string("(") + to_string(act) + " ran instead)";
        ev.push_back(e.to_json());
        guard.remember(e);
        if (writer)
          spdlog::warn("guard at step {}: {}: {} -> {}: {}", e.step, e.condition, e.reason, to_string(e.action),
                       e.outcome);
      }
      rec["guard"] = std::move(ev);
      if (act == GuardAction::kStop)
        stop_reason = events.front().condition + ": " + events.front().reason + " -> " + outcome;
    }
    const bool eval_step = !rolled_back && stop_reason.empty() && (step % tc.eval_interval == 0 || step == max_steps);
    if (eval_step) {
      sync_weights();
      last_val = evaluate_dist(model, val_bin, B, T, tc.eval_batches, comm.get());
      best_val = std::min(best_val, last_val);
      val_hist.emplace_back(step, last_val);
      rec["val_loss"] = last_val;
      rec["val_ppl"] = std::exp(last_val);
    }
    if (rolled_back) {
      // step-k is written again with what the guard did (its count, the
      // raised budget, the loader position past the skipped data) before the
      // rollback's record: the rename of the new step-k commits the rollback.
      // Killed before it, the run resumes from the old step-k as the run
      // before the rollback (and meets the same rollback again); killed
      // after it, as the rolled-back run, and the resume writes the record
      // the new step-k carries if it is not in metrics.jsonl yet.
      rollback_record = rec;
      write_checkpoint(true, false, &rollback_checkpoint);
      rollback_record = nullptr;
      test_kill_point("rewrite-before-record");  // tests/cli/rollback_crash.py: kill -9 between the two
    }
    if (metrics) metrics->append(rec);
    if (exporter) {
      exporter->update(rec);
      exporter->set_guard_state(int(guard.state));
    }
    if (!stop_reason.empty())
      fail("guard: stopped at step ", step, ": ", stop_reason, " (lower train.lr or raise the precision; "
           "docs/operations.md \"The guard\")");
    if (rolled_back) continue;  // the step after the checkpoint runs next; nothing else of this one
    // `snip experiment` reads this line back from each arm's log (cmd_experiment.cpp,
    // parse_progress_line): keep "step N/M | loss L" first and "| ETA " + fmt_duration.
    if (chatty && (step % tc.log_interval == 0 || step == max_steps || eval_step)) {
      const double tps = double(steps_done * tokens_per_step) / elapsed();
      const double eta = double((max_steps - step) * tokens_per_step) / tps;
      std::string line = fmt::format("step {:>6}/{} | loss {:.4f} | lr {:.2e} | gnorm {:.2f} | {:.0f} tok/s | ETA {}",
                                     step, max_steps, r.loss, lr, r.grad_norm, tps, fmt_duration(eta));
      if (eval_step) line += fmt::format(" | val {:.4f} ({}-token windows)", last_val, T);
      if (tty) std::fprintf(stderr, "\r%s\033[K", line.c_str());
      else std::fprintf(stderr, "%s\n", line.c_str());
      if (tty && eval_step) std::fprintf(stderr, "\n");
      if (eval_step && sampler) print_sample();
    }
    stopped_by = stop_signal.received();
    bool by_time = tc.checkpoint_minutes > 0 && elapsed() - last_checkpoint_s >= 60.0 * tc.checkpoint_minutes;
    if (comm) {
      // The ranks agree on stopping (any rank's signal stops all after this
      // step) and on a time-based checkpoint (rank 0's clock decides).
      const auto flags = comm->allgather(torch::tensor({int64_t(stopped_by), int64_t(by_time)}, torch::kLong));
      int64_t any_stop = 0;
      for (const auto& f : flags) any_stop = std::max(any_stop, f[0].item<int64_t>());
      if (!stopped_by && any_stop) stopped_by = int(any_stop);
      by_time = flags[0][1].item<int64_t>() != 0;
    }
    // Only the checkpoints of the schedule are rollback targets: one a
    // signal or the clock wrote would make a resumed run roll back elsewhere
    // than the uninterrupted one.
    const bool scheduled = (tc.checkpoint_interval > 0 && step % tc.checkpoint_interval == 0) || step == max_steps;
    const bool ckpt = scheduled || by_time || stopped_by;
    if (comm && (ckpt || (dopt.check_interval > 0 && step % dopt.check_interval == 0))) {
      if (!pipe) {
        dist::check_same_weights(*comm, param_names, params, str_cat("step ", step));
      } else if (dp_comm) {  // the replicas of a stage hold the same stage weights
        std::vector<std::string> names;
        std::vector<torch::Tensor> mine;
        for (size_t i = 0; i < stage_part.params.size(); ++i)
          if (pipe->layout.stage_of_param(stage_part.names[i]) == pipe->stage) {
            names.push_back(stage_part.names[i]);
            mine.push_back(stage_part.params[i]);
          }
        dist::check_same_weights(*dp_comm, names, mine, str_cat("step ", step, " (stage ", pipe->stage, ")"));
      }
    }
    if (ckpt) write_checkpoint(scheduled, eval_step, nullptr);
    if (stopped_by) break;
    if (ckpt && !pending_bounds.empty()) {
      // dist.rebalance: blocks move between stages through the checkpoint
      // just written (every rank holds every weight and every stage's
      // quantizer state after it): each rank's AdamW is rebuilt for its new
      // stage's parameters and loads their state from the checkpoint's
      // shards by name. A step's arithmetic does not depend on the split;
      // the next plan's stage rows and boundary pins do.
      const std::vector<int64_t> from = pipe->layout.bounds;
      pipe->layout.bounds = pending_bounds;
      pending_bounds.clear();
      assign_stage_params(*pipe);
      {  // the gradients of blocks that left this stage are not kept
        torch::NoGradGuard ng;
        std::set<const c10::TensorImpl*> mine;
        for (const torch::Tensor& t : pipe->stage_params) mine.insert(t.unsafeGetTensorImpl());
        for (torch::Tensor& t : params)
          if (!mine.count(t.unsafeGetTensorImpl())) t.mutable_grad() = torch::Tensor();
      }
      optimizer->param_groups().clear();
      optimizer->state().clear();
      const auto fresh = make_optimizer(pipe->stage_params, tc);  // the groups of the new stage's parameters
      for (const auto& g : fresh->param_groups())
        optimizer->add_param_group(torch::optim::OptimizerParamGroup(g.params(), g.options().clone()));
      load_checkpoint_optimizer(last_checkpoint, verify_checkpoint(last_checkpoint), *optimizer, model, tc, step,
                                shard_part);
      set_controller_stages();
      imbalance_now = std::get<0>(stage_balance(ctl.assignments()));
      if (!quiet)
        spdlog::info("pipeline: rebalanced after step {}: blocks per stage {} -> {} (estimated imbalance {:.3f})", step,
                     dist::PipelineLayout{S, DP, from}.describe(), pipe->layout.describe(), imbalance_now);
      rebalanced_to = pipe->layout.bounds;  // in the next step's record
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  // The summary covers the whole run, every invocation of a resumed one.
  TrainSummary sum;
  sum.run_dir = opts.run_dir;
  sum.steps = step;
  sum.tokens = tokens_trained;
  sum.invocation_seconds = elapsed();
  sum.seconds = elapsed0 + sum.invocation_seconds;
  sum.tokens_per_s = sum.seconds > 0 ? double(sum.tokens) / sum.seconds : 0;
  sum.invocation_steps = steps_done;
  sum.start_step = start_step;
  sum.rollbacks = guard.rollbacks;
  sum.skipped_steps = guard.skipped_steps;
  sum.guard_events = int64_t(guard.events.size());
  double acc = 0;
  for (const auto& [s, l] : recent) acc += l;
  sum.final_train_loss = recent.empty() ? 0 : acc / double(recent.size());
  sum.train_loss_steps = int64_t(recent.size());
  sum.final_val_loss = last_val;
  sum.init_val_loss = init_val;
  sum.eval_seq_len = T;
  sum.best_val_loss = std::isfinite(best_val) ? best_val : last_val;
  sum.checkpoint = last_checkpoint;
  sum.stopped_by_signal = step < max_steps ? stopped_by : 0;
  sum.rank = world.rank;
  if (sum.stopped_by_signal || !writer) return sum;  // not the end of the run, or not rank 0: no summary.json
  auto num = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
  json pipeline_summary = nullptr;
  if (pipe)
    pipeline_summary = {{"stages", S}, {"replicas", DP}, {"schedule", pipe->schedule},
                        {"micro_batches", accum}, {"bounds", pipe->layout.bounds},
                        {"boundary_comm", dopt.boundary_comm}, {"boundary_bytes_per_step", boundary_bytes},
                        {"bubble", bubble_steps ? json(bubble_sum / double(bubble_steps)) : json(nullptr)},
                        {"ideal_bubble", dist::ideal_bubble(S, int(accum))}, {"stage_imbalance", imbalance_now}};
  json s = {{"steps", sum.steps}, {"tokens", sum.tokens}, {"seconds", sum.seconds},
            {"tokens_per_s", sum.tokens_per_s}, {"final_train_loss", sum.final_train_loss},
            {"final_val_loss", num(last_val)}, {"final_val_ppl", num(std::exp(last_val))},
            {"best_val_loss", num(sum.best_val_loss)}, {"init_val_loss", num(init_val)},
            {"eval_seq_len", T},
            {"vocab_size", mcfg.vocab_size}, {"ln_vocab", std::log(double(mcfg.vocab_size))},
            {"parameters", mcfg.num_parameters()}, {"policy", ctl.policy()},
            {"gemm_dtype", tc.gemm_bf16 ? "bf16" : "fp32"}, {"elapsed_s", sum.seconds},
            {"tokens_total", sum.tokens}, {"resumed_at", resumed_at}, {"world_size", R},
            {"zero_stage", zero_stage}, {"memory_per_rank", memory_per_rank},
            {"pipeline", pipe ? pipeline_summary : json(nullptr)},
            {"guard", {{"rollbacks", guard.rollbacks}, {"skipped_steps", guard.skipped_steps},
                       {"raises", guard.raises}, {"events", guard.events.size()}}},
            {"invocation", {{"start_step", start_step}, {"steps", sum.invocation_steps},
                            {"tokens", sum.invocation_steps * tokens_per_step}, {"seconds", sum.invocation_seconds}}}};
  if (frozen_base) {
    // LoRA: what trained, and the base's linear weights as held at the end
    // (bytes; FP32 = 4 per weight).
    const FrozenMemory fm = frozen_base->memory(model->linear_layers());
    s["lora"] = {{"rank", rc.lora.rank}, {"alpha", rc.lora.alpha}, {"scale", rc.lora.scale()},
                 {"adapted_layers", lora_ref["adapted_layers"]}, {"trainable_parameters", lora_ref["trainable_parameters"]},
                 {"base", lora_ref["base"]}, {"base_linear_fp32_bytes", fm.fp32_bytes},
                 {"base_linear_stored_bytes", fm.stored_bytes}, {"base_linear_saved_fraction", fm.saved_fraction()},
                 {"base_linear_stored_bytes_max", std::max(lora_held_max, fm.stored_bytes)},
                 {"packed_layers", fm.packed_layers}, {"layers", fm.layers}};
    if (!quiet)
      spdlog::info("lora: base linear weights held in {:.2f} MiB instead of {:.2f} MiB in FP32 ({:.1f}% saved, {} of {} "
                   "layers packed)", double(fm.stored_bytes) / (1 << 20), double(fm.fp32_bytes) / (1 << 20),
                   100.0 * fm.saved_fraction(), fm.packed_layers, fm.layers);
    if (!quiet && fm.packed_layers < fm.layers && rc.lora.pack_base)
      spdlog::info("lora: {} layers kept FP32: their precision quantizes W with delayed scaling, stochastic "
                   "rounding, error feedback or a Hadamard transform, or runs FP32 GEMMs (docs/lora.md)",
                   fm.layers - fm.packed_layers);
  }
  io::write_file_atomic((run / "summary.json").string(), s.dump(2) + "\n");
  write_run_report(opts.run_dir);
  return sum;
}

}  // namespace snip
