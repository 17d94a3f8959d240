// src/app/plan_measure.h: Q measured on a model itself, for `snip plan
// --config MODEL.toml --init-from HF_DIR --data DIR` (docs/planner.md): the
// stats step a re-plan of `snip train` runs (docs/method.md section 3;
// snip/method/stats.h), on a Hugging Face checkpoint and one micro-batch of
// prepared text, as a cost table for the planner.
#pragma once

#include <cstdint>
#include <string>

#include "snip/plan/cost_table.h"

namespace snip {
class Config;
}

namespace snip::app {

/// What the stats step measures on.
struct PlanMeasureRequest {
  std::string hf_dir;    ///< Hugging Face folder: config.json, model.safetensors (tokenizer.model checked if present)
  std::string data_dir;  ///< prepared data folder (train.bin, tokenizer.model, meta.json)
  int64_t batch = 1;     ///< sequences of train.seq_len tokens in the measured micro-batch
  bool per_gemm = false;  ///< one cost-table row per GEMM (fprop/dgrad/wgrad), not per layer
  bool allow_other_tokenizer = false;  ///< the data's tokenizer may differ from the model's (warns)
  std::string stats_out;  ///< when set: the measured stats are also written here (stats.h to_json; atomically)
};

/// Adopts HF_DIR's config.json into `cfg` (the shapes planned are then the
/// checkpoint's; notes on stderr), loads the model, runs one stats step on
/// the first micro-batch of DIR/train.bin in the loader's order for
/// train.seed (fresh AdamW: WD is the divergence of a first update) at every
/// option of precision.options, and returns its cost table: layers in
/// forward order, FLOPs of the measured micro-batch, Q in nats/token.
/// Throws UserError, one line, as `snip eval` does: no such folder or
/// train.bin, another tokenizer (unless allowed), a vocabulary larger than
/// the model's, too little memory.
plan::CostTable measure_plan_costs(Config& cfg, const PlanMeasureRequest& r);

}  // namespace snip::app
