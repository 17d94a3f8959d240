// src/app/formats_command.cpp: what `snip formats` and `snip quantize` do
// (snip/app/formats_command.h; the command line is src/cli/cmd_formats.cpp).
//
//   snip formats                      table of every element format
//   snip formats --json               the same as a JSON array
//   snip formats --codes e2m1 [--json]  every code of a format of <= 8 bits
//   snip formats --recipes [--json] [--config RUN.toml | --recipe-file FILE]
//                                     the recipes (built-in, and the files') as plain config
//   snip quantize --scheme fp4 --input in.safetensors --output out.safetensors
//        [--operand fprop.w] [--seed N] [--json]
//     fake-quantizes every floating-point tensor along its last dimension
//     (viewed as [numel / last, last]) with the recipe's spec for the chosen
//     GEMM operand, writes FP32 tensors and prints per-tensor SQNR (dB) and
//     relative error. Per dtype (docs/formats.md, "safetensors dtypes"):
//     every float dtype is decoded to FP32 exactly (F64: rounded to nearest
//     FP32) and quantized; BOOL, integers and C64 are copied unchanged, the
//     per-tensor line says so; F6_E2M3 / F6_E3M2 (bit order undefined) and
//     an F64 beyond FP32's range are refused before anything is written.
//     --output is checked first (its folder exists and takes a new file);
//     an unwritable one fails before anything is read or printed.
//     A tensor that the scales flush to zero is named on stderr (kFlushWarning).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "snip/app/formats_command.h"
#include "snip/formats/element_format.h"
#include "snip/formats/fake_quant.h"
#include "snip/io/atomic_file.h"
#include "snip/formats/hadamard.h"
#include "snip/io/safetensors.h"
#include "snip/io/tensor_values.h"
#include "snip/config/config.h"
#include "snip/recipes/recipe.h"
#include "snip/recipes/recipe_file.h"
#include "snip/core/error.h"

namespace snip::app {

namespace {

using formats::ElementFormat;
using formats::ElementKind;

std::string num(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::ostringstream os;
  os << std::setprecision(9) << v;
  return os.str();
}

const char* kind_name(ElementKind k) {
  return k == ElementKind::kFloat ? "float" : k == ElementKind::kPosit ? "posit" : "int";
}

const char* nan_name(formats::NanEncoding n) {
  switch (n) {
    case formats::NanEncoding::kNone: return "none";
    case formats::NanEncoding::kAllOnes: return "S.1..1.1..1";
    case formats::NanEncoding::kIeee: return "exp all ones, M != 0";
    case formats::NanEncoding::kNaR: return "NaR 10..0";
  }
  return "?";
}

nlohmann::json format_json(const ElementFormat& f) {
  return {{"name", f.name},           {"kind", kind_name(f.kind)},
          {"bits", f.bits},           {"exponent_bits", f.kind == ElementKind::kFloat ? f.ebits : 0},
          {"mantissa_bits", f.mbits}, {"es", f.kind == ElementKind::kPosit ? f.ebits : 0},
          {"bias", f.bias},           {"max", f.max_value()},
          {"min_normal", f.min_normal()}, {"min_subnormal", f.min_subnormal()},
          {"has_inf", f.has_inf},     {"nan", nan_name(f.nan)}};
}

}  // namespace

void print_format_table(std::ostream& out, bool json) {
  std::ostringstream os;
  std::vector<ElementFormat> fmts;
  for (const std::string& n : formats::element_format_names())
    fmts.push_back(formats::find_element_format(n));
  if (json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const ElementFormat& f : fmts) arr.push_back(format_json(f));
    out << arr.dump(2) << "\n";
    return;
  }
  os << std::left << std::setw(8) << "format" << std::setw(6) << "kind" << std::right
     << std::setw(5) << "bits" << std::setw(5) << "exp" << std::setw(5) << "man" << std::setw(6)
     << "bias" << std::setw(15) << "max" << std::setw(15) << "min normal" << std::setw(15)
     << "min subnormal" << "  " << std::left << std::setw(5) << "inf" << "nan\n";
  for (const ElementFormat& f : fmts) {
    const bool fl = f.kind == ElementKind::kFloat;
    os << std::left << std::setw(8) << f.name << std::setw(6) << kind_name(f.kind) << std::right
       << std::setw(5) << f.bits << std::setw(5)
       << (fl ? std::to_string(f.ebits) : f.kind == ElementKind::kPosit ? "es" + std::to_string(f.ebits) : "-")
       << std::setw(5) << (fl ? std::to_string(f.mbits) : "-") << std::setw(6)
       << (fl ? std::to_string(f.bias) : "-") << std::setw(15) << num(f.max_value())
       << std::setw(15) << num(f.min_normal()) << std::setw(15) << num(f.min_subnormal()) << "  "
       << std::left << std::setw(5) << (f.has_inf ? "yes" : "no") << nan_name(f.nan) << "\n";
  }
  out << os.str();
}

