// The machine's capabilities and the GEMM support matrix (see capabilities.h).
#include "snip/hw/capabilities.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace snip::hw {
namespace {

namespace fs = std::filesystem;

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

/// The whole file, or false when it cannot be read.
bool read_text(const fs::path& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

/// A decimal integer ("0", "-1", surrounding spaces allowed), or false.
bool parse_long(const std::string& s, long* out) {
  const std::string t = trim(s);
  if (t.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(t.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

/// An integer in a sysfs file ("0\n", "-1\n"), or false.
bool read_int(const fs::path& path, long* out) {
  std::string text;
  return read_text(path, &text) && parse_long(text, out);
}

/// A sysfs cache size: "48K" (KiB), "105M" (MiB), "1G" (GiB) or plain bytes;
/// -1 when malformed.
std::int64_t parse_size(const std::string& text) {
  const std::string t = trim(text);
  size_t i = 0;
  while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i;
  if (i == 0 || i > 15) return -1;
  std::int64_t v = std::stoll(t.substr(0, i));
  const std::string unit = t.substr(i);
  if (unit.empty()) return v;
  if (unit.size() != 1) return -1;
  switch (std::toupper(static_cast<unsigned char>(unit[0]))) {
    case 'K': return v << 10;
    case 'M': return v << 20;
    case 'G': return v << 30;
    default: return -1;
  }
}

/// Directories named cpu<digits> under `dir` (none when it cannot be listed).
std::vector<fs::path> cpu_dirs(const std::string& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 3 && name.compare(0, 3, "cpu") == 0 &&
        std::all_of(name.begin() + 3, name.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool has_word(const std::set<std::string>& words, const char* w) { return words.count(w) > 0; }

// Arm implementer and part codes: Linux arch/arm64/include/asm/cputype.h.
std::string arm_implementer_name(unsigned long code) {
  switch (code) {
    case 0x41: return "ARM";
    case 0x42: return "Broadcom";
    case 0x43: return "Cavium";
    case 0x46: return "Fujitsu";
    case 0x48: return "HiSilicon";
    case 0x4e: return "NVIDIA";
    case 0x50: return "APM";
    case 0x51: return "Qualcomm";
    case 0x53: return "Samsung";
    case 0x61: return "Apple";
    case 0x6d: return "Microsoft";
    case 0xc0: return "Ampere";
    default: {
      char buf[48];
      std::snprintf(buf, sizeof buf, "implementer 0x%02lx", code);
      return buf;
    }
  }
}

std::string arm_part_name(unsigned long implementer, unsigned long part) {
  if (implementer == 0x41) {
    switch (part) {
      case 0xd03: return "Cortex-A53";
      case 0xd07: return "Cortex-A57";
      case 0xd08: return "Cortex-A72";
      case 0xd0b: return "Cortex-A76";
      case 0xd0c: return "Neoverse-N1";
      case 0xd40: return "Neoverse-V1";
      case 0xd49: return "Neoverse-N2";
      case 0xd4f: return "Neoverse-V2";
      case 0xd84: return "Neoverse-V3";
      case 0xd8e: return "Neoverse-N3";
      default: break;
    }
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "CPU part 0x%03lx", part);
  return buf;
}

bool parse_hex(const std::string& s, unsigned long* out) {
  const std::string t = trim(s);
  if (t.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long v = std::strtoul(t.c_str(), &end, 0);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

/// Counts from a set of (package, core) -> logical CPU count.
void set_topology(const std::map<std::pair<long, long>, int>& cores, CpuInfo* cpu) {
  if (cores.empty()) return;
  std::set<long> packages;
  int most = 0;
  for (const auto& [key, n] : cores) {
    packages.insert(key.first);
    most = std::max(most, n);
  }
  cpu->physical_cores = static_cast<int>(cores.size());
  cpu->sockets = static_cast<int>(packages.size());
  cpu->threads_per_core = most;
}

// The x86 vector-ISA tier of a CPU and of an OpenBLAS kernel set (OpenBLAS
// driver/others/dynamic.c corename[] and its TARGET list), see
// blas_core_type_recognised.
int cpu_x86_tier(const CpuInfo& c) {
  if (c.avx512f) return 3;
  if (c.avx2 && c.fma) return 2;
  if (c.avx) return 1;
  return 0;
}

/// -1 = not a known x86 kernel set.
int openblas_x86_tier(const std::string& core) {
  static const std::map<std::string, int> kTier = {
      {"katmai", 0},       {"coppermine", 0}, {"northwood", 0},  {"prescott", 0},     {"banias", 0},
      {"atom", 0},         {"core2", 0},      {"penryn", 0},     {"dunnington", 0},   {"nehalem", 0},
      {"athlon", 0},       {"opteron", 0},    {"opteron_sse3", 0}, {"barcelona", 0},  {"nano", 0},
      {"bobcat", 0},       {"sandybridge", 1}, {"bulldozer", 1}, {"piledriver", 1},   {"steamroller", 1},
      {"haswell", 2},      {"zen", 2},        {"excavator", 2},  {"skylakex", 3},     {"cooperlake", 3},
      {"sapphirerapids", 3}};
  const auto it = kTier.find(core);
  return it == kTier.end() ? -1 : it->second;
}

std::string plural_gpus(size_t n) { return std::to_string(n) + (n == 1 ? " GPU" : " GPUs"); }

/// An executable regular file named `name` in a PATH directory, or "".
std::string find_on_path(const char* name) {
  const char* path = std::getenv("PATH");
  if (!path) return "";
  std::string all(path);
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(':', start);
    if (end == std::string::npos) end = all.size();
    std::string dir = all.substr(start, end - start);
    if (dir.empty()) dir = ".";  // POSIX: an empty PATH entry is the current directory
    const std::string candidate = dir + "/" + name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    start = end + 1;
  }
  return "";
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string first_line(const std::string& text) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    line = trim(line);
    if (!line.empty()) return line.size() > 200 ? line.substr(0, 200) + "..." : line;
  }
  return "(no output)";
}

constexpr int kNvidiaSmiTimeoutS = 20;

/// Runs nvidia-smi if it is on PATH; fills gpus and probe.
void probe_gpus(std::vector<GpuInfo>* gpus, std::string* probe) {
  const std::string smi = find_on_path("nvidia-smi");
  if (smi.empty()) {
    *probe = "nvidia-smi not on PATH";
    return;
  }
  std::string cmd;
  const std::string timeout = find_on_path("timeout");
  if (!timeout.empty()) cmd = shell_quote(timeout) + " " + std::to_string(kNvidiaSmiTimeoutS) + " ";
  cmd += shell_quote(smi) +
         " --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv,noheader,nounits 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) {
    *probe = std::string("cannot run nvidia-smi: ") + std::strerror(errno);
    return;
  }
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = ::pclose(pipe);
  if (status == -1) {
    *probe = std::string("nvidia-smi: pclose failed: ") + std::strerror(errno);
    return;
  }
  if (!WIFEXITED(status)) {
    *probe = "nvidia-smi killed by signal " + std::to_string(WTERMSIG(status));
    return;
  }
  const int code = WEXITSTATUS(status);
  if (code == 124 && !timeout.empty()) {
    *probe = "nvidia-smi timed out after " + std::to_string(kNvidiaSmiTimeoutS) + " s";
    return;
  }
  if (code != 0) {
    *probe = "nvidia-smi failed (exit " + std::to_string(code) + "): " + first_line(out);
    return;
  }
  try {
    *gpus = parse_nvidia_smi_csv(out);
    *probe = plural_gpus(gpus->size());
  } catch (const std::runtime_error& e) {
    gpus->clear();
    *probe = e.what();
  }
}

/// Overrides the cpuinfo flags with __builtin_cpu_supports (cpuid + OS
/// state) where GCC knows the name, recording disagreements.
void cross_check_x86_flags(CpuInfo* cpu) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  auto check = [cpu](const char* name, bool CpuInfo::*field, bool builtin) {
    bool& value = cpu->*field;
    if (value != builtin) {
      cpu->flag_mismatches.push_back(std::string(name) + ": /proc/cpuinfo " + (value ? "yes" : "no") +
                                     ", __builtin_cpu_supports " + (builtin ? "yes" : "no") + " (using " +
                                     (builtin ? "yes" : "no") + ")");
      value = builtin;
    }
  };
  // The names every GCC >= 8 and clang >= 14 know.
  check("sse4_2", &CpuInfo::sse4_2, __builtin_cpu_supports("sse4.2"));
  check("avx", &CpuInfo::avx, __builtin_cpu_supports("avx"));
  check("avx2", &CpuInfo::avx2, __builtin_cpu_supports("avx2"));
  check("fma", &CpuInfo::fma, __builtin_cpu_supports("fma"));
  check("avx512f", &CpuInfo::avx512f, __builtin_cpu_supports("avx512f"));
  check("avx512bw", &CpuInfo::avx512bw, __builtin_cpu_supports("avx512bw"));
  check("avx512vl", &CpuInfo::avx512vl, __builtin_cpu_supports("avx512vl"));
  check("avx512dq", &CpuInfo::avx512dq, __builtin_cpu_supports("avx512dq"));
  check("avx512_vnni", &CpuInfo::avx512_vnni, __builtin_cpu_supports("avx512vnni"));
#if !defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 12
  // Added to GCC's list later (GCC 12 has all of them; clang 14 lacks most).
  check("f16c", &CpuInfo::f16c, __builtin_cpu_supports("f16c"));
  check("avx512_bf16", &CpuInfo::avx512_bf16, __builtin_cpu_supports("avx512bf16"));
  check("avx512_fp16", &CpuInfo::avx512_fp16, __builtin_cpu_supports("avx512fp16"));
  check("amx_tile", &CpuInfo::amx_tile, __builtin_cpu_supports("amx-tile"));
  check("amx_bf16", &CpuInfo::amx_bf16, __builtin_cpu_supports("amx-bf16"));
  check("amx_int8", &CpuInfo::amx_int8, __builtin_cpu_supports("amx-int8"));
#endif
#else
  (void)cpu;
#endif
}

// --- support-matrix text -----------------------------------------------------

constexpr const char* kSrcOfp8 = "OCP 8-bit Floating Point Specification (OFP8) rev 1.0";
constexpr const char* kSrcE2m1 = "OCP Microscaling Formats (MX) v1.0 §5.3 (E2M1)";
constexpr const char* kSrcMx = "OCP Microscaling Formats (MX) v1.0 §5";
constexpr const char* kSrcNvfp4 = "NVIDIA NVFP4 (Blackwell) E2M1 + E4M3 block scale, 16-element blocks";

/// How a format is emulated exactly with a BF16 GEMM (FP32 accumulation).
std::string emulated_how(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::kFp8E4M3:
    case GemmPrecision::kFp8E5M2:
      return "FP8 codes are exact in BF16: fake-quantized operands, BF16 GEMM with FP32 accumulation "
             "(exact when the tensor scale is a power of two or applied to the FP32 output)";
    case GemmPrecision::kFp4E2M1:
      return "E2M1 codes are exact in BF16: fake-quantized operands, BF16 GEMM with FP32 accumulation "
             "(exact when the scale is a power of two or applied to the FP32 output)";
    case GemmPrecision::kMxfp8:
    case GemmPrecision::kMxfp4:
      return "codes x E8M0 (power-of-two) scale are exact in BF16: fake-quantized operands, BF16 GEMM "
             "with FP32 accumulation";
    case GemmPrecision::kNvfp4:
      return "E2M1 code x E4M3 block scale is exact in BF16: fake-quantized operands, BF16 GEMM with "
             "FP32 accumulation (exact when the FP32 tensor scale is applied to the output)";
    default:
      return "";
  }
}

std::string format_source(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::kFp8E4M3:
    case GemmPrecision::kFp8E5M2: return kSrcOfp8;
    case GemmPrecision::kFp4E2M1: return kSrcE2m1;
    case GemmPrecision::kMxfp8:
    case GemmPrecision::kMxfp4: return kSrcMx;
    case GemmPrecision::kNvfp4: return kSrcNvfp4;
    default: return "";
  }
}

/// The PTX ISA instruction kind a Blackwell tensor core takes `p` with.
std::string blackwell_ptx(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::kFp4E2M1: return "PTX ISA: tcgen05.mma / mma.sync .kind::f8f6f4 (sm_100a, sm_120a)";
    case GemmPrecision::kMxfp8:
      return "PTX ISA: tcgen05.mma / mma.sync .kind::mxf8f6f4 .block_scale (sm_100a, sm_120a); " +
             std::string(kSrcMx);
    case GemmPrecision::kMxfp4:
      return "PTX ISA: tcgen05.mma / mma.sync .kind::mxf4 .block_scale (sm_100a, sm_120a); " + std::string(kSrcMx);
    case GemmPrecision::kNvfp4:
      return "PTX ISA: tcgen05.mma / mma.sync .kind::mxf4nvf4 .block_scale.scale_vec::4X (sm_100a, sm_120a); " +
             std::string(kSrcNvfp4);
    default: return "";
  }
}

}  // namespace

// --- CPU ----------------------------------------------------------------------

namespace {

// The ISA flags, in the record's order: the record's (and JSON's) name, the
// word /proc/cpuinfo lists ("flags" on x86, "Features" on aarch64), the field.
struct IsaFlag {
  const char* name;
  const char* cpuinfo_word;
  bool CpuInfo::*field;
  bool x86;
};
const IsaFlag kIsaFlags[] = {
    {"sse4_2", "sse4_2", &CpuInfo::sse4_2, true},
    {"avx", "avx", &CpuInfo::avx, true},
    {"avx2", "avx2", &CpuInfo::avx2, true},
    {"fma", "fma", &CpuInfo::fma, true},
    {"f16c", "f16c", &CpuInfo::f16c, true},
    {"avx512f", "avx512f", &CpuInfo::avx512f, true},
    {"avx512bw", "avx512bw", &CpuInfo::avx512bw, true},
    {"avx512vl", "avx512vl", &CpuInfo::avx512vl, true},
    {"avx512dq", "avx512dq", &CpuInfo::avx512dq, true},
    {"avx512_bf16", "avx512_bf16", &CpuInfo::avx512_bf16, true},
    {"avx512_fp16", "avx512_fp16", &CpuInfo::avx512_fp16, true},
    {"avx512_vnni", "avx512_vnni", &CpuInfo::avx512_vnni, true},
    {"amx_tile", "amx_tile", &CpuInfo::amx_tile, true},
    {"amx_bf16", "amx_bf16", &CpuInfo::amx_bf16, true},
    {"amx_int8", "amx_int8", &CpuInfo::amx_int8, true},
    {"neon", "asimd", &CpuInfo::neon, false},
    {"sve", "sve", &CpuInfo::sve, false},
    {"sve2", "sve2", &CpuInfo::sve2, false},
    {"arm_bf16", "bf16", &CpuInfo::arm_bf16, false},
    {"arm_i8mm", "i8mm", &CpuInfo::arm_i8mm, false},
};

// Sets the flags of one architecture from its cpuinfo word list.
void set_isa_flags(CpuInfo& cpu, const std::string& words, bool x86) {
  const auto w = split_words(words);
  const std::set<std::string> f(w.begin(), w.end());
  for (const IsaFlag& g : kIsaFlags)
    if (g.x86 == x86) cpu.*g.field = has_word(f, g.cpuinfo_word);
}

}  // namespace

std::vector<std::pair<std::string, bool>> isa_flags(const CpuInfo& c) {
  std::vector<std::pair<std::string, bool>> out;
  for (const IsaFlag& g : kIsaFlags) out.emplace_back(g.name, c.*g.field);
  return out;
}

CpuInfo parse_cpu(const std::string& cpuinfo_text, const std::string& sys_cpu_dir) {
  CpuInfo cpu;

  // /proc/cpuinfo: "key<tabs>: value" lines, one block per logical CPU. The
  // identity and flags come from the first block that has them.
  std::string vendor_id, model_name, flags, features, implementer, part;
  bool has_flags = false, has_features = false;
  int processors = 0;
  long physical_id = -1, core_id = -1;
  std::map<std::pair<long, long>, int> cpuinfo_cores;
  auto end_block = [&] {
    if (physical_id >= 0 && core_id >= 0) ++cpuinfo_cores[{physical_id, core_id}];
    physical_id = core_id = -1;
  };
  std::istringstream in(cpuinfo_text);
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) {
      if (trim(line).empty()) end_block();
      continue;
    }
    const std::string key = trim(line.substr(0, colon));
    const std::string value = trim(line.substr(colon + 1));
    if (key == "processor") {
      end_block();
      ++processors;
    } else if (key == "vendor_id" && vendor_id.empty()) {
      vendor_id = value;
    } else if (key == "model name" && model_name.empty()) {
      model_name = value;
    } else if (key == "flags" && !has_flags) {
      flags = value;
      has_flags = true;
    } else if (key == "Features" && !has_features) {
      features = value;
      has_features = true;
    } else if (key == "CPU implementer" && implementer.empty()) {
      implementer = value;
    } else if (key == "CPU part" && part.empty()) {
      part = value;
    } else if (key == "physical id") {
      parse_long(value, &physical_id);
    } else if (key == "core id") {
      parse_long(value, &core_id);
    }
  }
  end_block();

  if (!vendor_id.empty() || has_flags) {
    cpu.arch = "x86_64";
    if (!vendor_id.empty()) cpu.vendor = vendor_id;
    if (!model_name.empty()) cpu.model_name = model_name;
    set_isa_flags(cpu, flags, /*x86=*/true);
  } else if (!implementer.empty() || has_features) {
    cpu.arch = "aarch64";
    unsigned long imp = 0, prt = 0;
    const bool have_imp = parse_hex(implementer, &imp);
    if (have_imp) cpu.vendor = arm_implementer_name(imp);
    if (have_imp && parse_hex(part, &prt)) {
      cpu.model_name = arm_part_name(imp, prt);
      // An unnamed part: the kernel's "model name" line, where it has one, says more.
      if (cpu.model_name.compare(0, 8, "CPU part") == 0 && !model_name.empty()) cpu.model_name = model_name;
    } else if (!model_name.empty()) {
      cpu.model_name = model_name;
    }
    set_isa_flags(cpu, features, /*x86=*/false);
  }
  cpu.logical_cpus = processors;

  // sysfs: topology and caches per logical CPU.
  std::map<std::pair<long, long>, int> sys_cores;
  // (level, 'D' data / 'U' unified) -> shared_cpu_list -> bytes
  std::map<std::pair<long, char>, std::map<std::string, std::int64_t>> caches;
  int online_dirs = 0;
  for (const fs::path& dir : cpu_dirs(sys_cpu_dir)) {
    long package = -1, core = -1;
    if (read_int(dir / "topology" / "physical_package_id", &package) && read_int(dir / "topology" / "core_id", &core)) {
      ++online_dirs;
      // arm64 kernels before 5.x report package -1 on single-socket machines.
      ++sys_cores[{std::max(package, 0L), core}];
    }
    std::error_code ec;
    fs::directory_iterator it(dir / "cache", ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      const fs::path index = it->path();
      if (index.filename().string().compare(0, 5, "index") != 0) continue;
      long level = 0;
      std::string type, size_text, shared;
      if (!read_int(index / "level", &level) || !read_text(index / "type", &type) ||
          !read_text(index / "size", &size_text))
        continue;
      type = trim(type);
      const char kind = type == "Data" ? 'D' : type == "Unified" ? 'U' : type == "Instruction" ? 'I' : '?';
      if (kind == 'I' || kind == '?') continue;
      const std::int64_t bytes = parse_size(size_text);
      if (bytes <= 0) continue;
      // Without shared_cpu_list the instance is taken as private to this CPU.
      if (!read_text(index / "shared_cpu_list", &shared) || trim(shared).empty()) shared = dir.filename().string();
      auto& instances = caches[{level, kind}];
      auto [slot, inserted] = instances.emplace(trim(shared), bytes);
      if (!inserted) slot->second = std::max(slot->second, bytes);
    }
  }
  if (cpu.logical_cpus == 0) cpu.logical_cpus = online_dirs;
  set_topology(!sys_cores.empty() ? sys_cores : cpuinfo_cores, &cpu);

  auto level_of = [&caches](long level, bool data_only) {
    CacheLevel out;
    for (const char kind : {'D', 'U'}) {
      if (data_only && kind != 'D') continue;
      const auto it = caches.find({level, kind});
      if (it == caches.end()) continue;
      for (const auto& [shared, bytes] : it->second) {
        out.bytes = std::max(out.bytes, bytes);
        ++out.instances;
      }
      break;  // Data wins over Unified at one level (never both in practice)
    }
    return out;
  };
  cpu.l1d = level_of(1, /*data_only=*/true);
  cpu.l2 = level_of(2, /*data_only=*/false);
  cpu.l3 = level_of(3, /*data_only=*/false);
  return cpu;
}

