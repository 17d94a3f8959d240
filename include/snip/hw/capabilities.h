// snip/hw/capabilities.h: the machine's capabilities, detected once, as one
// record (CPU, the BLAS loaded in this process, NVIDIA GPUs), and the support
// matrix: which GEMM precisions the hardware runs natively, which snip
// emulates exactly, which it cannot run.
//
// Detection reads the machine (/proc/cpuinfo, /sys/devices/system/cpu,
// dlsym for OpenBLAS, `nvidia-smi`); parsing and the support matrix are pure
// functions of their arguments, so tests feed fixture text and any compute
// capability. Everything in this header is plain C++17 + POSIX (no LibTorch);
// whether LibTorch's BF16 GEMM accumulates in FP32 is decided on the LibTorch
// side (snip::native_bf16_gemm(), snip/model/matmul.h) and passed in.
//
// Units: sizes in bytes everywhere (sysfs "48K" = 48 * 1024, nvidia-smi MiB
// = 1024 * 1024). Unknown strings are "unknown", unknown counts 0.
//
// Support levels (Support):
//   native            the hardware has a matrix instruction taking these
//                     operands (for CPU BF16: LibTorch runs the BF16 GEMM
//                     itself with FP32 accumulation).
//   emulated exactly  the operands' values are exact in BF16 (or FP32), so a
//                     BF16 GEMM with FP32 accumulation (an FP32 GEMM for CPU
//                     BF16) of the fake-quantized operands gives the products
//                     exactly (BF16 x BF16 is exact in FP32); the sum equals
//                     a native unit's up to summation order and accumulator
//                     width (Hopper's FP8 tensor cores accumulate in fewer
//                     than 32 bits). Scales must be powers of two or applied
//                     to the FP32 output for this to hold (each row's `how`
//                     says which); values outside BF16's range (below 2^-133)
//                     are not exact.
//   none              no hardware path, and snip does not emulate there
//                     (its GPU emulation runs BF16 GEMMs, which need sm_80).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace snip::hw {

// ---------------------------------------------------------------------------
// CPU
// ---------------------------------------------------------------------------

/// One level of the cache hierarchy: the size of one instance and how many
/// instances the machine has (an instance = one set of CPUs sharing it, one
/// distinct sysfs shared_cpu_list). Both 0 when sysfs does not say.
struct CacheLevel {
  std::int64_t bytes = 0;  ///< bytes per instance (the largest, if instances differ, as on hybrid CPUs)
  int instances = 0;       ///< instances in the machine (e.g. one L2 per core, one L3 per socket or CCX)
};

/// The CPU: identity, topology, the ISA extensions that matter for GEMMs, and
/// the data caches. Sources: /proc/cpuinfo ("vendor_id", "model name",
/// "flags" on x86; "CPU implementer", "CPU part", "Features" on aarch64),
/// /sys/devices/system/cpu/cpu*/topology/{core_id,physical_package_id} and
/// /sys/devices/system/cpu/cpu*/cache/index*/{level,type,size,shared_cpu_list}.
/// Flag names are Linux's /proc/cpuinfo names; x86 flags are all false on
/// aarch64 and aarch64 flags all false on x86.
struct CpuInfo {
  std::string arch = "unknown";        ///< "x86_64" (cpuinfo has vendor_id), "aarch64" (CPU implementer / Features) or "unknown"
  std::string vendor = "unknown";      ///< x86: vendor_id ("GenuineIntel", "AuthenticAMD"); aarch64: implementer ("ARM", "NVIDIA", ...)
  std::string model_name = "unknown";  ///< x86: "model name"; aarch64: the core ("Neoverse-V1") or "CPU part 0x..."
  int logical_cpus = 0;                ///< online logical CPUs ("processor" entries in /proc/cpuinfo)
  int physical_cores = 0;              ///< distinct (package, core) pairs; 0 = unknown
  int sockets = 0;                     ///< distinct packages; 0 = unknown
  int threads_per_core = 0;            ///< most logical CPUs on one core (2 with SMT); 0 = unknown

