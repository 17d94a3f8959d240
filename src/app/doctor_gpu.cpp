// src/app/doctor_gpu.cpp: the GPU part of `snip doctor` (doctor_gpu.h): the
// CUDA devices LibTorch sees, their measured BF16 and FP8 GEMM rates, and the
// path each recipe's GEMMs take there.
//
// The CUDA headers come with the toolkit (/usr/local/cuda, on the include
// path through LibTorch's CMake files); without them this file still
// compiles and reports no device. Device properties are LibTorch's
// (at::cuda::getDeviceProperties, libtorch_cuda); the CUDA runtime's own
// answers (versions, cudaGetDeviceCount's error) are looked up with dlsym in
// the runtime LibTorch loaded, so snip does not link a second runtime.
#include "doctor_gpu.h"

#include <dlfcn.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <vector>

#include <fmt/format.h>

#include "snip/model/linear.h"
#include "snip/model/quantizers.h"
#include "snip/recipes/recipe.h"

#if __has_include(<ATen/cuda/CUDAContextLight.h>) && __has_include(<cuda_runtime_api.h>) && \
    __has_include(<cublasLt.h>) && __has_include(<cusparse.h>)
#define SNIP_DOCTOR_CUDA 1
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDAFunctions.h>
#else
#define SNIP_DOCTOR_CUDA 0
#endif

