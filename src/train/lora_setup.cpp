// SNIP-LoRA in a run (session.h, model/lora.h, docs/lora.md): the base
// (--init-from, or on a resume the checkpoint's reference, checked by
// SHA-256) frozen, adapters on lora.target, AdamW over the adapters alone,
// and the base's linear weights kept in their plan precision (FrozenBase).
#include <set>

#include "session.h"

#include "snip/io/safetensors.h"
#include "snip/train/checkpoint.h"
#include "snip/train/optimizer.h"
#include "snip/core/error.h"

namespace snip {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// What a LoRA run cannot combine with, before anything is built.
void check_lora_options(const TrainSession& s) {
  const RunConfig& rc = s.rc;
  if (s.S > 1)
    fail("lora.rank > 0: pipeline stages (dist.pipeline_stages = ", s.S, ") are not supported with adapters yet");
  if (s.zero_stage > 0)
    fail("lora.rank > 0: train.zero_stage = ", s.zero_stage, " is not supported with adapters yet "
         "(the optimizer holds the adapters alone; use zero_stage = 0)");
  // The stats step on a frozen base measures LD alone (docs/lora.md).
  if (rc.precision.needs_stats() && rc.precision.per_gemm)
    fail("lora.rank > 0: precision.granularity = gemm is not supported with adapters: a frozen base runs no wgrad "
         "GEMM and the stats step measures the fprop's loss divergence alone (no weight divergence to rank the "
         "dgrad GEMMs by); use precision.granularity = layer");
  if (rc.precision.needs_stats() && rc.precision.curvature_probes == 0 && rc.precision.first_order == FirstOrder::kDrop)
    fail("lora.rank > 0: precision.curvature_probes = 0 with precision.first_order = drop leaves the loss "
         "divergence, the only measure on a frozen base, at 0 for every layer (every plan would be arbitrary); "
         "use curvature_probes >= 1 or first_order = abs");
}

// A resumed LoRA run: the checkpoint's base (by SHA-256) and what shapes or
// scales the trained adapters, unchanged. Returns the base's reference.
LoraCheckpoint resumed_base(const TrainSession& s) {
  const LoraConfig& now = s.rc.lora;
  // --init-from on a resume: the same base at another path (its SHA-256 decides).
  const LoraCheckpoint b = lora_checkpoint_base(s.resume_ckpt, s.resume_state, "--resume", s.opts.init_from);
  // The model holds the base already: init is that folder (read_init_folder).
  SNIP_CHECK(s.init, "LoRA resume without its base folder");
  const LoraConfig& was = b.config;
  auto refuse = [&](const char* key, const std::string& v, const std::string& then) {
    fail("--resume: lora.", key, " is ", v, " but ", s.opts.run_dir, " was trained with ", then, " (", s.resume_ckpt,
         "/adapter_config.json); resume with that value, or start a new --run-dir");
  };
  if (was.rank != now.rank) refuse("rank", std::to_string(now.rank), std::to_string(was.rank));
  if (was.alpha != now.alpha) refuse("alpha", str_cat(now.alpha), str_cat(was.alpha));
  if (was.train_norms != now.train_norms)
    refuse("train_norms", now.train_norms ? "true" : "false", was.train_norms ? "true" : "false");
  if (was.dropout != now.dropout && !s.quiet)
    spdlog::warn("--resume: lora.dropout is {} but {} was trained with {}: the resumed steps will not be "
                 "bit-identical to an uninterrupted run", now.dropout, s.opts.run_dir, was.dropout);
  return b;
}

// The adapted layers are those of the checkpoint (lora.target may be
// spelled otherwise, not select otherwise).
void check_adapted_layers(const TrainSession& s, const std::vector<std::string>& adapted) {
  const std::string sp = (fs::path(s.resume_ckpt) / "model.safetensors").string();
  std::set<std::string> saved;
  for (const auto& t : io::read_safetensors(sp).tensors)
    if (t.name.size() > 14 && t.name.compare(t.name.size() - 14, 14, ".lora_A.weight") == 0)
      saved.insert(t.name.substr(0, t.name.size() - 14));
  if (saved != std::set<std::string>(adapted.begin(), adapted.end()))
    fail("--resume: lora.target selects ", adapted.size(), " layers (", adapted.empty() ? "" : adapted.front(),
         ", ...) but ", s.resume_ckpt, " holds adapters on ", saved.size(), " (",
         saved.empty() ? std::string() : *saved.begin(), ", ...); resume with the lora.target it was trained with");
}

}  // namespace

void setup_lora(TrainSession& s) {
  const bool lora_ckpt = !s.resume_ckpt.empty() && fs::exists(fs::path(s.resume_ckpt) / "adapter_config.json");
  const LoraConfig& lc = s.rc.lora;
  if (!lc.enabled()) {
    if (lora_ckpt)
      fail("--resume: ", s.resume_ckpt, " holds LoRA adapters but lora.rank is 0 (set the [lora] options it was "
           "trained with)");
    return;
  }
  check_lora_options(s);
  std::string base_dir, weights, sha;
  if (!s.resume_ckpt.empty()) {
    if (!lora_ckpt)
      fail("--resume: ", s.resume_ckpt, " holds a whole model, not adapters, but lora.rank = ", lc.rank);
    const LoraCheckpoint b = resumed_base(s);
    base_dir = b.dir, weights = b.weights, sha = b.sha256;
  } else {
    if (!s.init)
      fail("lora.rank = ", lc.rank, ": the adapters need a base model to adapt: add --init-from HF_DIR "
           "(e.g. a folder `snip export` wrote)");
    base_dir = fs::absolute(s.init->dir).lexically_normal().string();
    weights = fs::absolute(s.init->weights_path).lexically_normal().string();
    sha = base_checksum(weights);
  }
  const std::vector<std::string> adapted = attach_lora(s.model, lc, s.seed);
  if (!s.resume_ckpt.empty()) check_adapted_layers(s, adapted);
  for (auto l : s.model->linear_layers())
    if (l->lora_rank > std::min(l->in_features, l->out_features) && !s.quiet) {
      spdlog::warn("lora.rank {} is above min(IN, OUT) = {} of {}: such an adapter holds more parameters than a "
                   "full update of the layer", lc.rank, std::min(l->in_features, l->out_features), l->name);
      break;
    }
  for (auto& [n, t] : freeze_base(s.model, lc)) s.lora.trainable.push_back(t);
  s.optimizer = make_optimizer(s.lora.trainable, s.tc());
  s.lora.frozen_base = std::make_shared<FrozenBase>(weights, lc.pack_base);
  for (auto l : s.model->linear_layers())
    l->refreeze = [fb = s.lora.frozen_base](QuantLinearImpl& layer) { fb->refreeze(layer); };
  s.lora.ref = {{"base", {{"dir", base_dir}, {"weights", weights}, {"sha256", sha}}},
                {"rank", lc.rank}, {"alpha", lc.alpha}, {"adapted_layers", adapted.size()}};
}

}  // namespace snip
