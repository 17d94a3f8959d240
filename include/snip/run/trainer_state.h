// snip/run/trainer_state.h: a checkpoint's trainer_state.json as a typed
// record: where the run stands after `step` optimizer steps, written by the
// trainer's Checkpointer and read through this one type by --resume, a
// rollback, the pipeline stages' saved split, `snip correlate` and `snip
// sample` (`snip report --reference` reads it leniently as JSON: a report
// shows what it can of a damaged run).
//
// verify_checkpoint (checkpoint_files.h) checks the file's values (ranges,
// hashes, CRC-32s) before anything reads it; from_json reads what it
// verified. Parts that belong to one component stay JSON owned by it: the
// precision controller's state (method/controller.h state()), the guard's
// (train/guard.h), LoRA's base reference, the loader base and the rollback
// record. Keys this type does not know (the checkpoint writer's "crc32",
// "rollback_target", "validation", and any later addition) are kept in
// `extra`, so from_json then to_json gives the file's JSON back unchanged
// (a file without "val_loss", from before snip wrote it, gains a null one).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/data/loader.h"

namespace snip {

/// The data a checkpoint was trained on ("data"; absent in checkpoints
/// written before snip recorded it).
struct TrainerStateData {
  std::string dir;               ///< the data folder, absolute
  std::string tokenizer_sha256;  ///< SHA-256 of the tokenizer model, 64 lower-case hex digits
  int64_t vocab_size = 0;        ///< tokens of the tokenizer
  std::optional<std::string> val_sha256;  ///< SHA-256 of val.bin (absent in older checkpoints)
  nlohmann::json tokenizer;      ///< the tokenizer's record (data/data_folder.h tokenizer_record); null = absent
  std::optional<int64_t> seq_len;  ///< T, tokens per sequence (absent in older checkpoints)
};

/// How pipeline stages split the model ("pipeline"; dist/pipeline.h).
struct TrainerStatePipeline {
  int64_t stages = 1;               ///< S
  int64_t replicas = 1;             ///< data-parallel replicas of every stage
  std::vector<int64_t> bounds;      ///< [S + 1] block bounds of the stages
  std::string schedule;             ///< "gpipe" or "1f1b" (dist.pipeline_schedule)
  int64_t micro_batches = 1;        ///< per step and replica
};

/// trainer_state.json (header comment). Optional fields are absent from
/// the file when unset.
struct TrainerState {
  int64_t step = 0;                    ///< optimizer steps completed
  std::optional<int64_t> tokens;       ///< tokens of the trajectory, every rank's (absent in older checkpoints)
  data::LoaderState loader;            ///< rank 0's loader position (epoch, cursor)
  uint64_t seed = 0;                   ///< train.seed
  std::optional<double> val_loss;      ///< the last validation loss, nats/token; always written (null = none)
  std::optional<double> elapsed_s;     ///< wall time of every invocation so far, seconds
  std::optional<std::vector<int64_t>> resumed_at;  ///< the steps at which sessions resumed the run
  std::optional<TrainerStateData> data;
  std::optional<double> init_val_loss;  ///< validation loss before the first step (--init-from), nats/token
  nlohmann::json precision;            ///< the controller's state(); null = absent (policy none)
  std::optional<int64_t> world_size;   ///< ranks (absent = 1)
  std::optional<int64_t> data_parallel;  ///< the loader's ranks under pipeline stages (absent = world_size)
  std::optional<TrainerStatePipeline> pipeline;
  std::optional<int64_t> zero_stage;   ///< train.zero_stage when > 0
  nlohmann::json loader_base;          ///< where the run last changed its number of ranks; null = absent
  nlohmann::json guard;                ///< the guard's state; null = absent (guard off)
  nlohmann::json lora;                 ///< LoRA's base reference; null = absent
  nlohmann::json rollback_record;      ///< the rollback this checkpoint records; null = absent
  nlohmann::json extra = nlohmann::json::object();  ///< keys not typed here (header comment)

  /// The loader's ranks: data_parallel, else world_size, else 1.
  int64_t loader_ranks() const { return data_parallel.value_or(world_size.value_or(1)); }

  nlohmann::json to_json() const;
  /// From a verified trainer_state.json (verify_checkpoint). Checks every
  /// typed field: integers are JSON integers in range (step, tokens >= 0;
  /// ranks >= 1; data.vocab_size >= 1; data.seq_len in [1, 2^24];
  /// zero_stage 0-2; pipeline bounds ascending from 0 with a block per stage,
  /// schedule gpipe or 1f1b), losses finite and >= 0. Throws UserError
  /// "<what>: <field>: expected ..., got <value>" naming the first bad field.
  static TrainerState from_json(const nlohmann::json& j, const std::string& what);
};

}  // namespace snip
