// snip/config/config.h: the run configuration, as option records, and the
// typed records it is parsed into. LibTorch-free.
//
// Every option is one record (HiGHS options habit): dotted key
// (`section.name`), type, default, unit, range (or the allowed words) and
// meaning, in ONE table (config.cpp, option_table()). The same table drives:
// TOML parsing, `--set section.key=value` overrides, the range checks of
// validate(), `snip train --help`'s option list and the resolved
// `runs/NAME/config.toml`. An unknown key is a UserError naming the key and
// the closest valid one ("did you mean ..."); a wrong type names the key, the
// expected type and the value found; a value out of range names the key and
// the allowed range.
//
// A run reads its options once, through RunConfig::from(), into ModelConfig,
// DataConfig, TrainConfig and PrecisionConfig records (policy and first-order
// choices as enums); no string look-ups in the code that runs.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace snip {

/// One typed option value.
using OptionValue = std::variant<bool, int64_t, double, std::string>;

/// Type of an option; "list" options are comma-separated strings.
enum class OptionType { kBool, kInt, kFloat, kString };

/// Allowed values of a numeric option: lo..hi, each end closed ([) or open
/// ((); infinite ends are unbounded.
struct OptionRange {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;
  /// "in [0, 1]", ">= 0", "> 0", "in [0, 1)", ... ("" when unbounded).
  std::string describe(bool integer) const;
  bool contains(double v) const;
};

/// The record of one option.
struct OptionSpec {
  std::string key;       ///< dotted, e.g. "train.lr"
  OptionType type;
  OptionValue def;       ///< default value
  std::string unit;      ///< e.g. "steps", "tokens", "fraction", "" if none
  std::string help;      ///< one-line meaning
  OptionRange range;     ///< kInt, kFloat: allowed values (floats must also be finite)
  std::vector<std::string> choices;  ///< kString: the allowed words (empty = any string)
};

/// All options snip knows, sorted by key.
const std::vector<OptionSpec>& option_table();

/// Renders a value as TOML would write it (strings quoted).
std::string format_option_value(const OptionValue& v);

/// A resolved configuration: every key of option_table() has a value.
class Config {
 public:
  /// Defaults for every option.
  Config();

  /// Reads a TOML file on top of the current values.
  /// Throws UserError "<file>: <key>: ..." for an unknown key, a wrong type or
  /// a TOML syntax error (with line and column).
  void load_toml_file(const std::string& path);

  /// Parses TOML text (for tests); `what` names the source in errors.
  void load_toml_string(const std::string& text, const std::string& what);

  /// Applies one `section.key=value` override (the value is parsed according
  /// to the option's type: true/false, integer, number or string).
  /// Throws UserError "--set <arg>: ..." on a bad key, missing '=' or bad value.
  void set_override(const std::string& assignment);

  /// Sets a key to a typed value; throws UserError on unknown key/wrong type.
  void set(const std::string& key, const OptionValue& v, const std::string& what);