  // x86 ISA extensions (/proc/cpuinfo "flags"). After detect(), a flag GCC's
  // __builtin_cpu_supports knows is the builtin's value (cpuid + OS state):
  // what this process can execute. Disagreements go to flag_mismatches.
  bool sse4_2 = false;
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_bf16 = false;  ///< VDPBF16PS: BF16 dot products, FP32 accumulation (Cooper Lake, Sapphire Rapids, Zen 4)
  bool avx512_fp16 = false;
  bool avx512_vnni = false;
  bool amx_tile = false;
  bool amx_bf16 = false;     ///< TDPBF16PS: BF16 tile matrix multiply, FP32 accumulation (Sapphire Rapids)
  bool amx_int8 = false;

  // aarch64 ISA extensions (/proc/cpuinfo "Features").
  bool neon = false;      ///< "asimd"
  bool sve = false;       ///< "sve"
  bool sve2 = false;      ///< "sve2"
  bool arm_bf16 = false;  ///< "bf16" (FEAT_BF16: BFDOT, BFMMLA)
  bool arm_i8mm = false;  ///< "i8mm" (FEAT_I8MM: SMMLA)

  CacheLevel l1d;  ///< level 1, type Data
  CacheLevel l2;   ///< level 2, Unified (or Data)
  CacheLevel l3;   ///< level 3, Unified (or Data)

  /// detect() only: one line per x86 flag where /proc/cpuinfo and
  /// __builtin_cpu_supports disagree, e.g. "avx512f: /proc/cpuinfo no,
  /// __builtin_cpu_supports yes (using yes)". Empty when they agree.
  std::vector<std::string> flag_mismatches;
};

/// The ISA flags of `cpu` as (name, value) pairs in the struct's order, names
/// as the fields are spelled ("avx512_bf16", "arm_i8mm"). For printing and
/// to_json.
std::vector<std::pair<std::string, bool>> isa_flags(const CpuInfo& cpu);

/// Parses the CPU from the text of /proc/cpuinfo and a directory laid out as
/// /sys/devices/system/cpu (cpuN/topology/..., cpuN/cache/indexM/...).
/// Sizes like "48K", "2048K", "105M", "1G" or plain bytes. Missing or
/// malformed files leave their fields at 0 / "unknown" (a container may hide
/// sysfs); never throws except std::bad_alloc. Topology falls back to the
/// "physical id" / "core id" lines of cpuinfo when sysfs has none. Does not
/// consult __builtin_cpu_supports (detect() does).
CpuInfo parse_cpu(const std::string& cpuinfo_text, const std::string& sys_cpu_dir);

// ---------------------------------------------------------------------------
// BLAS
// ---------------------------------------------------------------------------

/// The BLAS library loaded in this process, as OpenBLAS reports itself
/// (openblas_get_config, openblas_get_corename, openblas_get_parallel,
/// openblas_get_num_threads). All "unknown" / 0 / false when no OpenBLAS is
/// loaded (a LibTorch-free program; a LibTorch that links MKL statically).
struct BlasInfo {
  std::string library = "unknown";    ///< "OpenBLAS" or "unknown"
  std::string version = "unknown";    ///< "0.3.21" (the second word of the config string)
  std::string config = "unknown";     ///< openblas_get_config(): "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64"
  std::string core_type = "unknown";  ///< openblas_get_corename(): the kernel set in use ("Haswell", "SkylakeX", "Zen", "Prescott")
  std::string threading = "unknown";  ///< openblas_get_parallel(): 0 "sequential", 1 "pthreads", 2 "openmp"
  int num_threads = 0;                ///< openblas_get_num_threads()
  /// False when the kernel set is older than the CPU's widest vector ISA or
  /// a generic fallback (see blas_core_type_recognised): OpenBLAS 0.3.21
  /// does not know Sapphire Rapids and picks a generic kernel, FP32 GEMM
  /// 12-17 GFLOP/s instead of ~90 (snip sets OPENBLAS_CORETYPE=SkylakeX,
  /// snip/hw/platform.h). False when no OpenBLAS is loaded.
  bool core_type_recognised = false;
};

/// Whether OpenBLAS's kernel set `core_type` (case-insensitive) suits `cpu`:
/// false for generic fallbacks ("", "unknown", "generic", "ARMV8") and for a
/// kernel set below the CPU's widest vector ISA (x86 tiers: SSE-era names
/// such as "Prescott", "Core2", "Nehalem" < AVX "Sandybridge", "Bulldozer",
/// "Piledriver" < AVX2 "Haswell", "Zen", "Steamroller", "Excavator" <
/// AVX-512 "SkylakeX", "Cooperlake", "SapphireRapids"; aarch64: an SVE CPU
/// needs an SVE kernel set "NeoverseV1", "NeoverseN2", "NeoverseV2",
/// "A64FX"). Names OpenBLAS may add later count as recognised. Pure.
bool blas_core_type_recognised(const std::string& core_type, const CpuInfo& cpu);

