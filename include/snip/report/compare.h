// snip/report/compare.h: what two runs were trained on and how, side by
// side, for `snip report RUN --reference OTHER`.
//
// A loss is nats per token of one tokenizer on one validation set: two runs'
// losses compare only when both are the same. What a run folder records:
//
//   tokenizer, vocabulary, validation set
//       the newest checkpoint's trainer_state.json "data" object
//       (tokenizer_sha256, vocab_size, val_sha256, dir; snip/train/checkpoint.h),
//       else the data folder as it is now (config.toml data.dir: meta.json's
//       tokenizer.sha256 and vocab_size, the SHA-256 of val.bin) when that
//       folder still holds the recorded tokenizer, else unknown
//   model shape      config.toml [model]
//   steps            summary.json "steps", else the last step of metrics.jsonl
//   tokens per step  config.toml train.batch_size × seq_len × grad_accum
//   evaluation       config.toml train.eval_batches (0 = the whole val.bin)
//
// Differences in model, steps, tokens per step or evaluation batches are
// what comparisons are made for: they are stated. A different tokenizer,
// vocabulary or validation set makes the losses incomparable: `snip report`
// refuses unless --force. A value a run does not record is "unknown": it is
// stated and never refuses on its own.
//
// Plain C++17, no LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace snip::report {

/// What a run folder records about its data and shape; "" or -1 = unknown.
struct RunRecord {
  std::string name;              ///< the folder's name (as the report shows it)
  std::string data_dir;          ///< the data folder it trained on (absolute when from a checkpoint)
  std::string tokenizer_sha256;  ///< hex SHA-256 of tokenizer.model, 64 digits
  int64_t vocab_size = -1;       ///< the tokenizer's vocabulary V (pieces)
  std::string val_sha256;        ///< hex SHA-256 of val.bin, 64 digits
  std::string data_source;       ///< where the three above come from: "checkpoint PATH", "data folder DIR (now)", ""
  std::string model;             ///< "C=32, 1 layer, 2/1 heads, SwiGLU 64[, V=N][, tied]" ("" = no config.toml)
  int64_t steps = -1;            ///< optimizer steps trained (or logged, for an unfinished run)
  int64_t max_steps = -1;        ///< train.max_steps
  int64_t batch_size = -1, seq_len = -1, grad_accum = -1;  ///< tokens per step = B × T × accum × replicas
  /// Data-parallel replicas (the newest checkpoint's world_size, or its
  /// pipeline's replicas; 1 when it records none or there is no checkpoint).
  int64_t replicas = 1;
  int64_t eval_batches = -1;     ///< train.eval_batches (0 = all of val.bin)
};

/// One way two runs differ: `what` ("tokenizer", "vocabulary",
/// "validation data", "data folder", "model", "steps", "tokens per step",
/// "evaluation"), each run's value as text ("unknown" when not recorded),
/// and whether it makes their losses incomparable (both values known and
/// different tokenizer, vocabulary or validation data).
struct RunDifference {
  std::string what, run, reference;
  bool incomparable = false;
  /// "what: RUN_VALUE (NAME) vs REF_VALUE (REF_NAME)", e.g.
  /// "vocabulary: 512 (a) vs 300 (b)".
  std::string line(const std::string& run_name, const std::string& ref_name) const;
};

/// The name a report gives the run folder `dir`: its last path component
/// ("runs/a/" -> "a"; "." -> the current folder's name).
std::string run_display_name(const std::string& dir);

/// Reads the record of run folder `run_dir` (see the header comment). Reads
/// only small files and val.bin (hashed when no checkpoint records it).
/// Throws UserError naming the file for an unparsable trainer_state.json,
/// summary.json or config.toml; missing files make fields unknown.
RunRecord read_run_record(const std::string& run_dir);

/// The differences between `run` and `reference`, in the order tokenizer,
/// vocabulary, validation data, data folder, model, steps, tokens per step,
/// evaluation; empty when the records agree. A field unknown on one side
/// only is a difference (value "unknown", never incomparable); unknown on
/// both is none.
std::vector<RunDifference> compare_runs(const RunRecord& run, const RunRecord& reference);

/// True when some difference makes the losses incomparable.
bool incomparable(const std::vector<RunDifference>& diffs);

}  // namespace snip::report
