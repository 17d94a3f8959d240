// snip/dist/world.h: several training processes (ranks) over LibTorch's c10d
// engine (docs/distributed.md).
//
// Dimensions: R = world size (ranks), P = parameters of the model (tensors).
//
// Where the world comes from (World::from_env), first match wins:
//   torchrun   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//              MASTER_PORT; TORCHELASTIC_USE_AGENT_STORE=True means torchrun's
//              agent already hosts the TCPStore at MASTER_ADDR:MASTER_PORT
//              (every rank connects as a client), else rank 0 hosts it.
//   Slurm      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the local task count
//              from SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE, the master
//              = the first host of SLURM_JOB_NODELIST (parse_nodelist), port
//              MASTER_PORT or 29500 (MASTER_ADDR, when set, wins).
//   otherwise  one process: rank 0 of 1, no process group.
//
// The communicator (Communicator, connect()) is the only way the trainer
// talks to other ranks; every line that names a c10d Gloo/NCCL/ProcessGroup
// type is in src/dist/process_group.cpp, so LibTorch 1.13 vs 2.x differences
// stay there.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "snip/config/config.h"

namespace snip::dist {

/// This process's place among the training processes.
struct World {
  int rank = 0;              ///< in [0, size)
  int size = 1;              ///< R, number of ranks
  int local_rank = 0;        ///< rank on this machine, in [0, local_size)
  int local_size = 1;        ///< ranks on this machine (threads default to cores / local_size)
  std::string master_addr;   ///< host of the TCPStore ("" for one process)
  int master_port = 0;       ///< its TCP port
  bool agent_store = false;  ///< torchrun's agent hosts the store: every rank is a client
  std::string source = "single";  ///< "torchrun", "snip --nproc-per-node", "slurm" or "single"

  /// From the environment (header comment). Throws UserError naming the
  /// variable for a malformed or inconsistent value (e.g. RANK >= WORLD_SIZE).
  static World from_env();
};

/// "node[01-04,07],gpu3" -> {"node01", "node02", "node03", "node04",
/// "node07", "gpu3"}: Slurm's compact host list (ranges keep their zero
/// padding). Throws UserError naming `what` for unbalanced brackets or a bad range.
std::vector<std::string> parse_nodelist(const std::string& list, const std::string& what = "SLURM_JOB_NODELIST");

/// The [dist] options (config/config.h DistConfig, parsed with the run's
/// configuration by RunConfig::from).
using DistOptions = DistConfig;

/// A collective in flight (Communicator::allreduce_sum_async). wait() blocks
/// until its result is in the tensors it was given (throws UserError like
/// the synchronous call); call it exactly once, before reading them.
class Pending {
 public:
  virtual ~Pending() = default;
  virtual void wait() = 0;
};

/// Collectives over the ranks of one World. All calls are collective: every
/// rank makes the same calls in the same order with tensors of the same
/// shape and dtype. gloo: CPU tensors. nccl: tensors on this rank's CUDA
/// device (cuda:LOCAL_RANK, or cuda:0 where each rank sees one) go to NCCL as they are (the calls are ordered
/// on PyTorch's current stream: a wait() returns once later work on that
/// stream is ordered after the collective, and blocked_s() counts the host's
/// waits only); CPU tensors (the control values: loss sums, checksums,
/// flags) are copied to the device and back, so every caller works on
/// both. A peer that does not answer within dist.timeout_s makes the call
/// throw UserError naming the silent rank (gloo; nccl when the host waits:
/// CPU tensors and barrier()). Under nccl a collective on device tensors
/// does not block the host: if a peer stopped, PyTorch's NCCL watchdog ends
/// the process after dist.timeout_s + 30 s with its own (multi-line) message,
/// unless a later host wait names the silent rank first.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// The world rank of this communicator's rank `r` (a subgroup's ranks are
  /// renumbered from 0; messages name world ranks). Identity for the world.
  virtual int world_rank_of(int r) const { return r; }
  /// "gloo" or "nccl".
  virtual std::string backend() const = 0;
  /// Sums each tensor in place over the ranks (one all-reduce per tensor,
  /// all started before the first is waited for). Contiguous tensors.
  virtual void allreduce_sum(std::vector<torch::Tensor>& tensors) = 0;
  /// allreduce_sum started and not waited for: every rank must start its
  /// asynchronous collectives in the same order (they are matched by order).
  /// The tensors must not be touched until the handle's wait() returned.
  /// The default runs allreduce_sum at once (a done handle).
  virtual std::unique_ptr<Pending> allreduce_sum_async(std::vector<torch::Tensor>& tensors);
  /// Element-wise maximum of each tensor in place over the ranks (the shared
  /// amax of quantized gradient communication). Contiguous tensors.
  virtual void allreduce_max(std::vector<torch::Tensor>& tensors) = 0;
  /// Copies `t` of rank `root` into `t` on every rank.
  virtual void broadcast(torch::Tensor& t, int root) = 0;
  /// Sums `t` (contiguous) over the ranks into `t` of rank `root` (c10d
  /// reduce; the other ranks' `t` is left unspecified). ZeRO stage 2.
  virtual void reduce_sum(torch::Tensor& t, int root) = 0;
  /// Blocks until every rank arrived.
  virtual void barrier() = 0;
  /// Every rank's `t` (small, contiguous, same shape on every rank), in rank order: [R] tensors.
  virtual std::vector<torch::Tensor> allgather(const torch::Tensor& t) = 0;
  /// Point-to-point (pipeline stages; gloo only, nccl throws UserError):
  /// starts sending `t` (contiguous CPU tensor; it must stay untouched until wait()) to rank `dst` of this
  /// communicator with message tag `tag` (messages of one (src, dst, tag)
  /// arrive in the order sent). Never blocks: a send is matched when the
  /// receiver posts its recv, so a schedule that waits for its sends late
  /// cannot deadlock. Throws UserError where the backend has no send.
  virtual std::unique_ptr<Pending> send_async(const torch::Tensor& t, int dst, int tag);
  /// Receives into `t` (contiguous, the sender's shape and dtype) the next
  /// message from rank `src` with `tag`; blocks (its time counts in
  /// blocked_s()). A peer that stopped makes it throw UserError naming it.
  virtual void recv(torch::Tensor& t, int src, int tag);
  /// A communicator over `ranks` (ranks of this one, ascending, this rank
  /// among them): rank i of the new one is ranks[i]. Collective over
  /// `ranks` only; `name` must be unique per group (it keys the
  /// rendezvous). Throws UserError where the backend has no groups (nccl:
  /// its only user, pipeline stages, runs on gloo).
  virtual std::unique_ptr<Communicator> subgroup(const std::vector<int>& ranks, const std::string& name);
  /// Seconds this rank has spent blocked in collectives since it connected
  /// (wall time of each synchronous call, and of each Pending::wait()): the
  /// communication time a step could not hide.
  double blocked_s() const { return blocked_s_; }

