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
// `recipe` is "none" (no quantization), a built-in recipe's name, or a
// recipe as JSON (recipes/recipe.h to_json: a recipe file's, from Python).
// `gemm` is "bf16" (BF16 inputs, FP32 accumulation) or "fp32" (the input
// dtype). A snip::UserError becomes a Python ValueError with its one line.
#include <torch/library.h>
#include <torch/torch.h>

#include <map>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "snip/app/formats_command.h"
#include "snip/core/error.h"
#include "snip/formats/fake_quant.h"
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
  if (step.scalar_type() != at::kLong || step.numel() != 1 || !step.device().is_cpu())
    fail("step: expected a one-element int64 CPU tensor, got ", c10::toString(step.scalar_type()), " ", step.sizes());
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

torch::Tensor linear_fprop_op(const torch::Tensor& x, const torch::Tensor& w, std::string recipe, int64_t seed,
                              const torch::Tensor& step, int64_t layer, std::string gemm) {
  return user_errors([&] {
    check_linear(x, w);
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

}  // namespace
}  // namespace snip

TORCH_LIBRARY(snip, m) {
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

TORCH_LIBRARY_IMPL(snip, CPU, m) {
  m.impl("fake_quant", &snip::fake_quant);
  m.impl("linear_fprop", &snip::linear_fprop_op);
  m.impl("linear_backward", &snip::linear_backward_op);
  m.impl("quantize", &snip::quantize_op);
  m.impl("dequantize", &snip::dequantize_op);
}
