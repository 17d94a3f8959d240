// snip/model/hf.h: Hugging Face import/export (config.json + model.safetensors)
// and tensor <-> safetensors record conversion.
//
// A Hugging Face Llama folder holds `config.json` (LlamaConfig fields) and
// `model.safetensors` with the parameter names of llama.h. Export writes
// float32 (or bfloat16) tensors; import accepts F32, BF16, F16 and F64 and
// converts to the model's float32 master weights.
#pragma once

#include <torch/torch.h>

#include <string>

#include "snip/model/llama.h"
#include "snip/io/safetensors.h"

namespace snip {

/// A CPU tensor as a safetensors record (dtype from the tensor: F32, F64,
/// BF16, F16, I64, I32). Throws std::logic_error for other dtypes.
io::TensorRecord to_record(const std::string& name, const torch::Tensor& t);

/// A safetensors record as a new CPU tensor of the record's dtype and shape.
/// Throws UserError for dtypes LibTorch 1.13 has no tensor type for (F8_*, U16..U64).
torch::Tensor from_record(const io::TensorRecord& r);

/// Parameters of `model` (HF names) into a SafeTensors value, as `dtype`
/// (at::kFloat or at::kBFloat16), with metadata {"format": "pt"}.
io::SafeTensors model_to_safetensors(LlamaForCausalLM& model, at::ScalarType dtype = at::kFloat);

/// Copies every parameter of `model` from `st` (converted to the parameter's
/// dtype). Throws UserError "<what>: missing tensor 'name'", "... tensor
/// 'name' has shape [a, b], expected [c, d]" or "... unexpected tensor 'x'"
/// (a tied checkpoint's absent lm_head.weight is expected).
void load_model_from_safetensors(LlamaForCausalLM& model, const io::SafeTensors& st, const std::string& what);

/// Writes `dir`/config.json and `dir`/model.safetensors atomically (dir is
/// created; `dtype` float32 or bfloat16). Throws UserError, writing nothing,
/// if dir is not writable, if it is a checkpoint folder of a run (it holds a
/// trainer_state.json, or is named checkpoints/ or sits in one), or if it is
/// not empty and `force` is false; and when a write fails (disk full), after
/// removing the folder if this call created it.
void export_hf(LlamaForCausalLM& model, const std::string& dir, at::ScalarType dtype = at::kFloat,
               bool force = false);

/// Reads a Hugging Face Llama folder into a new float32 model. Throws
/// UserError naming the file for a missing/invalid config.json or weights.
LlamaForCausalLM import_hf(const std::string& dir);

}  // namespace snip
