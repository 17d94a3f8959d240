// snip/train/checkpoint.h: checkpoints of a run (README.md "A run on
// disk").
//
//   RUN/checkpoints/step-N/        the state after N optimizer steps:
//     model.safetensors            every parameter, Hugging Face names, F32
//     config.json                  the model shape (Hugging Face LlamaConfig)
//     optimizer.pt                 AdamW state (LibTorch archive: m, v, step)
//                                  -- or, under ZeRO (train.zero_stage >= 1):
//     optimizer_index.json         parameter name -> owner rank, shape,
//                                  offset (dist::optimizer_index)
//     optimizer-rank<r>.safetensors rank r's AdamW state by parameter name
//                                  (dist::optimizer_shard_bytes); either
//                                  layout resumes at any world size and stage
//     trainer_state.json           "step": N, "loader": {epoch, cursor},
//                                  "seed", "val_loss", "elapsed_s" (seconds
//                                  since the run's first step, summed over
//                                  its sessions), "resumed_at" (the steps at
//                                  which sessions resumed the run, ascending;
//                                  absent before snip recorded it), "data":
//                                  {"dir", "tokenizer_sha256", "vocab_size",
//                                  "val_sha256"} (what the ids mean, and the
//                                  validation set the losses are on), "precision"
//                                  (the controller's state: phase, plan,
//                                  smoothed statistics, and "quantizers":
//                                  delayed scaling's amax histories and
//                                  scales per (layer, operand)) and "crc32":
//                                  {file: CRC-32 (zlib, ISO 3309)} of the
//                                  three files above
//     manifest.json                {"format": "snip-checkpoint", "version": 1,
//                                  "files": {name: {"bytes", "crc32"}}} for
//                                  the four files above, trainer_state.json
//                                  included (written last)
//   RUN/checkpoints/last_good.json {"step": N}: the newest checkpoint that was
//                                  written completely (its checksums computed
//                                  from the bytes on disk) and passed
//                                  validation (Retention::good); what the
//                                  guard's rollback returns to. keep-last-N
//                                  never deletes it.
//   RUN/checkpoints/good.json      {"steps": [...]}: the newest
//                                  checkpoint.keep_good checkpoints that
//                                  passed validation, ascending; kept apart
//                                  from the rolling train.keep_checkpoints.
//
// Writes are atomic: the folder is written as step-N.tmp (each file written,
// fsynced and renamed), then renamed to step-N, so a killed run never leaves a
// torn checkpoint and "newest complete" is simply the highest step-N with a
// trainer_state.json. Anything else under checkpoints/ (a stray folder, a
// step number past 2^63 - 1) is ignored with a warning when a run looks for
// its newest checkpoint. Later, per-rank shards plug in here.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/core/kill_point.h"
#include "snip/config/config.h"
#include "snip/dist/world.h"
#include "snip/io/safetensors.h"
#include "snip/data/data_folder.h"
#include "snip/model/hf.h"
#include "snip/model/llama.h"
#include "snip/run/checkpoint_files.h"  // verify_checkpoint, latest_checkpoint, ...

namespace snip::dist {
struct ZeroPartition;  // snip/dist/zero.h
}

