// gemm_calibrate.cpp: the GEMM-times calibration (snip/method/gemm_calibrate.h).
#include "snip/method/gemm_calibrate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include <spdlog/fmt/fmt.h>

#include "snip/core/error.h"
#include "snip/core/statistics.h"
#include "snip/model/gemm_timer.h"
#include "snip/model/linear.h"
#include "snip/model/quantizers.h"

namespace snip {

std::string gemm_dtype_name(at::ScalarType t) { return t == at::kBFloat16 ? "bf16" : "fp32"; }

namespace {

using Clock = std::chrono::steady_clock;

std::string machine_text() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::string m = str_cat(host[0] ? host : "unknown host", ", ", at::get_num_threads(), " intra-op threads, ",
                          std::max(1u, std::thread::hardware_concurrency()), " hardware threads");
  return m;
}

// "cpu", "cuda:0": the device kind first, so a run can refuse a table
// measured on another kind of device.
std::string device_text(const torch::Device& device) { return device.str(); }

void check_common(const CalibrateOptions& o) {
  if (o.repeats < 1) fail("calibrate: expected repeats >= 1, got ", o.repeats);
  if (o.warmup < 0) fail("calibrate: expected warm-up calls >= 0, got ", o.warmup);
  if (!(o.max_seconds > 0)) fail("calibrate: expected a time cap > 0 s, got ", o.max_seconds);
  if (o.options.empty()) fail("calibrate: expected at least one option, got none");
}

// One precision per option (bf16: no quantizer; the GEMM dtype casts).
std::vector<std::pair<std::string, LinearPrecision>> option_precisions(const recipes::RecipeSet& recipes,
                                                                       const CalibrateOptions& o) {
  std::vector<std::pair<std::string, LinearPrecision>> precs;
  for (const std::string& name : o.options) {
    LinearPrecision p;
    p.gemm_dtype = o.gemm_dtype;
    if (name != "bf16") p.quantizer = o.quantizer_for ? o.quantizer_for(name) : make_recipe_quantizer(recipes, name);
    precs.emplace_back(name, p);
  }
  return precs;
}

// Distinct (IN, OUT) of `layers`, in first-seen order (a repeated shape is timed once).
std::vector<std::pair<int64_t, int64_t>> distinct_shapes(const std::vector<plan::TimedLayer>& layers) {
  std::vector<std::pair<int64_t, int64_t>> shapes;
  std::set<std::pair<int64_t, int64_t>> seen;
  for (const plan::TimedLayer& l : layers)
    if (seen.insert({l.in, l.out}).second) shapes.emplace_back(l.in, l.out);
  if (shapes.empty()) fail("calibrate: expected at least one linear layer, got none");
  return shapes;
}

// The table's entry for GEMM `g` of a layer of `shape` (IN, OUT) at `tokens` rows.
plan::GemmTimeEntry entry(Gemm g, int64_t tokens, std::pair<int64_t, int64_t> shape, const std::string& option,
                          double seconds, int repeats) {
  plan::GemmTimeEntry e;
  e.gemm = g;
  e.shape = plan::linear_gemm_shapes(tokens, shape.first, shape.second)[int(g)];
  e.option = option;
  // A timer tick can read 0 for a tiny GEMM, and a GEMM the step does not
  // run costs 0; the table needs > 0.
  e.seconds = std::max(seconds, 1e-9);
  e.repeats = repeats;
  return e;
}

// The progress line when the time cap is reached (`rest`: what the remaining work gets).
void say_cap(const CalibrateOptions& o, const char* rest) {
  if (o.progress)
    o.progress(str_cat("calibrate: time cap of ", o.max_seconds, " s reached; ", rest,
                       " (less reliable: raise precision.calibrate_seconds or --max-seconds)"));
}

}  // namespace

