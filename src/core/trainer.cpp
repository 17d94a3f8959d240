// The training loop, evaluation and checkpoints (see trainer.h).
#include "snip/core/trainer.h"
#include "trainer_internal.h"

#include <spdlog/spdlog.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "snip/core/controller.h"
#include "snip/core/hf.h"
#include "snip/core/quantizers.h"
#include "snip/data/loader.h"
#include "snip/data/shard.h"
#include "snip/io/atomic_file.h"
#include "snip/report/report.h"
#include "snip/util/error.h"

namespace snip {

namespace fs = std::filesystem;
using json = nlohmann::json;

double lr_at(int64_t step, int64_t total, int64_t warmup, double lr, double min_ratio) {
  if (warmup > 0 && step < warmup) return lr * double(step + 1) / double(warmup);
  const double span = std::max<int64_t>(1, total - warmup);
  const double progress = std::min(1.0, double(step - warmup) / span);
  return lr * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + std::cos(M_PI * progress)));
}

namespace detail {

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = int64_t(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", long(t / 3600), long(t / 60 % 60));
  else std::snprintf(buf, sizeof buf, "%ldm%02lds", long(t / 60), long(t % 60));
  return buf;
}

uint32_t file_crc32(const std::string& path) {
  const std::string bytes = io::read_file(path);
  return static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

// Batch of token ids [B*T] (int32) -> [B, T] int64 tensor.
torch::Tensor to_ids(const std::vector<int32_t>& v, int64_t B, int64_t T) {
  return torch::from_blob(const_cast<int32_t*>(v.data()), {B, T}, torch::kInt).to(torch::kLong);
}

// AdamW with weight decay on 2-D weights only (norm weights are not decayed).
std::unique_ptr<torch::optim::AdamW> make_optimizer(LlamaForCausalLM& model, const Config& cfg) {
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto opts = [&](double wd) {
    auto o = std::make_unique<torch::optim::AdamWOptions>(cfg.get_float("train.lr"));
    o->betas({cfg.get_float("train.beta1"), cfg.get_float("train.beta2")});
    o->eps(cfg.get_float("train.eps"));
    o->weight_decay(wd);
    return o;
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, opts(cfg.get_float("train.weight_decay")));
  groups.emplace_back(no_decay, opts(0.0));
  return std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(cfg.get_float("train.lr")));
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
}

const char* kCkptFiles[] = {"model.safetensors", "optimizer.pt", "config.json"};

// Writes RUN/checkpoints/step-N/ atomically (step-N.tmp, then rename).
void save_checkpoint(const std::string& run_dir, int64_t step, LlamaForCausalLM& model,
                     torch::optim::Optimizer& opt, const json& state, int64_t keep) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  fs::create_directories(root);
  const fs::path final_dir = root / ("step-" + std::to_string(step));
  const fs::path tmp = root / ("step-" + std::to_string(step) + ".tmp");
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    io::write_safetensors((tmp / "model.safetensors").string(), model_to_safetensors(model));
    {
      // Serialised in memory, then written like every other file, so that a
      // full disk is a UserError (LibTorch's own file writer aborts the
      // process when a write fails inside its destructor).
      torch::serialize::OutputArchive a;
      opt.save(a);
      std::ostringstream bytes;
      a.save_to(bytes);
      io::write_file_atomic((tmp / "optimizer.pt").string(), bytes.str());
    }
    io::write_file_atomic((tmp / "config.json").string(), model->cfg.to_hf_json().dump(2) + "\n");
    json st = state;
    for (const char* f : kCkptFiles) st["crc32"][f] = file_crc32((tmp / f).string());
    io::write_file_atomic((tmp / "trainer_state.json").string(), st.dump(2) + "\n");
    io::fsync_dir(tmp.string());
    fs::remove_all(final_dir);
    io::rename_atomic(tmp.string(), final_dir.string());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  if (keep > 0) {  // drop the oldest complete checkpoints beyond `keep`
    std::vector<std::pair<int64_t, fs::path>> all;
    const std::regex re("step-([0-9]+)");
    for (auto& e : fs::directory_iterator(root)) {
      std::smatch m;
      const std::string n = e.path().filename().string();
      if (e.is_directory() && std::regex_match(n, m, re)) all.emplace_back(std::stoll(m[1]), e.path());
    }
    std::sort(all.begin(), all.end());
    for (size_t i = 0; i + keep < all.size(); ++i) fs::remove_all(all[i].second);
  }
}

