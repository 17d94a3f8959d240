// snip/train/checkpoint.h: checkpoints of a run (ARCHITECTURE.md "A run on
// disk").
//
//   RUN/checkpoints/step-N/        the state after N optimizer steps:
//     model.safetensors            every parameter, Hugging Face names, F32
//     config.json                  the model shape (Hugging Face LlamaConfig)
//     optimizer.pt                 AdamW state (LibTorch archive: m, v, step)
//     trainer_state.json           "step": N, "loader": {epoch, cursor},
//                                  "seed", "val_loss", "elapsed_s" (seconds
//                                  since the run's first step), "precision"
//                                  (the controller's state: phase, plan,
//                                  smoothed statistics, and "quantizers":
//                                  delayed scaling's amax histories and
//                                  scales per (layer, operand)) and "crc32":
//                                  {file: CRC-32 (zlib, ISO 3309)} of the
//                                  three files above
//   RUN/checkpoints/last_good.json {"step": N}: the newest checkpoint that was
//                                  written completely (its checksums computed
//                                  from the bytes on disk); what a rollback
//                                  returns to. keep-last-N never deletes it.
//
// Writes are atomic: the folder is written as step-N.tmp (each file written,
// fsynced and renamed), then renamed to step-N, so a killed run never leaves a
// torn checkpoint and "newest complete" is simply the highest step-N with a
// trainer_state.json. Later, per-rank shards plug in here.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "snip/model/llama.h"

namespace snip {

/// Writes RUN/checkpoints/step-`step`/ atomically from `model`, `opt` and
/// `state` (trainer_state.json without "crc32", which is added from the bytes
/// written), marks it last good (last_good.json), and deletes the
/// oldest complete checkpoints beyond the newest `keep` (0 = keep all; the
/// last-good one is never deleted). Returns the folder's path. Throws
/// UserError when a write fails (disk full, unwritable); nothing partial is
/// left then.
std::string save_checkpoint(const std::string& run_dir, int64_t step, LlamaForCausalLM& model,
                            torch::optim::Optimizer& opt, const nlohmann::json& state, int64_t keep);

/// trainer_state.json of the checkpoint folder `dir`, after checking that it
/// is well-formed (step matching the folder name, loader position) and that
/// the CRC-32 of every file matches. Throws UserError naming the file and
/// what is wrong (missing, corrupt JSON, checksum mismatch).
nlohmann::json verify_checkpoint(const std::string& dir);

/// Path of the newest complete checkpoint of RUN ("" if none).
std::string latest_checkpoint(const std::string& run_dir);

/// Path of the checkpoint RUN/checkpoints/last_good.json names ("" if none,
/// or if that folder no longer exists).
std::string last_good_checkpoint(const std::string& run_dir);

/// Loads the weights of a verified checkpoint into `model`, after checking
/// that its config.json describes the same model shape. Throws UserError
/// ("the model in X differs from the configured model") otherwise.
void load_checkpoint_weights(const std::string& dir, LlamaForCausalLM& model);

/// Loads AdamW state from the bytes of an optimizer.pt (`what` names the file
/// in errors). Throws UserError when the archive does not fit `opt`.
void load_optimizer_state(torch::optim::Optimizer& opt, const std::string& bytes, const std::string& what);

/// A verified checkpoint's model, built from its config.json (for
/// `snip eval`, `snip export`, `snip sample`). Throws UserError if the folder
/// is missing, incomplete or corrupt.
LlamaForCausalLM load_checkpoint_model(const std::string& dir);

}  // namespace snip
