// The world from torchrun's or Slurm's environment (see dist/world.h).
#include "snip/dist/world.h"

#include <cstdlib>
#include <thread>

#include "snip/core/error.h"
#include "snip/model/device.h"

namespace snip::dist {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// A non-negative decimal integer from variable `name`, UserError otherwise.
int env_int(const char* name, const char* v, int lo, int hi) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi)
    fail(name, ": expected an integer in [", lo, ", ", hi, "], got '", v, "'");
  return int(x);
}

// Slurm's SLURM_TASKS_PER_NODE "2(x3),1": the count of the first node (the
// local count is only exact when every node runs the same number of tasks,
// which is how snip is meant to be launched).
int slurm_tasks_per_node(const char* v) {
  std::string s(v);
  const size_t cut = s.find_first_of("(,");
  return env_int("SLURM_TASKS_PER_NODE", s.substr(0, cut).c_str(), 1, 1 << 20);
}

}  // namespace

std::vector<std::string> parse_nodelist(const std::string& list, const std::string& what) {
  std::vector<std::string> out;
  size_t i = 0;
  const size_t n = list.size();
  while (i < n) {
    // One item: prefix[ranges]suffix? (Slurm allows one bracket group per item in practice).
    size_t j = i;
    int depth = 0;
    while (j < n && (depth > 0 || list[j] != ',')) {
      if (list[j] == '[') {
        if (++depth > 1) fail(what, ": nested '[' in '", list, "'");
      } else if (list[j] == ']') {
        if (--depth < 0) fail(what, ": unbalanced ']' in '", list, "'");
      }
      ++j;
    }
    if (depth != 0) fail(what, ": unbalanced '[' in '", list, "'");
    const std::string item = list.substr(i, j - i);
    i = j + 1;
    if (item.empty()) continue;
    const size_t lb = item.find('[');
    if (lb == std::string::npos) {
      out.push_back(item);
      continue;
    }
    const size_t rb = item.find(']', lb);
    const std::string prefix = item.substr(0, lb), suffix = item.substr(rb + 1);
    const std::string body = item.substr(lb + 1, rb - lb - 1);
    size_t k = 0;
    while (k <= body.size()) {
      size_t e = body.find(',', k);
      if (e == std::string::npos) e = body.size();
      const std::string range = body.substr(k, e - k);
      k = e + 1;
      const size_t dash = range.find('-');
      const std::string a = range.substr(0, dash), b = dash == std::string::npos ? a : range.substr(dash + 1);
      auto digits = [&](const std::string& s) {
        if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
          fail(what, ": expected a number or a range like 01-04 in '", list, "', got '", range, "'");
        return std::stol(s);
      };
      const long lo = digits(a), hi = digits(b);
      if (hi < lo) fail(what, ": range '", range, "' in '", list, "' runs backwards");
      if (hi - lo > 100000) fail(what, ": range '", range, "' in '", list, "' is too long");
      for (long x = lo; x <= hi; ++x) {
        std::string num = std::to_string(x);
        if (num.size() < a.size()) num.insert(0, a.size() - num.size(), '0');  // keep zero padding
        out.push_back(prefix + num + suffix);
      }
    }
  }
  if (out.empty()) fail(what, ": expected at least one host, got '", list, "'");
  return out;
}