// Reads and verifies trainer_state.json and the file checksums of a checkpoint.
json read_checkpoint_state(const std::string& dir) {
  const std::string sp = (fs::path(dir) / "trainer_state.json").string();
  if (!fs::is_directory(dir)) fail("checkpoint ", dir, " does not exist");
  json st;
  try {
    st = json::parse(io::read_file(sp));
  } catch (const json::parse_error& e) {
    fail("checkpoint ", sp, ": corrupt JSON at byte ", e.byte);
  }
  auto unsigned_at = [&](const json& j, const char* key, const char* where) -> uint64_t {
    if (!j.is_object() || !j.contains(key) || !j[key].is_number_unsigned())
      fail("checkpoint ", sp, ": ", where, key, ": expected a non-negative integer");
    return j[key].get<uint64_t>();
  };
  if (!st.is_object() || !st.contains("crc32") || !st["crc32"].is_object())
    fail("checkpoint ", sp, ": missing the 'crc32' object");
  const uint64_t step = unsigned_at(st, "step", "");
  if (fs::path(dir).filename().string() != "step-" + std::to_string(step))
    fail("checkpoint ", sp, ": holds step ", step, " but its folder is ", fs::path(dir).filename().string());
  if (!st.contains("loader")) fail("checkpoint ", sp, ": missing the 'loader' object");
  unsigned_at(st["loader"], "epoch", "loader.");
  unsigned_at(st["loader"], "cursor", "loader.");
  for (const char* f : kCkptFiles) {
    const std::string p = (fs::path(dir) / f).string();
    if (!fs::is_regular_file(p)) fail("checkpoint ", dir, ": missing file ", f);
    if (!st["crc32"].contains(f) || !st["crc32"][f].is_number_unsigned() ||
        st["crc32"][f].get<uint64_t>() != file_crc32(p))
      fail("checkpoint ", p, ": checksum mismatch (the file is truncated or corrupted)");
  }
  return st;
}

// RUN/report.html (report.h); a failure is a warning, never the run's end.
void write_run_report(const std::string& run_dir) {
  try {
    report::write_report(run_dir);
  } catch (const std::exception& e) {
    spdlog::warn("run report not written: {}", e.what());
  }
}

}  // namespace detail

using namespace detail;

std::string latest_checkpoint(const std::string& run_dir) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  if (!fs::is_directory(root)) return "";
  int64_t best = -1;
  const std::regex re("step-([0-9]+)");
  for (auto& e : fs::directory_iterator(root)) {
    std::smatch m;
    const std::string n = e.path().filename().string();
    if (e.is_directory() && std::regex_match(n, m, re) && fs::exists(e.path() / "trainer_state.json"))
      best = std::max<int64_t>(best, std::stoll(m[1]));
  }
  return best < 0 ? "" : (root / ("step-" + std::to_string(best))).string();
}

LlamaForCausalLM load_checkpoint_model(const std::string& dir) {
  read_checkpoint_state(dir);
  const std::string cp = (fs::path(dir) / "config.json").string();
  json j;
  try {
    j = json::parse(io::read_file(cp));
  } catch (const json::parse_error& e) {
    fail(cp, ": invalid JSON (", e.what(), ")");
  }
  LlamaForCausalLM m(LlamaConfig::from_hf_json(j, cp));
  const std::string wp = (fs::path(dir) / "model.safetensors").string();
  load_model_from_safetensors(m, io::read_safetensors(wp), wp);
  return m;
}

double evaluate(LlamaForCausalLM& model, const std::string& val_path, int64_t B, int64_t T, int64_t batches) {
  torch::NoGradGuard ng;
  data::TokenLoader val(val_path, int(B), int(T), 0);
  if (int64_t(val.vocab_size()) > model->cfg.vocab_size)
    fail(val_path, ": vocabulary ", val.vocab_size(), " is larger than the model's ", model->cfg.vocab_size,
         " (data prepared with another tokenizer?)");
  const uint64_t W = val.num_windows();
  uint64_t n = batches > 0 ? std::min<uint64_t>(W, uint64_t(batches) * B) : W;
  std::vector<int32_t> in, tg, bin, btg;
  double sum = 0;
  uint64_t tokens = 0;
  for (uint64_t i = 0; i < n; i += B) {
    const uint64_t b = std::min<uint64_t>(B, n - i);
    bin.clear(), btg.clear();
    for (uint64_t k = 0; k < b; ++k) {
      val.window(i + k, in, tg);
      bin.insert(bin.end(), in.begin(), in.end());
      btg.insert(btg.end(), tg.begin(), tg.end());
    }
    torch::Tensor logits = model(to_ids(bin, b, T));
    sum += LlamaForCausalLMImpl::loss(logits, to_ids(btg, b, T)).item<double>() * double(b * T);
    tokens += b * T;
  }
  return sum / double(tokens);
}

