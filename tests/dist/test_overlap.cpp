// dist/data_parallel.h GradSync without other processes: a fake communicator
// stands for R = 2 ranks holding the same gradient (its all-reduce doubles
// each tensor, exactly: x + x), so the expected result of every bucket is
// known independently: 2 x the gradient backward produced. The 2-rank runs
// (bit for bit against one process) are tests/cli/test_dist.py and
// launch_local.py, with dist.overlap on (the default).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "snip/dist/data_parallel.h"
#include "snip/dist/grad_reducer.h"

namespace snip::dist {
namespace {

// Two ranks with identical gradients. Records every bucket it is handed: its
// size, a copy of its content at that moment, and whether the test's
// backward was running (`in_backward`, set by the test around backward()).
class TwinComm final : public Communicator {
 public:
  struct Launch {
    int64_t numel;
    torch::Tensor content;
    bool during_backward;
  };
  bool in_backward = false;
  std::vector<Launch> launches;
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string backend() const override { return "twin"; }
  void allreduce_sum(std::vector<torch::Tensor>& ts) override {
    for (auto& t : ts) {
      launches.push_back({t.numel(), t.clone(), in_backward});
      t.add_(t.clone());  // the other rank's identical tensor
    }
  }
  void allreduce_max(std::vector<torch::Tensor>&) override {}
  void reduce_sum(torch::Tensor& t, int) override { t.add_(t.clone()); }
  void broadcast(torch::Tensor&, int) override {}
  void barrier() override {}
  std::vector<torch::Tensor> allgather(const torch::Tensor& t) override { return {t.clone(), t.clone()}; }
};

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), size_t(a.numel()) * a.element_size()) == 0;
}

// Three parameters of 300,000 FP32 (1.2 MB each): in reverse order, p2
// fills the first bucket (over its 1 MiB cap alone), p1 and p0 share the
// second (25 MiB cap): buckets {p2}, {p1, p0}. p2 is used twice (a tied
// weight: two contributions, one accumulator run).
struct Model {
  torch::Tensor p0, p1, p2;
  Model() {
    torch::manual_seed(3);
    p0 = torch::randn({300000}).requires_grad_();
    p1 = torch::randn({300000}).requires_grad_();
    p2 = torch::randn({300000}).requires_grad_();
  }
  std::vector<torch::Tensor> params() const { return {p0, p1, p2, p2}; }  // p2 listed twice, like a tied lm_head
  torch::Tensor loss(const torch::Tensor& x, bool use_p0 = true) const {
    torch::Tensor l = (p1 * p2 * x).sum() + (p2 * p2).sum() * 0.5;
    if (use_p0) l = l + (p0 * x).pow(2).sum();
    return l;
  }
};

// The reference of every overlapped path: two backwards accumulated, then
// allreduce_gradients after them.
Model reference_grads(const torch::Tensor& x1, const torch::Tensor& x2, TwinComm& comm) {
  Model ref;
  ref.loss(x1).backward();
  ref.loss(x2).backward();
  allreduce_gradients(comm, ref.params());
  return ref;
}

TEST(DistOverlap, BucketsStartDuringBackwardAndEqualTheAllReduceAfterIt) {
  const torch::Tensor x1 = torch::randn({300000}), x2 = torch::randn({300000});
  TwinComm ref_comm;
  const Model ref = reference_grads(x1, x2, ref_comm);
  ASSERT_EQ(ref_comm.launches.size(), 2u);
  // Overlapped: hooks armed only for the second (last) backward.
  Model m;
  TwinComm comm;
  GradSync sync(comm, m.params());
  ASSERT_EQ(sync.buckets(), 2u);
  m.loss(x1).backward();
  sync.arm();
  comm.in_backward = true;
  m.loss(x2).backward();
  comm.in_backward = false;
  EXPECT_EQ(sync.launched_in_backward(), 2u);
  sync.finish();
  ASSERT_EQ(comm.launches.size(), 2u);
  for (size_t b = 0; b < 2; ++b) {
    SCOPED_TRACE(b);
    EXPECT_TRUE(comm.launches[b].during_backward);
    // The same buckets, in the same order, with the same (final) gradients.
    EXPECT_TRUE(bitwise_equal(comm.launches[b].content, ref_comm.launches[b].content));
  }
  EXPECT_TRUE(bitwise_equal(m.p0.grad(), ref.p0.grad()));
  EXPECT_TRUE(bitwise_equal(m.p1.grad(), ref.p1.grad()));
  EXPECT_TRUE(bitwise_equal(m.p2.grad(), ref.p2.grad()));
  // Hand-derived: d/dp2 of the loss is p1·x + p2 (both uses), per backward.
  const torch::Tensor want_p2 = 2 * ((m.p1 * x1 + m.p2) + (m.p1 * x2 + m.p2));
  // (FP32, another order of the same additions: |values| up to ~50, a few ulps apart.)
  EXPECT_TRUE(torch::allclose(m.p2.grad(), want_p2.detach(), 1e-5, 1e-5));
}