World World::from_env() {
  World w;
  if (const char* ws = env("WORLD_SIZE")) {  // torchrun (or a hand-made launch with its variables)
    // `snip train --nproc-per-node` sets torchrun's variables and says it did.
    const char* launcher = env("SNIP_LAUNCHER");
    w.source = launcher && std::string(launcher) == "nproc-per-node" ? "snip --nproc-per-node" : "torchrun";
    w.size = env_int("WORLD_SIZE", ws, 1, 1 << 20);
    const char* r = env("RANK");
    if (!r) fail("RANK: not set although WORLD_SIZE is ", w.size, " (launch with torchrun)");
    w.rank = env_int("RANK", r, 0, 1 << 20);
    if (const char* lr = env("LOCAL_RANK")) w.local_rank = env_int("LOCAL_RANK", lr, 0, 1 << 20);
    w.local_size = w.size;
    if (const char* ls = env("LOCAL_WORLD_SIZE")) w.local_size = env_int("LOCAL_WORLD_SIZE", ls, 1, 1 << 20);
    if (const char* s = env("TORCHELASTIC_USE_AGENT_STORE")) w.agent_store = std::string(s) == "True";
  } else if (const char* nt = env("SLURM_NTASKS")) {
    w.source = "slurm";
    w.size = env_int("SLURM_NTASKS", nt, 1, 1 << 20);
    const char* r = env("SLURM_PROCID");
    if (!r) fail("SLURM_PROCID: not set although SLURM_NTASKS is ", w.size, " (launch with srun)");
    w.rank = env_int("SLURM_PROCID", r, 0, 1 << 20);
    if (const char* lr = env("SLURM_LOCALID")) w.local_rank = env_int("SLURM_LOCALID", lr, 0, 1 << 20);
    if (const char* tpn = env("SLURM_NTASKS_PER_NODE")) w.local_size = env_int("SLURM_NTASKS_PER_NODE", tpn, 1, 1 << 20);
    else if (const char* tpn2 = env("SLURM_TASKS_PER_NODE")) w.local_size = slurm_tasks_per_node(tpn2);
    if (const char* nl = env("SLURM_JOB_NODELIST")) w.master_addr = parse_nodelist(nl).front();
  } else {
    return w;  // one process
  }
  if (w.rank >= w.size) fail("rank ", w.rank, " is outside the world of ", w.size, " ranks (RANK/SLURM_PROCID)");
  if (w.local_rank >= w.local_size)
    fail("local rank ", w.local_rank, " is outside the ", w.local_size, " ranks on this machine");
  if (const char* a = env("MASTER_ADDR")) w.master_addr = a;
  w.master_port = 29500;
  if (const char* p = env("MASTER_PORT")) w.master_port = env_int("MASTER_PORT", p, 1, 65535);
  if (w.size > 1 && w.master_addr.empty())
    fail("MASTER_ADDR: not set (", w.source == "slurm" ? "nor SLURM_JOB_NODELIST" : "launch with torchrun",
         "): the ranks cannot find rank 0");
  return w;
}


Placement place_rank(const DistOptions& opt, const std::string& device, const World& w) {
  const std::string& b = opt.backend;
  if (b != "auto" && b != "gloo" && b != "nccl") fail("dist.backend: expected auto, gloo or nccl, got '", b, "'");
  const DeviceChoice d = resolve_train_device(device, w.size, w.local_rank, w.local_size);
  if (w.size <= 1) return {"", d.device, d.reason};
  const int S = int(opt.pipeline_stages);
  const bool cuda = d.device.is_cuda();
  if (b == "nccl" || (b == "auto" && cuda && S <= 1 && nccl_available())) {
    if (!nccl_available()) fail("dist.backend = nccl: ", nccl_unavailable_reason(), "; or use dist.backend = gloo");
    if (!cuda)
      fail("dist.backend = nccl needs one CUDA device per rank, but ", d.reason, "; use dist.backend = gloo (or "
           "auto) to train on the CPU");
    if (S > 1)
      fail("dist.backend = nccl with dist.pipeline_stages = ", S, " is not built (pipeline stages exchange "
           "activations with point-to-point messages, which only the gloo path has); use dist.backend = gloo with "
           "train.device = cpu");
    return {"nccl", d.device, d.reason + " (dist.backend = " + b + ": nccl)"};
  }
  // gloo: host tensors.
  if (cuda) {
    if (device == "cuda")
      fail("train.device = cuda with dist.backend = ", b, S > 1 ? str_cat(" and dist.pipeline_stages = ", S) : "",
           " is not supported (gloo sums CPU tensors; snip does not stage a GPU's gradients through the host); use ",
           S > 1 || !nccl_available() ? "train.device = cpu" : "dist.backend = nccl (or auto), or train.device = cpu",
           S <= 1 && !nccl_available() ? str_cat(" (no nccl here: ", nccl_unavailable_reason(), ")") : "");
    return {"gloo", torch::kCPU,
            str_cat("train.device = auto: ", w.size, " ranks over gloo (dist.backend = ", b,
                    S > 1 ? str_cat(", dist.pipeline_stages = ", S) : "", "): the CPU")};
  }
  return {"gloo", d.device, d.reason};
}

}  // namespace snip::dist
