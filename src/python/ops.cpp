// The PyTorch custom operators of the Python package (python/snip,
// docs/python.md): TORCH_LIBRARY(snip) with CPU kernels over snip's C++
// core; their fake (meta) kernels and autograd formulas are registered in
// python/snip/_ops.py. Loaded with torch.ops.load_library, so tensors pass
// in and out without copies.
//
//   snip::fake_quant(Tensor x, str recipe, str operand, int seed, int step, int layer) -> Tensor
//       x [..., K] float32/float64, quantized along its last dimension with
//       the recipe's spec for `operand` (fprop.x, ..., wgrad.x) and
//       dequantized: same shape and dtype (model/linear.h OperandQuantizer)
//   snip::linear_fprop(Tensor x, Tensor w, str recipe, int seed, Tensor step, int layer, str gemm) -> Tensor
//       x [N, IN], w [OUT, IN] -> [N, OUT] (model/linear.h linear_fprop)
//   snip::linear_backward(Tensor dy, Tensor x, Tensor w, str recipe, int seed, Tensor step, int layer, str gemm,
//                         bool need_dx, bool need_dw) -> (Tensor, Tensor)
//       dX [N, IN], dW [OUT, IN] (model/linear.h linear_backward)
//   (`step` of the linear operators is a 0-d int64 CPU tensor, so a
//   compiled graph reads the step the layer holds now instead of
//   recompiling for each step; fake_quant's is an int.)
//   snip::quantize(Tensor x, str recipe, str operand, int seed, int step, int layer)
//                  -> (Tensor data, Tensor scale_codes, Tensor scales, Tensor tensor_scale, Tensor block)
//       x [..., K] (as FP32 [rows, K]) to element codes packed as snip packs
//       them (formats/fake_quant.h pack_codes: uint8 [packed bytes]), the
//       stored block-scale codes int64 [GR, GC] (E8M0/E4M3 codes, or FP32
//       bits), their decode values float32 [GR, GC] (the tensor scale
//       included), the second level float32 [2] (decode, encode; 1, 1 but
//       for NVFP4), the block shape int64 [2]
//   snip::dequantize(Tensor data, Tensor scales, Tensor block, int rows, int cols, str recipe, str operand)
//       -> Tensor float32 [rows, cols]: code x decode scale
//   snip::formats_json() -> str        `snip formats --json`
//   snip::recipes_json(str recipe_file) -> str   `snip formats --recipes --json [--recipe-file F]`
//
//
//   torch.classes.snip.Controller(str config_toml, str layers_json, str gemm, float grad_scale): the
//       C++ PrecisionController (method/controller.h) over layers it does not
//       hold, and the per-layer pieces of the stats step (method/stats.h
//       measure_layer, curvature_noise, calibration_noise, calibration_du_sq,
//       derive_stats): python/snip/controller.py runs the passes on the
//       user's model and hands the summed buffer back (begin_step);
//       needs_gemm_times() / set_gemm_times(int tokens, float micro_batches,
//       str device, bool verbose) for precision.budget_unit = time.
//
// `recipe` is "none" (no quantization), a built-in recipe's name, or a
// recipe as JSON (recipes/recipe.h to_json: a recipe file's, from Python).
// `gemm` is "bf16" (BF16 inputs, FP32 accumulation) or "fp32" (the input
// dtype). A snip::UserError becomes a Python ValueError with its one line.
#include <torch/library.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include <torch/custom_class.h>

#include "snip/app/formats_command.h"
#include "snip/config/config.h"
#include "snip/method/controller.h"
#include "snip/method/gemm_calibrate.h"
#include "snip/method/stats.h"
#include "snip/plan/plan_file.h"
#include "snip/core/error.h"
#include "snip/formats/fake_quant.h"
#include "snip/model/matmul.h"
#include "snip/model/linear.h"
#include "snip/model/quantizers.h"
#include "snip/recipes/recipe.h"