TEST(DistOverlap, AParameterWithoutGradientHoldsItsBucketUntilFinish) {
  const torch::Tensor x = torch::randn({300000});
  Model m;
  TwinComm comm;
  GradSync sync(comm, m.params());
  sync.arm();
  comm.in_backward = true;
  m.loss(x, /*use_p0=*/false).backward();  // p0 gets no gradient: its bucket (the last) waits
  comm.in_backward = false;
  EXPECT_EQ(sync.launched_in_backward(), 1u);
  sync.finish();
  ASSERT_EQ(comm.launches.size(), 2u);
  EXPECT_TRUE(comm.launches[0].during_backward);
  EXPECT_FALSE(comm.launches[1].during_backward);
  EXPECT_EQ(comm.launches[1].numel, 600000);
  EXPECT_TRUE(bitwise_equal(m.p0.grad(), torch::zeros({300000})));
}

TEST(DistOverlap, BucketsStartInOrderBehindAnUnfinishedOne) {
  // p2 gets no gradient: its bucket is the first, so nothing may start
  // during backward (every rank starts its buckets in the same order).
  torch::manual_seed(4);
  torch::Tensor p0 = torch::randn({300000}).requires_grad_(), p1 = torch::randn({300000}).requires_grad_();
  torch::Tensor p2 = torch::randn({300000}).requires_grad_();
  TwinComm comm;
  GradSync sync(comm, {p0, p1, p2});
  sync.arm();
  comm.in_backward = true;
  (p0 * p1).sum().backward();
  comm.in_backward = false;
  EXPECT_EQ(sync.launched_in_backward(), 0u);
  sync.finish();
  ASSERT_EQ(comm.launches.size(), 2u);
  for (const auto& l : comm.launches) EXPECT_FALSE(l.during_backward);
  EXPECT_TRUE(bitwise_equal(p0.grad(), 2 * p1.detach()));
}

TEST(DistOverlap, HooksAreRemovedAfterFinish) {
  // A backward after finish() reports nothing: ready() would reject a second report.
  const torch::Tensor x = torch::randn({300000});
  Model m;
  TwinComm comm;
  GradSync sync(comm, m.params());
  sync.arm();
  m.loss(x).backward();
  sync.finish();
  EXPECT_NO_THROW(m.loss(x).backward());
  EXPECT_EQ(comm.launches.size(), 2u);
}

// The reducer is chosen once from the options, as grad_reducer.h's table says.
TEST(DistReducer, ChosenFromTheOptionsTable) {
  TwinComm comm;
  Model m;
  GradComm fp32{GradCompressor(recipes::RecipeSet(), "fp32", true), {}};
  GradComm gathered{GradCompressor(recipes::RecipeSet(), "fp32", true), {}, /*allgather=*/true};
  GradComm fp8{GradCompressor(recipes::RecipeSet(), "fp8", true), {}};
  const ZeroPartition part = zero_partition({"p0", "p1", "p2"}, {m.p0, m.p1, m.p2}, 2);
  EXPECT_STREQ(make_grad_reducer(comm, nullptr, nullptr, 0, false)->name(), "allreduce");
  EXPECT_STREQ(make_grad_reducer(comm, nullptr, nullptr, 0, true)->name(), "overlapped");
  EXPECT_STREQ(make_grad_reducer(comm, &fp32, nullptr, 0, true)->name(), "overlapped");
  EXPECT_STREQ(make_grad_reducer(comm, &fp32, nullptr, 0, false)->name(), "quantized");  // the exact FP32 path
  EXPECT_STREQ(make_grad_reducer(comm, &gathered, nullptr, 0, true)->name(), "quantized");
  EXPECT_STREQ(make_grad_reducer(comm, &fp8, nullptr, 0, true)->name(), "quantized");
  EXPECT_STREQ(make_grad_reducer(comm, &fp32, &part, 1, true)->name(), "overlapped");  // ZeRO-1 reduces as stage 0
  EXPECT_STREQ(make_grad_reducer(comm, &fp32, &part, 2, true)->name(), "zero2");
}

// The overlapped reducer over a step: the bits of allreduce_gradients after
// backward, and the FP32 bytes of the gradient as both byte counts.
TEST(DistReducer, OverlappedEqualsTheAllReduceAfterBackward) {
  const torch::Tensor x1 = torch::randn({300000}), x2 = torch::randn({300000});
  TwinComm ref_comm;
  const Model ref = reference_grads(x1, x2, ref_comm);
  Model m;
  TwinComm comm;
  GradComm fp32{GradCompressor(recipes::RecipeSet(), "fp32", true), {}};
  const auto reducer = make_grad_reducer(comm, &fp32, nullptr, 0, true);
  reducer->begin(m.params());
  m.loss(x1).backward();
  reducer->before_last_backward();
  comm.in_backward = true;
  m.loss(x2).backward();
  comm.in_backward = false;
  const ReduceBytes b = reducer->reduce(m.params(), 0, 0);
  ASSERT_EQ(comm.launches.size(), 2u);
  EXPECT_TRUE(comm.launches[0].during_backward);
  EXPECT_EQ(b.format, 3 * 300000 * 4);  // p2 counted once
  EXPECT_EQ(b.sent, b.format);
  EXPECT_TRUE(bitwise_equal(m.p0.grad(), ref.p0.grad()));
  EXPECT_TRUE(bitwise_equal(m.p1.grad(), ref.p1.grad()));
  EXPECT_TRUE(bitwise_equal(m.p2.grad(), ref.p2.grad()));
}

}  // namespace
}  // namespace snip::dist
