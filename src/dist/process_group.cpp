// The only file that names c10d's stores and process groups (dist/world.h):
// TCPStore + PrefixStore for the rendezvous, ProcessGroupGloo or
// ProcessGroupNCCL for the collectives. LibTorch 1.13 and 2.x differ here
// (2.x: ProcessGroupGloo derives from Backend, errors are c10::DistError);
// keep such differences in this file.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

// NCCL where this LibTorch has it (a CUDA build defines USE_C10D_NCCL on
// torch_cuda's targets) and nccl.h is on the include path; a CPU LibTorch
// builds without it. ProcessGroupNCCL.hpp's layouts (Options holds an
// ncclConfig_t whose fields follow NCCL's version; the NCCL_HAS_* ifdefs
// add members) must be those of the NCCL that libtorch_cuda was built with,
// or its constructors write past what this file allocated: src/torch.cmake
// puts the venv's nvidia-nccl wheel headers (torch's own NCCL) ahead of the
// CUDA toolkit's for this file, and connect() refuses a version that differs
// from torch::cuda::nccl::version() (nccl_version_mismatch).
#if defined(USE_C10D_NCCL) && __has_include(<torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>) && \
    __has_include(<nccl.h>)
#define SNIP_HAVE_NCCL 1
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/cuda/nccl.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#else
#define SNIP_HAVE_NCCL 0
#endif
#if defined(USE_C10D_NCCL)
#define SNIP_TORCH_HAS_NCCL 1
#else
#define SNIP_TORCH_HAS_NCCL 0
#endif

#include <netdb.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include <spdlog/spdlog.h>

#include "snip/dist/world.h"
#include "snip/core/error.h"
#include "snip/model/device.h"

namespace snip::dist {

namespace {

using std::chrono::milliseconds;

// The first line of an exception's message (c10::Error carries a backtrace).
std::string first_line(const std::exception& e) {
  std::string s;
  if (auto* ce = dynamic_cast<const c10::Error*>(&e)) s = ce->what_without_backtrace();
  else s = e.what();
  const size_t nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

std::string env_or(const char* name, const std::string& dflt) {
  const char* v = std::getenv(name);
  return v && *v ? v : dflt;
}

// The socket the rendezvous store rank 0 hosts listens on
// (docs/distributed.md "Network and threads"): MASTER_ADDR's own address,
// not every address of the machine, so `snip launch` (127.0.0.1) and a
// loopback MASTER_ADDR are unreachable from elsewhere and a cluster's store
// answers where the ranks were told to connect. Returns the listening
// descriptor, which TCPStore takes over (TCPStoreOptions::masterListenFd),
// or -1 for TCPStore's own socket on every address, with a one-line warning,
// when MASTER_ADDR is not an address of this machine (a NAT or service
// address: bind says EADDRNOTAVAIL) or is a name that resolves to loopback
// here while ranks run on other machines (Debian maps the host name to
// 127.0.1.1). Throws UserError naming the address for anything else.
int listen_socket(const std::string& host, int port, bool all_local) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0)
    fail("dist: MASTER_ADDR '", host, "' cannot be resolved (", gai_strerror(rc), ")");
  bool loopback = true;
  for (addrinfo* a = res; a; a = a->ai_next) {
    if (a->ai_family == AF_INET)
      loopback = loopback && (ntohl(reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr.s_addr) >> 24) == 127;
    else if (a->ai_family == AF_INET6)
      loopback = loopback && IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
  }
  if (loopback && !all_local) {
    freeaddrinfo(res);
    spdlog::warn("dist: MASTER_ADDR '{}' resolves to a loopback address on rank 0's machine while ranks run on "
                 "other machines: the rendezvous store listens on every address (set MASTER_ADDR to this "
                 "machine's network address to bind that alone)", host);
    return -1;
  }
  std::string why = "no address";
  int fd = -1, err = 0;
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      why = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      err = errno;
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0 && err == EADDRNOTAVAIL) {
    spdlog::warn("dist: MASTER_ADDR '{}' is not an address of rank 0's machine (a NAT or service address?): the "
                 "rendezvous store listens on every address", host);
    return -1;
  }
  if (fd < 0)
    fail("dist: rank 0 cannot host the rendezvous store on ", host, ":", port, " (MASTER_ADDR:MASTER_PORT",
         err == EADDRINUSE ? "; in use by another program?" : "", "): ", why);
  return fd;
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// Which ranks are gone when a collective fails. Every rank adds 1 to its
// counter "beat/<rank>" in the rendezvous store every kBeat (a thread with a
// store client of its own); after a failure, the counters are read twice,
// kSilent apart: a rank whose counter did not move has stopped (killed,
// crashed) or is frozen (SIGSTOP, a hung machine). A store that cannot be
// read means rank 0, which hosts it, is gone (or the agent's, under torchrun).
class Heartbeat {
 public:
  static constexpr milliseconds kBeat{250}, kSilent{1500};