plan::GemmTimes calibrate_gemm_times(const std::vector<plan::TimedLayer>& layers, const recipes::RecipeSet& recipes,
                                     const CalibrateOptions& o) {
  if (o.tokens < 1) fail("calibrate: expected tokens per micro-batch >= 1, got ", o.tokens);
  check_common(o);
  const std::vector<std::pair<std::string, LinearPrecision>> precs = option_precisions(recipes, o);
  const std::vector<std::pair<int64_t, int64_t>> shapes = distinct_shapes(layers);

  torch::NoGradGuard ng;
  QuantStateFreeze freeze;  // no amax history or error-feedback update while timing
  const auto cuda = o.device.is_cuda();
  auto sync = [&] {
    if (cuda) torch::cuda::synchronize();
  };
  const auto t0 = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  plan::GemmTimes table;
  table.source = "calibration";
  table.device = device_text(o.device);
  table.gemm_dtype = gemm_dtype_name(o.gemm_dtype);
  bool over = false;
  // Operands from a generator of our own (drawn on the host): the run's RNGs stay where they are.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  for (size_t si = 0; si < shapes.size(); ++si) {
    const auto [in, out] = shapes[si];
    const torch::Tensor x = at::randn({o.tokens, in}, gen, f32).to(o.device);           // [T, IN]
    const torch::Tensor w = (at::randn({out, in}, gen, f32) * 0.05).to(o.device);       // [OUT, IN]
    const torch::Tensor dy = (at::randn({o.tokens, out}, gen, f32) * 1e-3).to(o.device);  // [T, OUT]
    for (const auto& [name, prec] : precs) {
      QuantKey key;
      key.layer = 0;
      for (Gemm g : kAllGemms) {
        auto call = [&] {
          if (g == Gemm::kFprop) return linear_fprop(x, w, prec, key);
          auto r = linear_backward(dy, x, w, prec, key, g == Gemm::kDgrad, g == Gemm::kWgrad);
          return g == Gemm::kDgrad ? r.first : r.second;
        };
        if (!over && elapsed() > o.max_seconds) {
          over = true;
          say_cap(o, "the remaining GEMMs get one warm-up and one timed call each");
        }
        // A first call pays one-time costs (allocations, kernel selection):
        // with warm-up calls asked for, one stays untimed past the cap too.
        const int warm = over ? std::min(1, o.warmup) : o.warmup, reps = over ? 1 : o.repeats;
        for (int k = 0; k < warm; ++k) call();
        sync();
        std::vector<double> ts;
        for (int k = 0; k < reps; ++k) {
          const auto a = Clock::now();
          torch::Tensor y = call();
          sync();
          ts.push_back(std::chrono::duration<double>(Clock::now() - a).count());
          (void)y;
        }
        table.entries.push_back(entry(g, o.tokens, shapes[si], name, median(ts), reps));
      }
    }
    if (o.progress)
      o.progress(str_cat("calibrate: shape ", si + 1, "/", shapes.size(), " (T=", o.tokens, ", IN=", in, ", OUT=", out,
                         ") x ", precs.size(), " options x 3 GEMMs done, ", fmt::format("{:.1f}", elapsed()), " s"));
  }
  table.machine = str_cat(machine_text(), "; calibrated in ", fmt::format("{:.2f}", elapsed()), " s");
  return table;
}

