// One optimizer step (see step.h).
#include "snip/train/step.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "snip/dist/grad_reducer.h"
#include "snip/model/device.h"
#include "snip/dist/zero.h"
#include "snip/method/nonfinite.h"
#include "snip/train/optimizer.h"
#include "snip/core/error.h"
#include "snip/core/kill_point.h"

namespace snip {

torch::Tensor to_ids(const std::vector<int32_t>& ids, int64_t B, int64_t T) {
  return torch::from_blob(const_cast<int32_t*>(ids.data()), {B, T}, torch::kInt).to(compute_device(), torch::kLong);
}

void clear_operand_errors(const std::vector<QuantLinear>& layers) {
  for (const QuantLinear& l : layers)
    if (l->operand_errors) l->operand_errors->take();
}

std::vector<double> take_operand_errors(const std::vector<QuantLinear>& layers) {
  std::vector<double> v;
  v.reserve(layers.size() * kNumOperands * 3);
  for (const QuantLinear& l : layers)
    for (const formats::ErrorNorms& n : l->operand_errors ? l->operand_errors->take()
                                                          : std::array<formats::ErrorNorms, kNumOperands>{})
      v.insert(v.end(), {n.sum_sq_err, n.sum_sq_ref, double(n.calls)});
  return v;
}

std::vector<std::array<formats::ErrorNorms, kNumOperands>> operand_errors_from(const double* v, size_t layers) {
  std::vector<std::array<formats::ErrorNorms, kNumOperands>> out(layers);
  for (size_t l = 0; l < layers; ++l)
    for (size_t o = 0; o < size_t(kNumOperands); ++o, v += 3) out[l][o] = {v[0], v[1], int64_t(std::llround(v[2]))};
  return out;
}

namespace {
// `v` to `digits` significant decimal digits (JSON then writes it short:
// 0.09673, not 0.09672505169293935); non-finite values as they are.
double round_sig(double v, int digits) {
  if (!std::isfinite(v) || v == 0) return v;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return std::strtod(buf, nullptr);
}
}  // namespace

std::optional<std::map<std::string, std::map<std::string, double>>> quant_error_record(
    const std::vector<QuantLinear>& layers, const StepResult& r) {
  std::map<std::string, std::map<std::string, double>> m;
  for (size_t l = 0; l < r.operand_errors.size() && l < layers.size(); ++l)
    for (int o = 0; o < kNumOperands; ++o)
      if (r.operand_errors[l][size_t(o)].calls > 0)
        m[layers[l]->name][operand_name(Operand(o))] = round_sig(r.operand_errors[l][size_t(o)].rel_error(), 4);
  if (m.empty()) return std::nullopt;
  return m;
}

double check_loss_and_clip_threshold(StepContext& c, StepResult& r, int64_t step) {
  if (!std::isfinite(r.loss) && !c.skip_nonfinite)
    fail("training diverged: loss is ", r.loss, " at step ", step + 1, " (lower train.lr or raise precision)");
  if (c.fault) c.fault(step);
  // train.clip_low_precision: a lower threshold while a layer runs below FP8
  // (decided at this step's boundary).
  r.grad_clip = c.grad_clip;
  if (c.clip_low_precision != 1.0 && c.controller && !c.controller->layers_below_fp8().empty())
    r.grad_clip = c.grad_clip * c.clip_low_precision;
  return r.grad_clip > 0 ? r.grad_clip : std::numeric_limits<double>::infinity();
}

StepResult train_step(StepContext& c, int64_t step, double lr) {
  set_lr(c.optimizer, lr);
  c.model->set_step(c.seed, step);
  if (c.zero) {  // the optimizer holds this rank's parameters only: zero every gradient as zero_grad() does
    for (auto& p : c.model->parameters())
      if (p.grad().defined()) p.mutable_grad().detach_().zero_();
  } else {
    c.optimizer.zero_grad();
  }
  StepResult r;
  double loss_sum = 0;
  const int R = c.comm ? c.comm->size() : 1, me = c.comm ? c.comm->rank() : 0;
  std::vector<int32_t> in, tg, other_in, other_tg;
  // The trained parameters (all of them, or a LoRA run's adapters: model/lora.h).
  std::vector<torch::Tensor> params;
  for (const auto& p : c.model->parameters())
    if (p.requires_grad()) params.push_back(p);
  SNIP_CHECK(!c.comm == !c.reducer, "train_step: ctx.comm and ctx.reducer go together");
  if (c.reducer) c.reducer->begin(params);  // the overlapped reducer's buckets (dist/grad_reducer.h)
  double blocked0 = 0;  // Communicator::blocked_s() before the last backward
  for (int64_t m = 0; m < c.grad_accum; ++m) {
    for (int k = 0; k < R; ++k)  // micro-batch m·R + k of the step is rank k's
      if (k == me) c.loader.next(in, tg);
      else c.loader.next(other_in, other_tg);
    const torch::Tensor ids = to_ids(in, c.B, c.T), targets = to_ids(tg, c.B, c.T);
    if (m == 0 && c.controller && c.controller->active()) {  // step boundary: stats step / re-plan
      try {
        r.precision = c.controller->begin_step(
            step, [&] { return LlamaForCausalLMImpl::loss(c.model(ids), targets); }, c.optimizer);
        if (r.precision.decided) install_precision(c.model->linear_layers(), c.controller->assignment());
      } catch (const NonFiniteStatsError& e) {
        if (!c.skip_nonfinite) throw;
        // The weights already give non-finite values: the guard decides
        // (train/guard.h "nonfinite"). The step's remaining micro-batches are
        // read, so the loader stands where a completed step leaves it. Every
        // rank met the same summed statistics, so every rank is here.
        for (int64_t rest = 1; rest < c.grad_accum; ++rest)
          for (int k = 0; k < R; ++k) c.loader.next(other_in, other_tg);
        r.loss = r.grad_norm = std::numeric_limits<double>::quiet_NaN();
        r.grad_clip = c.grad_clip;
        r.skipped = true;
        r.nonfinite_stats = e.what();
        return r;
      }
    }
    if (m == 0 && c.after_boundary) c.after_boundary();
    if (m == 0) clear_operand_errors(c.model->linear_layers());  // the boundary's passes do not count
    torch::Tensor loss = LlamaForCausalLMImpl::loss(c.model(ids), targets);
    if (m == c.grad_accum - 1) {
      if (c.comm) blocked0 = c.comm->blocked_s();
      if (c.reducer) c.reducer->before_last_backward();
    }
    (loss / double(c.grad_accum * R)).backward();
    loss_sum += loss.item<double>();
  }
  // The loss sum and the per-step quantization error: one float64 vector
  // [loss, L x 6 x (err, ref, calls)], summed over the ranks.
  const std::vector<QuantLinear> layers = c.model->linear_layers();
  std::vector<double> sums{loss_sum};
  const std::vector<double> qe = take_operand_errors(layers);
  sums.insert(sums.end(), qe.begin(), qe.end());
  if (c.comm) {
    const dist::ReduceBytes bytes = c.reducer->reduce(params, c.seed, step);
    r.grad_comm_bytes = bytes.format;
    r.grad_comm_sent_bytes = bytes.sent;
    r.comm_s = c.comm->blocked_s() - blocked0;
    std::vector<torch::Tensor> l{torch::tensor(sums, torch::kDouble)};
    c.comm->allreduce_sum(l);
    std::memcpy(sums.data(), l[0].data_ptr<double>(), sums.size() * sizeof(double));
    loss_sum = sums[0];
  }
  r.operand_errors = operand_errors_from(sums.data() + 1, layers.size());
  r.loss = loss_sum / double(c.grad_accum * R);
  const double clip = check_loss_and_clip_threshold(c, r, step);
  // Collective under ZeRO (every rank computes it, whatever the loss); the
  // reduced gradient and loss are the same on every rank, so every rank
  // takes the same branch below.
  r.grad_norm = c.zero ? dist::zero_clip_grad_norm(c.comm, *c.zero, clip)
                       : torch::nn::utils::clip_grad_norm_(params, clip);
  if (c.skip_nonfinite && !(std::isfinite(r.loss) && std::isfinite(r.grad_norm))) {
    r.skipped = true;  // no update: weights and AdamW state stay those of the previous step
    return r;
  }
  test_kill_point("step@" + std::to_string(step + 1));  // tests/cli/kill_resume.py
  c.optimizer.step();
  if (c.zero && c.comm) dist::broadcast_from_owners(*c.comm, *c.zero);  // every rank gets the owners' update
  return r;
}

}  // namespace snip