  Heartbeat(const std::string& host, int port, const std::string& prefix, int rank, int size)
      : rank_(rank), size_(size) {
    c10d::TCPStoreOptions so;
    so.port = uint16_t(port);
    so.isServer = false;
    so.waitWorkers = false;
    so.timeout = milliseconds(3000);
    store_ = c10::make_intrusive<c10d::PrefixStore>(prefix, c10::make_intrusive<c10d::TCPStore>(host, so));
    store_->add(key(rank_), 1);
    thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!cv_.wait_for(lock, kBeat, [this] { return stop_; })) {
        try {
          store_->add(key(rank_), 1);
        } catch (const std::exception&) {  // the store is gone: a failing collective will say so
        }
      }
    });
  }
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // "rank 1 stopped or hangs (...)" / "rank 0, which hosts the rendezvous
  // store, stopped (...)" / "" when every rank is alive. Takes kSilent.
  std::string silent_ranks() {
    std::vector<int64_t> before(size_t(size_), 0);
    try {
      for (int r = 0; r < size_; ++r) before[size_t(r)] = store_->add(key(r), 0);
      std::this_thread::sleep_for(kSilent);
      std::string out;
      for (int r = 0; r < size_; ++r)
        if (r != rank_ && store_->add(key(r), 0) == before[size_t(r)])
          out += str_cat(out.empty() ? "rank " : ", rank ", r);
      return out.empty() ? out : out + " stopped or hangs (no heartbeat for " + std::to_string(kSilent.count()) +
                                     " ms; its own error, if any, is in its output)";
    } catch (const std::exception&) {
      return "the rendezvous store is gone: rank 0, which hosts it, stopped (its own error, if any, is in its "
             "output)";
    }
  }

 private:
  static std::string key(int r) { return "beat/" + std::to_string(r); }
  c10::intrusive_ptr<c10d::Store> store_;
  int rank_, size_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// Runs one collective (its time counts in `blocked_s`); a c10d error becomes