/// A BlasInfo from OpenBLAS's answers (config string, corename, parallel
/// mode 0/1/2, thread count) for `cpu`. Pure; detect() calls it with the
/// loaded library's answers. An unexpected parallel value gives threading
/// "unknown (N)".
BlasInfo blas_info_from_openblas(const std::string& config, const std::string& core_type,
                                 int parallel, int num_threads, const CpuInfo& cpu);

/// The OpenBLAS loaded in this process now, found with dlsym(RTLD_DEFAULT)
/// (libraries linked at build time, or dlopen'ed with RTLD_GLOBAL; not one
/// dlopen'ed RTLD_LOCAL). A default BlasInfo when the symbols are absent.
/// Never throws except std::bad_alloc.
BlasInfo detect_blas(const CpuInfo& cpu);

// ---------------------------------------------------------------------------
// GPUs
// ---------------------------------------------------------------------------

/// One NVIDIA GPU as nvidia-smi reports it.
struct GpuInfo {
  int index = 0;                          ///< nvidia-smi's index (not necessarily the CUDA ordinal)
  std::string name;                       ///< "NVIDIA H200"
  int cc_major = 0;                       ///< compute capability, e.g. 9 for 9.0 (Hopper)
  int cc_minor = 0;                       ///< e.g. 0 for 9.0
  std::int64_t memory_bytes = 0;          ///< total memory, bytes (nvidia-smi memory.total MiB * 1024 * 1024)
  std::string driver_version;             ///< "565.57.01"
};

/// Parses the output of `nvidia-smi --query-gpu=index,name,compute_cap,
/// memory.total,driver_version --format=csv,noheader,nounits`: one GPU per
/// non-blank line, "0, NVIDIA H200, 9.0, 143771, 565.57.01" (fields trimmed;
/// a name containing commas is rejoined from the middle fields). Throws
/// std::runtime_error "nvidia-smi output line N ("<line>"): expected ...,
/// got ..." for a line with fewer than 5 fields or a field that is not a
/// number where one is expected (e.g. "[N/A]"). Empty text: no GPUs.
std::vector<GpuInfo> parse_nvidia_smi_csv(const std::string& csv);

// ---------------------------------------------------------------------------
// The record
// ---------------------------------------------------------------------------

/// Everything detect() finds.
struct Capabilities {
  CpuInfo cpu;
  BlasInfo blas;
  std::vector<GpuInfo> gpus;
  /// What the GPU probe found: "nvidia-smi not on PATH", "0 GPUs", "1 GPU",
  /// "2 GPUs", or why it failed ("nvidia-smi failed (exit 9): NVIDIA-SMI has
  /// failed because ...", "nvidia-smi timed out after 20 s", a parse error).
  std::string gpu_probe;
};

/// Reads the machine now: parse_cpu on /proc/cpuinfo and
/// /sys/devices/system/cpu, x86 flags cross-checked with
/// __builtin_cpu_supports (the builtin wins where GCC knows the name),
/// detect_blas, and `nvidia-smi` (run through popen, under coreutils
/// `timeout 20` when that is on PATH, only if an executable nvidia-smi is
/// found on PATH). Under 10 ms without nvidia-smi (a 2-CPU machine); with
/// it, as long as nvidia-smi takes (can be seconds when the driver is not in
/// persistence mode). Never throws except std::bad_alloc: GPU failures go to
/// gpu_probe.
Capabilities detect();

/// The machine's capabilities, detected once per process (on the first call;
/// thread-safe) and kept. The BLAS part is what was loaded at that moment.
const Capabilities& capabilities();

/// The record as JSON, snake_case keys, sizes in bytes:
///   {"cpu": {"arch", "vendor", "model_name", "logical_cpus", "physical_cores",
///            "sockets", "threads_per_core",
///            "flags": {"sse4_2": bool, ..., "arm_i8mm": bool},
///            "cache": {"l1d": {"bytes", "instances"}, "l2": {...}, "l3": {...}},
///            "flag_mismatches": [string]},
///    "blas": {"library", "version", "config", "core_type",
///             "core_type_recognised", "threading", "num_threads"},
///    "gpus": [{"index", "name", "cc_major", "cc_minor", "memory_bytes",
///              "driver_version"}],
///    "gpu_probe": string}
nlohmann::json to_json(const Capabilities& caps);