namespace snip::app {

const GpuGemmShape kGpuShapes[2] = {
    {"tiny", 2048, 256, 688, "configs/tiny.toml MLP gate/up projection: 16*128 tokens, C = 256 -> F = 688"},
    {"1b", 8192, 2048, 5632, "TinyLlama-1.1B MLP gate/up projection: 4*2048 tokens, C = 2048 -> F = 5632"},
};

namespace {

using nlohmann::json;

#if !SNIP_DOCTOR_CUDA

std::string no_device_reason(bool cuda_built) {
  return cuda_built ? "no CUDA device: snip was built without the CUDA headers (cuda_runtime_api.h), so it cannot query one"
                    : "no CUDA device: this LibTorch is built without CUDA";
}

#else

using clk = std::chrono::steady_clock;

constexpr int kReps = 5;  // timed batches per rate; the median is kept

double seconds_since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }

// The first line of an exception's message (LibTorch's carry a backtrace).
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// A CUDA version integer (1000 * major + 10 * minor: 12080) as "12.8".
std::string cuda_version_string(int v) { return v > 0 ? fmt::format("{}.{}", v / 1000, (v % 1000) / 10) : "unknown"; }

// The CUDA runtime function `name`, of type `Fn`, from the runtime already
// loaded in this process (the one libtorch_cuda needs), found with dlsym;
// nullptr when none is loaded.
template <class Fn>
Fn runtime_fn(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

// cudaDriverGetVersion / cudaRuntimeGetVersion (`name`) through the loaded
// runtime, as "12.8"; "unknown" when it is not loaded or the call fails.
std::string runtime_version(const char* name) {
  int v = 0;
  const auto f = runtime_fn<decltype(&cudaRuntimeGetVersion)>(name);
  return f && f(&v) == cudaSuccess ? cuda_version_string(v) : "unknown";
}

// What cudaGetDeviceCount says when it finds no device ("cudaGetDeviceCount:
// CUDA driver version is insufficient for CUDA runtime version (error 35)"),
// or "" when the runtime is not loaded.
std::string device_count_error() {
  const auto count = runtime_fn<decltype(&cudaGetDeviceCount)>("cudaGetDeviceCount");
  const auto str = runtime_fn<decltype(&cudaGetErrorString)>("cudaGetErrorString");
  if (!count) return "";
  int n = 0;
  const cudaError_t e = count(&n);
  if (e == cudaSuccess) return fmt::format("cudaGetDeviceCount: {} devices", n);
  if (const auto clear = runtime_fn<decltype(&cudaGetLastError)>("cudaGetLastError")) clear();  // leave no error behind
  return fmt::format("cudaGetDeviceCount: {} (error {})", str ? str(e) : "?", int(e));
}

// Why no CUDA device is usable: one line, "no CUDA device: <torch's reason>
// (<the runtime's>)".
std::string no_device_reason(bool cuda_built) {
  if (!cuda_built) return "no CUDA device: this LibTorch is built without CUDA";
  std::string why;
  try {
    c10::cuda::device_count_ensure_non_zero();  // throws with torch's reason
    why = "torch::cuda::is_available() is false";
  } catch (const c10::Error& e) {
    why = first_line(e.what_without_backtrace());
  }
  const std::string rt = device_count_error();
  return "no CUDA device: " + why + (rt.empty() ? "" : " (" + rt + ")");
}

// Seconds per call of f on CUDA device `dev`: 3 warm-up calls, then kReps
// batches of n back-to-back calls, each bracketed by device
// synchronisations; n is sized from one timed call so that a batch lasts
// about total_s / kReps (at least 1 call). The median batch time / n: launch
// overhead counts, as it does in a training step.
template <class F>
double gpu_seconds_per_call(F&& f, int dev, double total_s) {
  for (int i = 0; i < 3; ++i) f();
  torch::cuda::synchronize(dev);
  auto t0 = clk::now();
  f();
  torch::cuda::synchronize(dev);
  const double one = std::max(seconds_since(t0), 1e-7);
  const int64_t n = std::clamp<int64_t>(int64_t(std::ceil(total_s / kReps / one)), 1, 100000);
  std::vector<double> per(kReps);
  for (double& p : per) {
    t0 = clk::now();
    for (int64_t i = 0; i < n; ++i) f();
    torch::cuda::synchronize(dev);
    p = seconds_since(t0) / double(n);
  }
  std::nth_element(per.begin(), per.begin() + kReps / 2, per.end());
  return per[kReps / 2];
}

// {"tflops", "ms"} of one GEMM shape taking `s` seconds per call.
json rate(const GpuGemmShape& sh, double s) {
  return {{"tflops", 2.0 * double(sh.m) * double(sh.k) * double(sh.n) / s / 1e12}, {"ms", s * 1e3}};
}

// BF16 GEMM [M, K] x [K, N] (W [N, K] row-major, transposed: as a linear
// layer's fprop), BF16 out, FP32 accumulation (cuBLAS), random normal data.
json measure_bf16(const GpuGemmShape& sh, int dev, double total_s) {
  torch::NoGradGuard ng;
  const auto o = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA, dev);
  const torch::Tensor x = torch::randn({sh.m, sh.k}, o), w = torch::randn({sh.n, sh.k}, o) * 0.05;
  torch::Tensor y = torch::empty({sh.m, sh.n}, o);
  return rate(sh, gpu_seconds_per_call([&] { at::mm_out(y, x, w.t()); }, dev, total_s));
}

// FP8 GEMM through at::_scaled_mm: X, W cast to E4M3 with one FP32 scale per
// tensor (amax -> 448, TE's current scaling), the inverse scales handed to
// the GEMM (applied to the FP32 accumulator), BF16 out, use_fast_accum =
// false (FP32 accumulation). W [N, K] row-major is the column-major [K, N]
// second operand cuBLASLt's FP8 kernels require; M, K, N multiples of 16.
json measure_fp8(const GpuGemmShape& sh, int dev, double total_s) {
  torch::NoGradGuard ng;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(torch::kCUDA, dev);
  const torch::Tensor x = torch::randn({sh.m, sh.k}, f32), w = torch::randn({sh.n, sh.k}, f32) * 0.05;
  const torch::Tensor sx = 448.0 / x.abs().max(), sw = 448.0 / w.abs().max();  // FP32 scalars on the device
  const torch::Tensor x8 = (x * sx).to(at::kFloat8_e4m3fn), w8 = (w * sw).to(at::kFloat8_e4m3fn);
  const torch::Tensor ix = sx.reciprocal(), iw = sw.reciprocal();
  torch::Tensor y = torch::empty({sh.m, sh.n}, f32.dtype(torch::kBFloat16));
  return rate(sh, gpu_seconds_per_call(
                      [&] { at::_scaled_mm_out(y, x8, w8.t(), ix, iw, std::nullopt, std::nullopt, at::kBFloat16, false); },
                      dev, total_s));
}

// Runs one measurement; a failure becomes {"error": its first line}.
template <class F>
json try_rate(F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return {{"error", first_line(e.what())}};
  }
}