namespace {

std::string bit_string(uint32_t code, int bits) {
  std::string s;
  for (int i = bits - 1; i >= 0; --i) s += ((code >> i) & 1u) ? '1' : '0';
  return s;
}

}  // namespace

void print_codes(std::ostream& out, const std::string& name, bool json) {
  std::ostringstream os;
  const ElementFormat f = formats::find_element_format(name);
  if (f.bits > 8)
    fail("--codes ", name, ": expected a format of 8 bits or fewer, got ", f.bits, " bits");
  nlohmann::json arr = nlohmann::json::array();
  for (uint32_t c = 0; c < f.num_codes(); ++c) {
    const float v = formats::decode(f, c);
    if (json) {
      nlohmann::json e = {{"code", c}, {"bits", bit_string(c, f.bits)}};
      if (std::isfinite(v)) {
        e["value"] = double(v);
      } else {
        e["value"] = nullptr;  // JSON has no NaN/Inf
        e["special"] = std::isnan(v) ? "nan" : (v > 0 ? "+inf" : "-inf");
      }
      arr.push_back(e);
    } else {
      char hex[16];
      std::snprintf(hex, sizeof hex, "0x%02x", c);
      os << hex << "  " << bit_string(c, f.bits) << "  "
         << (std::signbit(v) && v == 0 ? "-0" : num(v)) << "\n";
    }
  }
  if (json) os << arr.dump(2) << "\n";
  out << os.str();
}

recipes::RecipeSet listed_recipes(const std::string& config, const std::string& recipe_file) {
  recipes::RecipeSet set;
  if (!config.empty()) {
    Config cfg;
    cfg.load_toml_file(config);
    set = recipes::load_recipe_set(cfg.get_string("precision.recipe_file"));
  }
  if (!recipe_file.empty())
    for (const recipes::Recipe& r : recipes::load_recipe_file(recipe_file).recipes) set.add(r, /*replace=*/true);
  return set;
}

void print_recipes(std::ostream& out, const recipes::RecipeSet& set, bool json) {
  std::ostringstream os;
  nlohmann::json arr = nlohmann::json::array();
  for (const std::string& name : set.names()) {
    const recipes::Recipe& r = set.find(name);
    if (json) {
      arr.push_back(recipes::to_json(r));
      continue;
    }
    os << r.name << ": " << r.description << (r.error_feedback ? " [error feedback on W]" : "") << "\n";
    for (int i = 0; i < kNumOperands; ++i)
      os << "  " << std::left << std::setw(9) << operand_name(Operand(i))
         << r.operands[size_t(i)].describe() << "\n";
  }
  if (json) os << arr.dump(2) << "\n";
  out << os.str();
}

