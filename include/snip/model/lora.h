// snip/model/lora.h: SNIP-LoRA: low-rank adapters on a frozen, quantized base
// (docs/lora.md).
//
// Shapes (the glossary is in model/llama.h): N tokens, IN/OUT a linear
// layer's features, r the adapter rank.
//
// A targeted layer computes (LoRA: Hu et al., "LoRA: Low-Rank Adaptation of
// Large Language Models", ICLR 2022, eq. 3; PEFT's Linear.forward):
//
//   Y [N, OUT] = base(X) + (alpha / r) · dropout(X) · Aᵀ · Bᵀ
//
// with A [r, IN] and B [OUT, r] trainable FP32 parameters (Hugging Face PEFT
// names `<layer>.lora_A.weight`, `<layer>.lora_B.weight`), initialised A
// Kaiming-uniform (PEFT's kaiming_uniform_(a = sqrt(5)): U(-1/sqrt(IN),
// 1/sqrt(IN))) or N(0, 1/r²) ("gaussian"), and B = 0, so the adapted model
// starts equal to the base bit for bit. base(X) is the layer's own quantized
// GEMMs (model/linear.h) at the precision the plan gives it; the adapter
// GEMMs run in FP32. The seed's r = 8 with a scale of 0.1 is alpha = 0.8.
//
// The base does not train, so its weight is quantized once per plan and kept
// as the GEMM operands that precision feeds its fprop and dgrad
// (FrozenWeight): element codes packed two per byte (FP4) or one (FP8) plus
// one FP32 decode scale per block, or BF16 for layers the plan keeps at BF16.
// The FP32 weight is read again from the base file only when it is needed
// (a stats step, a plan change): FrozenBase.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/config/config.h"
#include "snip/io/safetensors.h"
#include "snip/model/llama.h"