// True when every operand of `r` is FP8 E4M3/E5M2 with one FP32 scale per
// tensor (no Hadamard transform) and no GEMM pairs two E5M2 operands
// (cuBLASLt has no E5M2 x E5M2 kernel): what at::_scaled_mm runs natively.
bool per_tensor_fp8(const recipes::Recipe& r) {
  using formats::ScaleFormat;
  using formats::ScaleRule;
  auto ok = [](const formats::QuantSpec& s) {
    return (s.element == formats::kE4M3 || s.element == formats::kE5M2) && s.block == formats::BlockShape::tensor() &&
           (s.rule == ScaleRule::kCurrent || s.rule == ScaleRule::kDelayed) &&
           (s.scale_format == ScaleFormat::kFP32 || s.scale_format == ScaleFormat::kFP32Pow2) && s.hadamard_size == 0;
  };
  for (int g = 0; g < kNumGemms; ++g) {
    const formats::QuantSpec& a = r.operands[size_t(2 * g)];
    const formats::QuantSpec& b = r.operands[size_t(2 * g + 1)];
    if (!ok(a) || !ok(b) || (a.element == formats::kE5M2 && b.element == formats::kE5M2)) return false;
  }
  return true;
}

// Whether `recipe`'s fprop operands, quantized on the CPU at the tiny shape
// (X [M, K] random normal, W [N, K] * 0.05), are BF16 values: the BF16 GEMM
// then multiplies exactly the quantized values (NaN compares as equal).
bool operands_exact_in_bf16(const recipes::RecipeSet& set, const std::string& recipe) {
  torch::NoGradGuard ng;
  torch::manual_seed(0);
  const GpuGemmShape& sh = kGpuShapes[0];
  const torch::Tensor x = torch::randn({sh.m, sh.k}), w = torch::randn({sh.n, sh.k}) * 0.05;
  const auto q = make_recipe_quantizer(set, recipe);
  QuantKey key;
  for (const auto& [t, op] : {std::pair{x, Operand::kFpropX}, std::pair{w, Operand::kFpropW}}) {
    key.operand = op;
    const torch::Tensor v = q ? q->quantize(t, key) : t;
    if (!torch::equal(v.to(torch::kBFloat16).to(torch::kFloat).nan_to_num(0), v.nan_to_num(0))) return false;
  }
  return true;
}

#endif  // SNIP_DOCTOR_CUDA

}  // namespace

