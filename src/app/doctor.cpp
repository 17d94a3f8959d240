// src/app/doctor.cpp: what `snip doctor` does: what this machine can do for
// snip, measured (the command line is src/cli/cmd_doctor.cpp).
//
// Prints the capability record (snip/hw/capabilities.h), the LibTorch build,
// the runtime settings snip applies (snip/hw/platform.h), the CPU support
// matrix with a measured GEMM throughput per precision at the tiny model's
// shape, the GPU it finds measured (doctor_gpu.h: name, compute capability,
// memory, versions, BF16 and FP8 GEMM rates and each recipe's path) or why
// none is usable, the static GPU support matrix as a reference by compute
// capability for GPUs not present, warnings with their fix, and the checks
// that decide the exit status: 0 when the main job can run here; when it
// cannot, one line `snip: error: the main job cannot run here: <reasons>`
// and status 2.
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <cctype>
#include <optional>
#include <sstream>
#include <thread>
#include <unistd.h>
#include <algorithm>

#include "snip/app/doctor.h"
#include "doctor_gpu.h"
#include "snip/data/data_folder.h"
#include "snip/config/config.h"
#include "snip/dist/world.h"
#include "snip/model/device.h"
#include "snip/data/loader.h"
#include "snip/hw/platform.h"
#include "snip/hw/capabilities.h"
#include "snip/model/linear.h"
#include "snip/model/llama.h"
#include "snip/model/blas.h"
#include "snip/model/matmul.h"
#include "snip/model/quantizers.h"
#include "snip/recipes/recipe.h"
#include "snip/train/memory.h"
#include "snip/train/trainer.h"
#include "snip/core/error.h"
#include "snip/io/atomic_file.h"
#include "snip/method/controller.h"
#include "snip/method/gemm_calibrate.h"
#include "snip/plan/cost_table.h"
#include "snip/plan/gemm_times.h"
#include "snip/recipes/recipe_file.h"

namespace snip::app {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The tiny model's MLP GEMM (configs/tiny.toml: B*T = 16*128 tokens, C = 256,
// F = 688): X [M, K] x Wᵀ, W [N, K].
constexpr int64_t kM = 2048, kK = 256, kN = 688;

// Which recipe stands for each GEMM precision in the throughput column, and
// which GEMM of it is timed: fprop (X, W) or dgrad (dY, Wᵀ; fp8_tensor's
// E5M2 is its dY format).
struct Timed {
  hw::GemmPrecision p;
  const char* recipe;  // nullptr: no quantizer
  bool dgrad;
};
const Timed kTimed[] = {
    {hw::GemmPrecision::kFp32, nullptr, false},       {hw::GemmPrecision::kBf16, nullptr, false},
    {hw::GemmPrecision::kFp8E4M3, "fp8", false},      {hw::GemmPrecision::kFp8E5M2, "fp8_tensor", true},
    {hw::GemmPrecision::kFp4E2M1, "fp4", false},      {hw::GemmPrecision::kMxfp8, "mxfp8", false},
    {hw::GemmPrecision::kMxfp4, "mxfp4", false},      {hw::GemmPrecision::kNvfp4, "nvfp4", false},
};

// Seconds per call of f, measured for at least min_s after one warm-up call.
template <class F>
double seconds_per_call(F&& f, double min_s) {
  f();
  using clk = std::chrono::steady_clock;
  const auto t0 = clk::now();
  int64_t n = 0;
  double s = 0;
  do {
    f();
    ++n;
    s = std::chrono::duration<double>(clk::now() - t0).count();
  } while (s < min_s);
  return s / double(n);
}

// GFLOP/s (2*M*K*N / seconds / 1e9) of one GEMM at the tiny model's shape,
// quantization of both operands included (what a training step pays).
double measure_gflops(const Timed& t, double min_s) {
  torch::NoGradGuard ng;
  torch::manual_seed(0);
  const torch::Tensor a = torch::randn({kM, kK}), w = torch::randn({kN, kK}) * 0.05;
  std::shared_ptr<const OperandQuantizer> q = t.recipe ? make_recipe_quantizer(recipes::RecipeSet(), t.recipe) : nullptr;  // built-in
  const Operand oa = t.dgrad ? Operand::kDgradDY : Operand::kFpropX;
  const Operand ob = t.dgrad ? Operand::kDgradW : Operand::kFpropW;
  double s;
  if (t.p == hw::GemmPrecision::kFp32) {
    s = seconds_per_call([&] { return fp32_mm(a, w.t()); }, min_s);  // what snip's layers run
  } else {
    s = seconds_per_call(
        [&] {
          QuantKey k;
          k.operand = oa;
          const torch::Tensor qa = q ? q->quantize(a, k) : a;
          k.operand = ob;
          const torch::Tensor qb = q ? q->quantize(w, k) : w;
          return matmul_in(qa, qb.t(), at::kBFloat16);
        },
        min_s);
  }
  return 2.0 * kM * kK * kN / s / 1e9;
}

// ||got - ref|| / ||ref|| against a float64 product of fixed operands: the
// GEMM paths give right answers here (a broken BLAS or kernel is caught).
double gemm_rel_error(bool bf16) {
  torch::NoGradGuard ng;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  const torch::Tensor a = torch::arange(64 * 1024, f32).mul(0.6180339887).frac().sub(0.5).reshape({64, 1024});
  const torch::Tensor b = torch::arange(1024 * 48, f32).mul(0.7548776662).frac().sub(0.5).reshape({1024, 48});
  const torch::Tensor ra = bf16 ? a.to(torch::kBFloat16).to(torch::kDouble) : a.to(torch::kDouble);
  const torch::Tensor rb = bf16 ? b.to(torch::kBFloat16).to(torch::kDouble) : b.to(torch::kDouble);
  const torch::Tensor ref = torch::mm(ra, rb);
  const torch::Tensor got = bf16 ? matmul_in(a, b, at::kBFloat16) : torch::mm(a, b);
  return (got.to(torch::kDouble) - ref).norm().item<double>() / ref.norm().item<double>();
}

std::string env_or(const char* name, const char* dflt) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string(dflt);
}

