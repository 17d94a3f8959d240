// gemm_calibrate.cpp: the GEMM-times calibration (snip/method/gemm_calibrate.h).
#include "snip/method/gemm_calibrate.h"

#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "snip/core/error.h"
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

}  // namespace

plan::GemmTimes calibrate_gemm_times(const std::vector<plan::TimedLayer>& layers, const recipes::RecipeSet& recipes,
                                     const CalibrateOptions& o) {
  if (o.tokens < 1) fail("calibrate: expected tokens per micro-batch >= 1, got ", o.tokens);
  if (o.repeats < 1) fail("calibrate: expected repeats >= 1, got ", o.repeats);
  if (o.warmup < 0) fail("calibrate: expected warm-up calls >= 0, got ", o.warmup);
  if (!(o.max_seconds > 0)) fail("calibrate: expected a time cap > 0 s, got ", o.max_seconds);
  if (o.options.empty()) fail("calibrate: expected at least one option, got none");
  // One precision per option (bf16: no quantizer; the GEMM dtype casts).
  std::vector<std::pair<std::string, LinearPrecision>> precs;
  for (const std::string& name : o.options) {
    LinearPrecision p;
    p.gemm_dtype = o.gemm_dtype;
    if (name != "bf16") p.quantizer = make_recipe_quantizer(recipes, name);
    precs.emplace_back(name, p);
  }
  // Distinct shapes, in first-seen order.
  std::vector<std::pair<int64_t, int64_t>> shapes;
  {
    std::set<std::pair<int64_t, int64_t>> seen;
    for (const plan::TimedLayer& l : layers)
      if (seen.insert({l.in, l.out}).second) shapes.emplace_back(l.in, l.out);
  }
  if (shapes.empty()) fail("calibrate: expected at least one linear layer, got none");

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
  torch::manual_seed(0);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(o.device);
  for (size_t si = 0; si < shapes.size(); ++si) {
    const auto [in, out] = shapes[si];
    const auto gs = plan::linear_gemm_shapes(o.tokens, in, out);
    const torch::Tensor x = torch::randn({o.tokens, in}, f32);        // [T, IN]
    const torch::Tensor w = torch::randn({out, in}, f32) * 0.05;      // [OUT, IN]
    const torch::Tensor dy = torch::randn({o.tokens, out}, f32) * 1e-3;  // [T, OUT]
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
          if (o.progress)
            o.progress(str_cat("calibrate: time cap of ", o.max_seconds,
                               " s reached; the remaining GEMMs get one warm-up and one timed call each "
                               "(less reliable: raise precision.calibrate_seconds or --max-seconds)"));
        }
        // A first call pays one-time costs (allocations, kernel selection):
        // never time it, past the cap too.
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
        std::sort(ts.begin(), ts.end());
        const double med = ts.size() % 2 ? ts[ts.size() / 2] : 0.5 * (ts[ts.size() / 2 - 1] + ts[ts.size() / 2]);
        plan::GemmTimeEntry e;
        e.gemm = g;
        e.shape = gs[int(g)];
        e.option = name;
        // A timer tick can read 0 for a tiny GEMM; the table needs > 0.
        e.seconds = std::max(med, 1e-9);
        e.repeats = reps;
        table.entries.push_back(std::move(e));
      }
    }
    if (o.progress) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.1f", elapsed());
      o.progress(str_cat("calibrate: shape ", si + 1, "/", shapes.size(), " (T=", o.tokens, ", IN=", in, ", OUT=", out,
                         ") x ", precs.size(), " options x 3 GEMMs done, ", buf, " s"));
    }
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", elapsed());
  table.machine = str_cat(machine_text(), "; calibrated in ", buf, " s");
  return table;
}

plan::GemmTimes gemm_times_for_run(const PrecisionConfig& pc, const recipes::RecipeSet& recipes,
                                   const std::vector<plan::TimedLayer>& layers,
                                   const std::vector<std::string>& options, at::ScalarType gemm_dtype,
                                   const torch::Device& device, int64_t tokens,
                                   const std::function<void(const std::string&)>& progress) {
  if (!pc.gemm_times.empty()) {
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
  return calibrate_gemm_times(layers, recipes, o);
}

}  // namespace snip
