// snip/run/checkpoint_files.h: the files of a checkpoint folder, read,
// checked and found without LibTorch (layout: snip/train/checkpoint.h), so
// that what a run reads back is testable and fuzzable alone (tests/fuzz).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/config/llama_config.h"
#include "snip/data/loader.h"  // LoaderState (a plain struct)

namespace snip {

/// CRC-32 (zlib, ISO 3309) of `bytes`.
uint32_t crc32_of(const std::string& bytes);

/// CRC-32 of the file at `path`. Throws UserError when it cannot be read.
uint32_t file_crc32(const std::string& path);

/// The complete checkpoints under the folder `checkpoints_dir` (folders
/// step-N holding a trainer_state.json), oldest first, as (N, path). A
/// complete step-N.old (the checkpoint save_checkpoint renames aside before
/// it puts a rewritten step-N in its place) stands for step N while no
/// complete step-N is there: a process killed between the two renames loses
/// no checkpoint. With `warn`, every other entry (a stray folder, a step
/// number past 2^63 - 1, a step-N without trainer_state.json) is named in a
/// warning and ignored; step-N.tmp folders and NAME.tmp.PID files (writes
/// cut short), good.json and last_good.json are expected.
std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& checkpoints_dir, bool warn);

/// The model shape `dir`/config.json describes (LlamaConfig::from_hf_json).
/// Throws UserError naming the file for invalid JSON or a bad field.
LlamaConfig checkpoint_model_config(const std::string& dir);

/// A checkpoint's manifest.json: the size and CRC-32 of each of its files,
/// {"format": "snip-checkpoint", "version": 1, "files": {"model.safetensors":
/// {"bytes": N, "crc32": C}, ...}}. save_checkpoint writes it last, so a
/// folder whose files match it is complete.
struct CheckpointManifest {
  struct File {
    uint64_t bytes = 0;  ///< the file's size, bytes
    uint32_t crc32 = 0;  ///< CRC-32 (crc32_of) of its bytes
  };
  std::map<std::string, File> files;  ///< by file name within the checkpoint folder

  /// The entry of `dir`/`name` as it is now (reads the file; UserError when it cannot).
  static File of_file(const std::string& dir, const std::string& name);
  nlohmann::json to_json() const;
  /// Inverse of to_json. Throws UserError "<what>: ..." for another format
  /// or version, a missing "files" object, or an entry without an unsigned
  /// "bytes" and a 32-bit "crc32" ("<what>: files.NAME: missing its bytes and
  /// crc32 (corrupt manifest)").
  static CheckpointManifest from_json(const nlohmann::json& j, const std::string& what);
};

/// Writes `dir`/manifest.json (atomically) from the bytes of the files now
/// in the checkpoint folder `dir`: model.safetensors, config.json,
/// trainer_state.json and the optimizer's files (save_checkpoint's last file;
/// tests that edit a checkpoint on purpose reseal it with this). The
/// optimizer's files: `optimizer_files` when given, else those
/// checkpoint_optimizer_files finds. Throws UserError when a file cannot be
/// read or the manifest written.
void write_checkpoint_manifest(const std::string& dir, const std::vector<std::string>& optimizer_files = {});

/// The optimizer's files of the checkpoint folder `dir`: {"optimizer.pt"},
/// or, when `dir` holds optimizer_index.json (ZeRO, dist/zero.h), it and the
/// shards its "files" names. Throws UserError naming the index when it is
/// not JSON or its "files" is not a list of optimizer-rank<r>.safetensors.
std::vector<std::string> checkpoint_optimizer_files(const std::string& dir);

/// trainer_state.json of the checkpoint folder `dir`, after checking that the
/// size and CRC-32 of every file (trainer_state.json included) match
/// manifest.json (a checkpoint without one, from an older snip, is read with a
/// warning), that its "crc32" entries match, and that its fields are
/// well-formed: step an integer in [0, 2^63) matching the folder name,
/// loader.epoch and loader.cursor non-negative integers, seed a non-negative
/// integer, elapsed_s (when present) finite and >= 0 seconds, val_loss a
/// number or null, precision an object, data (when present) an object with
/// "tokenizer_sha256" (64 hex digits), "dir" and, when present, "val_sha256"
/// (64 lower-case hex digits), resumed_at (when present) an ascending list
/// of steps in [0, step], tokens (when present; tokens trained up to step)
/// a non-negative integer, rollback_record (when present; the record of the
/// guard's rollback that rewrote this checkpoint) an object with an integer
/// step and rollback_to equal to step. Older checkpoints lack val_sha256,
/// resumed_at and tokens:
/// unknown, not an error. Throws UserError naming the file and
/// what is wrong (missing, corrupt JSON, checksum mismatch, bad field).
nlohmann::json verify_checkpoint(const std::string& dir);

/// The loader position of a verified trainer_state.json `state`, checked
/// against its step: a run that draws `batch` x `grad_accum` windows per step
/// from an epoch of `windows_per_epoch` windows (TokenLoader, world 1) is at
/// epoch·W + cursor = base_windows + (step - base_step)·batch·grad_accum with
/// cursor < W, where "loader_base": {"step", "windows"} is where the run last
/// changed its number of ranks (absent: 0, 0); `grad_accum` is the
/// micro-batches per step of every rank together since then. Throws
/// UserError naming `what` (the file) when it is not: a corrupt file, or a
/// data folder that changed since the checkpoint.
data::LoaderState checkpoint_loader_state(const nlohmann::json& state, int64_t batch, int64_t grad_accum,
                                          uint64_t windows_per_epoch, const std::string& what);

/// The hex SHA-256 of the tokenizer a verified trainer_state.json `state`
/// was trained with ("data"."tokenizer_sha256"; "" for checkpoints written
/// before snip recorded it).
std::string checkpoint_tokenizer_sha256(const nlohmann::json& state);

/// The absolute data folder a verified trainer_state.json `state` was
/// trained on ("data"."dir"; "" when not recorded).
std::string checkpoint_data_dir(const nlohmann::json& state);

/// Path of the newest complete checkpoint of RUN ("" if none).
std::string latest_checkpoint(const std::string& run_dir);

/// Path of the checkpoint RUN/checkpoints/last_good.json names, as
/// complete_checkpoints finds it ("" if none, or if it no longer exists).
std::string last_good_checkpoint(const std::string& run_dir);

}  // namespace snip
