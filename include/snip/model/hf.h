// snip/model/hf.h: Hugging Face import/export (config.json + model.safetensors)
// and tensor <-> safetensors record conversion.
//
// A Hugging Face Llama folder holds `config.json` (LlamaConfig fields) and
// `model.safetensors` with the parameter names of llama.h. Export writes F32
// (or BF16) tensors. Import (import_hf, `snip train --init-from`) reads the
// weights of every float dtype whose values FP32 holds exactly (F32, F16,
// BF16, F8_E4M3, F8_E5M2, F8_E4M3FNUZ, F8_E5M2FNUZ, F8_E8M0, F4) and F64
// (rounded to nearest) into the model's FP32 master weights; any other dtype
// (BOOL, integers, C64, F6_*) is an error naming the tensor and its dtype
// (io/tensor_values.h has the value rules; docs/formats.md the table).
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <map>
#include <string>
#include <vector>

#include "snip/data/data_folder.h"
#include "snip/io/safetensors.h"
#include "snip/model/llama.h"

namespace snip {

class Config;

/// A CPU tensor as a safetensors record (dtype from the tensor: F32, F64,
/// BF16, F16, I64, I32, C64 for complex float). Throws std::logic_error for
/// other dtypes.
io::TensorRecord to_record(const std::string& name, const torch::Tensor& t);

/// A safetensors record as a new CPU tensor of the record's dtype and shape
/// (F32, F64, BF16, F16, I64, I32, I16, I8, U8, BOOL, C64 as complex float).
/// Throws UserError for dtypes LibTorch 1.13 has no tensor type for (F8_*,
/// F4, F6_*, U16..U64); io::decode_to_f32 reads the float ones as FP32.
torch::Tensor from_record(const io::TensorRecord& r);

/// Parameters of `model` (HF names) into a SafeTensors value, as `dtype`
/// (at::kFloat or at::kBFloat16), with metadata {"format": "pt"}.
io::SafeTensors model_to_safetensors(LlamaForCausalLM& model, at::ScalarType dtype = at::kFloat);

/// Copies every parameter of `model` from `st`, each decoded to FP32 by
/// io::decode_to_f32 (dtypes: see the file comment) and converted to the
/// parameter's dtype (an F64 tensor into a float64 parameter is copied
/// without the FP32 rounding). `file_tied` is whether the file's own model ties
/// lm_head to model.embed_tokens (its config.json's tie_word_embeddings;
/// nullopt = as `model` does, e.g. a snip checkpoint). The head:
///   model tied:   lm_head.weight [V, C] may be absent; present, it must equal
///                 model.embed_tokens.weight bit for bit as stored (same dtype,
///                 same bytes), the one tensor provably redundant; otherwise
///                 refused (the file's head would be dropped).
///   model untied: lm_head.weight is loaded; absent from a file whose model is
///                 tied, the head starts as a copy of the embeddings (the
///                 file's model computes the same logits); absent otherwise:
///                 missing.
/// Returns notes, one line each, for what was not a plain copy (a redundant
/// head, a head copied from the embeddings). Throws UserError "<what>: ..."
/// for a missing tensor, a shape mismatch ("tensor 'name' has shape [a, b],
/// expected [c, d]"), a dtype that is not decoded ("tensor 'x': I64 is not
/// floating point ..."), an unused tensor ("unexpected tensor 'x' (not a
/// parameter of this model)"), a head that differs from tied embeddings, and
/// a NaN or Inf value ("tensor 'x' holds a non-finite value ..."; checked as
/// each tensor is copied: the model is then partly loaded, discard it).
std::vector<std::string> load_model_from_safetensors(LlamaForCausalLM& model, const io::SafeTensors& st,
                                                     const std::string& what,
                                                     std::optional<bool> file_tied = std::nullopt);

/// The tokenizer files export_hf writes beside the model, so the folder is
/// usable on its own (transformers' LlamaTokenizer reads them).
struct HfTokenizer {
  std::string model_path;          ///< a SentencePiece tokenizer.model, copied as is
  int64_t bos_id = -1, eos_id = -1;  ///< ids (-1 = none), written to config.json
  std::string bos_piece, eos_piece, unk_piece;  ///< their pieces ("" = none)