// one UserError line naming the silent ranks (the heartbeat) or the timeout.
template <typename F>
void guarded(const char* what, Heartbeat* hb, int world_rank, double timeout_s, double& blocked_s, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    f();
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) {
    const std::string who = hb ? hb->silent_ranks() : "";
    if (!who.empty())
      fail("dist: ", what, " failed on rank ", world_rank, ": ", who, " [", first_line(e), "]");
    fail("dist: ", what, " failed on rank ", world_rank, " (a rank stopped, or did not answer within "
         "dist.timeout_s = ", timeout_s, " s): ", first_line(e));
  }
  blocked_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::ProcessGroupGloo> pg,
                   int rank, int size, double timeout_s, std::shared_ptr<Heartbeat> hb,
                   c10::intrusive_ptr<c10d::Store> group_store, c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> po,
                   std::vector<int> world_ranks)
      : store_(std::move(store)), pg_(std::move(pg)), rank_(rank), size_(size), timeout_s_(timeout_s),
        hb_(std::move(hb)), group_store_(std::move(group_store)), po_(std::move(po)),
        world_ranks_(std::move(world_ranks)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int world_rank_of(int r) const override { return world_ranks_[size_t(r)]; }
  std::string backend() const override { return "gloo"; }

  void allreduce_sum(std::vector<torch::Tensor>& tensors) override {
    guard("all-reduce", [&] {
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      works.reserve(tensors.size());
      for (auto& t : tensors) {
        std::vector<at::Tensor> one{t};
        works.push_back(pg_->allreduce(one, c10d::AllreduceOptions{}));  // ReduceOp::SUM
      }
      for (auto& w : works) w->wait();
    });
  }

  std::unique_ptr<Pending> allreduce_sum_async(std::vector<torch::Tensor>& tensors) override {
    auto p = std::make_unique<GlooPending>(this);
    guard("all-reduce", [&] {
      for (auto& t : tensors) {
        std::vector<at::Tensor> one{t};
        p->works.push_back(pg_->allreduce(one, c10d::AllreduceOptions{}));  // ReduceOp::SUM
      }
    });
    return p;
  }

  void allreduce_max(std::vector<torch::Tensor>& tensors) override {
    guard("all-reduce (max)", [&] {
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      works.reserve(tensors.size());
      c10d::AllreduceOptions o;
      o.reduceOp = c10d::ReduceOp::MAX;
      for (auto& t : tensors) {
        std::vector<at::Tensor> one{t};
        works.push_back(pg_->allreduce(one, o));
      }
      for (auto& w : works) w->wait();
    });
  }

  void broadcast(torch::Tensor& t, int root) override {
    guard("broadcast", [&] {
      std::vector<at::Tensor> one{t};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      pg_->broadcast(one, o)->wait();
    });
  }

  void reduce_sum(torch::Tensor& t, int root) override {
    guard("reduce", [&] {
      std::vector<at::Tensor> one{t};
      c10d::ReduceOptions o;  // ReduceOp::SUM
      o.rootRank = root;
      pg_->reduce(one, o)->wait();
    });
  }

  void barrier() override {
    guard("barrier", [&] { pg_->barrier()->wait(); });
  }

  std::unique_ptr<Pending> send_async(const torch::Tensor& t, int dst, int tag) override {
    auto p = std::make_unique<GlooPending>(this, "send");
    guard("send", [&] {
      std::vector<at::Tensor> one{t};
      p->works.push_back(pg_->send(one, dst, tag));
    });
    return p;
  }

  void recv(torch::Tensor& t, int src, int tag) override {
    guard("recv", [&] {
      std::vector<at::Tensor> one{t};
      pg_->recv(one, src, tag)->wait();
    });
  }

  std::unique_ptr<Communicator> subgroup(const std::vector<int>& ranks, const std::string& name) override {
    int me = -1;
    std::vector<int> world;
    for (size_t i = 0; i < ranks.size(); ++i) {
      SNIP_CHECK(ranks[i] >= 0 && ranks[i] < size_ && (i == 0 || ranks[i] > ranks[i - 1]),
                 "subgroup: ranks must be ascending ranks of the communicator");
      if (ranks[i] == rank_) me = int(i);
      world.push_back(world_ranks_[size_t(ranks[i])]);
    }
    SNIP_CHECK(me >= 0, "subgroup: this rank is not in group ", name);
    try {
      auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>("group/" + name, group_store_), me, int(ranks.size()), po_);
      return std::make_unique<GlooCommunicator>(store_, pg, me, int(ranks.size()), timeout_s_, hb_, group_store_,
                                                po_, world);
    } catch (const std::exception& e) {
      fail("dist: rank ", world_ranks_[size_t(rank_)], " cannot set up process group ", name, " (", ranks.size(),
           " ranks): ", first_line(e));
    }
  }

  std::vector<torch::Tensor> allgather(const torch::Tensor& t) override {
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < size_; ++r) out[0].push_back(torch::empty_like(t));
    guard("all-gather", [&] {
      std::vector<at::Tensor> in{t.contiguous()};
      pg_->allgather(out, in)->wait();
    });
    return out[0];
  }

 private:
  struct GlooPending final : Pending {
    explicit GlooPending(GlooCommunicator* c, const char* w = "all-reduce") : comm(c), what(w) {}
    void wait() override {
      comm->guard(what, [&] {
        for (auto& w : works) w->wait();
      });
      works.clear();
    }
    GlooCommunicator* comm;
    const char* what;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
  };

  // Runs one collective (its time counts in blocked_s_); a c10d error becomes one UserError line.
  template <typename F>
  void guard(const char* what, F&& f) {
    guarded(what, hb_.get(), world_ranks_[size_t(rank_)], timeout_s_, blocked_s_, std::forward<F>(f));
  }

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int rank_, size_;
  double timeout_s_;
  std::shared_ptr<Heartbeat> hb_;  // the world's, shared by its subgroups
  c10::intrusive_ptr<c10d::Store> group_store_;  // the launch's PrefixStore: subgroups key their rendezvous under it
  c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> po_;
  std::vector<int> world_ranks_;  // [size] world rank of each rank of this communicator
};

