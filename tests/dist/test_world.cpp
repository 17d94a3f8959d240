// dist/world.h and dist/data_parallel.h without other processes: the world
// from torchrun's and Slurm's variables, Slurm host lists, the bucket layout,
// the checksum (FNV-1a 64 test vectors). The multi-process behaviour is
// tests/cli/test_dist.py.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "snip/dist/data_parallel.h"
#include "snip/dist/world.h"
#include "snip/core/error.h"

namespace snip::dist {
namespace {

// Sets the given variables (and clears every other launcher variable) for
// the test's lifetime.
class Env {
 public:
  explicit Env(const std::map<std::string, std::string>& vars) {
    for (const char* k : kAll) {
      if (const char* v = std::getenv(k)) saved_[k] = v;
      ::unsetenv(k);
    }
    for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~Env() {
    for (const char* k : kAll) ::unsetenv(k);
    for (const auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
  }

 private:
  static constexpr const char* kAll[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                         "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "SLURM_PROCID",
                                         "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_NODELIST",
                                         "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"};
  std::map<std::string, std::string> saved_;
};

TEST(DistWorld, SingleProcessWithoutLauncherVariables) {
  Env e({});
  const World w = World::from_env();
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.size, 1);
  EXPECT_EQ(w.source, "single");
}

TEST(DistWorld, Torchrun) {
  Env e({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
         {"MASTER_ADDR", "10.0.0.7"}, {"MASTER_PORT", "29611"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  const World w = World::from_env();
  EXPECT_EQ(w.source, "torchrun");
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.size, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_size, 2);
  EXPECT_EQ(w.master_addr, "10.0.0.7");
  EXPECT_EQ(w.master_port, 29611);
  EXPECT_TRUE(w.agent_store);
}

TEST(DistWorld, SlurmTakesTheFirstHostOfTheNodelist) {
  Env e({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}, {"SLURM_TASKS_PER_NODE", "2(x4)"},
         {"SLURM_JOB_NODELIST", "gpu[07-10]"}});
  const World w = World::from_env();
  EXPECT_EQ(w.source, "slurm");
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.size, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_size, 2);
  EXPECT_EQ(w.master_addr, "gpu07");
  EXPECT_EQ(w.master_port, 29500);
  EXPECT_FALSE(w.agent_store);
}

TEST(DistWorld, BadValuesAreUserErrors) {
  {
    Env e({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}});
    EXPECT_THROW(World::from_env(), UserError);
  }
  {
    Env e({{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}});
    EXPECT_THROW(World::from_env(), UserError);
  }
  {
    Env e({{"RANK", "0"}, {"WORLD_SIZE", "2"}});  // no MASTER_ADDR
    EXPECT_THROW(World::from_env(), UserError);
  }
  {
    Env e({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}});
    EXPECT_THROW(World::from_env(), UserError);
  }
}

TEST(DistWorld, SlurmNodelists) {
  using V = std::vector<std::string>;
  EXPECT_EQ(parse_nodelist("node01"), V({"node01"}));
  EXPECT_EQ(parse_nodelist("node[01-04]"), V({"node01", "node02", "node03", "node04"}));
  EXPECT_EQ(parse_nodelist("a[8-10],b3"), V({"a8", "a9", "a10", "b3"}));
  EXPECT_EQ(parse_nodelist("n[1,3-4]x,m"), V({"n1x", "n3x", "n4x", "m"}));
  EXPECT_EQ(parse_nodelist("gpu[098-101]"), V({"gpu098", "gpu099", "gpu100", "gpu101"}));
  EXPECT_THROW(parse_nodelist("node[01-04"), UserError);
  EXPECT_THROW(parse_nodelist("node[04-01]"), UserError);
  EXPECT_THROW(parse_nodelist("node[a-b]"), UserError);
  EXPECT_THROW(parse_nodelist(""), UserError);
}

// dist.backend against train.device (place_rank): one line naming the
// options for every refusal; auto = nccl on CUDA devices, gloo on the CPU.
std::string placement_error(const std::string& backend, const std::string& device, const World& w, int stages = 1) {
  DistOptions o;
  o.backend = backend;
  o.pipeline_stages = stages;
  try {
    place_rank(o, device, w);
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    return m;
  }
  return "";
}

TEST(DistPlacement, BackendAgainstDevice) {
  World two;
  two.size = 2;
  two.rank = two.local_rank = 1;
  two.local_size = 2;
  DistOptions o;  // backend auto
  const bool gpus = torch::cuda::is_available() && torch::cuda::device_count() >= 2;
  const Placement cpu = place_rank(o, "cpu", two);
  EXPECT_EQ(cpu.backend, "gloo");
  EXPECT_TRUE(cpu.device.is_cpu());
  const Placement a = place_rank(o, "auto", two);
  EXPECT_EQ(a.backend, gpus && nccl_available() ? "nccl" : "gloo") << a.reason;
  EXPECT_EQ(a.device, gpus && nccl_available() ? torch::Device(torch::kCUDA, 1) : torch::Device(torch::kCPU))
      << a.reason;
  // nccl on the CPU: refused naming both options.
  const std::string e = placement_error("nccl", "cpu", two);
  EXPECT_NE(e.find("dist.backend = nccl"), std::string::npos) << e;
  EXPECT_NE(e.find("train.device = cpu"), std::string::npos) << e;
  // gloo keeps auto on the CPU; pipeline stages stay on gloo.
  o.backend = "gloo";
  EXPECT_TRUE(place_rank(o, "auto", two).device.is_cpu());
  o.backend = "auto";
  o.pipeline_stages = 2;
  EXPECT_EQ(place_rank(o, "auto", two).backend, "gloo");
  EXPECT_TRUE(place_rank(o, "auto", two).device.is_cpu());
  if (!gpus) {
    // No (or one) CUDA device: nccl with auto says why the device is the CPU.
    const std::string n = placement_error("nccl", "auto", two);
    EXPECT_NE(n.find("dist.backend = nccl"), std::string::npos) << n;
    EXPECT_NE(n.find("train.device = auto"), std::string::npos) << n;
  } else {
    EXPECT_NE(placement_error("gloo", "cuda", two).find("dist.backend = nccl (or auto)"), std::string::npos);
    EXPECT_NE(placement_error("nccl", "cuda", two, 2).find("dist.pipeline_stages = 2"), std::string::npos);
  }
  EXPECT_NE(placement_error("mpi", "cpu", two).find("expected auto, gloo or nccl"), std::string::npos);
  // One process: no backend, the device alone.
  const Placement one = place_rank(o, "cpu", World{});
  EXPECT_EQ(one.backend, "");
  EXPECT_TRUE(one.device.is_cpu());
}

// The rendezvous handshake (connect): every rank's "<world size> <backend>"
// against this rank's; dist.backend = auto resolves per rank, so a rank
// without GPUs (gloo) among nccl ranks must stop in one line, not hang.
TEST(DistPlacement, HandshakeComparesWorldSizeAndBackend) {
  EXPECT_EQ(handshake_value(4, "nccl"), "4 nccl");
  EXPECT_EQ(handshake_mismatch(0, 4, "nccl", 3, handshake_value(4, "nccl")), "");
  const std::string b = handshake_mismatch(0, 4, "nccl", 3, handshake_value(4, "gloo"));
  EXPECT_NE(b.find("backend mismatch: rank 3 resolved dist.backend to gloo, rank 0 to nccl"), std::string::npos) << b;
  EXPECT_EQ(b.find('\n'), std::string::npos) << b;
  // The world size is named first (a rank of another launch disagrees on both).
  const std::string w = handshake_mismatch(1, 4, "gloo", 0, handshake_value(2, "nccl"));
  EXPECT_NE(w.find("world-size mismatch: rank 0 was started with a world of 2 ranks, rank 1 with 4"), std::string::npos)
      << w;
  EXPECT_NE(handshake_mismatch(0, 2, "gloo", 1, "2").find("backend mismatch"), std::string::npos);
}

// nccl.h's version against the NCCL LibTorch was built with (major << 32 | minor << 16 | patch).
TEST(DistPlacement, NcclHeaderVersionMustBeLibTorchs) {
  const uint64_t torch_2_28_9 = (uint64_t(2) << 32) | (uint64_t(28) << 16) | 9u;
  EXPECT_EQ(nccl_version_mismatch(2, 28, 9, torch_2_28_9), "");
  const std::string m = nccl_version_mismatch(2, 27, 3, torch_2_28_9);
  EXPECT_EQ(m.rfind("dist.backend = nccl: ", 0), 0u) << m;
  EXPECT_NE(m.find("nccl.h 2.27.3"), std::string::npos) << m;
  EXPECT_NE(m.find("NCCL 2.28.9"), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  EXPECT_NE(nccl_version_mismatch(2, 28, 8, torch_2_28_9), "");
  // Available or not, with its own words.
  EXPECT_EQ(nccl_unavailable_reason().empty(), nccl_available()) << nccl_unavailable_reason();
}

TEST(DistDataParallel, BucketsRunInReverseOrderUnderTheirCaps) {
  // 4-byte floats: 100, 300, 200, 50 elements = 400, 1200, 800, 200 bytes.
  std::vector<torch::Tensor> p = {torch::zeros({100}), torch::zeros({300}), torch::zeros({200}), torch::zeros({50})};
  // first cap 1000 bytes: {3 (200), 2 (800)} = 1000; then cap 1500: {1 (1200)}, then {0 (400)} would make 1600.
  const auto b = grad_buckets(p, 1000, 1500);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0], (std::vector<size_t>{3, 2}));
  EXPECT_EQ(b[1], (std::vector<size_t>{1}));
  EXPECT_EQ(b[2], (std::vector<size_t>{0}));
  // A tensor above the cap is a bucket alone.
  const auto big = grad_buckets({torch::zeros({10}), torch::zeros({1000})}, 100, 100);
  ASSERT_EQ(big.size(), 2u);
  EXPECT_EQ(big[0], (std::vector<size_t>{1}));
}

TEST(DistDataParallel, ChecksumIsFnv1a64OfTheBytes) {
  // FNV-1a 64 test vectors (Fowler/Noll/Vo): "" -> cbf29ce484222325, "a" -> af63dc4c8601ec8c.
  const torch::Tensor empty = torch::empty({0}, torch::kUInt8);
  const torch::Tensor a = torch::tensor({int64_t('a')}).to(torch::kUInt8);
  const torch::Tensor c = param_checksums({empty, a});
  EXPECT_EQ(uint64_t(c[0].item<int64_t>()), 0xcbf29ce484222325ull);
  EXPECT_EQ(uint64_t(c[1].item<int64_t>()), 0xaf63dc4c8601ec8cull);
  // One flipped bit changes it.
  torch::Tensor w = torch::ones({4});
  const int64_t before = param_checksums({w})[0].item<int64_t>();
  w[2] = std::nextafter(1.0f, 2.0f);
  EXPECT_NE(param_checksums({w})[0].item<int64_t>(), before);
}

}  // namespace
}  // namespace snip::dist