  /// The tokenizer of a prepared data folder (data::verify_data_folder):
  /// its tokenizer.model, BOS/EOS ids and special pieces. Reads no file.
  static HfTokenizer of_data_folder(const data::DataFolderInfo& info);
};

/// The checks export_hf and export_peft (model/lora.h) make on --out
/// `dir`, then creates it: UserError when it is empty, a checkpoint folder,
/// not empty without `force`, or holds the other kind of export (a model's
/// config.json/model.safetensors when writing `adapters`, adapter files
/// otherwise). Returns whether this call created the folder.
bool prepare_export_folder(const std::string& dir, bool force, bool adapters);

/// The tokenizer files of a Hugging Face folder for `tok`, name -> bytes:
/// tokenizer.model (a copy of tok.model_path), tokenizer_config.json
/// ({"tokenizer_class": "LlamaTokenizer", "add_bos_token": bos_id >= 0,
/// "add_eos_token": false, bos/eos/unk tokens, "model_max_length":
/// `max_positions`, "legacy": true: SentencePiece's own behaviour}) and
/// special_tokens_map.json (the bos/eos/unk pieces that are not ""). What
/// export_hf writes beside the model and every checkpoint carries
/// (save_checkpoint's extra files), so either folder is usable on its own as
/// Hugging Face Trainer's are. Throws UserError when tok.model_path cannot be
/// read.
std::map<std::string, std::string> hf_tokenizer_files(const HfTokenizer& tok, int64_t max_positions);

/// Writes `dir`/config.json and `dir`/model.safetensors atomically (dir is
/// created; `dtype` float32 or bfloat16: the tensors are F32 or BF16, the
/// only dtypes export writes). Throws UserError, writing nothing,
/// if dir is not writable, if it is a checkpoint folder of a run (it holds a
/// trainer_state.json, or is named checkpoints/ or sits in one), or if it is
/// not empty and `force` is false; and when a write fails (disk full), after
/// removing the folder if this call created it.
/// With `tokenizer`, also hf_tokenizer_files(*tokenizer,
/// max_position_embeddings) and "bos_token_id"/"eos_token_id" in config.json;
/// without it, under `force`, tokenizer files an earlier export left in dir
/// are removed (a model never sits beside another model's tokenizer).
/// `extra_files` (name -> bytes, e.g. snip_export.json) are written the same
/// way, atomically, inside the same clean-up.
void export_hf(LlamaForCausalLM& model, const std::string& dir, at::ScalarType dtype = at::kFloat,
               bool force = false, const HfTokenizer* tokenizer = nullptr,
               const std::map<std::string, std::string>& extra_files = {});

/// A Hugging Face folder's config.json, read and checked.
struct HfFolder {
  std::string dir;            ///< the folder as given
  std::string config_path;    ///< dir/config.json
  std::string weights_path;   ///< dir/model.safetensors
  nlohmann::json config_json; ///< config.json as read
  LlamaConfig config;         ///< LlamaConfig::from_hf_json(config_json): the file's model
};

/// True when `dir` is a Hugging Face model folder rather than a snip
/// checkpoint: it has config.json but no trainer_state.json (what `snip
/// eval --checkpoint` and `snip sample --checkpoint` tell apart). Reads no file.
bool is_hf_folder(const std::string& dir);

/// Reads `dir`/config.json. Throws UserError "DIR is not a folder ...",
/// "DIR is not a Hugging Face model folder: it has no config.json" (naming
/// `snip export` when DIR is a snip checkpoint), or naming the file when it
/// is not JSON or LlamaConfig::from_hf_json refuses it.
HfFolder read_hf_folder(const std::string& dir);

/// `snip train --init-from`: reconciles the run's configuration `cfg` with
/// the folder's config.json, field by field (transformers' LlamaConfig; the
/// table is in README.md, "Starting from a Hugging Face model"):
///   vocab_size, hidden_size, intermediate_size, num_hidden_layers,
///   num_attention_heads, num_key_value_heads, max_position_embeddings,
///   rms_norm_eps, rope_theta, tie_word_embeddings: the file's value
///   (transformers' default where the file has none) is taken into
///   model.<field> when the run does not set that option (cfg.values() lacks
///   it; model.vocab_size = 0 counts as unset), with a note; when the run
///   sets it, the two must be equal, else UserError, one line naming the
///   field, both values and the fix. tie_word_embeddings is the exception
///   both ways: a tied run over an untied file is decided by the weights
///   (load_model_from_safetensors: refused unless the head equals the
///   embeddings); an untied run over a tied file starts its head as a copy
///   of the embeddings (a note).
///   hidden_act, attention_bias, mlp_bias, attention_dropout, head_dim,
///   rope_scaling, rope_parameters, model_type, architectures,
///   quantization_config: checked by LlamaConfig::from_hf_json (only the
///   value snip implements is accepted).
///   initializer_range, use_cache, pretraining_tp, pad/bos/eos_token_id,
///   torch_dtype / dtype, transformers_version and PretrainedConfig's other
///   generic keys (kNoActionFields in hf.cpp): accepted, no effect on the
///   weights' function (see README).
///   Any other key: ignored, named in one note.
/// Returns the notes (one line each, without a prefix).
std::vector<std::string> adopt_hf_config(const HfFolder& folder, Config& cfg);

/// Reads a Hugging Face Llama folder into a new float32 model of the
/// folder's own shape (read_hf_folder, then load_model_from_safetensors with
/// the file's tie_word_embeddings). Throws UserError naming the file for a
/// missing/invalid config.json or weights.
LlamaForCausalLM import_hf(const std::string& dir);

}  // namespace snip