// ---------------------------------------------------------------------------
// The support matrix (pure: no detection inside)
// ---------------------------------------------------------------------------

/// How a machine runs a GEMM precision (the header comment defines each).
/// kEmulatedRounded: emulated, but the path rounds the operands (NVFP4 on
/// the CPU: the FP32 tensor scale is multiplied into the operands before the
/// BF16 cast; tests/python/test_doctor_emulation.py checks both labels).
enum class Support { kNative, kEmulated, kEmulatedRounded, kNone };

/// "native", "emulated exactly", "emulated, operands rounded", "none".
const char* to_string(Support s);

/// The operand precisions of a GEMM. Element formats (FP8, FP4 E2M1) apart
/// from block-scaled schemes around them (MXFP8 = E4M3 x E8M0 per 32, MXFP4 =
/// E2M1 x E8M0 per 32, NVFP4 = E2M1 x E4M3 per 16 x FP32 per tensor).
enum class GemmPrecision { kFp32, kBf16, kFp8E4M3, kFp8E5M2, kFp4E2M1, kMxfp8, kMxfp4, kNvfp4 };

/// Every GemmPrecision, in the order the support functions list them.
inline constexpr std::array<GemmPrecision, 8> kAllGemmPrecisions = {
    GemmPrecision::kFp32,    GemmPrecision::kBf16,  GemmPrecision::kFp8E4M3, GemmPrecision::kFp8E5M2,
    GemmPrecision::kFp4E2M1, GemmPrecision::kMxfp8, GemmPrecision::kMxfp4,   GemmPrecision::kNvfp4};

/// "fp32", "bf16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "mxfp8", "mxfp4", "nvfp4".
const char* to_string(GemmPrecision p);

/// One row of the support matrix.
struct SupportRow {
  GemmPrecision precision = GemmPrecision::kFp32;
  Support support = Support::kNone;
  std::string how;     ///< the mechanism, one line ("BF16 GEMM with FP32 accumulation (oneDNN)")
  std::string source;  ///< the document it rests on, short ("PTX ISA: mma.sync .bf16 (sm_80+)")
};

/// The CPU's support matrix, one row per kAllGemmPrecisions entry, in order.
/// FP32: native (BLAS SGEMM). BF16: native when
/// `libtorch_bf16_gemm_accumulates_fp32` (pass snip::native_bf16_gemm(): on
/// LibTorch 1.13 true where oneDNN takes BF16 GEMMs, AVX512-BW/VL/DQ and up,
/// AMX-BF16 / AVX512_BF16 being the native dot products), else emulated
/// exactly (BF16-rounded operands, FP32 GEMM, result rounded to BF16). FP8,
/// FP4, MX, NVFP4: emulated exactly on every CPU; snip uses no CPU FP8/FP4
/// instruction (x86 AMX-FP8 and Arm FEAT_FP8 are neither detected nor used).
/// Pure.
std::vector<SupportRow> cpu_support(const CpuInfo& cpu, bool libtorch_bf16_gemm_accumulates_fp32);

/// An NVIDIA GPU's support matrix for compute capability
/// `cc_major`.`cc_minor`, one row per kAllGemmPrecisions entry, in order:
///   FP32          native everywhere (FP32 FMA; TF32 tensor cores only if enabled)
///   BF16          native from 8.0 (Ampere); none below
///   FP8 E4M3/E5M2 native from 8.9 (Ada) and 9.0 (Hopper); emulated exactly
///                 on 8.0-8.8 (A100 has no FP8 units: fake-quantized
///                 operands, BF16 GEMM); none below 8.0
///   FP4 E2M1, MXFP8, MXFP4, NVFP4
///                 native from 10.0 (Blackwell: 10.x datacenter, 11.0 Thor,
///                 12.x consumer and workstation); emulated exactly on
///                 8.0-9.x; none below 8.0
/// Pure; any cc (a future major counts as having everything 10.0 has).
std::vector<SupportRow> gpu_support(int cc_major, int cc_minor);

}  // namespace snip::hw
