// Validation losses and samples (trainer.h evaluate, first_eval_batch;
// session.h Evaluator).
#include "session.h"

#include "snip/model/quantizers.h"
#include "snip/core/error.h"

namespace snip {

namespace fs = std::filesystem;

namespace {

// Validation micro-batch losses (loss x tokens, one per batch in shard order;
// 0 for the batches of other ranks: batch i is rank i mod R's). evaluate()
// sums them in order, so R ranks that add their vectors (x + 0 = x exactly)
// and then sum get the one-process value bit for bit.
std::vector<double> eval_batch_losses(LlamaForCausalLM& model, const std::string& val_path, int64_t B, int64_t T,
                                      int64_t batches, EvalCoverage* coverage, int rank, int world) {
  torch::NoGradGuard ng;
  QuantStateFreeze freeze;  // evaluation does not feed amax histories
  data::TokenLoader val(val_path, int(B), int(T), 0);
  if (int64_t(val.vocab_size()) > model->cfg.vocab_size)
    fail(val_path, ": vocabulary ", val.vocab_size(), " is larger than the model's ", model->cfg.vocab_size,
         " (data prepared with another tokenizer?)");
  const uint64_t W = val.num_windows();
  uint64_t n = batches > 0 ? std::min<uint64_t>(W, uint64_t(batches) * B) : W;
  std::vector<int32_t> in, tg, bin, btg;
  std::vector<double> losses;
  uint64_t tokens = 0;
  for (uint64_t i = 0; i < n; i += B) {
    const uint64_t b = std::min<uint64_t>(B, n - i);
    tokens += b * T;
    if (int64_t(losses.size()) % world != rank) {
      losses.push_back(0.0);
      continue;
    }
    bin.clear(), btg.clear();
    for (uint64_t k = 0; k < b; ++k) {
      val.window(i + k, in, tg);
      bin.insert(bin.end(), in.begin(), in.end());
      btg.insert(btg.end(), tg.begin(), tg.end());
    }
    torch::Tensor logits = model(to_ids(bin, b, T));
    losses.push_back(LlamaForCausalLMImpl::loss(logits, to_ids(btg, b, T)).item<double>() * double(b * T));
  }
  if (coverage) {
    coverage->windows = n;
    coverage->windows_total = W;
    coverage->batches = (n + uint64_t(B) - 1) / uint64_t(B);
    coverage->batches_total = (W + uint64_t(B) - 1) / uint64_t(B);
    coverage->tokens = tokens;
  }
  losses.push_back(double(tokens));  // the last entry: the token count
  return losses;
}

double sum_eval_losses(const std::vector<double>& losses) {
  double sum = 0;
  for (size_t i = 0; i + 1 < losses.size(); ++i) sum += losses[i];
  return sum / losses.back();
}

// Validation loss over R ranks: each evaluates every R-th batch (see
// eval_batch_losses); the per-batch vector is summed over the ranks.
double evaluate_dist(LlamaForCausalLM& model, const std::string& val_path, int64_t B, int64_t T, int64_t batches,
                     dist::Communicator* comm) {
  if (!comm) return evaluate(model, val_path, B, T, batches);
  std::vector<double> l = eval_batch_losses(model, val_path, B, T, batches, nullptr, comm->rank(), comm->size());
  l.back() = comm->rank() == 0 ? l.back() : 0.0;  // the token count once
  std::vector<torch::Tensor> t{torch::tensor(l, torch::kDouble)};
  comm->allreduce_sum(t);
  const double* p = t[0].data_ptr<double>();
  return sum_eval_losses(std::vector<double>(p, p + t[0].numel()));
}

}  // namespace

double evaluate(LlamaForCausalLM& model, const std::string& val_path, int64_t B, int64_t T, int64_t batches,
                EvalCoverage* coverage) {
  return sum_eval_losses(eval_batch_losses(model, val_path, B, T, batches, coverage, 0, 1));
}

EvalBatch first_eval_batch(LlamaForCausalLM& model, const std::string& val_path, int64_t B, int64_t T) {
  torch::NoGradGuard ng;
  QuantStateFreeze freeze;
  data::TokenLoader val(val_path, int(B), int(T), 0);
  if (int64_t(val.vocab_size()) > model->cfg.vocab_size)
    fail(val_path, ": vocabulary ", val.vocab_size(), " is larger than the model's ", model->cfg.vocab_size,
         " (data prepared with another tokenizer?)");
  const uint64_t b = std::min<uint64_t>(uint64_t(B), val.num_windows());
  std::vector<int32_t> in, tg, bin;
  for (uint64_t k = 0; k < b; ++k) {
    val.window(k, in, tg);
    bin.insert(bin.end(), in.begin(), in.end());
  }
  EvalBatch e;
  e.input_ids = to_ids(bin, b, T);
  e.logits = model(e.input_ids).to(torch::kFloat).contiguous();
  return e;
}

Evaluator::Evaluator(TrainSession& s) : s_(s) {
  // A short sample at each evaluation, to see what the model learned. A
  // sample that cannot be made is a warning, never the run's end.
  const TrainConfig& tc = s.tc();
  sample_opts_.max_new_tokens = tc.sample_tokens;
  if (!s.chatty || sample_opts_.max_new_tokens <= 0 || s.opts.snip_data.empty()) return;
  try {
    sampler_ = std::make_unique<data::TokenizerClient>(s.opts.snip_data, (s.data_dir / "tokenizer.model").string());
    prompt_ = sampler_->encode(tc.sample_prompt, /*bos=*/true);
    sample_opts_.eos_id = data::TokenizerMeta::read(s.data_dir.string()).eos_id;
    sample_opts_.vocab_limit = int64_t(s.data_info.vocab_size);  // a larger model vocabulary: its extra ids decode to nothing
  } catch (const std::exception& e) {
    spdlog::warn("no samples at evaluations: {}", e.what());
    sampler_.reset();
  }
}

double Evaluator::validation_loss() {
  return evaluate_dist(s_.model, s_.val_bin, s_.B, s_.T, s_.tc().eval_batches, s_.comm.get());
}

void Evaluator::print_sample() {
  if (!sampler_) return;
  QuantStateFreeze freeze;  // nor does sampling
  try {
    sample_opts_.seed = s_.seed + uint64_t(s_.step);
    std::string text = sampler_->decode(sample(s_.model, prompt_, sample_opts_));
    // One line, no terminal control bytes (an untrained model writes any piece).
    for (char& c : text)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
    std::fprintf(stderr, "sample: %s\n", text.c_str());
  } catch (const std::exception& e) {
    spdlog::warn("no more samples: {}", e.what());
    sampler_.reset();
  }
}

}  // namespace snip
