// A model opened to measure, not to train a run (snip/train/model_session.h).
#include "snip/train/model_session.h"

#include <filesystem>

#include "snip/core/error.h"
#include "snip/hw/platform.h"
#include "snip/model/hf.h"
#include "snip/run/checkpoint_files.h"
#include "snip/train/checkpoint.h"
#include "snip/train/memory.h"
#include "snip/train/optimizer.h"
#include "snip/train/trainer.h"

namespace snip {

namespace fs = std::filesystem;

namespace {

// The parts both openings share, after the model's weights are in: the
// GEMM dtype, the optimizer (the checkpoint's state) and, from a
// checkpoint, the copy reset() returns to.
void finish(ModelSession& s) {
  s.gemm = prepare_model(s.model, s.rc.train);
  s.optimizer = make_optimizer(s.model, s.rc.train);
  s.loader0 = s.loader->state();
  if (s.checkpoint.empty()) return;
  load_checkpoint_optimizer(s.checkpoint, s.state, *s.optimizer, s.model, s.rc.train, s.step);
  torch::NoGradGuard ng;
  for (const auto& p : s.model->parameters()) s.weights0.push_back(p.detach().clone());
}

}  // namespace

void ModelSession::reset() {
  if (checkpoint.empty()) fail("ModelSession::reset: a session opened from a Hugging Face folder keeps no copy of its weights");
  {
    torch::NoGradGuard ng;
    auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(weights0[i]);
  }
  optimizer = make_optimizer(model, rc.train);
  if (!checkpoint.empty()) load_checkpoint_optimizer(checkpoint, state, *optimizer, model, rc.train, step);
  loader->restore(loader0);
  model->set_precision(LinearPrecision{nullptr, gemm});
}

ModelSession open_checkpoint_session(const RunConfig& rc, const std::string& checkpoint, const std::string& what) {
  ModelSession s;
  s.rc = rc;
  const TrainConfig& tc = rc.train;
  const std::string train_bin = (fs::path(rc.data.dir) / "train.bin").string();
  if (!fs::exists(train_bin)) fail("data.dir: ", train_bin, " does not exist (the run's data is needed)");
  s.checkpoint = checkpoint;
  s.state = verify_checkpoint(checkpoint);
  const std::string sp = (fs::path(checkpoint) / "trainer_state.json").string();
  s.trainer_state = TrainerState::from_json(s.state, sp);
  const TrainerState& ts = *s.trainer_state;
  s.step = ts.step;
  const int64_t ranks = ts.loader_ranks();
  const int64_t run_accum = ts.pipeline ? ts.pipeline->micro_batches : tc.grad_accum;
  if (ranks < 1 || run_accum < 1)
    fail("checkpoint ", sp, ": world_size/data_parallel and micro-batches must be >= 1 (corrupt?)");
  s.accum = run_accum * ranks;
  s.B = tc.batch_size;
  s.T = tc.seq_len;
  const uint64_t seed = uint64_t(tc.seed);
  set_threads(tc.threads);
  s.loader = std::make_unique<data::TokenLoader>(train_bin, int(s.B), int(s.T), seed);
  s.loader->restore(checkpoint_loader_state(s.state, s.B, s.accum, s.loader->windows_per_epoch(), sp));
  torch::manual_seed(seed);
  const LlamaConfig mcfg = LlamaConfig::from_run_config(rc.model, s.loader->vocab_size());
  check_memory(training_memory(mcfg, s.B, s.T), hw::available_memory_bytes(), what);
  s.model = LlamaForCausalLM(mcfg);
  load_checkpoint_weights(checkpoint, s.model);
  finish(s);
  return s;
}

ModelSession open_hf_session(const RunConfig& rc, const std::string& hf_dir, const std::string& train_bin,
                             int64_t batch, const std::string& what) {
  ModelSession s;
  s.rc = rc;
  const TrainConfig& tc = rc.train;
  s.B = batch;
  s.T = tc.seq_len;
  check_memory(training_memory(read_hf_folder(hf_dir).config, s.B, s.T), hw::available_memory_bytes(), what);
  set_threads(tc.threads);
  s.model = import_hf(hf_dir);
  s.loader = std::make_unique<data::TokenLoader>(train_bin, int(s.B), int(s.T), uint64_t(tc.seed));
  finish(s);
  set_lr(*s.optimizer, tc.lr);
  return s;
}

}  // namespace snip
