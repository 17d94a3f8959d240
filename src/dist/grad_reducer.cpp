// The gradient reducers of a data-parallel step (grad_reducer.h).
#include "snip/dist/grad_reducer.h"

#include <optional>

#include "snip/core/error.h"

namespace snip::dist {
namespace {

class AllReduce : public GradReducer {
 public:
  explicit AllReduce(Communicator& comm) : comm_(comm) {}
  const char* name() const override { return "allreduce"; }
  ReduceBytes reduce(const std::vector<torch::Tensor>& params, uint64_t, int64_t) override {
    allreduce_gradients(comm_, params);
    return {};
  }

 private:
  Communicator& comm_;
};

class Overlapped : public GradReducer {
 public:
  Overlapped(Communicator& comm, const GradComm* gc) : comm_(comm), gc_(gc) {}
  const char* name() const override { return "overlapped"; }
  void begin(const std::vector<torch::Tensor>& params) override { sync_.emplace(comm_, params); }
  void before_last_backward() override {
    SNIP_CHECK(sync_, "GradReducer: before_last_backward without begin");
    sync_->arm();
  }
  ReduceBytes reduce(const std::vector<torch::Tensor>& params, uint64_t, int64_t) override {
    SNIP_CHECK(sync_, "GradReducer: reduce without begin");
    sync_->finish();
    sync_.reset();
    if (!gc_) return {};
    const int64_t b = fp32_bytes(params);  // an FP32 format sends the gradient as it is
    return {b, b};
  }

 private:
  Communicator& comm_;
  const GradComm* gc_;
  std::optional<GradSync> sync_;
};

class Quantized : public GradReducer {
 public:
  Quantized(Communicator& comm, GradComm& gc) : comm_(comm), gc_(gc) {}
  const char* name() const override { return "quantized"; }
  ReduceBytes reduce(const std::vector<torch::Tensor>& params, uint64_t seed, int64_t step) override {
    const int64_t format = allreduce_gradients_quantized(comm_, params, gc_, seed, step);
    return {format, gc_.sent_bytes};
  }

 private:
  Communicator& comm_;
  GradComm& gc_;
};

class Zero2 : public GradReducer {
 public:
  Zero2(Communicator& comm, const ZeroPartition& part) : comm_(comm), part_(part) {}
  const char* name() const override { return "zero2"; }
  ReduceBytes reduce(const std::vector<torch::Tensor>&, uint64_t, int64_t) override {
    reduce_gradients_to_owners(comm_, part_);
    return {};
  }

 private:
  Communicator& comm_;
  const ZeroPartition& part_;
};

}  // namespace

std::unique_ptr<GradReducer> make_grad_reducer(Communicator& comm, GradComm* gc, const ZeroPartition* zero,
                                               int zero_stage, bool overlap) {
  if (zero && zero_stage == 2) return std::make_unique<Zero2>(comm, *zero);
  if (overlap && (!gc || (gc->compressor.is_fp32() && !gc->allgather))) return std::make_unique<Overlapped>(comm, gc);
  if (gc) return std::make_unique<Quantized>(comm, *gc);
  return std::make_unique<AllReduce>(comm);
}

}  // namespace snip::dist