namespace snip {

/// One frozen weight W [OUT, IN] as the GEMM operands of one precision
/// (model/linear.h): fprop reads W [OUT, IN], dgrad Wᵀ [IN, OUT], each laid
/// out [rows, K]. operand(op) equals, bit for bit,
/// precision.quantizer->quantize_for_gemm(W or Wᵀ, key, precision.gemm_dtype)
/// (or gemm_operand(W, gemm_dtype) without a quantizer).
struct FrozenWeight {
  /// The precision this was made for (identity of the quantizer and the GEMM
  /// dtype); a layer whose precision differs does not use it.
  const OperandQuantizer* quantizer = nullptr;
  at::ScalarType gemm_dtype = at::ScalarType::Undefined;
  /// True when this was made for precision `p` (the same quantizer and GEMM dtype).
  bool made_for(const LinearPrecision& p) const {
    return quantizer == p.quantizer.get() && gemm_dtype == p.gemm_dtype;
  }
  /// One stored operand [rows, cols]: packed element codes with one FP32
  /// decode scale per block (out = decode(code) x scale, formats::dequantize),
  /// or a plain tensor (BF16 without a quantizer).
  struct Stored {
    int64_t rows = 0, cols = 0;
    int bits = 0;                       ///< element bits; 0 = plain
    std::vector<uint8_t> codes;         ///< formats::pack_codes layout (two per byte for bits <= 4)
    int64_t block_rows = 1, block_cols = 1, grid_cols = 1;
    std::vector<float> block_decode;    ///< [GR, GC] decode scales
    std::vector<float> lut;             ///< [2^bits] decoded element values (NaN codes -> canonical NaN)
    torch::Tensor plain;                ///< bits == 0: [rows, cols] BF16
    int64_t bytes() const;              ///< memory held, bytes
    torch::Tensor decode() const;       ///< [rows, cols] FP32 values
  };
  Stored fprop;             ///< W [OUT, IN]
  Stored dgrad;             ///< Wᵀ [IN, OUT]; unused when dgrad_is_fprop_t
  bool dgrad_is_fprop_t = false;  ///< dgrad's values are fprop's transposed (square blocks): stored once
  /// The GEMM input for Operand::kFpropW ([OUT, IN]) or kDgradW ([IN, OUT]),
  /// contiguous, as gemm_operand(.., gemm_dtype) gives it. Throws
  /// std::logic_error for other operands.
  torch::Tensor operand(Operand op) const;
  /// Memory held, bytes (codes + scales, or the BF16 tensor).
  int64_t bytes() const { return fprop.bytes() + (dgrad_is_fprop_t ? 0 : dgrad.bytes()); }
  /// "fp4 packed", "bf16", ...: what is stored, for logs.
  std::string describe() const;
};

/// Freezes `w` [OUT, IN] (FP32) at precision `p` with stochastic-rounding key
/// `key` (layer set; step unused: the packable specs round to nearest).
/// nullptr when nothing smaller than FP32 reproduces the GEMM inputs
/// exactly: no quantizer and an FP32 GEMM, or a quantizer whose weight
/// operands are not packable (OperandQuantizer::quantize_packed: delayed
/// scaling, stochastic rounding, error feedback, a Hadamard transform).
std::shared_ptr<const FrozenWeight> freeze_weight(const torch::Tensor& w, const LinearPrecision& p,
                                                  const QuantKey& key);

/// Memory of the frozen linear weights, bytes.
struct FrozenMemory {
  int64_t fp32_bytes = 0;    ///< 4 x the elements of every frozen linear weight (what FP32 master weights hold)
  int64_t stored_bytes = 0;  ///< what the layers hold now: FrozenWeight::bytes(), or 4 x elements while FP32
  int64_t packed_layers = 0, layers = 0;  ///< layers held in a FrozenWeight, of all
  double saved_fraction() const { return fp32_bytes > 0 ? 1.0 - double(stored_bytes) / double(fp32_bytes) : 0.0; }
};

/// The frozen base of a LoRA run: keeps each linear layer's weight as a
/// FrozenWeight of its current precision and, with `pack`, releases the FP32
/// copy (the layer's `weight` becomes an empty tensor), reading it again from
/// the base's model.safetensors when a stats step or a plan change needs it.
class FrozenBase {
 public:
  /// `weights_path`: the base's model.safetensors (the file --init-from
  /// loaded); `pack` = lora.pack_base.
  FrozenBase(std::string weights_path, bool pack) : path_(std::move(weights_path)), pack_(pack) {}
  /// Puts every released FP32 weight back into its layer (one read of the
  /// file). Throws UserError naming the file when a tensor is missing or of
  /// another shape (the file changed under the run).
  void materialize(const std::vector<QuantLinear>& layers);
  /// Re-freezes every layer whose FrozenWeight was made for another
  /// precision (materializing first when needed), then releases each FP32
  /// weight that has a FrozenWeight. Returns the layers re-frozen. Without
  /// `pack` it does nothing: the FP32 weights stay and the GEMMs quantize
  /// them every step as in full training (the reference the packed path is
  /// checked against, bit for bit).
  int sync(const std::vector<QuantLinear>& layers);
  /// One layer: its FP32 weight read from the file, frozen for its current
  /// precision, and released again with `pack` (QuantLinearImpl::refreeze).
  void refreeze(QuantLinearImpl& layer);
  /// What the layers hold now.
  FrozenMemory memory(const std::vector<QuantLinear>& layers) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool pack_ = true;
};

/// Adds adapters (rank cfg.rank, scale cfg.alpha / cfg.rank, dropout) to every
/// linear layer whose Hugging Face name (model.layers.i.self_attn.q_proj)
/// matches one of cfg.target (plan/pins.h globs), initialised as
/// cfg.init says from a generator seeded with `seed`. Returns the adapted
/// layers' names in model order. Throws UserError "lora.target: ..." when a
/// glob matches no layer.
std::vector<std::string> attach_lora(LlamaForCausalLM& model, const LoraConfig& cfg, uint64_t seed);

/// Freezes the base: requires_grad false on every parameter but the
/// adapters (and the RMSNorm weights with cfg.train_norms). Returns the
/// trainable parameters by name, model order.
std::vector<std::pair<std::string, torch::Tensor>> freeze_base(LlamaForCausalLM& model, const LoraConfig& cfg);

/// The adapters (and trained norms) by their model names
/// ("model.layers.0.self_attn.q_proj.lora_A.weight"), model order.
std::vector<std::pair<std::string, torch::Tensor>> lora_parameters(LlamaForCausalLM& model, bool with_norms);

/// PEFT's adapter_config.json for the adapted `model` (peft_type LORA,
/// task_type CAUSAL_LM, r, lora_alpha, lora_dropout, target_modules: the
/// adapted layers' short names when they are all layers of those kinds, else
/// their full names; modules_to_save: the norms with cfg.train_norms, else
/// null; bias "none"; fan_in_fan_out false; init_lora_weights true or
/// "gaussian"; base_model_name_or_path `base`).
nlohmann::json peft_adapter_config(LlamaForCausalLM& model, const LoraConfig& cfg, const std::string& base);

/// The adapter tensors under PEFT's saved names: "base_model.model." + the
/// model name (lora_A.weight [r, IN], lora_B.weight [OUT, r], and the norms'
/// weight [C] with train_norms), F32 (or BF16 with `dtype` at::kBFloat16,
/// rounded to nearest even), metadata {"format": "pt"}.
io::SafeTensors peft_adapter_tensors(LlamaForCausalLM& model, bool with_norms, at::ScalarType dtype = at::kFloat);

/// Writes `dir`/adapter_config.json (peft_adapter_config) and
/// `dir`/adapter_model.safetensors (peft_adapter_tensors) atomically: the
/// folder PEFT's PeftModel.from_pretrained(base, dir) loads. The folder
/// rules are export_hf's (model/hf.h): never a checkpoint folder, empty
/// unless `force`, and never a folder holding a model (config.json,
/// model.safetensors); nothing partial is left when a write fails. Tensors
/// in `dtype` (float32 or bfloat16).
void export_peft(LlamaForCausalLM& model, const LoraConfig& cfg, const std::string& base, const std::string& dir,
                 bool force, at::ScalarType dtype = at::kFloat);

/// Reads a PEFT folder's adapter_config.json (as peft_adapter_config writes
/// it, or as PEFT does) back into a LoraConfig. Throws UserError naming the
/// file and field for a peft_type other than LORA, bias other than "none",
/// fan_in_fan_out true, use_dora/use_rslora true, a missing r or lora_alpha.
LoraConfig lora_config_from_peft(const nlohmann::json& cfg, const std::string& what);

/// Loads adapter tensors (PEFT names, with or without the "base_model.model."
/// prefix) into the adapted `model`. Throws UserError "<what>: ..." for a
/// missing tensor, an unexpected one, a shape mismatch or a non-finite value.
void load_adapter_tensors(LlamaForCausalLM& model, const io::SafeTensors& st, const std::string& what,
                          bool with_norms);

/// Folds every adapter into its base weight, W <- W + (alpha/r) · B · A
/// (FP32), and removes the adapters: the model computes the adapted
/// function as one plain Llama (`snip export --merge`). The base weights must
/// be materialized (FP32).
void merge_lora(LlamaForCausalLM& model);

/// SHA-256 (hex) of a base's weights file, for the reference a LoRA
/// checkpoint keeps. Throws UserError when it cannot be read.
std::string base_checksum(const std::string& weights_path);

}  // namespace snip