// The LibTorch build: version and what it was built with.
json libtorch_info() {
  const std::string cfg = at::show_config();
  auto has = [&](const std::string& s) { return cfg.find(s) != std::string::npos; };
  json j;
  j["version"] = TORCH_VERSION;
  j["cuda_built"] = has("USE_CUDA=ON") || has("USE_CUDA=1");
  j["cuda_available"] = torch::cuda::is_available();
  j["cuda_devices"] = torch::cuda::is_available() ? int(torch::cuda::device_count()) : 0;
#ifdef USE_C10D_GLOO
  j["gloo"] = true;
#else
  j["gloo"] = false;
#endif
#ifdef USE_C10D_NCCL
  j["nccl"] = true;
#else
  j["nccl"] = false;
#endif
#ifdef USE_C10D_MPI
  j["mpi"] = true;
#else
  j["mpi"] = false;
#endif
  j["mkldnn"] = has("USE_MKLDNN=ON") || has("USE_MKLDNN=1");
  j["intra_op_threads"] = at::get_num_threads();
  // The BLAS of LibTorch's FP32 GEMMs (the wheel links MKL statically; the
  // OpenBLAS of the `blas` line is the one CBC's LAPACK loads) and the
  // vector ISA its CPU kernels dispatch to.
  auto field = [&](const std::string& key) {
    const size_t at = cfg.find(key);
    if (at == std::string::npos) return std::string("unknown");
    const size_t b = at + key.size();
    return cfg.substr(b, cfg.find_first_of(", \n", b) - b);
  };
  j["blas"] = field("BLAS_INFO=");
  const size_t mkl = cfg.find("Math Kernel Library Version ");
  j["blas_version"] = mkl == std::string::npos ? "" : cfg.substr(mkl + 28, cfg.find_first_of(" -\n", mkl + 28) - mkl - 28);
  const size_t isa = cfg.find("CPU capability usage: ");
  j["cpu_capability"] = isa == std::string::npos ? "unknown" : cfg.substr(isa + 22, cfg.find('\n', isa) - isa - 22);
  return j;
}


}  // namespace