#if SNIP_HAVE_NCCL
// dist.backend = nccl: ProcessGroupNCCL on this rank's CUDA device (one
// device per rank). Tensors on that device go to NCCL as they are; CPU
// tensors (the trainer's control values) are copied there and back
// (Staged). NCCL orders its work on its own streams after PyTorch's current
// stream and Work::wait() orders the current stream after it, so a device
// tensor may be used right after wait() by work on that stream. A staged
// collective (and the barrier) is waited for on the host instead
// (wait_host): polled until done or dist.timeout_s, so a peer that stopped
// is named in one line (guarded, the heartbeat) before NCCL's watchdog,
// which waits kWatchdogGrace longer, ends the process with its own dump.
class NcclCommunicator final : public Communicator {
 public:
  // How much longer than dist.timeout_s NCCL's watchdog waits: the host's
  // deadline, the heartbeat's look (Heartbeat::kSilent) and the one-line
  // error come first.
  static constexpr std::chrono::seconds kWatchdogGrace{30};

  NcclCommunicator(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg, int rank,
                   int size, torch::Device device, double timeout_s, std::shared_ptr<Heartbeat> hb)
      : store_(std::move(store)), pg_(std::move(pg)), rank_(rank), size_(size), device_(device),
        timeout_s_(timeout_s), hb_(std::move(hb)) {}