namespace snip {
namespace {

// Runs `f`, turning a UserError into c10::ValueError (Python ValueError).
template <class F>
auto user_errors(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const UserError& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

// The recipe `recipe` names (see above; not "none"). Recipes that keep state
// between calls (delayed scaling's amax history, error feedback's residual)
// are refused: a cached quantizer (quantizer_of) would share that state
// across every caller of the process, until the Python controller owns it.
recipes::Recipe recipe_of(const std::string& recipe) {
  recipes::RecipeSet set;
  std::string name = recipe;
  if (!recipe.empty() && recipe[0] == '{') {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(recipe);
    } catch (const nlohmann::json::exception& e) {
      fail("recipe: expected a recipe name or its JSON, got invalid JSON (", e.what(), ")");
    }
    const recipes::Recipe r = recipes::recipe_from_json(j, "recipe");
    if (r.name.empty() || r.name == "none")
      fail("recipe: name: expected a name other than '", r.name, "' ('none' means no quantization)");
    set.add(r, /*replace=*/true);
    name = r.name;
  }
  const recipes::Recipe& r = set.find(name);  // UserError "unknown recipe 'x' (known: ...)"
  bool stateful = r.error_feedback;
  for (const auto& s : r.operands) stateful = stateful || s.rule == formats::ScaleRule::kDelayed;
  if (stateful)
    fail("recipe '", name, "' keeps state between calls (", r.error_feedback ? "error feedback" : "delayed scaling",
         "), which the Python operators do not hold yet; choose a recipe with current scaling (fp8, mxfp8, "
         "nvfp4, mxfp4, ...)");
  return r;
}

// The quantizer of `recipe` (see above; nullptr for "none"), one per
// distinct string: recipes are values, so a cached quantizer is the one a
// fresh call would build.
std::shared_ptr<const OperandQuantizer> quantizer_of(const std::string& recipe) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const OperandQuantizer>> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto it = cache.find(recipe);
  if (it != cache.end()) return it->second;
  std::shared_ptr<const OperandQuantizer> q;
  if (recipe.empty()) fail("recipe: expected a recipe name, 'none' or a recipe's JSON, got ''");
  if (recipe != "none") {
    const recipes::Recipe r = recipe_of(recipe);
    recipes::RecipeSet set;
    set.add(r, /*replace=*/true);
    q = make_recipe_quantizer(set, r.name);
  }
  cache.emplace(recipe, q);
  return q;
}

at::ScalarType gemm_dtype(const std::string& gemm) {
  if (gemm == "bf16") return at::kBFloat16;
  if (gemm == "fp32") return at::ScalarType::Undefined;
  fail("gemm: expected bf16 or fp32, got '", gemm, "'");
}

void check_float(const torch::Tensor& t, const char* what) {
  if (t.scalar_type() != at::kFloat && t.scalar_type() != at::kDouble)
    fail(what, ": expected a float32 or float64 tensor, got ", c10::toString(t.scalar_type()));
}

int64_t step_of(const torch::Tensor& step) {
  // On the CPU or beside a CUDA module's weight (snip.nn.Linear's buffer moves with it): item() reads either.
  if (step.scalar_type() != at::kLong || step.numel() != 1 || !(step.device().is_cpu() || step.is_cuda()))
    fail("step: expected a one-element int64 tensor on the CPU or a CUDA device, got ",
         c10::toString(step.scalar_type()), " ", step.sizes(), " on ", step.device().str());
  return step.item<int64_t>();
}

QuantKey key_of(int64_t seed, int64_t step, int64_t layer) {
  if (seed < 0 || step < 0 || layer < 0 || step >= (int64_t(1) << 32) || layer >= (int64_t(1) << 32))
    fail("seed, step and layer: expected integers >= 0 (step and layer < 2^32), got ", seed, ", ", step, ", ", layer);
  QuantKey k;
  k.seed = uint64_t(seed);
  k.step = step;
  k.layer = layer;
  return k;
}

torch::Tensor fake_quant(const torch::Tensor& x, std::string recipe, std::string operand, int64_t seed,
                         int64_t step, int64_t layer) {
  return user_errors([&] {
    check_float(x, "x");
    if (x.dim() < 1 || x.size(-1) < 1) fail("x: expected a tensor [..., K] with K >= 1, got ", x.sizes());
    QuantKey k = key_of(seed, step, layer);
    k.operand = parse_operand(operand, "operand");
    const auto q = quantizer_of(recipe);
    if (!q) return x.clone();
    const torch::Tensor x2 = x.reshape({-1, x.size(-1)}).contiguous();
    return q->quantize(x2, k).view(x.sizes());
  });
}

void check_linear(const torch::Tensor& x, const torch::Tensor& w) {
  check_float(x, "x");
  check_float(w, "weight");
  if (x.dim() != 2 || w.dim() != 2 || x.size(1) != w.size(1))
    fail("linear: expected x [N, IN] and weight [OUT, IN], got ", x.sizes(), " and ", w.sizes());
}

// The first CUDA GEMM of the process sets the BF16 GEMMs as the trainer does
// on cuda (model/matmul.h: native, no reduced-precision split-K reductions);
// CPU calls in the same process then run native BF16 too.
void bf16_on_cuda(const torch::Tensor& x) {
  static std::once_flag once;
  if (x.is_cuda()) std::call_once(once, [] { set_bf16_gemm_backend(GemmBackend::kAuto, /*on_cuda=*/true); });
}

torch::Tensor linear_fprop_op(const torch::Tensor& x, const torch::Tensor& w, std::string recipe, int64_t seed,
                              const torch::Tensor& step, int64_t layer, std::string gemm) {
  return user_errors([&] {
    check_linear(x, w);
    bf16_on_cuda(x);
    return linear_fprop(x, w, LinearPrecision{quantizer_of(recipe), gemm_dtype(gemm)},
                        key_of(seed, step_of(step), layer));
  });
}

std::tuple<torch::Tensor, torch::Tensor> linear_backward_op(const torch::Tensor& dy, const torch::Tensor& x,
                                                            const torch::Tensor& w, std::string recipe, int64_t seed,
                                                            const torch::Tensor& step, int64_t layer, std::string gemm,
                                                            bool need_dx, bool need_dw) {
  return user_errors([&] {
    check_linear(x, w);
    bf16_on_cuda(x);
    if (dy.dim() != 2 || dy.size(0) != x.size(0) || dy.size(1) != w.size(0))
      fail("linear: expected dy [N, OUT] = [", x.size(0), ", ", w.size(0), "], got ", dy.sizes());
    auto [dx, dw] = linear_backward(dy, x, w, LinearPrecision{quantizer_of(recipe), gemm_dtype(gemm)},
                                    key_of(seed, step_of(step), layer), need_dx, need_dw);
    // Undefined results as empty tensors (a custom operator returns tensors).
    return std::make_tuple(dx.defined() ? dx : torch::empty({0}, x.options()),
                           dw.defined() ? dw : torch::empty({0}, w.options()));
  });
}

// x [..., K] as the FP32 [rows, K] matrix the codec reads.
torch::Tensor as_rows(const torch::Tensor& x) {
  check_float(x, "x");
  if (x.dim() < 1 || x.size(-1) < 1) fail("x: expected a tensor [..., K] with K >= 1, got ", x.sizes());
  return x.reshape({-1, x.size(-1)}).to(torch::kFloat).contiguous();
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> quantize_op(
    const torch::Tensor& x, std::string recipe, std::string operand, int64_t seed, int64_t step, int64_t layer) {
  return user_errors([&] {
    const torch::Tensor x2 = as_rows(x);
    const QuantKey k = key_of(seed, step, layer);
    const Operand op = parse_operand(operand, "operand");
    const formats::QuantSpec spec = recipe_of(recipe)[op];
    const formats::RoundingKey rk{k.seed, uint64_t(k.step), uint64_t(k.layer), uint32_t(op)};
    const formats::QuantizedTensor q = formats::quantize_packed(x2.data_ptr<float>(), x2.size(0), x2.size(1), spec, rk);
    torch::Tensor data = torch::empty({int64_t(q.data.size())}, torch::kUInt8);
    std::memcpy(data.data_ptr<uint8_t>(), q.data.data(), q.data.size());
    const auto& s = q.scales;
    torch::Tensor codes = torch::empty({s.grid_rows, s.grid_cols}, torch::kLong);
    torch::Tensor decode = torch::empty({s.grid_rows, s.grid_cols}, torch::kFloat);
    for (size_t i = 0; i < s.blocks.size(); ++i) {
      codes.data_ptr<int64_t>()[i] = int64_t(s.blocks[i].code);
      decode.data_ptr<float>()[i] = s.blocks[i].decode;
    }
    torch::Tensor tensor_scale = torch::tensor({s.tensor.decode, s.tensor.encode}, torch::kFloat);
    torch::Tensor block = torch::tensor({s.block_rows, s.block_cols}, torch::kLong);
    return std::make_tuple(data, codes, decode, tensor_scale, block);
  });
}

torch::Tensor dequantize_op(const torch::Tensor& data, const torch::Tensor& decode, const torch::Tensor& block,
                            int64_t rows, int64_t cols, std::string recipe, std::string operand) {
  return user_errors([&] {
    formats::QuantizedTensor q;
    q.spec = recipe_of(recipe)[parse_operand(operand, "operand")];
    if (rows < 0 || cols < 1 || rows > (int64_t(1) << 40) / cols)
      fail("dequantize: expected rows >= 0, cols >= 1, rows x cols <= 2^40, got ", rows, ", ", cols);
    q.rows = rows;
    q.cols = cols;
    const int64_t want = formats::packed_bytes(rows * cols, q.spec.element.bits);
    if (data.scalar_type() != at::kByte || data.dim() != 1 || data.numel() != want)
      fail("dequantize: data: expected ", want, " packed uint8 bytes for [", rows, ", ", cols, "] of ",
           q.spec.element.bits, "-bit codes, got ", c10::toString(data.scalar_type()), " ", data.sizes());
    if (block.scalar_type() != at::kLong || block.numel() != 2) fail("dequantize: block: expected int64 [2]");
    auto& s = q.scales;
    s.block_rows = block[0].item<int64_t>();
    s.block_cols = block[1].item<int64_t>();
    if (s.block_rows < 1 || s.block_cols < 1 || s.block_rows > (int64_t(1) << 40) || s.block_cols > (int64_t(1) << 40))
      fail("dequantize: block: expected sizes in [1, 2^40], got ", s.block_rows, " x ", s.block_cols);
    s.grid_rows = (rows + s.block_rows - 1) / s.block_rows;
    s.grid_cols = (cols + s.block_cols - 1) / s.block_cols;
    if (decode.scalar_type() != at::kFloat || decode.dim() != 2 || decode.size(0) != s.grid_rows ||
        decode.size(1) != s.grid_cols)
      fail("dequantize: scales: expected float32 [", s.grid_rows, ", ", s.grid_cols, "], got ",
           c10::toString(decode.scalar_type()), " ", decode.sizes());
    const torch::Tensor d = decode.contiguous();
    s.blocks.resize(size_t(s.grid_rows * s.grid_cols));
    for (size_t i = 0; i < s.blocks.size(); ++i) s.blocks[i].decode = d.data_ptr<float>()[i];
    const torch::Tensor bytes = data.contiguous();  // a strided view reads as its elements
    q.data.assign(bytes.data_ptr<uint8_t>(), bytes.data_ptr<uint8_t>() + want);
    torch::Tensor out = torch::empty({rows, cols}, torch::kFloat);
    formats::dequantize(q, out.data_ptr<float>());
    return out;
  });
}

std::string formats_json() {
  return user_errors([&] {
    std::ostringstream os;
    app::print_format_table(os, /*json=*/true);
    return os.str();
  });
}

std::string recipes_json(std::string recipe_file) {
  return user_errors([&] {
    std::ostringstream os;
    app::print_recipes(os, app::listed_recipes("", recipe_file), /*json=*/true);
    return os.str();
  });
}

// The Python controller's C++ half (see the header comment). Every method
// turns a UserError into a ValueError (snip.Error subclasses in Python).
class ControllerCore : public torch::CustomClassHolder {
 public:
  ControllerCore(std::string config_toml, std::string layers_json, std::string gemm, double grad_scale) {
    user_errors([&] {
      Config cfg;
      cfg.load_toml_string(config_toml, "snip.Controller");
      const RunConfig rc = RunConfig::from(cfg);
      const nlohmann::json j = nlohmann::json::parse(layers_json);
      std::vector<LayerShape> shapes;
      for (const auto& l : j)
        shapes.push_back(LayerShape{l.at("name").get<std::string>(), l.at("index").get<int64_t>(),
                                    l.at("in").get<int64_t>(), l.at("out").get<int64_t>()});
      if (shapes.empty()) fail("snip.Controller: expected at least one linear layer, got none");
      ctl_ = std::make_unique<PrecisionController>(rc, shapes, gemm_dtype(gemm));
      precision_ = rc.precision;
      recipes_ = rc.recipes;
      gemm_ = gemm_dtype(gemm);
      so_ = ctl_->stats_options();
      if (!(grad_scale > 0) || !std::isfinite(grad_scale))
        fail("snip.Controller: grad_scale: expected a finite number > 0, got ", grad_scale);
      so_.grad_scale = grad_scale;
      for (const auto& o : so_.options) quant_.push_back(make_recipe_quantizer(so_.recipes, o));
      return 0;
    });
  }

  bool stats_due(int64_t s) { return ctl_->stats_due(s); }

  // What the passes need: the options, low_option, curvature_probes, the
  // number of fields per layer and the indices of those the passes fill.
  std::string stats_options() {
    return nlohmann::json{{"options", so_.options},
                          {"low_option", so_.low_option},
                          {"curvature_probes", so_.curvature_probes},
                          {"fields", stats_fields(so_.options.size())},
                          {"dx_field", int(StatsField::kDxSq)},
                          {"group_field", int(StatsField::kGroup)},
                          {"curvature_field", int(StatsField::kCurvatureNum)},
                          {"calibration_field", int(StatsField::kCalibrationDuSq)}}
        .dump();
  }

  // [sums [F] float64, row_rms [N, 1], <ε_k, g(0)> [K] float64, dW [OUT, IN]].
  std::vector<torch::Tensor> measure_layer(int64_t l, torch::Tensor x, torch::Tensor dy, torch::Tensor w,
                                           std::vector<torch::Tensor> adam, std::vector<double> adam_scalars,
                                           int64_t key_seed, int64_t s) {
    return user_errors([&] {
      const LayerSums m = snip::measure_layer(x, dy, w, quant_, adam_of(adam, adam_scalars), so_, uint64_t(key_seed),
                                              layer(l), s);
      torch::Tensor e = m.eps_dot_g0.empty() ? torch::zeros({0}, torch::kDouble) : torch::stack(m.eps_dot_g0);
      return std::vector<torch::Tensor>{torch::stack(m.sums), m.row_rms, e, m.dw};
    });
  }

  torch::Tensor curvature_noise(int64_t l, int64_t k, torch::Tensor row_rms, int64_t s) {
    return user_errors([&] { return snip::curvature_noise(so_, s, layer(l), int(k), row_rms); });
  }

  torch::Tensor calibration_noise(int64_t l, int64_t rows, torch::Tensor dx_sq, torch::Tensor like, int64_t s) {
    return user_errors([&] { return snip::calibration_noise(so_, s, layer(l), rows, dx_sq, like); });
  }

  torch::Tensor calibration_du_sq(torch::Tensor x, torch::Tensor dy, torch::Tensor dw, std::vector<torch::Tensor> adam,
                                  std::vector<double> adam_scalars) {
    return user_errors([&] { return snip::calibration_du_sq(x, dy, dw, adam_of(adam, adam_scalars), so_); });
  }

  // {"decided": bool, "metrics": {...}}; `reduced` the summed buffer of a
  // stats step (empty when stats_due(s) is false), measured in
  // `measured_seconds` (wall time of the passes).
  std::string begin_step(int64_t s, torch::Tensor reduced, double measured_seconds) {
    return user_errors([&] {
      ctl_->set_outside_stats_seconds(measured_seconds);
      const PrecisionEvent ev = ctl_->begin_step(s, [&](const StatsOptions& so) {
        if (reduced.numel() == 0) fail("snip.Controller: step ", s, ": a stats step is due, got no statistics");
        return derive_stats(reduced, ctl_->layer_shapes(), so, s);
      });
      return nlohmann::json{{"decided", ev.decided}, {"metrics", ev.metrics}}.dump();
    });
  }

  std::string assignment() { return ctl_->assignment().to_json().dump(); }
  std::string last_plan() { return ctl_->last_plan().dump(); }
  std::string plan_table() {
    return user_errors([&] { return ctl_->last_plan().is_null() ? std::string() : format_plan_table(ctl_->last_plan()); });
  }
  double fp4_share() { return ctl_->fp4_share(); }
  std::string smoothed() {
    return ctl_->smoothed().layers.empty() ? std::string("null")
                                           : to_json(ctl_->smoothed(), ctl_->per_gemm()).dump();
  }
  std::string state() { return ctl_->state().dump(); }
  void restore(std::string st) {
    user_errors([&] {
      ctl_->restore(nlohmann::json::parse(st), "snip.Controller.load_state_dict");
      return 0;
    });
  }
  void set_output(std::string run_dir, bool verbose) { ctl_->set_output(run_dir, verbose); }
  // precision.budget_unit = time (or a precision.gemm_times table): whether
  // the controller needs the GEMM-times table, and giving it one: the file
  // precision.gemm_times names, else a calibration of every layer shape on
  // `device` at `tokens` rows per micro-batch (method/gemm_calibrate.h);
  // progress lines on stderr when `verbose`. The budget's feasibility is
  // checked here (UserError -> ValueError).
  bool needs_gemm_times() { return ctl_->uses_gemm_times(); }  // asked once, before set_gemm_times
  void set_gemm_times(int64_t tokens, double micro_batches, std::string device, bool verbose) {
    user_errors([&] {
      if (tokens < 1) fail("snip.Controller: tokens: expected rows per micro-batch >= 1, got ", tokens);
      if (!(micro_batches >= 1) || !std::isfinite(micro_batches))
        fail("snip.Controller: micro_batches: expected a number >= 1, got ", micro_batches);
      auto say = [verbose](const std::string& line) {
        if (verbose) std::fprintf(stderr, "snip.Controller: %s\n", line.c_str());
      };
      ctl_->set_gemm_times(gemm_times_for_run(precision_, recipes_, ctl_->timed_layers(), ctl_->known_options(),
                                              gemm_, torch::Device(device), tokens, say),
                           tokens, micro_batches);
      return 0;
    });
  }
  std::string schedule() {
    const PrecisionSchedule& sc = ctl_->schedule();
    return nlohmann::json{{"max_steps", sc.max_steps},
                          {"warmup_end", sc.warmup_end},
                          {"final_start", sc.final_start},
                          {"plan_steps", sc.plan_steps()},
                          {"policy", ctl_->policy()}}
        .dump();
  }
  std::string phase_at(int64_t s) { return to_string(ctl_->schedule().phase_at(s)); }

 private:
  const LayerShape& layer(int64_t l) const {
    const auto& sh = ctl_->layer_shapes();
    if (l < 0 || l >= int64_t(sh.size())) fail("snip.Controller: layer ", l, ": expected an index below ", sh.size());
    return sh[size_t(l)];
  }
  // adam = [m, v, vmax] (empty tensors: no state yet), scalars = [step, lr, beta1, beta2, eps, amsgrad].
  static AdamwState adam_of(const std::vector<torch::Tensor>& t, const std::vector<double>& v) {
    if (t.size() != 3 || v.size() != 6) fail("snip.Controller: expected 3 AdamW tensors and 6 numbers");
    AdamwState st;
    if (t[0].numel() > 0) st.m = t[0];
    if (t[1].numel() > 0) st.v = t[1];
    if (t[2].numel() > 0) st.vmax = t[2];
    st.step = int64_t(v[0]);
    st.lr = v[1];
    st.beta1 = v[2];
    st.beta2 = v[3];
    st.eps = v[4];
    st.amsgrad = v[5] != 0;
    return st;
  }
  std::unique_ptr<PrecisionController> ctl_;
  PrecisionConfig precision_;  // the [precision] options, for the GEMM-times table
  recipes::RecipeSet recipes_;
  at::ScalarType gemm_ = at::kBFloat16;
  StatsOptions so_;
  std::vector<std::shared_ptr<const OperandQuantizer>> quant_;
};

}  // namespace
}  // namespace snip