namespace {

// Why `snip quantize` copies a tensor of dtype `d` unchanged instead of
// quantizing it ("" = it is quantized): BOOL and integers are not floating
// point; C64 is complex (real, imaginary F32 pairs), which no recipe
// quantizes. Every float dtype is decoded to FP32 (io/tensor_values.h) and
// quantized; F6_* cannot be decoded, so decode_to_f32 refuses it.
std::string copy_reason(io::DType d) {
  switch (io::dtype_kind(d)) {
    case io::DTypeKind::kBool:
    case io::DTypeKind::kInteger:
      return io::dtype_name(d) + " is not floating point";
    case io::DTypeKind::kComplex:
      return io::dtype_name(d) + " is complex; snip quantizes real tensors only";
    case io::DTypeKind::kFloat:
      return "";
  }
  return "";
}

// Flush-to-zero warning rule of `snip quantize`: a tensor is named on stderr
// when it has nonzero (non-NaN) inputs and MORE than this fraction of them
// came out exactly 0. Block scaling rounds an element to 0 when it is below
// half the smallest element step of its block (|x| < amax_block / 24 for
// E2M1), which for ordinary data is a small minority (~7% of a Gaussian
// 1x16 block); a majority means the scales themselves failed, e.g. NVFP4's
// FP32 tensor scale S_enc = 2688 / amax is clamped to FLT_MAX for
// amax < ~7.9e-36, so a tensor of 1e-40 values (FP32 subnormals) becomes all
// zeros. The message says "every ... became 0" when none survived.
constexpr double kFlushWarning = 0.5;

// The warning line for one tensor, or "" (rule: kFlushWarning).
std::string flush_warning(const std::string& tensor, const std::string& scheme,
                          int64_t nonzero, int64_t flushed) {
  if (nonzero == 0 || double(flushed) <= kFlushWarning * double(nonzero)) return "";
  if (flushed == nonzero)
    return str_cat("snip: warning: tensor '", tensor, "' flushed to zero by ", scheme,
                   " (every one of its ", nonzero, " nonzero inputs became 0)");
  return str_cat("snip: warning: tensor '", tensor, "' mostly flushed to zero by ", scheme, " (",
                 flushed, " of its ", nonzero, " nonzero inputs became 0)");
}

}  // namespace