void run_calibrate(const DoctorOpts& o) {
  if (!o.config_given || o.config.empty()) fail("snip doctor --calibrate: expected --config FILE (the run to calibrate for), got none");
  if (o.run.empty()) fail("snip doctor --calibrate: expected --run RUN (where gemm_times.json goes), got none");
  if (o.repeats < 1) fail("snip doctor --calibrate: --repeats: expected >= 1, got ", o.repeats);
  if (!(o.max_seconds > 0)) fail("snip doctor --calibrate: --max-seconds: expected > 0, got ", o.max_seconds);
  // Before the timing (minutes on a large model): RUN must be a folder, and
  // a run's own table is not replaced (its plans, and a --resume, read it).
  {
    std::error_code ec;
    const fs::path run(o.run);
    if (fs::exists(run, ec) && !fs::is_directory(run, ec))
      fail("snip doctor --calibrate: --run ", o.run, ": expected a folder, got a file");
    if (fs::exists(run / "gemm_times.json", ec))
      fail("snip doctor --calibrate: ", (run / "gemm_times.json").string(),
           " exists (a run's table: its plans and a --resume read it); give another --run or remove the file");
    if (fs::exists(run, ec)) io::ensure_writable_dir(o.run);
  }
  Config c;
  c.load_toml_file(o.config);
  const std::string rf = c.get_string("precision.recipe_file");
  recipes::RecipeSet recipes = recipes::load_recipe_set(rf);
  (void)resolve_precision_alias(c, recipes);
  const RunConfig rc = RunConfig::from(c, std::move(recipes));
  const ModelConfig& m = rc.model;
  const int64_t tokens = rc.train.batch_size * rc.train.seq_len;
  std::vector<LayerShape> shapes;
  int64_t idx = 0;
  for (const plan::LinearLayerShape& l :
       plan::llama_linear_layers(int(m.num_hidden_layers), m.hidden_size, m.intermediate_size,
                                 int(m.num_attention_heads), int(m.num_key_value_heads), tokens))
    shapes.push_back(LayerShape{l.name, idx++, l.in_features, l.out_features});
  const at::ScalarType gemm = rc.train.gemm_bf16 ? at::kBFloat16 : at::kFloat;
  set_threads(rc.train.threads);  // the run's train.threads: GEMM times depend on them
  const torch::Device device = dist::place_rank(rc.dist, rc.train.device, dist::World::from_env()).device;
  set_bf16_gemm_backend(rc.train.gemm_backend, device.is_cuda());
  set_fp8_gemm(parse_fp8_gemm(rc.train.fp8_gemm));
  PrecisionController ctl(rc, shapes, gemm);  // the options a run of this config can choose
  CalibrateOptions co;
  co.options = ctl.known_options();
  co.gemm_dtype = gemm;
  co.device = device;
  co.tokens = tokens;
  co.repeats = o.repeats;
  co.max_seconds = o.max_seconds;
  // Progress on stderr unless -q / --log-level warning (src/cli/run_app.h).
  const bool say = spdlog::should_log(spdlog::level::info);
  co.progress = [say](const std::string& line) {
    if (say) std::fprintf(stderr, "%s\n", line.c_str());
  };
  if (say)
    std::fprintf(stderr, "calibrate: %s on %s: %zu layers, T=%lld rows, options %s\n", o.config.c_str(),
               device.str().c_str(), shapes.size(), (long long)tokens, [&] {
                 std::string s;
                 for (const auto& x : co.options) s += (s.empty() ? "" : ",") + x;
                 return s;
               }().c_str());
  const std::string how = o.calibration.empty() ? rc.precision.calibration : o.calibration;
  plan::GemmTimes t;
  if (how == "in_step") {
    // The run's model as snip train prepares it (its weights random: times do not depend on them).
    // The LM head is never in the table; its size only shapes the step around
    // the GEMMs: model.vocab_size, else the prepared data's, else 32000.
    int64_t vocab = m.vocab_size;
    std::string vocab_from = "model.vocab_size";
    if (vocab <= 0) {
      try {
        vocab = data::verify_data_folder(rc.data.dir, "data.dir").vocab_size;
        vocab_from = "the vocabulary of " + rc.data.dir;
      } catch (const UserError&) {
        vocab = 32000, vocab_from = "32000: model.vocab_size unset and data.dir unreadable";
      }
    }
    const LlamaConfig mc = LlamaConfig::from_run_config(m, vocab);
    // The forward and backward passes need a training step's memory (not the optimizer's, counted anyway).
    if (device.is_cpu())
      check_memory(training_memory(mc, rc.train.batch_size, rc.train.seq_len), hw::available_memory_bytes(),
                   "snip doctor --calibrate");
    torch::manual_seed(rc.train.seed);
    InStepModel whole{LlamaForCausalLM(mc), rc.train.batch_size, rc.train.seq_len, uint64_t(rc.train.seed)};
    (void)prepare_model(whole.model, rc.train, device);
    // monitor.quant_error = false: the run's quantizers record no per-step error, so neither do these.
    if (!rc.monitor.quant_error)
      for (QuantLinear l : whole.model->linear_layers()) l->operand_errors = nullptr;
    if (say)
      std::fprintf(stderr, "calibrate: in training steps of the model (vocabulary %lld, %s), %d timed steps per option\n",
                   (long long)vocab, vocab_from.c_str(), o.repeats);
    t = calibrate_gemm_times_in_step(whole, rc.recipes, co);
  } else {
    t = calibrate_gemm_times(ctl.timed_layers(), rc.recipes, co);
  }
  io::ensure_writable_dir(o.run);
  const std::string path = (fs::path(o.run) / "gemm_times.json").string();
  plan::save_gemm_times(t, path);
  // Totals per option over the model's layers (one micro-batch).
  plan::PlanProblem prob;
  for (const LayerShape& l : shapes) {
    plan::PlanItem it;
    it.name = it.layer = l.name;
    prob.items.push_back(it);
  }
  plan::apply_gemm_times(prob, t, ctl.timed_layers(), tokens, 1.0, co.options);
  std::printf("%s\n", path.c_str());
  double ref = 0;
  for (const auto& it : prob.items) ref += it.seconds.at("bf16");
  for (const std::string& opt : co.options) {
    double s = 0;
    for (const auto& it : prob.items) s += it.seconds.at(opt);
    std::printf("  %-10s %9.3f ms per micro-batch (%.3fx bf16)\n", opt.c_str(), 1e3 * s, ref > 0 ? s / ref : 0.0);
  }
}