// --- BLAS ---------------------------------------------------------------------

bool blas_core_type_recognised(const std::string& core_type, const CpuInfo& cpu) {
  const std::string core = lower(trim(core_type));
  if (core.empty() || core == "unknown" || core == "generic" || core == "armv8") return false;
  if (cpu.arch == "aarch64") {
    static const std::set<std::string> kSve = {"neoversev1", "neoversen2", "neoversev2", "a64fx", "armv8sve",
                                               "armv9sme"};
    return !cpu.sve || kSve.count(core) > 0;
  }
  const int core_tier = openblas_x86_tier(core);
  if (core_tier < 0) return true;  // a kernel set newer than this table
  return core_tier >= cpu_x86_tier(cpu);
}

BlasInfo blas_info_from_openblas(const std::string& config, const std::string& core_type, int parallel,
                                 int num_threads, const CpuInfo& cpu) {
  BlasInfo b;
  b.library = "OpenBLAS";
  if (!trim(config).empty()) b.config = trim(config);
  const auto words = split_words(config);
  if (words.size() >= 2 && words[0] == "OpenBLAS") b.version = words[1];
  if (!trim(core_type).empty()) b.core_type = trim(core_type);
  switch (parallel) {
    case 0: b.threading = "sequential"; break;
    case 1: b.threading = "pthreads"; break;
    case 2: b.threading = "openmp"; break;
    default: b.threading = "unknown (" + std::to_string(parallel) + ")"; break;
  }
  b.num_threads = std::max(num_threads, 0);
  b.core_type_recognised = blas_core_type_recognised(b.core_type, cpu);
  return b;
}