void run_quantize(const QuantizeOpts& o, std::ostream& out, std::ostream& err) {
  std::ostringstream os;  // flushed line by line; std::cout's flags stay untouched
  auto flush = [&] {
    out << os.str() << std::flush;
    os.str("");
  };
  const recipes::Recipe recipe = recipes::RecipeSet().find(o.scheme);
  const Operand op = parse_operand(o.operand, "--operand");
  const formats::QuantSpec spec = recipe[op];
  // An operand with a Hadamard transform (nvfp4's wgrad operands): the
  // tensor is transformed, x·R, quantized without the transform, and the
  // result mapped back, Q(x·R)·Rᵀ, so the file approximates the input; the
  // statistics (and the flush warning) are over x·R, which has x's norm.
  formats::QuantSpec plain = spec;
  plain.hadamard_size = 0;
  const std::vector<float> signs =
      spec.hadamard_size ? formats::hadamard_signs(spec.hadamard_size, spec.hadamard_seed) : std::vector<float>{};
  io::ensure_writable_file(o.output, "--output");  // before any work or output
  const io::SafeTensors in = io::read_safetensors(o.input);
  // Every float tensor must decode before anything is printed or written:
  // F6_* never does, an F64 beyond FP32's range neither (one line, exit 2).
  for (const io::TensorRecord& t : in.tensors)
    if (copy_reason(t.dtype).empty() && io::f32_conversion(t.dtype) != io::F32Conversion::kExact)
      io::decode_to_f32(t, o.input);  // throws for F6_*; checks F64's range
  io::SafeTensors result;
  result.metadata = in.metadata;
  result.metadata["snip.quantize.scheme"] = o.scheme;
  result.metadata["snip.quantize.operand"] = o.operand;
  result.metadata["snip.quantize.spec"] = spec.describe();
  if (spec.hadamard_size) {
    result.metadata["snip.quantize.hadamard"] = "Q(x·R)·Rᵀ written: mapped back to the input's basis";
    if (!o.json)
      os << "operand " << o.operand << " passes a " << spec.hadamard_size << "x" << spec.hadamard_size
         << " random Hadamard transform R before quantization: statistics are over x·R (same norm as x); "
            "the file holds Q(x·R)·Rᵀ, an approximation of x\n";
  }
  if (!o.json)
    os << "scheme " << o.scheme << " (" << o.operand << ": " << spec.describe() << ")\n"
       << std::left << std::setw(40) << "tensor" << std::right << std::setw(16) << "shape"
       << std::setw(10) << "SQNR dB" << std::setw(12) << "rel err" << std::setw(11) << "underflow"
       << std::setw(11) << "saturated" << "\n";
  formats::QuantStats total;
  std::vector<float> x, y;
  for (size_t ti = 0; ti < in.tensors.size(); ++ti) {
    const io::TensorRecord& t = in.tensors[ti];
    std::string shape = "[";
    for (size_t d = 0; d < t.shape.size(); ++d) shape += (d ? ", " : "") + std::to_string(t.shape[d]);
    shape += "]";
    if (const std::string why = copy_reason(t.dtype); !why.empty()) {
      result.add(t.name, t.dtype, t.shape, t.data.data());
      if (o.json)
        os << nlohmann::json{{"tensor", t.name}, {"shape", t.shape}, {"dtype", io::dtype_name(t.dtype)},
                             {"action", "copied"}, {"reason", why}}
                  .dump()
           << "\n";
      else
        os << std::left << std::setw(40) << t.name << std::right << std::setw(16) << shape << "  copied ("
           << why << ")\n";
      flush();
      continue;
    }
    x = io::decode_to_f32(t, o.input);
    const int64_t cols = t.shape.empty() ? 1 : t.shape.back();
    const int64_t rows = cols == 0 ? 0 : t.numel() / cols;
    y.resize(x.size());
    formats::QuantStats st;
    const formats::RoundingKey key{o.seed, 0, uint64_t(ti), uint32_t(static_cast<int>(op))};
    if (spec.hadamard_size) formats::hadamard_rows(x.data(), rows, cols, spec.hadamard_size, signs.data());
    if (spec.rule == formats::ScaleRule::kDelayed) {
      formats::DelayedScaling state(plain);  // fresh: the first call uses current scaling
      formats::fake_quantize(x.data(), y.data(), rows, cols, key, state, &st);
    } else {
      formats::fake_quantize(x.data(), y.data(), rows, cols, plain, key, &st);
    }
    if (spec.hadamard_size) formats::hadamard_rows_inverse(y.data(), rows, cols, spec.hadamard_size, signs.data());
    result.add(t.name, io::DType::F32, t.shape, y.data());
    total.merge(st);
    int64_t nonzero = 0;  // the inputs st.underflow counts among (x != 0, NaN excluded; x·R under a transform)
    for (const float v : x) nonzero += v != 0.0f && !std::isnan(v);
    if (const std::string w = flush_warning(t.name, o.scheme, nonzero, st.underflow); !w.empty())
      err << w << "\n" << std::flush;
    if (o.json) {
      os << nlohmann::json{{"tensor", t.name},
                           {"shape", t.shape},
                           {"dtype", io::dtype_name(t.dtype)},
                           {"action", "quantized"},
                           {"sqnr_db", std::isfinite(st.sqnr_db()) ? nlohmann::json(st.sqnr_db()) : nlohmann::json(nullptr)},
                           {"rel_error", st.rel_error()},
                           {"underflow_fraction", st.underflow_fraction()},
                           {"saturated_fraction", st.saturated_fraction()},
                           {"nonfinite", st.nonfinite}}
                .dump()
         << "\n";
    } else {
      os << std::left << std::setw(40) << t.name << std::right << std::setw(16) << shape
         << std::fixed << std::setprecision(2) << std::setw(10) << st.sqnr_db()
         << std::scientific << std::setprecision(3) << std::setw(12) << st.rel_error()
         << std::fixed << std::setprecision(4) << std::setw(11) << st.underflow_fraction()
         << std::setw(11) << st.saturated_fraction() << std::defaultfloat << "\n";
    }
    flush();
  }
  io::write_safetensors(o.output, result);
  if (!o.json)
    os << "all tensors: SQNR " << std::fixed << std::setprecision(2) << total.sqnr_db()
       << " dB, rel err " << std::scientific << std::setprecision(3) << total.rel_error()
       << std::defaultfloat << "; wrote " << o.output << "\n";
  flush();
}

}  // namespace snip::app