  // ~ProcessGroupNCCL without shutdown() warns (several lines) and aborts
  // the communicators. After a clean run: a last barrier, so rank 0 (which
  // hosts the TCPStore that ProcessGroupNCCL's threads still read) goes
  // last, then shutdown(). After a failed collective, or while an exception
  // unwinds (the other ranks may sit in another collective): abort().
  ~NcclCommunicator() override {
    const bool clean = !failed_ && std::uncaught_exceptions() == 0;
    try {
      if (clean) barrier();
    } catch (const std::exception& e) {
      spdlog::warn("dist: rank {}: the closing barrier failed: {}", rank_, first_line(e));
      failed_ = true;
    }
    try {
      if (failed_ || !clean) pg_->abort();
      else pg_->shutdown();
    } catch (const std::exception& e) {
      spdlog::warn("dist: rank {}: closing the nccl process group: {}", rank_, first_line(e));
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }

  void allreduce_sum(std::vector<torch::Tensor>& tensors) override {
    std::vector<Staged> st;
    guard("all-reduce", [&] {
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      for (auto& t : tensors) {
        st.push_back(stage(t));
        std::vector<at::Tensor> one{st.back().dev};
        works.push_back(pg_->allreduce(one, c10d::AllreduceOptions{}));  // ReduceOp::SUM
      }
      for (size_t i = 0; i < works.size(); ++i) wait(works[i], st[i].copy);
      for (auto& s : st) s.back();
    });
  }

  std::unique_ptr<Pending> allreduce_sum_async(std::vector<torch::Tensor>& tensors) override {
    auto p = std::make_unique<NcclPending>(this);
    guard("all-reduce", [&] {
      for (auto& t : tensors) {
        p->staged.push_back(stage(t));
        std::vector<at::Tensor> one{p->staged.back().dev};
        p->works.push_back(pg_->allreduce(one, c10d::AllreduceOptions{}));  // ReduceOp::SUM
      }
    });
    return p;
  }

  void allreduce_max(std::vector<torch::Tensor>& tensors) override {
    std::vector<Staged> st;
    guard("all-reduce (max)", [&] {
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      c10d::AllreduceOptions o;
      o.reduceOp = c10d::ReduceOp::MAX;
      for (auto& t : tensors) {
        st.push_back(stage(t));
        std::vector<at::Tensor> one{st.back().dev};
        works.push_back(pg_->allreduce(one, o));
      }
      for (size_t i = 0; i < works.size(); ++i) wait(works[i], st[i].copy);
      for (auto& s : st) s.back();
    });
  }

  void broadcast(torch::Tensor& t, int root) override {
    guard("broadcast", [&] {
      Staged s = stage(t);
      std::vector<at::Tensor> one{s.dev};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      wait(pg_->broadcast(one, o), s.copy);
      s.back();
    });
  }

  void reduce_sum(torch::Tensor& t, int root) override {
    guard("reduce", [&] {
      Staged s = stage(t);
      std::vector<at::Tensor> one{s.dev};
      c10d::ReduceOptions o;  // ReduceOp::SUM
      o.rootRank = root;
      wait(pg_->reduce(one, o), s.copy);
      s.back();
    });
  }

  void barrier() override {
    guard("barrier", [&] {
      c10d::BarrierOptions o;
      o.device_ids = {int64_t(device_.index())};
      wait(pg_->barrier(o), true);  // the host waits for it
    });
  }

  std::vector<torch::Tensor> allgather(const torch::Tensor& t) override {
    std::vector<std::vector<at::Tensor>> out(1);
    guard("all-gather", [&] {
      Staged s = stage(t.contiguous());
      for (int r = 0; r < size_; ++r) out[0].push_back(torch::empty_like(s.dev));
      std::vector<at::Tensor> in{s.dev};
      wait(pg_->allgather(out, in), s.copy);
      if (s.copy)
        for (auto& o : out[0]) o = o.to(torch::kCPU);  // the caller's device
    });
    return out[0];
  }

 private:
  // `orig` as NCCL takes it: itself on this rank's device, else a copy there
  // that back() copies into it.
  struct Staged {
    torch::Tensor orig, dev;
    bool copy = false;
    void back() {
      if (copy) orig.copy_(dev);
    }
  };
  Staged stage(const torch::Tensor& t) {
    SNIP_CHECK(t.is_contiguous(), "nccl: collectives take contiguous tensors");
    if (t.device() == device_) return {t, t, false};
    SNIP_CHECK(t.is_cpu(), "nccl: a tensor on ", t.device().str(), "; this rank's device is ", device_.str());
    return {t, t.to(device_), true};
  }

  // A collective's end: `host` (a staged tensor, the barrier): the host
  // polls it until done or dist.timeout_s (then throws, and guarded names
  // the silent rank); else Work::wait(), which only orders the current
  // stream after it (a hang there is the watchdog's, after dist.timeout_s +
  // kWatchdogGrace).
  void wait(const c10::intrusive_ptr<c10d::Work>& w, bool host) {
    if (host) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
      while (!w->isCompleted()) {
        if (std::chrono::steady_clock::now() > deadline)
          throw std::runtime_error(str_cat("no answer within dist.timeout_s = ", timeout_s_, " s"));
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
    w->wait();  // rethrows the collective's error, if any
  }

  struct NcclPending final : Pending {
    explicit NcclPending(NcclCommunicator* c) : comm(c) {}
    void wait() override {
      comm->guard("all-reduce", [&] {
        for (size_t i = 0; i < works.size(); ++i) comm->wait(works[i], staged[i].copy);
        for (auto& s : staged) s.back();
      });
      works.clear();
      staged.clear();
    }
    NcclCommunicator* comm;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    std::vector<Staged> staged;
  };

  template <typename F>
  void guard(const char* what, F&& f) {
    try {
      guarded(what, hb_.get(), rank_, timeout_s_, blocked_s_, std::forward<F>(f));
    } catch (...) {
      failed_ = true;  // the destructor aborts instead of a last barrier
      throw;
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg_;
  int rank_, size_;
  torch::Device device_;
  double timeout_s_;
  std::shared_ptr<Heartbeat> hb_;
  bool failed_ = false;  // a collective threw
};
#endif  // SNIP_HAVE_NCCL

}  // namespace

std::unique_ptr<Pending> Communicator::send_async(const torch::Tensor&, int, int) {
  fail("dist: backend ", backend(), " has no point-to-point send");
}

void Communicator::recv(torch::Tensor&, int, int) { fail("dist: backend ", backend(), " has no point-to-point recv"); }

std::unique_ptr<Communicator> Communicator::subgroup(const std::vector<int>&, const std::string&) {
  fail("dist: backend ", backend(), " has no process subgroups");
}

std::unique_ptr<Pending> Communicator::allreduce_sum_async(std::vector<torch::Tensor>& tensors) {
  struct Done final : Pending {
    void wait() override {}
  };
  allreduce_sum(tensors);
  return std::make_unique<Done>();
}

bool nccl_available() { return SNIP_HAVE_NCCL != 0; }

std::string nccl_unavailable_reason() {
  if (SNIP_HAVE_NCCL) return "";
  if (SNIP_TORCH_HAS_NCCL)
    return "this LibTorch has the NCCL process group, but no nccl.h was found when snip was built (src/torch.cmake "
           "looks for the nvidia-nccl wheel's headers next to torch; reinstall the venv's torch with its "
           "nvidia-nccl-cu* dependency and rebuild snip)";
  return "this LibTorch build has no NCCL process group (a CPU LibTorch: USE_C10D_NCCL is not defined); build snip "
         "against a CUDA LibTorch";
}

std::string nccl_version_mismatch(int major, int minor, int patch, uint64_t torch_version) {
  const uint64_t mine = (uint64_t(major) << 32) | (uint64_t(minor) << 16) | uint64_t(patch);
  if (mine == torch_version) return "";
  return str_cat("dist.backend = nccl: snip was compiled against nccl.h ", major, ".", minor, ".", patch,
                 " but LibTorch's ProcessGroupNCCL was built with NCCL ", torch_version >> 32, ".",
                 (torch_version >> 16) & 0xffff, ".", torch_version & 0xffff, " (their class layouts differ); "
                 "rebuild snip with that NCCL's headers first on the include path (the nvidia-nccl wheel that "
                 "comes with this torch: src/torch.cmake), or use dist.backend = gloo");
}

std::string handshake_value(int world_size, const std::string& backend) {
  return str_cat(world_size, " ", backend);
}

std::string handshake_mismatch(int my_rank, int my_size, const std::string& my_backend, int r,
                               const std::string& theirs) {
  const size_t sp = theirs.find(' ');
  const std::string size = theirs.substr(0, sp);
  const std::string backend = sp == std::string::npos ? "?" : theirs.substr(sp + 1);
  if (size != std::to_string(my_size))
    return str_cat("dist: world-size mismatch: rank ", r, " was started with a world of ", size, " ranks, rank ",
                   my_rank, " with ", my_size, " (WORLD_SIZE/SLURM_NTASKS must be the same on every rank)");
  if (backend != my_backend)
    return str_cat("dist: backend mismatch: rank ", r, " resolved dist.backend to ", backend, ", rank ", my_rank,
                   " to ", my_backend, " (with dist.backend = auto each rank picks nccl when it sees a CUDA device "
                   "per local rank: give every rank the same GPUs, or set dist.backend and train.device explicitly)");
  return "";
}

std::unique_ptr<Communicator> connect(const World& w, const DistOptions& opt, const torch::Device& device) {
  SNIP_CHECK(w.size > 1, "connect() needs a world of more than one rank");
  const bool nccl = opt.backend == "nccl";
  const std::string backend = nccl ? "nccl" : "gloo";
  // This rank's CUDA device under nccl: place_rank's, else resolve_train_device's for train.device = cuda.
  torch::Device dev = device;
  if (nccl) {
    if (!nccl_available()) fail("dist.backend = nccl: ", nccl_unavailable_reason(), "; or use dist.backend = gloo");
    if (!dev.is_cuda()) dev = resolve_train_device("cuda", w.size, w.local_rank, w.local_size).device;
    const int n = torch::cuda::is_available() ? int(torch::cuda::device_count()) : 0;
    if (dev.index() >= n)
      fail("dist.backend = nccl: rank ", w.rank, " (LOCAL_RANK ", w.local_rank, ") would use ", dev.str(),
           " but LibTorch sees ", n, " CUDA device", n == 1 ? "" : "s", " on its machine; use dist.backend = gloo");
#if SNIP_HAVE_NCCL
    // Before any ProcessGroupNCCL is made: its layouts follow nccl.h (the comment at the NCCL includes).
    if (const std::string m = nccl_version_mismatch(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, torch::cuda::nccl::version());
        !m.empty())
      fail(m);
#endif
  }
  const milliseconds timeout(int64_t(opt.timeout_s * 1000.0));
  const std::string where = str_cat(w.master_addr, ":", w.master_port);
  c10::intrusive_ptr<c10d::Store> tcp;
  const bool server = w.rank == 0 && !w.agent_store;
  try {
    c10d::TCPStoreOptions so;
    so.port = uint16_t(w.master_port);
    so.isServer = server;
    so.waitWorkers = false;  // the handshake below waits, with a message that names the missing rank
    so.timeout = timeout;
    if (server)
      if (const int fd = listen_socket(w.master_addr, w.master_port, w.local_size == w.size); fd >= 0)
        so.masterListenFd = fd;
    tcp = c10::make_intrusive<c10d::TCPStore>(w.master_addr, so);
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) {
    if (server)
      fail("dist: rank 0 cannot host the rendezvous store on port ", w.master_port, " (MASTER_PORT; in use by "
           "another program?): ", first_line(e));
    fail("dist: rank ", w.rank, " cannot reach the rendezvous store at ", where, " within dist.timeout_s = ",
         opt.timeout_s, " s (MASTER_ADDR/MASTER_PORT wrong, or rank 0 not started?): ", first_line(e));
  }
  // Keys of this launch only: torchrun's agent store lives across restarts.
  const std::string prefix = "snip/" + env_or("TORCHELASTIC_RESTART_COUNT", "0");
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, tcp);
  // Handshake: every rank states its world size and its backend (dist.backend = auto resolves per rank, from
  // its own devices); all must agree.
  try {
    const std::string mine = handshake_value(w.size, backend);
    store->set("world/" + std::to_string(w.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  } catch (const std::exception& e) {
    fail("dist: rank ", w.rank, " cannot write to the rendezvous store at ", where, ": ", first_line(e));
  }
  for (int r = 0; r < w.size; ++r) {
    const std::string key = "world/" + std::to_string(r);
    std::vector<uint8_t> v;
    try {
      store->wait({key}, timeout);
    } catch (const std::exception& e) {
      fail("dist: rank ", r, " did not join within dist.timeout_s = ", opt.timeout_s, " s (", w.size,
           " ranks expected at ", where, "; was it started, with the same WORLD_SIZE?)");
    }
    try {
      v = store->get(key);
    } catch (const std::exception& e) {
      // Rank 0 hosts the store: it stopped (e.g. it found a world-size
      // mismatch first) between our wait and our read.
      fail("dist: rank ", w.rank, " lost the rendezvous store at ", where, " while reading rank ", r,
           "'s world size (rank 0 stopped: see its error): ", first_line(e));
    }
    if (const std::string m = handshake_mismatch(w.rank, w.size, backend, r, std::string(v.begin(), v.end()));
        !m.empty())
      fail(m);
  }
#if SNIP_HAVE_NCCL
  if (nccl) {
    try {
      c10::cuda::set_device(dev.index());  // this process's current device: NCCL, cuBLAS, the quantizer kernels
      auto po = c10d::ProcessGroupNCCL::Options::create();
      // The watchdog's: a device collective that long ends the process; host waits give up first (wait_host).
      po->timeout = timeout + std::chrono::duration_cast<milliseconds>(NcclCommunicator::kWatchdogGrace);
      auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("nccl", store),
                                                            w.rank, w.size, po);
      pg->setBoundDeviceId(dev);  // barrier() and eager checks use this rank's device
      auto hb = std::make_shared<Heartbeat>(w.master_addr, w.master_port, prefix, w.rank, w.size);
      return std::make_unique<NcclCommunicator>(tcp, pg, w.rank, w.size, dev, opt.timeout_s, std::move(hb));
    } catch (const UserError&) {
      throw;
    } catch (const std::exception& e) {
      fail("dist: rank ", w.rank, " cannot set up the nccl process group with ", w.size, " ranks at ", where,
           " on ", dev.str(), ": ", first_line(e));
    }
  }
#endif
  try {
    auto po = c10d::ProcessGroupGloo::Options::create(timeout);
    const std::string ifname = env_or("GLOO_SOCKET_IFNAME", "");
    if (!ifname.empty()) po->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    else if (is_loopback(w.master_addr))
      po->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    else po->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    po->threads = 2;
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(
        c10::make_intrusive<c10d::PrefixStore>("gloo", store), w.rank, w.size, po);
    auto hb = std::make_shared<Heartbeat>(w.master_addr, w.master_port, prefix, w.rank, w.size);
    std::vector<int> ranks(size_t(w.size));
    for (int r = 0; r < w.size; ++r) ranks[size_t(r)] = r;
    return std::make_unique<GlooCommunicator>(tcp, pg, w.rank, w.size, opt.timeout_s, std::move(hb), store, po,
                                              std::move(ranks));
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) {
    fail("dist: rank ", w.rank, " cannot set up the gloo process group with ", w.size, " ranks at ", where, ": ",
         first_line(e));
  }
}

}  // namespace snip::dist