  bool get_bool(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;

  /// Keys explicitly set by a file or an override (not defaults).
  const std::map<std::string, OptionValue>& values() const { return values_; }

  /// True when `key` holds a value other than its option's default (set or
  /// not: a resolved config.toml lists every option, so "set" alone says
  /// nothing after a resume). Throws std::logic_error (SNIP_CHECK) for an unknown key.
  bool differs_from_default(const std::string& key) const;

  /// The resolved configuration as TOML text, with each option's help and unit
  /// as a comment; loading it back gives an equal Config.
  std::string to_toml() const;

  /// Throws UserError "config: <key>: expected ..., got ..." for a value
  /// outside its option's range or choices, or when options are individually
  /// valid but inconsistent (e.g. hidden_size not divisible by
  /// num_attention_heads).
  void validate() const;

  /// Where `key`'s value came from, for messages: "config: FILE:LINE" or
  /// "config: --set key=value" (the `what` it was set with), or "config"
  /// for a default.
  std::string origin(const std::string& key) const;

 private:
  const OptionValue& raw(const std::string& key) const;
  std::map<std::string, OptionValue> values_;
  std::map<std::string, std::string> origins_;  ///< the `what` each value was set with
};

/// The option key closest to `key` by edit distance (for "did you mean").
std::string closest_option_key(const std::string& key);

/// Every `section.key = scalar` of a TOML file as display text (strings
/// unquoted, numbers as toml++ prints them), keys not in option_table()
/// included: for readers that must not reject a run written by another
/// version (the run report). Throws UserError "<path>:<line>:<col>: TOML
/// syntax error: ..." or when the file cannot be read.
std::map<std::string, std::string> read_toml_display(const std::string& path);

/// The comma-separated items of a list option, trimmed, empty items dropped.
std::vector<std::string> split_list(const std::string& s);

// ---- Typed records (every field is the option of the same name; units and
// meanings are in option_table()).

/// [model]: Hugging Face LlamaConfig fields. Dimension letters as in
/// model/llama.h: V, C, F, L, NH, NKV.
struct ModelConfig {
  int64_t vocab_size = 0;  ///< V; 0 = the tokenizer's
  int64_t hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0;
  int64_t num_attention_heads = 0, num_key_value_heads = 0, max_position_embeddings = 0;
  double rms_norm_eps = 0, rope_theta = 0, init_std = 0;
  bool tie_word_embeddings = true;
};

/// [data].
struct DataConfig {
  std::string dir;  ///< prepared data folder (train.bin, val.bin, tokenizer.model, meta.json)
};

/// [train]. B = batch_size sequences of T = seq_len tokens per micro-batch.
struct TrainConfig {
  int64_t seed = 0, batch_size = 0, seq_len = 0, grad_accum = 1, max_steps = 0, warmup_steps = 0;
  double lr = 0, min_lr_ratio = 0, weight_decay = 0, beta1 = 0, beta2 = 0, eps = 0, grad_clip = 0;
  bool gemm_bf16 = true;  ///< train.gemm_dtype = "bf16" (else "fp32")
  std::string gemm_backend = "auto";  ///< train.gemm_backend: "auto", "native" or "emulated" (model/matmul.h)
  int64_t eval_interval = 0, eval_batches = 0, checkpoint_interval = 0, keep_checkpoints = 0;
  int64_t log_interval = 0, threads = 0, sample_tokens = 0;
  int64_t zero_stage = 0;  ///< train.zero_stage: 0 plain data parallel, 1 ZeRO-1, 2 ZeRO-2 (dist/zero.h)
  double checkpoint_minutes = 0;  ///< train.checkpoint_minutes: also checkpoint after this wall time, minutes (0 = off)
  double clip_low_precision = 1;  ///< train.clip_low_precision: factor on grad_clip while a layer runs below FP8
  int64_t keep_good = 0;          ///< checkpoint.keep_good: good checkpoints kept apart from the rolling ones
  double good_margin = 0;         ///< checkpoint.good_margin: fraction above the best validation loss still good
  std::string sample_prompt;
};

/// Who chooses each layer's precision (precision.policy).
enum class Policy { kNone, kUniform, kSnip, kMinRelErr, kLayerType, kFirstLastFp8, kRandom };
/// The first-order term of the loss divergence (precision.first_order; docs/method.md section 3).
enum class FirstOrder { kDrop, kAbs, kSigned };
/// "none" (no quantization: every GEMM in train.gemm_dtype; "bf16" is read as
/// "none", its earlier name), "uniform-<option>" needs the option:
/// see PrecisionConfig::policy_name().
const char* to_string(Policy p);
const char* to_string(FirstOrder f);
/// Throws UserError "<what>: expected drop, abs or signed, got 'x'".
FirstOrder parse_first_order(const std::string& s, const std::string& what);

/// [precision] (method/controller.h says what each does).
struct PrecisionConfig {
  Policy policy = Policy::kNone;
  std::string uniform_option;  ///< the option of policy uniform-<option>, else ""
  std::string recipe;          ///< precision.recipe ("none" once resolve_precision_alias ran)
  double budget = 0;
  std::vector<std::string> options, pins;
  int64_t warmup_steps = -1, initial_interval = -1, final_interval = -1;
  double warmup_fraction = 0, initial_interval_fraction = 0, final_interval_fraction = 0;
  double final_high_precision_fraction = 0;
  std::string warmup_precision, final_precision, low_option;
  double smoothing = 0, alpha = 0;
  int64_t seed = 0;
  bool per_gemm = false;  ///< precision.granularity = "gemm" (else "layer")
  FirstOrder first_order = FirstOrder::kDrop;
  int64_t curvature_probes = 1;
  /// The policy as written in the configuration ("uniform-fp8", "snip", ...).
  std::string policy_name() const;
  /// policy is snip or min-rel-err (they run stats steps).
  bool needs_stats() const { return policy == Policy::kSnip || policy == Policy::kMinRelErr; }
};

/// [guard] (train/guard.h says what each does). Actions are "warn",
/// "fp8-layer", "replan", "rollback" or "stop" (checked by Config::validate).
struct GuardConfig {
  bool enabled = true;
  std::string on_nonfinite = "rollback", on_loss_spike = "rollback", on_quant_error = "warn",
              on_throughput_drop = "warn";
  int64_t spike_window = 20;          ///< steps
  double spike_ratio = 0.5;           ///< fraction above the window's mean loss
  double throughput_drop = 0.5;       ///< fraction below the window's mean tokens/s
  double quant_error_threshold = 0.05;  ///< relative error (fraction), layers in 8-bit formats
  double quant_error_threshold_fp4 = 0.2;  ///< relative error (fraction), layers with 4-bit fprop operands
  int64_t quant_error_steps = 3;      ///< consecutive measurements
  double stall_minutes = 10;          ///< minutes; 0 = off
  double budget_step = 0.10;          ///< FP4 FLOPs share taken off precision.budget
  double smoothing = 0.3;             ///< precision.smoothing raised to at least this
  std::string raise_option = "fp8";   ///< the option fp8-layer moves a layer to
  int64_t max_rollbacks = 3;
};

/// [lora] (model/lora.h says what each does): adapters when rank > 0.
struct LoraConfig {
  int64_t rank = 0;          ///< r; 0 = no adapters
  double alpha = 16;         ///< output scale alpha / r
  double dropout = 0;        ///< fraction of adapter inputs zeroed in training
  std::vector<std::string> target;  ///< globs over HF layer names
  std::string init = "kaiming";     ///< "kaiming" or "gaussian"
  bool train_norms = false;  ///< RMSNorm weights train too
  bool pack_base = true;     ///< frozen base weights stored packed (model/lora.h FrozenWeight)
  bool enabled() const { return rank > 0; }
  double scale() const { return rank > 0 ? alpha / double(rank) : 0.0; }
};

/// A run's whole configuration, parsed once.
struct RunConfig {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  PrecisionConfig precision;
  GuardConfig guard;
  LoraConfig lora;
  /// Checks `cfg` (Config::validate) and parses it. Throws UserError naming
  /// the key for a bad value (e.g. an unknown precision.policy).
  static RunConfig from(const Config& cfg);
};

}  // namespace snip