TORCH_LIBRARY(snip, m) {
  m.class_<snip::ControllerCore>("Controller")
      .def(torch::init<std::string, std::string, std::string, double>())
      .def("stats_due", &snip::ControllerCore::stats_due)
      .def("stats_options", &snip::ControllerCore::stats_options)
      .def("measure_layer", &snip::ControllerCore::measure_layer)
      .def("curvature_noise", &snip::ControllerCore::curvature_noise)
      .def("calibration_noise", &snip::ControllerCore::calibration_noise)
      .def("calibration_du_sq", &snip::ControllerCore::calibration_du_sq)
      .def("begin_step", &snip::ControllerCore::begin_step)
      .def("assignment", &snip::ControllerCore::assignment)
      .def("last_plan", &snip::ControllerCore::last_plan)
      .def("plan_table", &snip::ControllerCore::plan_table)
      .def("fp4_share", &snip::ControllerCore::fp4_share)
      .def("smoothed", &snip::ControllerCore::smoothed)
      .def("state", &snip::ControllerCore::state)
      .def("restore", &snip::ControllerCore::restore)
      .def("set_output", &snip::ControllerCore::set_output)
      .def("needs_gemm_times", &snip::ControllerCore::needs_gemm_times)
      .def("set_gemm_times", &snip::ControllerCore::set_gemm_times)
      .def("schedule", &snip::ControllerCore::schedule)
      .def("phase_at", &snip::ControllerCore::phase_at);
  m.def("fake_quant(Tensor x, str recipe, str operand, int seed, int step, int layer) -> Tensor");
  m.def("linear_fprop(Tensor x, Tensor w, str recipe, int seed, Tensor step, int layer, str gemm) -> Tensor");
  m.def("linear_backward(Tensor dy, Tensor x, Tensor w, str recipe, int seed, Tensor step, int layer, str gemm, "
        "bool need_dx, bool need_dw) -> (Tensor, Tensor)");
  m.def("quantize(Tensor x, str recipe, str operand, int seed, int step, int layer) -> "
        "(Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("dequantize(Tensor data, Tensor scales, Tensor block, int rows, int cols, str recipe, str operand) -> Tensor");
  m.def("formats_json() -> str", &snip::formats_json);
  m.def("recipes_json(str recipe_file) -> str", &snip::recipes_json);
}

// CUDA tensors: the same functions; the recipe quantizers send CUDA operands
// to the CUDA kernels (formats/fake_quant_cuda.h) with the CPU's bits, and
// the GEMMs are LibTorch's on the device (docs/gpu.md). quantize/dequantize
// (packed codes and scales) stay host-only.
TORCH_LIBRARY_IMPL(snip, CUDA, m) {
  m.impl("fake_quant", &snip::fake_quant);
  m.impl("linear_fprop", &snip::linear_fprop_op);
  m.impl("linear_backward", &snip::linear_backward_op);
}

TORCH_LIBRARY_IMPL(snip, CPU, m) {
  m.impl("fake_quant", &snip::fake_quant);
  m.impl("linear_fprop", &snip::linear_fprop_op);
  m.impl("linear_backward", &snip::linear_backward_op);
  m.impl("quantize", &snip::quantize_op);
  m.impl("dequantize", &snip::dequantize_op);
}