namespace snip {

/// Writes RUN/checkpoints/step-`step`/ atomically from `model`, `opt` and
/// `state` (trainer_state.json without "crc32", which is added from the bytes
/// written), marks it last good (last_good.json) when `keep.good`, and deletes the
/// oldest complete checkpoints beyond the newest `keep.keep` (0 = keep all;
/// the last-good one and those in good.json are never deleted). Throws
/// UserError, writing nothing, when a parameter is not finite. Returns the
/// folder's path. Throws UserError when a write fails (disk full, unwritable); nothing partial is
/// left then. Rewriting an existing step-N (after a rollback) renames the old
/// one to step-N.old first and deletes it only once the new one is in place:
/// at every instant one complete checkpoint of step N exists (complete_checkpoints). `extra_files` (file name -> bytes) are written into the same
/// folder before trainer_state.json, inside the same atomic rename, with their
/// CRC-32 in its "crc32" (e.g. grad_residuals.safetensors, dist.grad_comm).
///
/// ZeRO (`shards` set): every rank calls it. Each writes its
/// optimizer-rank<r>.safetensors into step-N.tmp (which rank 0 creates
/// first); the ranks then agree (one all-gather of a flag) that every shard
/// was written, and rank 0 alone writes the rest (`opt` unused; `model`,
/// `state`, `extra_files` only read on rank 0), with optimizer_index.json
/// instead of optimizer.pt, every shard's CRC-32 in trainer_state.json and
/// manifest.json, and renames. A rank that fails to write its shard makes
/// every rank throw UserError and rank 0 remove the .tmp folder. The ranks
/// share the run folder (one machine, or a shared file system). Other ranks
/// return the path without waiting for the rename (the caller's barrier).
struct OptimizerShards {
  dist::Communicator* comm = nullptr;  ///< the ranks
  std::string shard_bytes;             ///< this rank's optimizer-rank<r>.safetensors (dist::optimizer_shard_bytes)
  std::string index_json;              ///< optimizer_index.json (rank 0; dist::optimizer_index)
};
/// Which checkpoints stay (save_checkpoint).
struct Retention {
  Retention(int64_t keep_newest = 0) : keep(keep_newest) {}  // NOLINT: an int is "keep the newest N"
  int64_t keep = 0;       ///< train.keep_checkpoints: newest complete checkpoints kept; 0 = all
  int64_t keep_good = 0;  ///< checkpoint.keep_good: newest good ones kept apart (good.json); 0 = none apart
  /// This checkpoint passed validation (finite, validation loss within
  /// checkpoint.good_margin of the best): it becomes last_good.json (and
  /// enters good.json when keep_good > 0). With keep_good = 0 the trainer
  /// passes true for every checkpoint.
  bool good = true;
};
std::string save_checkpoint(const std::string& run_dir, int64_t step, LlamaForCausalLM& model,
                            torch::optim::Optimizer& opt, const nlohmann::json& state, const Retention& keep,
                            const std::map<std::string, std::string>& extra_files = {},
                            const OptimizerShards* shards = nullptr);

/// The steps RUN/checkpoints/good.json lists, ascending ({} when it is
/// absent or unreadable).
std::vector<int64_t> good_checkpoint_steps(const std::string& run_dir);

/// Puts RUN/checkpoints back in order after a process was killed while it
/// wrote there: deletes step-N.tmp folders, a step-N.old beside a complete
/// step-N and the temporary files of atomic writes (NAME.tmp.PID); renames
/// a step-N.old that complete_checkpoints reads as step N back to step-N;
/// and, when the newest checkpoint records "rollback_target": true but
/// last_good.json does not name it (killed between its rename and the
/// marker), marks it as save_checkpoint would (good.json trimmed to the
/// newest `keep_good`). Returns one line per thing done. Only the run
/// folder's lock holder may call it, and only after every rank has read
/// its checkpoint (it renames folders). Throws UserError when a file cannot
/// be read, renamed or written.
std::vector<std::string> tidy_checkpoints(const std::string& run_dir, int64_t keep_good);

/// The guard's rollback to step `step`: deletes RUN's complete checkpoints
/// after `step` (an abandoned trajectory, which --resume must not pick as the
/// newest) and drops them from good.json. Returns the steps deleted.
std::vector<int64_t> discard_checkpoints_after(const std::string& run_dir, int64_t step);

/// Loads the weights of a verified checkpoint into `model`, after checking
/// that its config.json describes the same model shape. Throws UserError
/// ("the model in X differs from the configured model") otherwise.
void load_checkpoint_weights(const std::string& dir, LlamaForCausalLM& model);

/// Loads AdamW state from the bytes of an optimizer.pt (`what` names the file
/// in errors) of the checkpoint at optimizer step `step`, then checks it
/// against `opt`'s parameters: the same parameter groups and tensor counts,
/// and per parameter with state exp_avg and exp_avg_sq of the parameter's
/// shape and dtype, all finite, exp_avg_sq >= 0, and its step in [1, step].
/// The groups keep `opt`'s configured options (lr, betas, eps, weight decay:
/// the run's config wins over the file's). Throws UserError when the archive
/// cannot be read or does not pass these checks ("... (corrupt)").
void load_optimizer_state(torch::optim::Optimizer& opt, const std::string& bytes, const std::string& what,
                          int64_t step);

/// The AdamW state of the verified checkpoint `dir` (trainer_state.json
/// `state`, at optimizer step `step`) into `opt`, whichever layout it holds
/// and whichever world size wrote it: optimizer.pt (load_optimizer_state;
/// under ZeRO, `part` set, loaded whole into a transient full AdamW made by
/// make_optimizer(model, tc) and this rank's share copied by parameter) or
/// optimizer_index.json + shards (dist::load_optimizer_shards, by name).
/// `opt` holds `part`'s parameters of this rank, or every parameter (`part`
/// null). Throws UserError naming the file that is missing or corrupt.
void load_checkpoint_optimizer(const std::string& dir, const nlohmann::json& state, torch::optim::AdamW& opt,
                               LlamaForCausalLM& model, const TrainConfig& tc, int64_t step,
                               const dist::ZeroPartition* part = nullptr);

/// True when some linear layer of `model` has a LoRA adapter (model/lora.h).
bool has_lora(LlamaForCausalLM& model);
/// The parameters that require grad (a LoRA run's adapters and trained
/// norms), by model name, F32: a LoRA checkpoint's model.safetensors.
io::SafeTensors trainable_safetensors(LlamaForCausalLM& model);

/// A LoRA checkpoint's base model (trainer_state.json "lora".base) and its
/// adapters' configuration (adapter_config.json, PEFT's layout).
struct LoraCheckpoint {
  std::string dir;      ///< the base's Hugging Face folder
  std::string weights;  ///< its model.safetensors
  std::string sha256;   ///< SHA-256 of that file when the run started
  LoraConfig config;    ///< rank, alpha, dropout, targets, init, train_norms
};
/// Reads and checks the reference: throws UserError "<what>: ..." when it is
/// missing or malformed, when the base file is gone, or when its SHA-256
/// differs from the recorded one (the base changed since the run started).
/// `moved_to` (a folder, "" = none): the base was moved there; its
/// model.safetensors must have the recorded SHA-256, and the result names it.
LoraCheckpoint lora_checkpoint_base(const std::string& dir, const nlohmann::json& state, const std::string& what,
                                    const std::string& moved_to = "");

/// A verified checkpoint's model, built from its config.json (for
/// `snip eval`, `snip export`, `snip sample`). A LoRA checkpoint gives the
/// base (checked against its SHA-256) with the adapters attached and loaded
/// (FP32, not packed). Throws UserError if the folder is missing, incomplete
/// or corrupt, or its base changed.
LlamaForCausalLM load_checkpoint_model(const std::string& dir);

/// "data"."tokenizer" of trainer_state.json: the BOS/EOS ids and special
/// pieces of `info`'s tokenizer, which checkpoint_tokenizer reads back.
nlohmann::json tokenizer_record(const data::DataFolderInfo& info);

/// The tokenizer of checkpoint `dir` (`state`: its verified
/// trainer_state.json), for `snip export` and `snip sample`: the checkpoint's
/// own tokenizer.model when it has one (every checkpoint carries it, with
/// tokenizer_config.json and special_tokens_map.json, so that a run folder
/// does not depend on its data folder staying put), else the data folder
/// trainer_state.json names ("data"."dir", or the run's config.toml data.dir)
/// when it still holds the tokenizer of the recorded SHA-256 (checkpoints of
/// earlier versions). Throws UserError naming the checkpoint and why neither
/// is usable.
/// A copy that is missing, unreadable or of another SHA-256 than trainer_state.json
/// records falls back to the data folder (with a warning). The copy's files
/// are not in trainer_state.json's CRC-32 list (is_checkpoint_tokenizer_file),
/// so a damaged copy never makes the weights unusable.
HfTokenizer checkpoint_tokenizer(const std::string& dir, const nlohmann::json& state);

/// T, the tokens per sequence checkpoint `dir` trained on: trainer_state.json
/// "data"."seq_len", else its run's config.toml train.seq_len (checkpoints
/// of earlier versions, still in their run); -1 when neither says.
int64_t checkpoint_seq_len(const std::string& dir, const nlohmann::json& state);

/// tokenizer.model, tokenizer_config.json, special_tokens_map.json: the
/// tokenizer files a checkpoint carries, checked by checkpoint_tokenizer.
bool is_checkpoint_tokenizer_file(const std::string& name);

}  // namespace snip