json measure_gpu(const recipes::RecipeSet& recipes, bool cuda_built, const std::string& nvidia_smi_driver,
                 double min_time_s, bool progress) {
#if !SNIP_DOCTOR_CUDA
  (void)recipes, (void)nvidia_smi_driver, (void)min_time_s, (void)progress;
  return {{"present", false}, {"reason", no_device_reason(cuda_built)}};
#else
  if (!cuda_built || !torch::cuda::is_available()) return {{"present", false}, {"reason", no_device_reason(cuda_built)}};
  const auto t_start = clk::now();
  json g;
  g["present"] = true;
  g["driver_version"] = nvidia_smi_driver;
  g["driver_cuda_version"] = runtime_version("cudaDriverGetVersion");
  g["runtime_cuda_version"] = runtime_version("cudaRuntimeGetVersion");
  json devices = json::array();
  const int n = int(torch::cuda::device_count());
  for (int i = 0; i < n; ++i) {
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(c10::DeviceIndex(i));
    devices.push_back({{"index", i},
                       {"name", std::string(p->name)},
                       {"compute_capability", fmt::format("{}.{}", p->major, p->minor)},
                       {"cc_major", p->major},
                       {"cc_minor", p->minor},
                       {"memory_bytes", int64_t(p->totalGlobalMem)},
                       {"memory_gib", double(p->totalGlobalMem) / double(1ull << 30)},
                       {"sm_count", p->multiProcessorCount}});
  }
  g["devices"] = devices;
  const int dev = 0;
  g["measured_device"] = dev;
  const int cc = devices[0]["cc_major"].get<int>() * 10 + std::min(devices[0]["cc_minor"].get<int>(), 9);
  g["units"] = "TFLOP/s = 2*M*K*N / seconds / 1e12; seconds per GEMM: the median of 5 timed batches of back-to-back "
               "calls after warm-up, the device synchronised around each batch (launch overhead included)";
  json shapes = json::array();
  for (const GpuGemmShape& sh : kGpuShapes)
    shapes.push_back({{"name", sh.name}, {"M", sh.m}, {"K", sh.k}, {"N", sh.n}, {"what", sh.what}});
  g["shapes"] = shapes;
  auto say = [&](const std::string& what) {
    if (progress) std::cerr << "measuring GPU " << what << " ...          \r" << std::flush;
  };

  // The BF16 rate of this run: every other rate is compared with it.
  json bf16 = {{"gemm", "torch::mm: BF16 operands, FP32 accumulation, BF16 out (cuBLAS)"}};
  for (const GpuGemmShape& sh : kGpuShapes) {
    say(std::string("bf16 ") + sh.name);
    bf16[sh.name] = try_rate([&] { return measure_bf16(sh, dev, min_time_s); });
  }
  g["bf16"] = bf16;
  // The per-tensor FP8 rate, measured once for every recipe that takes it.
  json fp8;
  const bool fp8_units = cc >= 89;
  bool fp8_measured = false;
  auto fp8_rates = [&] {
    if (!fp8_measured)
      for (const GpuGemmShape& sh : kGpuShapes) {
        say(std::string("fp8 ") + sh.name);
        fp8[sh.name] = try_rate([&] { return measure_fp8(sh, dev, min_time_s); });
      }
    fp8_measured = true;
    return fp8;
  };
  auto with_vs_bf16 = [&](json& row, const json& rates) {
    row["tflops"] = json::object();
    row["vs_bf16"] = json::object();
    for (const GpuGemmShape& sh : kGpuShapes) {
      if (!rates.contains(sh.name)) continue;
      const json& r = rates[sh.name];
      if (r.contains("error")) {
        row["error"] = std::string(sh.name) + ": " + r["error"].get<std::string>();
        continue;
      }
      row["tflops"][sh.name] = r["tflops"];
      if (bf16.contains(sh.name) && bf16[sh.name].contains("tflops"))
        row["vs_bf16"][sh.name] = r["tflops"].get<double>() / bf16[sh.name]["tflops"].get<double>();
    }
  };

  json rows = json::array();
  for (const std::string& name : recipes.names()) {
    const recipes::Recipe& r = recipes.find(name);
    json row = {{"recipe", name}};
    if (cc < 80) {
      row["path"] = "none";
      row["reason"] = fmt::format("compute capability {}.{} has no BF16 tensor cores (sm_80+), which snip's GPU GEMMs need",
                                  cc / 10, cc % 10);
    } else if (r.is_passthrough()) {
      row["path"] = "native";
      row["how"] = "BF16 operands on BF16 tensor cores, FP32 accumulation";
      row["timed"] = "the BF16 GEMM above";
      with_vs_bf16(row, bf16);
    } else if (fp8_units && per_tensor_fp8(r) && !fp8_rates()[kGpuShapes[0].name].contains("error")) {
      row["path"] = "native";
      row["how"] = "FP8 tensor cores through at::_scaled_mm: FP8 operands with one FP32 scale per tensor, applied to "
                   "the FP32 accumulator";
      row["timed"] = "at::_scaled_mm, E4M3 x E4M3, per-tensor FP32 scales, FP32 accumulation (use_fast_accum = false), "
                     "BF16 out";
      with_vs_bf16(row, fp8);
    } else {
      row["path"] = "emulated";
      row["how"] = "fake-quantized operands (values of the format) in a BF16 GEMM with FP32 accumulation";
      row["timed"] = "the BF16 GEMM above (its GEMM; the quantization of the operands is not timed)";
      with_vs_bf16(row, bf16);
      if (fp8_units && per_tensor_fp8(r)) row["native_error"] = fp8[kGpuShapes[0].name].value("error", "");
      try {
        row["operands_exact_in_bf16"] = operands_exact_in_bf16(recipes, name);
      } catch (const std::exception& e) {
        row["error"] = "quantizing the operands: " + first_line(e.what());
      }
    }
    rows.push_back(row);
  }
  g["recipes"] = rows;
  if (fp8_measured) {
    fp8["gemm"] = "at::_scaled_mm: E4M3 x E4M3, one FP32 scale per tensor, FP32 accumulation, BF16 out (cuBLASLt)";
    g["fp8"] = fp8;
  }
  g["seconds"] = seconds_since(t_start);
  return g;
#endif
}