void run_doctor(const DoctorOpts& o) {
  if (o.calibrate) return run_calibrate(o);
  // As many intra-op threads as snip train uses (train.threads = 0).
  torch::set_num_threads(int(std::max(1u, std::thread::hardware_concurrency())));
  const bool progress = !o.json_out && isatty(STDERR_FILENO);
  const hw::Capabilities& caps = hw::capabilities();
  json out;
  out["machine"] = hw::to_json(caps);
  out["libtorch"] = libtorch_info();
  out["runtime"] = {{"OMP_WAIT_POLICY", env_or("OMP_WAIT_POLICY", "")},
                    {"OPENBLAS_CORETYPE", env_or("OPENBLAS_CORETYPE", "")},
                    {"OPENBLAS_THREAD_TIMEOUT", env_or("OPENBLAS_THREAD_TIMEOUT", "")},
                    {"SNIP_BF16_GEMM", env_or("SNIP_BF16_GEMM", "")}};
  // Checks: can the main job (or --config's run) run here?
  json checks = json::array();
  std::vector<std::string> failures;
  auto check = [&](const std::string& name, bool ok, const std::string& detail) {
    checks.push_back({{"check", name}, {"ok", ok}, {"detail", detail}});
    if (!ok) failures.push_back(detail.rfind(name + ": ", 0) == 0 ? detail : name + ": " + detail);
  };
  // --config first: its train.gemm_backend decides the BF16 path judged below.
  std::optional<RunConfig> run;
  int64_t run_vocab = 8192;  // the Brown tokenizer's, when model.vocab_size = 0 and no data is readable
  if (o.config_given) {
    try {
      if (o.config.empty()) fail("--config: empty file name");
      Config c;
      c.load_toml_file(o.config);
      run = RunConfig::from(c);
      check("config", true, o.config + " is valid");
      set_bf16_gemm_backend(run->train.gemm_backend);
      try {  // train.device with dist.backend as the trainer resolves them (this process's world: one, or its launcher's)
        check("device", true, dist::place_rank(run->dist, run->train.device, dist::World::from_env()).reason);
      } catch (const std::exception& e) {
        check("device", false, e.what());
      }
      const std::string dir = run->data.dir;
      try {  // the shards as the trainer opens them (header, token range, size)
        for (const char* f : {"train.bin", "val.bin"}) {
          data::TokenLoader l((fs::path(dir) / f).string(), int(run->train.batch_size), int(run->train.seq_len), 0);
          run_vocab = l.vocab_size();
        }
        check("data", true, dir + ": train.bin and val.bin open as the trainer opens them");
      } catch (const std::exception& e) {
        check("data", false, std::string(e.what()) + " (make it with " + data::prepare_hint(dir) + ")");
      }
    } catch (const std::exception& e) {
      const std::string what = e.what();
      // The file named once: most messages name it already ("config: FILE:20: ...").
      check("config", false, what.find(o.config) != std::string::npos || o.config.empty() ? what : o.config + ": " + what);
      run.reset();
    }
  }
  const bool lt_fp32 = libtorch_bf16_gemm_accumulates_fp32();
  const bool native = native_bf16_gemm();
  out["fp32_gemm"] = {{"backend", openblas_fp32_gemm() ? "openblas" : "libtorch"}, {"reason", fp32_gemm_reason()}};
  out["bf16_gemm"] = {{"libtorch_accumulates_fp32", lt_fp32},
                      {"backend", native ? "native" : "emulated"},
                      {"reason", bf16_gemm_reason()}};

  // The CPU matrix, with a measured throughput per row.
  json rows = json::array();
  double bf16_gflops = 0;
  // The rows describe the paths this process runs (a forced native BF16
  // backend is measured and judged as native).
  for (const hw::SupportRow& r : hw::cpu_support(caps.cpu, native)) {
    json row = {{"precision", hw::to_string(r.precision)},
                {"support", hw::to_string(r.support)},
                {"how", r.how},
                {"source", r.source}};
    const recipes::RecipeSet builtin;  // kTimed names built-in recipes
    for (const Timed& t : kTimed) {
      if (t.p != r.precision) continue;
      if (progress) std::cerr << "measuring " << hw::to_string(r.precision) << " GEMM ...\r" << std::flush;
      const double g = measure_gflops(t, o.min_time);
      if (r.precision == hw::GemmPrecision::kBf16) bf16_gflops = g;
      row["gflops"] = g;
      if (t.recipe) {
        // A scale that is not a power of two (FP32 tensor scales: per-tensor
        // FP8, NVFP4's second level) makes code x scale inexact in BF16;
        // snip's recipes multiply it in before the GEMM today, so the BF16
        // GEMM sees one extra rounding that hardware (which scales the FP32
        // output) does not.
        const recipes::Recipe& rc = builtin.find(t.recipe);
        const formats::QuantSpec& sa = rc[t.dgrad ? Operand::kDgradDY : Operand::kFpropX];
        if (sa.rule == formats::ScaleRule::kTwoLevel || sa.rule == formats::ScaleRule::kDelayed ||
            sa.scale_format == formats::ScaleFormat::kFP32)
          row["note"] = std::string("snip's recipe ") + t.recipe +
                        " applies its FP32 tensor scale before the GEMM: one extra rounding to BF16 (not yet bit-exact "
                        "to hardware that scales the output)";
      }
      row["timed"] = t.recipe ? std::string("recipe ") + t.recipe + (t.dgrad ? " (dgrad)" : " (fprop)")
                              : std::string(r.precision == hw::GemmPrecision::kFp32 ? "torch::mm" : "snip BF16 GEMM");
    }
    rows.push_back(row);
  }
  for (json& row : rows)
    if (row.contains("gflops") && bf16_gflops > 0) row["vs_bf16"] = row["gflops"].get<double>() / bf16_gflops;
  out["cpu_support"] = rows;
  out["gemm_shape"] = {{"M", kM}, {"K", kK}, {"N", kN}, {"what", "tiny model MLP fprop, quantization of both operands included"}};

  // The GPU LibTorch sees, measured (doctor_gpu.h); the recipes listed are
  // --config's run's (its recipe file's included) or the built-in ones.
  out["gpu"] = measure_gpu(run ? run->recipes : recipes::RecipeSet(), out["libtorch"]["cuda_built"].get<bool>(),
                           caps.gpus.empty() ? std::string() : caps.gpus[0].driver_version, o.min_time, progress);
  const bool gpu_present = out["gpu"]["present"].get<bool>();

  // The static GPU matrix, a reference by compute capability for GPUs not
  // present (not measured): the usual capabilities, plus those nvidia-smi
  // reports.
  json gpus = json::array();
  auto gpu_rows = [](int ma, int mi) {
    json rs = json::array();
    for (const hw::SupportRow& r : hw::gpu_support(ma, mi))
      rs.push_back({{"precision", hw::to_string(r.precision)}, {"support", hw::to_string(r.support)},
                    {"how", r.how}, {"source", r.source}});
    return rs;
  };
  std::vector<std::pair<int, int>> ref = {{7, 0}, {8, 0}, {8, 9}, {9, 0}, {10, 0}, {12, 0}};
  for (const hw::GpuInfo& g : caps.gpus) ref.emplace_back(g.cc_major, g.cc_minor);
  std::sort(ref.begin(), ref.end());
  ref.erase(std::unique(ref.begin(), ref.end()), ref.end());
  for (auto [ma, mi] : ref)
    gpus.push_back({{"compute_capability", std::to_string(ma) + "." + std::to_string(mi)}, {"rows", gpu_rows(ma, mi)}});
  out["gpu_support"] = gpus;
  out["gpu_support_is_reference"] = true;  // the measured GPU is out["gpu"]

  // Warnings, each with its fix.
  json warnings = json::array(), notes = json::array();
  auto warn = [&](const std::string& what, const std::string& fix) { warnings.push_back({{"warning", what}, {"fix", fix}}); };
  if (!native && !lt_fp32)
    notes.push_back("BF16 GEMMs are emulated: LibTorch's own BF16 kernel accumulates in BF16 on this CPU (no "
                    "AVX512-BF16/AMX path) and is ~100x slower than FP32; snip runs the same numerics as FP32 GEMMs "
                    "on BF16-rounded operands (train.gemm_backend = auto)");
  if (!native && lt_fp32)
    notes.push_back("BF16 GEMMs are emulated: LibTorch's BF16 kernel accumulates in FP32 here but this CPU has no "
                    "BF16 dot products (AVX512_BF16/AMX-BF16), so it widens BF16 in registers and runs several times "
                    "slower than FP32; snip runs the same numerics as FP32 GEMMs on BF16-rounded operands "
                    "(train.gemm_backend = auto; compare the bf16 row with train.gemm_backend = native)");
  notes.push_back(fmt::format("throughput is measured for {} s per row on a machine that may be busy: compare rows of "
                              "one run, and raise --min-time for steadier numbers", o.min_time));
  if (native && !lt_fp32)
    warn(bf16_gemm_reason() + " on a CPU whose LibTorch BF16 kernel accumulates in BF16: inexact (see the bf16_gemm "
         "check) and ~100x slower",
         "use train.gemm_backend = auto (and unset SNIP_BF16_GEMM)");
  // snip sets OPENBLAS_CORETYPE=SkylakeX itself, on AVX-512 CPUs only.
  const std::string coretype = env_or("OPENBLAS_CORETYPE", "");
  const bool user_coretype = !coretype.empty() && !(caps.cpu.avx512f && coretype == "SkylakeX");
  const bool tuning_off = opted_out_of_runtime_tuning();
  if (caps.blas.library != "unknown" && !caps.blas.core_type_recognised)
    warn("OpenBLAS uses kernel set '" + caps.blas.core_type + "', older than this CPU (FP32 GEMMs several times slower)",
         user_coretype ? "unset OPENBLAS_CORETYPE (OpenBLAS then picks its own kernel set" +
                             std::string(caps.cpu.avx512f ? "; snip sets SkylakeX on AVX-512 CPUs)" : ")")
         : caps.cpu.avx512f ? "export OPENBLAS_CORETYPE=SkylakeX (snip sets it when unset)"
                            : "export OPENBLAS_CORETYPE=Haswell");
  std::string wait = env_or("OMP_WAIT_POLICY", "");
  std::transform(wait.begin(), wait.end(), wait.begin(), [](unsigned char ch) { return char(std::toupper(ch)); });
  if (wait == "ACTIVE")
    warn("OMP_WAIT_POLICY=" + env_or("OMP_WAIT_POLICY", "") +
             ": spinning OpenMP threads collapse when the cores are shared (measured 2.6 s vs > 120 s)",
         "unset OMP_WAIT_POLICY (snip uses PASSIVE) unless the cores are yours alone");
  if (caps.blas.threading == "pthreads" && !std::getenv("OPENBLAS_THREAD_TIMEOUT"))
    warn("OpenBLAS workers spin with sched_yield for ~0.1 s after each GEMM, taking cores from LibTorch's threads",
         tuning_off ? "export OPENBLAS_THREAD_TIMEOUT=12 (snip sets it unless SNIP_NO_RUNTIME_TUNE is set)"
                    : "export OPENBLAS_THREAD_TIMEOUT=12 (snip sets it when unset)");
  if (!caps.gpus.empty() && !out["libtorch"]["cuda_built"].get<bool>())
    warn(std::to_string(caps.gpus.size()) + " NVIDIA GPU(s) found, but this LibTorch is built without CUDA: snip trains on the CPU",
         "build snip against a CUDA LibTorch to use them");
  if (!caps.gpus.empty() && out["libtorch"]["cuda_built"].get<bool>() && !gpu_present)
    warn(std::to_string(caps.gpus.size()) + " NVIDIA GPU(s) found by nvidia-smi, but CUDA cannot use them: " +
             out["gpu"]["reason"].get<std::string>(),
         "install an NVIDIA driver new enough for the CUDA 13 runtime (nvidia-smi's \"CUDA Version\" 13.0 or later), "
         "and check CUDA_VISIBLE_DEVICES");
  if (caps.cpu.arch == "x86_64" && !caps.cpu.avx2)
    warn("no AVX2: the fake-quantization kernels run their SSE2 baseline (several times slower)", "use an AVX2 machine");
  for (const std::string& m : caps.cpu.flag_mismatches) warn("ISA flag mismatch: " + m, "none needed: snip uses what the CPU reports via cpuid");
  out["warnings"] = warnings;
  out["notes"] = notes;

  const double e32 = gemm_rel_error(false), e16 = gemm_rel_error(true);
  check("fp32_gemm", e32 < 1e-5, fmt::format("relative error {:.2e} against float64 (bound 1e-5)", e32));
  check("bf16_gemm", e16 < 1.0 / 256, fmt::format("relative error {:.2e} against float64 of BF16 operands (bound 2^-8)", e16));
  const int64_t avail = hw::available_memory_bytes();
  // The estimate for the default configuration (the tiny model's shapes with
  // the Brown tokenizer's 8192 pieces), or for --config's run (its data's
  // vocabulary when model.vocab_size = 0).
  const RunConfig rc = run ? *run : RunConfig::from(Config());
  const int64_t vocab = rc.model.vocab_size > 0 ? rc.model.vocab_size : run_vocab;
  // The estimate `snip train` checks before it allocates (train/memory.h), so
  // the doctor's verdict is the trainer's.
  const double need = training_memory(LlamaConfig::from_run_config(rc.model, vocab), rc.train.batch_size,
                                      rc.train.seq_len)
                          .total();
  const std::string need_what = run ? o.config : "the default model (configs/tiny.toml's shapes)";
  check("memory", avail == 0 || avail >= need,
        fmt::format("{:.2f} GiB available, at least {:.2f} GiB needed by {} (weights, gradients, AdamW and "
                    "activations, train/memory.h; the process adds ~0.3 GiB of libraries and cached blocks)",
                    double(avail) / (1 << 30), need / (1 << 30), need_what));
  out["checks"] = checks;
  out["ok"] = failures.empty();
  // The job judged: the main job (configs/tiny.toml), or --config's run.
  const std::string job = run ? "the run of " + o.config : std::string("the main job");
  out["verdict"] = job + (failures.empty() ? " can run here" : " cannot run here");

  if (o.json_out) {
    std::cout << out.dump(2) << "\n";
  } else {
    if (progress) std::cerr << std::string(40, ' ') << "\r";
    const hw::CpuInfo& cpu = caps.cpu;
    std::cout << "machine\n";
    std::cout << "  cpu        " << cpu.vendor << " " << cpu.model_name << " (" << cpu.arch << "), " << cpu.logical_cpus
              << " logical CPUs, " << cpu.physical_cores << " cores, " << cpu.sockets << " socket(s)\n";
    std::string flags;
    for (const auto& [name, on] : hw::isa_flags(cpu))
      if (on) flags += (flags.empty() ? "" : " ") + name;
    std::cout << "  isa        " << (flags.empty() ? "(none detected)" : flags) << "\n";
    std::cout << fmt::format("  caches     L1d {} KiB x{}, L2 {} KiB x{}, L3 {} MiB x{}\n", cpu.l1d.bytes / 1024,
                             cpu.l1d.instances, cpu.l2.bytes / 1024, cpu.l2.instances, cpu.l3.bytes >> 20, cpu.l3.instances);
    std::cout << "  blas       " << caps.blas.config << " | kernels " << caps.blas.core_type
              << (caps.blas.core_type_recognised ? "" : " (NOT recognised)") << " | " << caps.blas.threading << ", "
              << caps.blas.num_threads << " threads\n";
    const json& lt = out["libtorch"];
    std::cout << "  libtorch   " << lt["version"].get<std::string>() << " | CUDA " << (lt["cuda_built"].get<bool>() ? "built" : "not built")
              << ", " << lt["cuda_devices"].get<int>() << " device(s) | c10d: gloo " << (lt["gloo"].get<bool>() ? "yes" : "no")
              << ", nccl " << (lt["nccl"].get<bool>() ? "yes" : "no") << ", mpi " << (lt["mpi"].get<bool>() ? "yes" : "no")
              << " | " << lt["intra_op_threads"].get<int>() << " intra-op threads | BLAS " << lt["blas"].get<std::string>()
              << (lt["blas_version"].get<std::string>().empty() ? "" : " " + lt["blas_version"].get<std::string>())
              << ", kernels " << lt["cpu_capability"].get<std::string>() << "\n";
    std::cout << "  gpus       " << caps.gpu_probe << "\n";
    std::cout << "  bf16 gemm  " << (native ? "native" : "emulated (FP32 GEMMs on BF16-rounded operands)") << ": "
              << bf16_gemm_reason() << "\n";
    std::cout << "  fp32 gemm  " << (openblas_fp32_gemm() ? "OpenBLAS cblas_sgemm" : "LibTorch (torch::mm)") << ": "
              << fp32_gemm_reason() << "\n\n";
    std::cout << fmt::format("CPU support matrix (GEMM [{}, {}] x [{}, {}], quantization of both operands included)\n", kM, kK, kK, kN);
    std::cout << fmt::format("  {:<9} {:<17} {:>9} {:>8}  {}\n", "precision", "support", "GFLOP/s", "vs bf16", "how");
    for (const json& r : rows)
      std::cout << fmt::format("  {:<9} {:<17} {:>9.1f} {:>7.2f}x  {}{}\n", r["precision"].get<std::string>(),
                               r["support"].get<std::string>(), r.value("gflops", 0.0), r.value("vs_bf16", 0.0),
                               r["how"].get<std::string>(),
                               r.contains("note") ? "\n" + std::string(50, ' ') + "note: " + r["note"].get<std::string>() : "");
    std::cout << "\n";
    print_gpu(out["gpu"], std::cout);
    std::cout << "\nGPU support matrix: reference by compute capability, for GPUs not present (static table, not "
                 "measured"
              << (gpu_present ? "; the GPU here is measured above" : "") << ")\n";
    for (const json& g : gpus) {
      std::cout << "  compute capability " << g["compute_capability"].get<std::string>() << ":";
      for (const json& r : g["rows"]) std::cout << " " << r["precision"].get<std::string>() << "=" << r["support"].get<std::string>();
      std::cout << "\n";
    }
    std::cout << "  sources:\n";
    {
      std::vector<std::string> seen;
      for (const json& g : gpus)
        for (const json& r : g["rows"]) {
          const std::string s = r["source"].get<std::string>();
          if (std::find(seen.begin(), seen.end(), s) == seen.end()) {
            seen.push_back(s);
            std::cout << "    - " << s << "\n";
          }
        }
    }
    std::cout << "\nnotes\n";
    for (const json& n : notes) std::cout << "  - " << n.get<std::string>() << "\n";
    std::cout << "\nwarnings" << (warnings.empty() ? ": none" : "") << "\n";
    for (const json& w : warnings)
      std::cout << "  - " << w["warning"].get<std::string>() << "\n    fix: " << w["fix"].get<std::string>() << "\n";
    std::cout << "\nchecks\n";
    for (const json& c : checks)
      std::cout << "  " << (c["ok"].get<bool>() ? "ok  " : "FAIL") << " " << c["check"].get<std::string>() << ": "
                << c["detail"].get<std::string>() << "\n";
    std::cout << "\n" << out["verdict"].get<std::string>() << "\n";
  }
  if (!failures.empty()) {
    std::string why;
    for (const std::string& f : failures) why += (why.empty() ? "" : "; ") + f;
    throw UserError(job + " cannot run here: " + why);
  }
}


}  // namespace snip::app