plan::GemmTimes calibrate_gemm_times_in_step(const InStepModel& m, const recipes::RecipeSet& recipes,
                                             const CalibrateOptions& o) {
  if (!m.model) throw std::logic_error("calibrate_gemm_times_in_step: no model");
  if (m.batch < 1 || m.seq_len < 1)
    fail("calibrate: expected a micro-batch of at least 1 x 1 tokens, got ", m.batch, " x ", m.seq_len);
  check_common(o);
  const std::vector<std::pair<std::string, LinearPrecision>> precs = option_precisions(recipes, o);
  LlamaForCausalLM model = m.model;  // a handle to the same module
  std::vector<QuantLinear> layers = model->linear_layers();
  std::vector<plan::TimedLayer> timed;
  for (const QuantLinear& l : layers) timed.push_back({l->name, l->in_features, l->out_features});
  const std::vector<std::pair<int64_t, int64_t>> shapes = distinct_shapes(timed);
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& p : model->parameters())
    if (p.requires_grad()) params.push_back(p);
  if (params.empty()) fail("calibrate: the model has no trained parameter (nothing to take a backward pass of)");
  const torch::Device device = params[0].device();
  const int64_t tokens = m.batch * m.seq_len;
  // Random token ids from a generator of our own: the run's RNGs stay where they are.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(m.seed);
  const torch::Tensor seq = at::randint(model->cfg.vocab_size, {m.batch, m.seq_len + 1}, gen, torch::kLong).to(device);
  const torch::Tensor ids = seq.slice(1, 0, m.seq_len), targets = seq.slice(1, 1, m.seq_len + 1);
  // The run's precision and key of every layer come back whatever happens,
  // and the calibration's per-step quantization errors are dropped.
  struct Saved {
    LinearPrecision precision;
    QuantKey key;
  };
  std::vector<Saved> saved;
  for (const QuantLinear& l : layers) saved.push_back({l->precision, l->key_base});
  struct Restore {
    std::vector<QuantLinear>& layers;
    const std::vector<Saved>& saved;
    ~Restore() {
      for (size_t i = 0; i < layers.size(); ++i) {
        layers[i]->precision = saved[i].precision;
        layers[i]->key_base = saved[i].key;
        if (layers[i]->operand_errors) layers[i]->operand_errors->take();
      }
    }
  } restore{layers, saved};
  torch::AutoGradMode grad_on(true);
  const bool cuda = device.is_cuda();
  // Each pass under a step number of its own, counting down from the
  // largest a rounding key holds (2^32 - 1; far above any optimizer step): a
  // quantizer's per-step work (an error-feedback residual) runs as in a
  // training step, and LoRA's dropout masks, keyed by step, start afresh at
  // the run's first step.
  int64_t pass = 0;
  auto step = [&] {
    for (QuantLinear& l : layers) l->key_base.step = int64_t(std::numeric_limits<uint32_t>::max()) - pass;
    ++pass;
    torch::Tensor loss = LlamaForCausalLMImpl::loss(model(ids), targets);
    torch::autograd::grad({loss}, params, {}, /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
  };
  const auto t0 = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  plan::GemmTimes table;
  table.source = "calibration";
  table.device = device_text(device);
  table.gemm_dtype = gemm_dtype_name(o.gemm_dtype);
  bool over = false;
  auto check_cap = [&](const char* rest) {
    if (!over && elapsed() > o.max_seconds) {
      over = true;
      say_cap(o, rest);
    }
  };
  for (size_t pi = 0; pi < precs.size(); ++pi) {
    const auto& [name, prec] = precs[pi];
    for (QuantLinear& l : layers) l->precision = prec;
    check_cap("this and the remaining options get one warm-up and one timed step each");
    // An option's first step pays one-time costs (allocations, kernel
    // selection): with warm-up steps asked for, past the cap too, one is untimed.
    const int warm = over ? std::min(1, o.warmup) : o.warmup;
    for (int k = 0; k < warm; ++k) step();
    // Per shape and GEMM, one sample per timed step: the mean over the
    // shape's layers that ran the GEMM (a frozen base's wgrad, or the dgrad
    // of a layer whose input needs no gradient, does not run: 0 if none ran).
    std::map<std::pair<int64_t, int64_t>, std::array<std::vector<double>, 3>> samples;
    int reps = 0;
    {
      GemmTimer timer(cuda);
      for (; reps < (over ? 1 : o.repeats); ++reps) {
        if (reps > 0) check_cap("the remaining options get one warm-up and one timed step each");
        if (reps > 0 && over) break;
        step();
        const std::map<const void*, std::array<double, 3>> t = timer.take();
        std::map<std::pair<int64_t, int64_t>, std::array<std::pair<double, int>, 3>> sum;  // seconds, layers
        for (const QuantLinear& l : layers) {
          const auto it = t.find(l.get());
          auto& s = sum[{l->in_features, l->out_features}];
          if (it != t.end())
            for (Gemm g : kAllGemms)
              if (it->second[size_t(g)] > 0) s[size_t(g)].first += it->second[size_t(g)], ++s[size_t(g)].second;
        }
        for (const auto& shape : shapes)
          for (Gemm g : kAllGemms) {
            const auto [sec, n] = sum[shape][size_t(g)];
            samples[shape][size_t(g)].push_back(n > 0 ? sec / n : 0.0);
          }
      }
    }
    for (const auto& shape : shapes)
      for (Gemm g : kAllGemms) table.entries.push_back(entry(g, tokens, shape, name, median(samples[shape][size_t(g)]), reps));
    if (o.progress)
      o.progress(str_cat("calibrate: option ", name, " (", pi + 1, "/", precs.size(), "): ", warm, " + ", reps,
                         " training steps of ", m.batch, " x ", m.seq_len, " tokens, ", shapes.size(),
                         " layer shapes x 3 GEMMs timed in the step, ", fmt::format("{:.1f}", elapsed()), " s"));
  }
  table.machine = str_cat(machine_text(), "; calibrated in training steps (in_step) in ", fmt::format("{:.2f}", elapsed()), " s");
  return table;
}

plan::GemmTimes gemm_times_for_run(const PrecisionConfig& pc, const recipes::RecipeSet& recipes,
                                   const std::vector<plan::TimedLayer>& layers,
                                   const std::vector<std::string>& options, at::ScalarType gemm_dtype,
                                   const torch::Device& device, int64_t tokens,
                                   const std::function<void(const std::string&)>& progress,
                                   const InStepModel* whole) {
  if (!pc.gemm_times.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(pc.gemm_times, ec))
      fail("precision.gemm_times: ", pc.gemm_times, ": no such file (a table of snip doctor --calibrate --config "
           "FILE --run RUN is RUN/gemm_times.json; leave precision.gemm_times empty to calibrate at start)");
    plan::GemmTimes t = plan::load_gemm_times(pc.gemm_times);
    const std::string want = device.is_cuda() ? "cuda" : device.str();
    if (t.device.rfind(want, 0) != 0)
      fail(pc.gemm_times, ": device: expected a table measured on ", want, " (this run's device), got \"", t.device,
           "\" (re-run snip doctor --calibrate --config FILE here)");
    if (t.gemm_dtype != gemm_dtype_name(gemm_dtype))
      fail(pc.gemm_times, ": gemm_dtype: expected \"", gemm_dtype_name(gemm_dtype),
           "\" (this run's train.gemm_dtype), got \"", t.gemm_dtype, "\"");
    return t;
  }
  CalibrateOptions o;
  o.options = options;
  o.gemm_dtype = gemm_dtype;
  o.device = device;
  o.tokens = tokens;
  o.max_seconds = pc.calibrate_seconds;
  o.progress = progress;
  if (whole && pc.calibration == "in_step") return calibrate_gemm_times_in_step(*whole, recipes, o);
  return calibrate_gemm_times(layers, recipes, o);
}

}  // namespace snip