TrainSummary train(const Config& cfg_in, const TrainOptions& opts) {
  Config cfg = cfg_in;
  if (opts.run_dir.empty()) fail("--run-dir: expected a directory name, got an empty string");
  const fs::path run(opts.run_dir);
  // ---- validate everything before touching the run directory
  std::string resume_ckpt;
  if (opts.resume) {
    resume_ckpt = latest_checkpoint(opts.run_dir);
    if (resume_ckpt.empty()) fail("--resume: no complete checkpoint in ", (run / "checkpoints").string());
  } else if (fs::exists(run / "metrics.jsonl") || fs::exists(run / "checkpoints")) {
    fail("run directory ", opts.run_dir, " already holds a run; continue it with --resume, or choose "
         "another --run-dir (or delete it)");
  }
  cfg.validate();
  const fs::path data_dir(cfg.get_string("data.dir"));
  const std::string train_bin = (data_dir / "train.bin").string(), val_bin = (data_dir / "val.bin").string();
  for (const auto& p : {train_bin, val_bin})
    if (!fs::exists(p))
      fail("data.dir: ", p, " does not exist (run `snip data prepare --out ", data_dir.string(), "` first)");
  const int64_t B = cfg.get_int("train.batch_size"), T = cfg.get_int("train.seq_len");
  const int64_t accum = cfg.get_int("train.grad_accum"), max_steps = cfg.get_int("train.max_steps");
  const uint64_t seed = uint64_t(cfg.get_int("train.seed"));
  data::TokenLoader loader(train_bin, int(B), int(T), seed);
  {
    data::TokenLoader check_val(val_bin, 1, int(T), 0);
    if (check_val.vocab_size() != loader.vocab_size())
      fail("data.dir: ", val_bin, " has vocabulary ", check_val.vocab_size(), " but ", train_bin, " has ",
           loader.vocab_size(), " (prepared with different tokenizers?)");
  }
  const int64_t shard_vocab = loader.vocab_size();
  const int64_t cfg_vocab = cfg.get_int("model.vocab_size");
  if (cfg_vocab > 0 && cfg_vocab < shard_vocab)
    fail("model.vocab_size ", cfg_vocab, " is smaller than the tokenizer's vocabulary ", shard_vocab, " (",
         train_bin, "); set it to 0 to use the tokenizer's");
  const int64_t threads = cfg.get_int("train.threads");
  torch::set_num_threads(threads > 0 ? int(threads) : int(std::max(1u, std::thread::hardware_concurrency())));
  const std::string recipe = cfg.get_string("precision.recipe");
  std::shared_ptr<const OperandQuantizer> quantizer = make_recipe_quantizer(recipe);  // UserError if unknown

  torch::manual_seed(seed);
  LlamaConfig mcfg = LlamaConfig::from_run_config(cfg, shard_vocab);
  LlamaForCausalLM model(mcfg);
  if (!opts.init_from.empty()) {
    LlamaForCausalLM src = import_hf(opts.init_from);
    load_model_from_safetensors(model, model_to_safetensors(src), opts.init_from);
  }
  const at::ScalarType gemm = cfg.get_string("train.gemm_dtype") == "bf16" ? at::kBFloat16 : at::kFloat;
  model->set_precision(LinearPrecision{quantizer, gemm});
  model->set_non_linear_gemm_dtype(gemm);
  auto optimizer = make_optimizer(model, cfg);
  // The adaptive precision controller (inactive for policy bf16). Validates
  // the [precision] options against the layer list, pins and budget included.
  PrecisionController ctl(cfg, model->linear_layers(), gemm);

  int64_t step = 0;
  json resume_state;
  if (opts.resume) {
    resume_state = read_checkpoint_state(resume_ckpt);
    const std::string cp = (fs::path(resume_ckpt) / "config.json").string();
    LlamaConfig saved = LlamaConfig::from_hf_json(json::parse(io::read_file(cp)), cp);
    if (saved.to_hf_json() != mcfg.to_hf_json())
      fail("--resume: the model in ", cp, " differs from the configured model ([model] options changed)");
    const std::string wp = (fs::path(resume_ckpt) / "model.safetensors").string();
    load_model_from_safetensors(model, io::read_safetensors(wp), wp);
    try {
      torch::serialize::InputArchive a;
      a.load_from((fs::path(resume_ckpt) / "optimizer.pt").string());
      optimizer->load(a);
    } catch (const c10::Error& e) {
      fail("checkpoint ", resume_ckpt, "/optimizer.pt: cannot be loaded: ", e.what_without_backtrace());
    }
    step = resume_state.at("step").get<int64_t>();
    if (step >= max_steps)
      fail("--resume: the checkpoint is at step ", step, " and train.max_steps is ", max_steps,
           ": nothing to do (raise train.max_steps to train further)");
    if (ctl.active() && resume_state.contains("precision"))
      ctl.restore(resume_state["precision"], (fs::path(resume_ckpt) / "trainer_state.json").string());
    loader.restore({resume_state.at("loader").at("epoch").get<uint64_t>(),
                    resume_state.at("loader").at("cursor").get<uint64_t>()});
  }

  // ---- the run directory: only now is anything written
  io::ensure_writable_dir(opts.run_dir);
  io::write_file_atomic((run / "config.toml").string(), cfg.to_toml());
  const std::string metrics_path = (run / "metrics.jsonl").string();
  std::deque<double> recent;  // training losses of the last 10 steps (the summary's train loss)
  if (opts.resume) {  // drop metrics of steps after the checkpoint (the interrupted tail)
    std::ifstream in(metrics_path);
    std::string line, kept;
    while (std::getline(in, line)) {
      try {
        const json r = json::parse(line);
        if (r.value("step", int64_t{0}) <= step) {
          kept += line + "\n";
          recent.push_back(r.value("loss", 0.0));
          if (recent.size() > 10) recent.pop_front();
        }
      } catch (const json::parse_error&) {
        // a torn last line from a killed run is dropped
      }
    }
    io::write_file_atomic(metrics_path, kept);
  } else {
    io::write_file_atomic(metrics_path, "");
  }
  std::ofstream metrics(metrics_path, std::ios::app);
  ctl.set_output(opts.run_dir, !opts.quiet);

  const bool tty = !opts.quiet && isatty(STDERR_FILENO);
  const int64_t tokens_per_step = B * T * accum;
  const int64_t log_every = cfg.get_int("train.log_interval");
  const int64_t eval_every = cfg.get_int("train.eval_interval");
  const int64_t ckpt_every = cfg.get_int("train.checkpoint_interval");
  const int64_t eval_batches = cfg.get_int("train.eval_batches");
  const double clip = cfg.get_float("train.grad_clip");
  if (!opts.quiet)
    spdlog::info("model: {} parameters ({} layers, C={}, V={}), {} tokens/step, GEMMs in {}, recipe {}, policy {}",
                 mcfg.num_parameters(), mcfg.num_hidden_layers, mcfg.hidden_size, mcfg.vocab_size,
                 tokens_per_step, cfg.get_string("train.gemm_dtype"), recipe, ctl.policy());
  if (!opts.quiet && opts.resume) spdlog::info("resumed from {} at step {}", resume_ckpt, step);

  TrainSummary sum;
  sum.run_dir = opts.run_dir;
  sum.best_val_loss = std::numeric_limits<double>::infinity();
  std::vector<int32_t> in, tg;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  // Wall time of the earlier invocations (a resumed run's elapsed_s continues).
  const double elapsed0 = opts.resume ? resume_state.value("elapsed_s", 0.0) : 0.0;
  double last_val = std::nan("");
  const int64_t start_step = step;
  auto state_json = [&] {
    auto ls = loader.state();
    return json{{"step", step}, {"loader", {{"epoch", ls.epoch}, {"cursor", ls.cursor}}}, {"seed", seed},
                {"val_loss", std::isfinite(last_val) ? json(last_val) : json(nullptr)},
                {"elapsed_s", elapsed0 + elapsed()}};
  };
  auto full_state = [&] {
    json st = state_json();
    if (ctl.active()) st["precision"] = ctl.state();
    return st;
  };
  // Without a controller: the FP4 share of precision.recipe on every layer.
  const double static_fp4_share = recipe == "fp4" ? 1.0 : 0.0;

  while (step < max_steps) {
    if (opts.stop_after > 0 && step - start_step >= opts.stop_after) break;
    const auto ts = std::chrono::steady_clock::now();
    const double lr = lr_at(step, max_steps, cfg.get_int("train.warmup_steps"), cfg.get_float("train.lr"),
                            cfg.get_float("train.min_lr_ratio"));
    set_lr(*optimizer, lr);
    model->set_step(seed, step);
    optimizer->zero_grad();
    double loss_sum = 0;
    PrecisionEvent pev;
    for (int64_t m = 0; m < accum; ++m) {
      loader.next(in, tg);
      const torch::Tensor ids = to_ids(in, B, T), targets = to_ids(tg, B, T);
      if (m == 0 && ctl.active())  // step boundary: stats step / re-plan on the first micro-batch
        pev = ctl.begin_step(step, [&] { return LlamaForCausalLMImpl::loss(model(ids), targets); }, *optimizer);
      torch::Tensor loss = LlamaForCausalLMImpl::loss(model(ids), targets);
      (loss / double(accum)).backward();
      loss_sum += loss.item<double>();
    }
    const double loss = loss_sum / double(accum);
    if (!std::isfinite(loss)) fail("training diverged: loss is ", loss, " at step ", step + 1,
                                   " (lower train.lr or raise precision)");
    double gnorm = 0;
    {
      std::vector<torch::Tensor> params = model->parameters();
      gnorm = torch::nn::utils::clip_grad_norm_(params, clip > 0 ? clip : std::numeric_limits<double>::infinity());
    }
    optimizer->step();
    ++step;
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    sum.tokens += tokens_per_step;
    recent.push_back(loss);
    if (recent.size() > 10) recent.pop_front();
    json rec = {{"step", step}, {"loss", loss}, {"lr", lr}, {"grad_norm", gnorm},
                {"tokens_per_s", double(tokens_per_step) / dt}, {"elapsed_s", elapsed0 + elapsed()},
                {"fp4_share", ctl.active() ? ctl.fp4_share() : static_fp4_share}};
    for (auto& [k, v] : pev.metrics.items()) rec[k] = v;
    if (step % eval_every == 0 || step == max_steps) {
      last_val = evaluate(model, val_bin, B, T, eval_batches);
      sum.best_val_loss = std::min(sum.best_val_loss, last_val);
      rec["val_loss"] = last_val;
      rec["val_ppl"] = std::exp(last_val);
    }
    metrics << rec.dump() << "\n" << std::flush;
    if (!opts.quiet && (step % log_every == 0 || step == max_steps || rec.contains("val_loss"))) {
      const double tps = double(sum.tokens) / elapsed();
      const double eta = double((max_steps - step) * tokens_per_step) / tps;
      std::string line = fmt::format("step {:>6}/{} | loss {:.4f} | lr {:.2e} | gnorm {:.2f} | {:.0f} tok/s | ETA {}",
                                     step, max_steps, loss, lr, gnorm, tps, fmt_duration(eta));
      if (std::isfinite(last_val)) line += fmt::format(" | val {:.4f}", last_val);
      if (tty) std::fprintf(stderr, "\r%s\033[K", line.c_str());
      else std::fprintf(stderr, "%s\n", line.c_str());
      if (tty && rec.contains("val_loss")) std::fprintf(stderr, "\n");
    }
    if ((ckpt_every > 0 && step % ckpt_every == 0) || step == max_steps) {
      save_checkpoint(opts.run_dir, step, model, *optimizer, full_state(), cfg.get_int("train.keep_checkpoints"));
      if (step != max_steps) write_run_report(opts.run_dir);
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  sum.steps = step;
  sum.seconds = elapsed();
  sum.tokens_per_s = sum.seconds > 0 ? double(sum.tokens) / sum.seconds : 0;
  double acc = 0;
  for (double l : recent) acc += l;
  sum.final_train_loss = recent.empty() ? 0 : acc / double(recent.size());
  sum.final_val_loss = last_val;
  if (!std::isfinite(sum.best_val_loss)) sum.best_val_loss = last_val;
  json s = {{"steps", sum.steps}, {"tokens", sum.tokens}, {"seconds", sum.seconds},
            {"tokens_per_s", sum.tokens_per_s}, {"final_train_loss", sum.final_train_loss},
            {"final_val_loss", std::isfinite(last_val) ? json(last_val) : json(nullptr)},
            {"final_val_ppl", std::isfinite(last_val) ? json(std::exp(last_val)) : json(nullptr)},
            {"vocab_size", mcfg.vocab_size}, {"ln_vocab", std::log(double(mcfg.vocab_size))},
            {"parameters", mcfg.num_parameters()}, {"recipe", recipe}, {"policy", ctl.policy()},
            {"gemm_dtype", cfg.get_string("train.gemm_dtype")}, {"elapsed_s", elapsed0 + sum.seconds},
            {"tokens_total", step * tokens_per_step}};
  io::write_file_atomic((run / "summary.json").string(), s.dump(2) + "\n");
  write_run_report(opts.run_dir);
  return sum;
}

}  // namespace snip