 protected:
  double blocked_s_ = 0;
};

/// Connects this rank (world.size > 1) to the others: the TCPStore (hosted
/// by rank 0 unless world.agent_store), a handshake in which every rank
/// reports its world size and backend (handshake_value), then the process
/// group of `opt.backend` ("nccl": ProcessGroupNCCL on `device`, place_rank's
/// CUDA device, made this process's current device; a CPU `device` means
/// resolve_train_device's for train.device = cuda; anything else: gloo;
/// place_rank resolves "auto" first). Throws UserError with one line for: a
/// port in use, an unreachable master (after dist.timeout_s), ranks that
/// disagree on the world size or the backend, nccl without NCCL in this
/// build (nccl_unavailable_reason), with an nccl.h of another version than
/// LibTorch's (nccl_version_mismatch) or without the CUDA device. The nccl
/// communicator ends with a barrier and ProcessGroupNCCL::shutdown() (abort()
/// after a failed collective or during an exception).
std::unique_ptr<Communicator> connect(const World& world, const DistOptions& opt,
                                      const torch::Device& device = torch::kCPU);

/// What each rank writes in the rendezvous handshake: "<world size> <backend>".
std::string handshake_value(int world_size, const std::string& backend);

/// "" when rank `r`'s handshake value `theirs` agrees with this rank's world
/// size and backend; else one line naming both ranks and their values (the
/// world size first: a rank of another launch disagrees on everything).
std::string handshake_mismatch(int my_rank, int my_size, const std::string& my_backend, int r,
                               const std::string& theirs);

/// "" when the nccl.h snip was compiled with (major.minor.patch) is the NCCL
/// LibTorch was built with (`torch_version` as torch::cuda::nccl::version()
/// packs it: major << 32 | minor << 16 | patch); else the one-line refusal
/// naming both versions.
std::string nccl_version_mismatch(int major, int minor, int patch, uint64_t torch_version);

/// Where this rank trains and over which c10d backend: dist.backend
/// resolved against train.device (model/device.h resolve_train_device).
struct Placement {
  std::string backend;           ///< "gloo" or "nccl"; "" for one process (no communicator)
  torch::Device device = torch::kCPU;  ///< the rank's device: cpu, or cuda:LOCAL_RANK (cuda:0 for one process, or where each rank sees one device)
  std::string reason;            ///< one line: the device and why (the run's log and summary.json)
};

/// dist.backend (opt.backend: auto, gloo, nccl) and train.device (`device`:
/// auto, cpu, cuda) for this rank of `world`:
///   one process   the device of resolve_train_device; no backend.
///   auto backend  nccl when the device resolves to CUDA (and the build
///                 has NCCL and there are no pipeline stages), else gloo.
///   gloo          the CPU: train.device = auto picks it; cuda is refused
///                 (gloo sums host tensors; snip does not stage a GPU's
///                 gradients through the host).
///   nccl          the CUDA device of resolve_train_device
///                 (cuda:LOCAL_RANK, or cuda:0 where each rank sees one
///                 device); refused when the device resolves to the
///                 CPU (cpu, auto without enough CUDA devices), without
///                 NCCL in this LibTorch, and with dist.pipeline_stages > 1
///                 (point-to-point messages are gloo's only).
/// Throws UserError with one line naming dist.backend and/or train.device
/// and the reason; called before anything is written to the run folder.
Placement place_rank(const DistOptions& opt, const std::string& device, const World& world);

/// True when this build has the NCCL process group (a CUDA LibTorch, and
/// nccl.h found when snip was built).
bool nccl_available();

/// Why nccl_available() is false, in words for "dist.backend = nccl: ..."
/// ("" when it is true): a CPU LibTorch, or a CUDA one built without nccl.h.
std::string nccl_unavailable_reason();

}  // namespace snip::dist
