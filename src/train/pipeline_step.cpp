// One optimizer step under pipeline stages (see train/pipeline_step.h).
#include "pipeline_step.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <memory>

#include "snip/dist/data_parallel.h"
#include "snip/method/nonfinite.h"
#include "snip/train/optimizer.h"
#include "snip/core/error.h"

namespace snip {

namespace {

using torch::Tensor;

// Message tags: training micro-batch m uses 2m (activation) and 2m + 1
// (gradient); the stats step's passes count from kStatsTag.
constexpr int kStatsTag = 1 << 20;

// Sends and receives of one stage with its neighbours (pipe group ranks =
// stages), counting the bytes that cross and the time spent waiting.
struct Boundary {
  PipelineContext& p;
  std::vector<std::unique_ptr<dist::Pending>> sends;
  std::vector<Tensor> in_flight;  // kept alive until their send completed
  int64_t bytes = 0;
  double wait_s = 0;

  std::vector<int64_t> shape(const StepContext& c) const { return {c.B, c.T, c.model->cfg.hidden_size}; }

  // `t` [B, T, C] to stage `to`: FP32, or under fp8 its codes and scale
  // (E5M2 for a `gradient`, else E4M3; dist::boundary_encode).
  void send(const Tensor& t, int to, int tag, bool gradient, bool fp8) {
    Tensor buf = t.detach().to(torch::kFloat).contiguous();
    buf = fp8 ? dist::boundary_encode(buf, gradient) : buf.clone();
    bytes += buf.numel() * int64_t(buf.element_size());
    in_flight.push_back(buf);
    sends.push_back(p.pipe->send_async(buf, to, tag));
  }
  Tensor recv(const StepContext& c, int from, int tag, at::ScalarType dtype, bool gradient, bool fp8) {
    Tensor out = torch::empty(shape(c), torch::kFloat);
    Tensor buf = fp8 ? torch::empty({out.numel() + 4}, torch::kUInt8) : out;
    const auto t0 = std::chrono::steady_clock::now();
    p.pipe->recv(buf, from, tag);
    wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (fp8) dist::boundary_decode(buf, gradient, out);
    return out.to(dtype);
  }
  void finish() {
    for (auto& s : sends) s->wait();
    sends.clear();
    in_flight.clear();
  }
};

// The global gradient norm of every stage's gradients, and this stage's
// gradients clipped to `max_norm`: clip_grad_norm_'s arithmetic (LibTorch,
// norm type 2) on the [P] per-parameter norms of every stage
// (dist::zero_clip_grad_norm): each stage fills its own, the sum over the
// pipeline is exact (x + 0 = x). Collective over the pipeline.
double clip_stage_gradients(PipelineContext& p, double max_norm) {
  torch::NoGradGuard ng;
  const dist::ZeroPartition& part = p.norm_part;
  const size_t P = part.params.size();
  Tensor norms = torch::zeros({int64_t(P)}, torch::kFloat);
  for (size_t i = 0; i < P; ++i)
    if (part.owner[i] == p.stage && part.params[i].grad().defined())
      norms[int64_t(i)].copy_(part.params[i].grad().data().norm(2.0));
  std::vector<Tensor> v{norms};
  p.pipe->allreduce_sum(v);
  const Tensor total = P == 1 ? norms[0] : norms.norm(2.0);
  const Tensor clip = torch::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
  for (Tensor& t : p.stage_params)
    if (t.grad().defined()) t.mutable_grad().data().mul_(clip);
  return total.item().toDouble();
}

}  // namespace

StepResult pipeline_step(StepContext& c, PipelineContext& p, int64_t step, double lr) {
  SNIP_CHECK(!c.comm && !c.reducer && !c.zero, "pipeline_step: ctx.comm, reducer and zero must be unset");
  set_lr(c.optimizer, lr);
  c.model->set_step(c.seed, step);
  c.optimizer.zero_grad();
  const int S = p.layout.stages, D = p.layout.replicas, s = p.stage;
  const int64_t M = p.micro_batches;
  const bool first = s == 0, last = s == S - 1;
  const int64_t b0 = p.layout.bounds[size_t(s)], b1 = p.layout.bounds[size_t(s) + 1];
  const at::ScalarType act = c.model->model->embed_tokens->weight.scalar_type();
  StepResult r;

  // ---- the step's micro-batches (every rank reads all M·D: the loader
  // position stays that of a one-process step)
  const size_t nm = size_t(M);
  std::vector<Tensor> ids(nm), targets(nm);
  {
    std::vector<int32_t> in, tg, other_in, other_tg;
    for (int64_t m = 0; m < M; ++m) {
      for (int k = 0; k < D; ++k)
        if (k == p.replica) c.loader.next(in, tg);
        else c.loader.next(other_in, other_tg);
      ids[size_t(m)] = to_ids(in, c.B, c.T);
      targets[size_t(m)] = to_ids(tg, c.B, c.T);
    }
  }
  Boundary io{p, {}, {}};

  // ---- step boundary: the stats step's passes run through every stage.
  if (c.controller && c.controller->active()) {
    int pass = 0;
    c.controller->set_stats_pass([&](const std::vector<Tensor>& weights) {
      const int tag = kStatsTag + 2 * pass++;
      Tensor x = first ? ids[0] : io.recv(c, s - 1, tag, act, false, false).requires_grad_(true);
      Tensor out = c.model->forward_stage(x, b0, b1, first, last);
      std::vector<Tensor> inputs = weights;
      if (!first) inputs.push_back(x);
      std::vector<Tensor> g;
      if (last) {
        Tensor loss = LlamaForCausalLMImpl::loss(out, targets[0]);
        g = torch::autograd::grad({loss}, inputs, {}, false, false, /*allow_unused=*/true);
      } else {
        io.send(out, s + 1, tag, false, false);  // the stats step measures at full precision
        Tensor dy = io.recv(c, s + 1, tag + 1, act, true, false);
        g = torch::autograd::grad({out}, inputs, {dy}, false, false, /*allow_unused=*/true);
      }
      if (!first) io.send(g.back(), s - 1, tag + 1, true, false);
      io.finish();
    });
    try {
      r.precision = c.controller->begin_step(step, [] { return Tensor(); }, c.optimizer);
      if (r.precision.decided) install_precision(c.model->linear_layers(), c.controller->assignment());
    } catch (const NonFiniteStatsError& e) {
      if (!c.skip_nonfinite) throw;
      // Every rank met the same summed statistics: every rank skips.
      r.loss = r.grad_norm = std::numeric_limits<double>::quiet_NaN();
      r.grad_clip = c.grad_clip;
      r.skipped = true;
      r.nonfinite_stats = e.what();
      return r;
    }
    c.controller->set_stats_pass(nullptr);
  }
  io.bytes = 0;
  io.wait_s = 0;
  clear_operand_errors(c.model->linear_layers());  // the boundary's passes do not count

  // ---- the schedule
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Tensor> x_in(nm), out(nm), losses(nm);
  double loss_sum = 0;
  for (const auto& [forward, m] : dist::schedule_ops(p.schedule, S, s, int(M))) {
    const size_t i = size_t(m);
    if (forward) {
      if (first) {
        x_in[i] = ids[i];
      } else {
        x_in[i] = io.recv(c, s - 1, 2 * m, act, false, p.fp8_boundary).requires_grad_(true);
      }
      out[i] = c.model->forward_stage(x_in[i], b0, b1, first, last);
      if (last) {
        losses[i] = LlamaForCausalLMImpl::loss(out[i], targets[i]);
        loss_sum += losses[i].item<double>();
        out[i] = Tensor();
      } else {
        io.send(out[i], s + 1, 2 * m, false, p.fp8_boundary);
      }
    } else {
      if (last) {
        (losses[i] / double(M * D)).backward();
        losses[i] = Tensor();
      } else {
        Tensor dy = io.recv(c, s + 1, 2 * m + 1, act, true, p.fp8_boundary);
        torch::autograd::backward({out[i]}, {dy});
        out[i] = Tensor();
      }
      if (!first) {
        SNIP_CHECK(x_in[i].grad().defined(), "pipeline: no gradient reached the input of stage ", s);
        io.send(x_in[i].grad(), s - 1, 2 * m + 1, true, p.fp8_boundary);
      }
      x_in[i] = Tensor();
    }
  }
  io.finish();
  const double sched_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // ---- gradients: the tied embedding's two halves, then the replicas
  if (p.tied) {
    torch::NoGradGuard ng;
    Tensor& w = c.model->model->embed_tokens->weight;
    // A middle stage adds nothing: zeros every step (its optimizer does not
    // hold the weight, so nothing else clears the last step's sum).
    if (!w.grad().defined()) w.mutable_grad() = torch::zeros_like(w);
    else if (!first && !last) w.mutable_grad().zero_();
    std::vector<Tensor> g{w.mutable_grad()};
    p.pipe->allreduce_sum(g);
  }
  if (p.dp) dist::allreduce_gradients(*p.dp, p.stage_params);
  // loss (last stages), bubble, boundary bytes and the per-step quantization
  // error (each stage's own layers; the others add 0): one float64
  // all-reduce over the world
  {
    const std::vector<QuantLinear> layers = c.model->linear_layers();
    std::vector<double> sums{last ? loss_sum : 0.0, sched_s > 0 ? io.wait_s / sched_s : 0.0, double(io.bytes)};
    const std::vector<double> qe = take_operand_errors(layers);
    sums.insert(sums.end(), qe.begin(), qe.end());
    std::vector<Tensor> v{torch::tensor(sums, torch::kDouble)};
    p.world->allreduce_sum(v);
    const double* a = v[0].data_ptr<double>();
    loss_sum = a[0];
    r.pipe_bubble = a[1] / double(S * D);
    r.boundary_bytes = int64_t(std::llround(a[2]));
    r.operand_errors = operand_errors_from(a + 3, layers.size());
  }
  r.loss = loss_sum / double(M * D);
  const double max_norm = check_loss_and_clip_threshold(c, r, step);
  r.grad_norm = clip_stage_gradients(p, max_norm);
  if (c.skip_nonfinite && !(std::isfinite(r.loss) && std::isfinite(r.grad_norm))) {
    r.skipped = true;
    return r;
  }
  c.optimizer.step();
  return r;
}

}  // namespace snip
