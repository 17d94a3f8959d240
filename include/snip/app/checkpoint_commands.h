// snip/app/checkpoint_commands.h: `snip train`'s summary, and what `snip
// eval`, `snip export` and `snip sample` do with a checkpoint (README, "A run
// on disk" and "Starting from a Hugging Face model"). The command lines are
// src/cli/cmd_train.cpp and cmd_sample.cpp.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "snip/train/sample.h"

namespace snip {
struct TrainSummary;
}

namespace snip::app {

/// `snip train`'s end-of-run summary on rank 0: steps (and the resumed
/// session's share, the guard's events), tokens, seconds, tokens/s, the final
/// train and validation loss (nats/token) and perplexity, the best
/// validation loss, the run folder and what it holds; with pipeline stages
/// also their layout, bubble and boundary bytes (from RUN/summary.json).
void print_train_summary(const TrainSummary& s, std::ostream& out);

/// The options of `snip eval`.
struct EvalRequest {
  std::string run_dir;      ///< --run-dir: its newest checkpoint and config.toml ("" = none)
  std::string checkpoint;   ///< --checkpoint: a checkpoint folder or a Hugging Face folder
  std::string data;         ///< --data: prepared data folder (default: the run's data.dir, or the checkpoint's)
  std::string logits_out;   ///< --logits-out: also write input_ids I64 [B, T] and logits F32 [B, T, V]
  int64_t batches = 0;      ///< --batches: micro-batches to evaluate; 0 = the whole validation split
  int64_t batch = 16;       ///< --batch-size: sequences per micro-batch (B)
  int64_t seq = 0;          ///< --seq-len: tokens per sequence (T); 0 = what the model trained on
  bool allow_other_tokenizer = false;  ///< --allow-other-tokenizer
};

/// Evaluates the model of `r` (FP32 GEMMs, unquantized) on the validation
/// split and prints one line: its loss in nats/token, perplexity, and the
/// windows it covered. Throws UserError, one line, for a --run-dir that is not a
/// run, a missing or corrupt checkpoint, missing data, another tokenizer (unless allowed), a
/// vocabulary larger than the model's, too little memory.
void run_eval(const EvalRequest& r);

/// The options of `snip export`.
struct ExportRequest {
  std::string run_dir;     ///< --run-dir: its newest checkpoint ("" = none)
  std::string checkpoint;  ///< --checkpoint: a checkpoint folder
  std::string out;         ///< --out: the Hugging Face folder to write (new or empty unless force)
  std::string dtype = "float32";  ///< --dtype: float32|fp32 or bfloat16|bf16
  bool force = false;       ///< --force: replace the model and tokenizer files of a non-empty out
  bool merge = false;       ///< --merge: fold LoRA adapters into the weights (W + alpha/r B A)
  bool model_only = false;  ///< --model-only: no tokenizer files
};

/// Writes the checkpoint of `r` as a Hugging Face folder (config.json,
/// model.safetensors, the tokenizer, snip_export.json), or, for a LoRA
/// checkpoint without merge, as a PEFT adapter folder; prints what it wrote.
/// Throws UserError, one line: a --run-dir that is not a run, no
/// checkpoint, a corrupt one, merge without
/// adapters, a checkpoint without its tokenizer (unless model_only), an
/// out that is not empty (unless force) or is a checkpoint folder.
void run_export(const ExportRequest& r);

/// The options of `snip sample`.
struct SampleRequest {
  std::string run_dir;     ///< --run-dir: its newest checkpoint, with the tokenizer it carries
  std::string checkpoint;  ///< --checkpoint: a checkpoint folder or a Hugging Face folder
  std::string prompt;      ///< --prompt: the text to continue
  std::string tokenizer;   ///< --tokenizer: a tokenizer.model ("" = the checkpoint's or folder's own)
  SampleOptions o;         ///< --max-new-tokens, --temperature, --top-k (train/sample.h)
  int64_t seed = 0;        ///< --seed: seed of the draws, >= 0
};

/// The longest --max-new-tokens `snip sample` takes.
inline constexpr int64_t kMaxNewTokens = 100000;

/// Loads the model of `r`, encodes the prompt with its tokenizer (through
/// snip-data), samples (train/sample.h) and prints the decoded text.
/// Throws UserError, one line: a negative seed, a non-finite temperature,
/// more than kMaxNewTokens, no checkpoint or tokenizer, a tokenizer whose
/// ids the model does not have.
void run_sample(const SampleRequest& r);

}  // namespace snip::app