void print_gpu(const json& g, std::ostream& os) {
  if (!g.value("present", false)) {
    os << "GPU: none measured: " << g.value("reason", std::string("unknown")) << "\n";
    return;
  }
  os << fmt::format("GPU (measured on device {} in {:.1f} s)\n", g["measured_device"].get<int>(), g["seconds"].get<double>());
  for (const json& d : g["devices"])
    os << fmt::format("  device {}   {}, compute capability {}, {:.1f} GiB, {} SMs\n", d["index"].get<int>(),
                      d["name"].get<std::string>(), d["compute_capability"].get<std::string>(),
                      d["memory_gib"].get<double>(), d["sm_count"].get<int>());
  const std::string drv = g["driver_version"].get<std::string>();
  os << "  versions   driver " << (drv.empty() ? "" : drv + ", ") << "CUDA " << g["driver_cuda_version"].get<std::string>()
     << " (driver API), CUDA runtime " << g["runtime_cuda_version"].get<std::string>() << "\n";
  os << "  units      " << g["units"].get<std::string>() << "\n";
  for (const GpuGemmShape& sh : kGpuShapes)
    os << fmt::format("  shape {:<4} [{}, {}] x [{}, {}]: {}\n", sh.name, sh.m, sh.k, sh.k, sh.n, sh.what);
  auto cell = [](const json& r, const char* shape) {
    return r.contains(shape) && r[shape].contains("tflops") ? fmt::format("{:.1f}", r[shape]["tflops"].get<double>())
                                                             : std::string("-");
  };
  os << "  bf16       tiny " << cell(g["bf16"], "tiny") << " TFLOP/s, 1b " << cell(g["bf16"], "1b") << " TFLOP/s ("
     << g["bf16"]["gemm"].get<std::string>() << ")\n";
  os << fmt::format("  {:<12} {:<26} {:>12} {:>8} {:>12} {:>8}  {}\n", "recipe", "path", "tiny TFLOP/s", "vs bf16",
                    "1b TFLOP/s", "vs bf16", "timed");
  for (const json& r : g["recipes"]) {
    std::string path = r["path"].get<std::string>();
    if (r.contains("operands_exact_in_bf16"))
      path = r["operands_exact_in_bf16"].get<bool>() ? "emulated exactly" : "emulated, operands rounded";
    auto vs = [&](const char* shape) {
      return r.contains("vs_bf16") && r["vs_bf16"].contains(shape)
                 ? fmt::format("{:.2f}x", r["vs_bf16"][shape].get<double>())
                 : std::string("-");
    };
    auto tf = [&](const char* shape) {
      return r.contains("tflops") && r["tflops"].contains(shape)
                 ? fmt::format("{:.1f}", r["tflops"][shape].get<double>())
                 : std::string("-");
    };
    std::string tail = r.value("timed", r.value("reason", std::string()));
    if (r.contains("error")) tail += " [error: " + r["error"].get<std::string>() + "]";
    os << fmt::format("  {:<12} {:<26} {:>12} {:>8} {:>12} {:>8}  {}\n", r["recipe"].get<std::string>(), path,
                      tf("tiny"), vs("tiny"), tf("1b"), vs("1b"), tail);
  }
}

}  // namespace snip::app