BlasInfo detect_blas(const CpuInfo& cpu) {
  using StrFn = char* (*)();
  using IntFn = int (*)();
  const auto get_config = reinterpret_cast<StrFn>(::dlsym(RTLD_DEFAULT, "openblas_get_config"));
  if (!get_config) return BlasInfo{};
  const auto get_corename = reinterpret_cast<StrFn>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  const auto get_parallel = reinterpret_cast<IntFn>(::dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  const auto get_threads = reinterpret_cast<IntFn>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  const char* config = get_config();
  const char* corename = get_corename ? get_corename() : nullptr;
  return blas_info_from_openblas(config ? config : "", corename ? corename : "", get_parallel ? get_parallel() : -1,
                                 get_threads ? get_threads() : 0, cpu);
}

// --- GPUs ---------------------------------------------------------------------

std::vector<GpuInfo> parse_nvidia_smi_csv(const std::string& csv) {
  std::vector<GpuInfo> gpus;
  std::istringstream in(csv);
  int line_no = 0;
  for (std::string raw; std::getline(in, raw);) {
    ++line_no;
    const std::string line = trim(raw);
    if (line.empty()) continue;
    const std::string where = "nvidia-smi output line " + std::to_string(line_no) + " (\"" + line + "\")";
    std::vector<std::string> f;
    for (size_t start = 0;;) {
      const size_t comma = line.find(',', start);
      f.push_back(trim(line.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    if (f.size() < 5)
      throw std::runtime_error(where + ": expected 5 comma-separated fields (index, name, compute_cap, "
                               "memory.total [MiB], driver_version), got " + std::to_string(f.size()));
    GpuInfo g;
    auto integer = [&where](const std::string& s, const char* what) {
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(s.c_str(), &end, 10);
      if (s.empty() || errno != 0 || *end != '\0' || v < 0)
        throw std::runtime_error(where + ": expected " + what + " as a non-negative integer, got \"" + s + "\"");
      return v;
    };
    g.index = static_cast<int>(integer(f[0], "index"));
    // A name with commas: every field between index and the last three.
    const size_t n = f.size();
    g.name = f[1];
    for (size_t i = 2; i + 3 < n; ++i) g.name += ", " + f[i];
    const std::string& cc = f[n - 3];
    const size_t dot = cc.find('.');
    if (dot == std::string::npos)
      throw std::runtime_error(where + ": expected compute_cap as major.minor (e.g. 9.0), got \"" + cc + "\"");
    g.cc_major = static_cast<int>(integer(cc.substr(0, dot), "the compute_cap major"));
    g.cc_minor = static_cast<int>(integer(cc.substr(dot + 1), "the compute_cap minor"));
    const long long mib = integer(f[n - 2], "memory.total in MiB");
    if (mib > std::numeric_limits<std::int64_t>::max() / (1024 * 1024))  // found by tests/fuzz/fuzz_nvidia_smi.cpp
      throw std::runtime_error(where + ": expected memory.total below 2^43 MiB, got " + f[n - 2]);
    g.memory_bytes = static_cast<std::int64_t>(mib) * 1024 * 1024;
    g.driver_version = f[n - 1];
    if (g.driver_version.empty()) throw std::runtime_error(where + ": expected a driver_version, got \"\"");
    gpus.push_back(std::move(g));
  }
  return gpus;
}

// --- the record ---------------------------------------------------------------

Capabilities detect() {
  Capabilities caps;
  std::string cpuinfo;
  read_text("/proc/cpuinfo", &cpuinfo);  // unreadable: parse_cpu sees "" and says "unknown"
  caps.cpu = parse_cpu(cpuinfo, "/sys/devices/system/cpu");
  cross_check_x86_flags(&caps.cpu);
  if (caps.cpu.logical_cpus == 0) {
    const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
    if (n > 0) caps.cpu.logical_cpus = static_cast<int>(n);
  }
  caps.blas = detect_blas(caps.cpu);
  probe_gpus(&caps.gpus, &caps.gpu_probe);
  return caps;
}

const Capabilities& capabilities() {
  static const Capabilities caps = detect();
  return caps;
}

nlohmann::json to_json(const Capabilities& caps) {
  using nlohmann::json;
  const CpuInfo& c = caps.cpu;
  json flags = json::object();
  for (const auto& [name, value] : isa_flags(c)) flags[name] = value;
  auto cache = [](const CacheLevel& l) { return json{{"bytes", l.bytes}, {"instances", l.instances}}; };
  json cpu = {{"arch", c.arch},
              {"vendor", c.vendor},
              {"model_name", c.model_name},
              {"logical_cpus", c.logical_cpus},
              {"physical_cores", c.physical_cores},
              {"sockets", c.sockets},
              {"threads_per_core", c.threads_per_core},
              {"flags", flags},
              {"cache", {{"l1d", cache(c.l1d)}, {"l2", cache(c.l2)}, {"l3", cache(c.l3)}}},
              {"flag_mismatches", c.flag_mismatches}};
  const BlasInfo& b = caps.blas;
  json blas = {{"library", b.library},     {"version", b.version},
               {"config", b.config},       {"core_type", b.core_type},
               {"core_type_recognised", b.core_type_recognised},
               {"threading", b.threading}, {"num_threads", b.num_threads}};
  json gpus = json::array();
  for (const GpuInfo& g : caps.gpus)
    gpus.push_back({{"index", g.index},
                    {"name", g.name},
                    {"cc_major", g.cc_major},
                    {"cc_minor", g.cc_minor},
                    {"memory_bytes", g.memory_bytes},
                    {"driver_version", g.driver_version}});
  return {{"cpu", cpu}, {"blas", blas}, {"gpus", gpus}, {"gpu_probe", caps.gpu_probe}};
}

// --- the support matrix ---------------------------------------------------------

const char* to_string(Support s) {
  switch (s) {
    case Support::kNative: return "native";
    case Support::kEmulated: return "emulated exactly";
    case Support::kEmulatedRounded: return "emulated, operands rounded";
    case Support::kNone: return "none";
  }
  return "?";
}

const char* to_string(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::kFp32: return "fp32";
    case GemmPrecision::kBf16: return "bf16";
    case GemmPrecision::kFp8E4M3: return "fp8_e4m3";
    case GemmPrecision::kFp8E5M2: return "fp8_e5m2";
    case GemmPrecision::kFp4E2M1: return "fp4_e2m1";
    case GemmPrecision::kMxfp8: return "mxfp8";
    case GemmPrecision::kMxfp4: return "mxfp4";
    case GemmPrecision::kNvfp4: return "nvfp4";
  }
  return "?";
}

std::vector<SupportRow> cpu_support(const CpuInfo& cpu, bool libtorch_bf16_gemm_accumulates_fp32) {
  std::vector<SupportRow> rows;
  for (const GemmPrecision p : kAllGemmPrecisions) {
    SupportRow r;
    r.precision = p;
    if (p == GemmPrecision::kFp32) {
      r.support = Support::kNative;
      r.how = "FP32 GEMM (BLAS)";
      r.source = cpu.avx512f               ? "Intel ISA extensions reference (AVX-512F FMA)"
                 : cpu.avx2 && cpu.fma     ? "Intel ISA extensions reference (AVX2, FMA)"
                 : cpu.arch == "aarch64"   ? "Arm A64 ISA (NEON/SVE FMLA)"
                                           : "IEEE 754 binary32 (BLAS SGEMM)";
    } else if (p == GemmPrecision::kBf16) {
      if (libtorch_bf16_gemm_accumulates_fp32) {
        r.support = Support::kNative;
        r.how = cpu.amx_bf16      ? "BF16 GEMM with FP32 accumulation (oneDNN, AMX-BF16 TDPBF16PS)"
                : cpu.avx512_bf16 ? "BF16 GEMM with FP32 accumulation (oneDNN, AVX512_BF16 VDPBF16PS)"
                : cpu.arm_bf16    ? "BF16 GEMM with FP32 accumulation (BFMMLA/BFDOT)"
                                  : "BF16 GEMM with FP32 accumulation (oneDNN, BF16 widened to FP32 in registers)";
        r.source = cpu.arch == "aarch64" ? "Arm A64 ISA (FEAT_BF16); snip::native_bf16_gemm() probe"
                                         : "Intel ISA extensions reference (AVX512_BF16, AMX); "
                                           "snip::native_bf16_gemm() probe";
      } else {
        r.support = Support::kEmulated;
        r.how = "BF16-rounded operands, FP32 GEMM, result rounded to BF16";
        r.source = "snip/model/matmul.h (LibTorch's fallback BF16 GEMM accumulates in BF16)";
      }
    } else if (p == GemmPrecision::kNvfp4) {
      // The CPU path fake-quantizes each operand to code x block scale x FP32
      // tensor scale and casts that to BF16: the tensor scale's bits do not
      // fit, so the operands are rounded (tests/python/test_doctor_emulation.py).
      r.support = Support::kEmulatedRounded;
      r.how = "E2M1 code x E4M3 block scale is exact in BF16, but snip's CPU GEMM multiplies the FP32 tensor "
              "scale into the operands before their BF16 cast (up to 2^-9 relative error per operand); "
              "gemm = fp32 keeps them exact";
      r.source = format_source(p) + "; no CPU FP8/FP4 GEMM instruction is used";
    } else {
      r.support = Support::kEmulated;
      r.how = emulated_how(p);
      r.source = format_source(p) + "; no CPU FP8/FP4 GEMM instruction is used";
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

std::vector<SupportRow> gpu_support(int cc_major, int cc_minor) {
  const int cc = cc_major * 10 + std::min(std::max(cc_minor, 0), 9);  // 8.9 -> 89
  const bool bf16_tc = cc >= 80;
  std::vector<SupportRow> rows;
  for (const GemmPrecision p : kAllGemmPrecisions) {
    SupportRow r;
    r.precision = p;
    switch (p) {
      case GemmPrecision::kFp32:
        r.support = Support::kNative;
        r.how = "FP32 FMA on CUDA cores (TF32 tensor cores only if enabled; TF32 rounds operands)";
        r.source = "CUDA C++ Programming Guide, arithmetic instructions throughput (FP32 FMA)";
        break;
      case GemmPrecision::kBf16:
        r.support = bf16_tc ? Support::kNative : Support::kNone;
        r.how = bf16_tc ? "BF16 tensor cores, FP32 accumulation" : "no BF16 tensor cores (sm_80+)";
        r.source = "PTX ISA: mma.sync .bf16 (sm_80+)";
        break;
      case GemmPrecision::kFp8E4M3:
      case GemmPrecision::kFp8E5M2:
        if (cc >= 89) {
          r.support = Support::kNative;
          r.how = "FP8 tensor cores, FP32 output; tensor scales applied to the output";
        } else if (bf16_tc) {
          r.support = Support::kEmulated;
          r.how = emulated_how(p);
        } else {
          r.support = Support::kNone;
          r.how = "no FP8 tensor cores (sm_89+) and no BF16 tensor cores to emulate on (sm_80+)";
        }
        r.source = "PTX ISA: mma.sync .e4m3/.e5m2 (sm_89+), wgmma (sm_90a); " + std::string(kSrcOfp8);
        break;
      case GemmPrecision::kFp4E2M1:
      case GemmPrecision::kMxfp8:
      case GemmPrecision::kMxfp4:
      case GemmPrecision::kNvfp4:
        if (cc >= 100) {
          r.support = Support::kNative;
          r.how = p == GemmPrecision::kFp4E2M1 ? "FP4 tensor cores (f8f6f4 kind), FP32 accumulation"
                                               : "block-scaled tensor cores: scales applied inside the MMA, "
                                                 "FP32 accumulation";
          r.source = blackwell_ptx(p);
        } else if (bf16_tc) {
          r.support = Support::kEmulated;
          r.how = emulated_how(p);
          r.source = format_source(p) + "; block-scaled MMA needs sm_100a/sm_120a (PTX ISA)";
        } else {
          r.support = Support::kNone;
          r.how = "no FP4/block-scaled tensor cores (sm_100+) and no BF16 tensor cores to emulate on (sm_80+)";
          r.source = format_source(p) + "; block-scaled MMA needs sm_100a/sm_120a (PTX ISA)";
        }
        break;
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace snip::hw
