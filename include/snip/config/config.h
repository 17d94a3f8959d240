// snip/config/config.h: the run configuration, as option records, and the
// typed records it is parsed into. LibTorch-free.
//
// Every option is declared once (HiGHS options habit): one line of the
// table in config.cpp (option_table()) binds the dotted key
// (`section.name`) to its typed member of RunConfig below, whose
// initializer is the option's default, with its unit, range (or the
// allowed words) and meaning. The same declaration drives: TOML parsing,
// `--set section.key=value` overrides, the range checks of validate(),
// `snip train --help`'s option list, the resolved `runs/NAME/config.toml`
// and RunConfig::from (RunConfig{} holds every default). An unknown key is a UserError naming the key and
// the closest valid one ("did you mean ..."); a wrong type names the key, the
// expected type and the value found; a value out of range names the key and
// the allowed range.
//
// A run reads its options once, through RunConfig::from(), into ModelConfig,
// DataConfig, TrainConfig and PrecisionConfig records (policy and first-order
// choices as enums); no string look-ups in the code that runs.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "snip/recipes/recipe.h"

namespace snip {

struct RunConfig;

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
  /// Stores a value of this option in its typed member of RunConfig
  /// (RunConfig::from). The value has the option's type and passed its checks.
  std::function<void(const OptionValue&, RunConfig&)> set;
  /// The member's value as this option's value (inverse of `set`); `def`
  /// is get(RunConfig{}) for an option bound to one member.
  std::function<OptionValue(const RunConfig&)> get;
};

/// All options snip knows, sorted by key.
const std::vector<OptionSpec>& option_table();
/// The option_table() entry of dotted `key`, or nullptr when snip has no such option.
const OptionSpec* find_spec(const std::string& key);

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

  /// The value of `key` (its default when not set); throws UserError for an unknown key.
  const OptionValue& get(const std::string& key) const;
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

  /// Where `key`'s value came from, for messages: "config: FILE:LINE",
  /// "--set key=value" (the `what` it was set with, as --set's own parse
  /// errors name it), or "config" for a default.
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

// ---- Typed records: every field is the option named in its comment, its
// initializer the option's default (units, ranges and meanings are in
// option_table(), `snip train --help`).

/// [model]: Hugging Face LlamaConfig fields. Dimension letters as in
/// model/llama.h: V, C, F, L, NH, NKV.
struct ModelConfig {
  int64_t vocab_size = 0;  ///< model.vocab_size
  int64_t hidden_size = 256;  ///< model.hidden_size
  int64_t intermediate_size = 688;  ///< model.intermediate_size
  int64_t num_hidden_layers = 4;  ///< model.num_hidden_layers
  int64_t num_attention_heads = 8;  ///< model.num_attention_heads
  int64_t num_key_value_heads = 4;  ///< model.num_key_value_heads
  double rms_norm_eps = 1e-5;  ///< model.rms_norm_eps
  double rope_theta = 10000.0;  ///< model.rope_theta
  bool tie_word_embeddings = true;  ///< model.tie_word_embeddings
  int64_t max_position_embeddings = 2048;  ///< model.max_position_embeddings
  double init_std = 0.02;  ///< model.init_std
};

/// [data].
struct DataConfig {
  std::string dir = "data/kjv";  ///< data.dir: a prepared folder (train.bin, val.bin, tokenizer.model, meta.json)
};

/// How BF16 GEMMs run (train.gemm_backend; model/matmul.h says what each does).
enum class GemmBackend { kAuto, kNative, kEmulated };
/// The order of a pipeline stage's forwards and backwards (dist.pipeline_schedule; dist/pipeline.h).
enum class PipelineSchedule { kGpipe, k1F1B };
/// What crosses a pipeline stage boundary (dist.boundary_comm; dist/pipeline.h).
enum class BoundaryComm { kFp32, kFp8 };
/// How LoRA adapters start (lora.init; model/lora.h).
enum class LoraInit { kKaiming, kGaussian };
/// The option's words: "auto", "native", "emulated"; "gpipe", "1f1b";
/// "fp32", "fp8"; "kaiming", "gaussian".
const char* to_string(GemmBackend b);
const char* to_string(PipelineSchedule s);
const char* to_string(BoundaryComm c);
const char* to_string(LoraInit i);
/// Into JSON as their words (not nlohmann's default, the enum's integer):
/// summary.json, trainer_state.json and the report read the words.
void to_json(nlohmann::json& j, GemmBackend b);
void to_json(nlohmann::json& j, PipelineSchedule s);
void to_json(nlohmann::json& j, BoundaryComm c);
void to_json(nlohmann::json& j, LoraInit i);

/// [train]. B = batch_size sequences of T = seq_len tokens per micro-batch.
struct TrainConfig {
  int64_t seed = 1234;  ///< train.seed
  int64_t batch_size = 16;  ///< train.batch_size
  int64_t seq_len = 128;  ///< train.seq_len
  int64_t grad_accum = 1;  ///< train.grad_accum
  int64_t max_steps = 1000;  ///< train.max_steps
  double lr = 3e-3;  ///< train.lr
  double min_lr_ratio = 0.1;  ///< train.min_lr_ratio
  int64_t warmup_steps = 50;  ///< train.warmup_steps
  double weight_decay = 0.1;  ///< train.weight_decay
  double beta1 = 0.9;  ///< train.beta1
  double beta2 = 0.95;  ///< train.beta2
  double eps = 1e-8;  ///< train.eps
  double grad_clip = 1.0;  ///< train.grad_clip
  double clip_low_precision = 1.0;  ///< train.clip_low_precision
  int64_t zero_stage = 0;  ///< train.zero_stage
  bool gemm_bf16 = true;  ///< train.gemm_dtype = "bf16" (else "fp32")
  GemmBackend gemm_backend = GemmBackend::kAuto;  ///< train.gemm_backend
  std::string device = "auto";  ///< train.device: auto, cpu or cuda (model/device.h)
  std::string attention = "auto";  ///< train.attention: auto, sdpa or math (model/llama.h AttentionImpl::sdpa)
  std::string fp8_gemm = "auto";  ///< train.fp8_gemm: auto, native or emulated (model/matmul.h Fp8Gemm)
  int64_t eval_interval = 100;  ///< train.eval_interval
  int64_t eval_batches = 16;  ///< train.eval_batches
  int64_t checkpoint_interval = 500;  ///< train.checkpoint_interval
  double checkpoint_minutes = 30.0;  ///< train.checkpoint_minutes
  int64_t keep_checkpoints = 2;  ///< train.keep_checkpoints
  int64_t log_interval = 10;  ///< train.log_interval
  int64_t threads = 0;  ///< train.threads
  int64_t sample_tokens = 32;  ///< train.sample_tokens
  std::string sample_prompt = "The";  ///< train.sample_prompt
  int64_t keep_good = 1;  ///< checkpoint.keep_good
  double good_margin = 0.05;  ///< checkpoint.good_margin
};

/// Who chooses each layer's precision (precision.policy).
enum class Policy {
  kNone, kUniform, kSnip, kMinRelErr, kLayerType, kFirstLastFp8, kRandom,
  kAutoswitch,  ///< "autoswitch": TE AutoswitchGemm's per-GEMM rule on the stats step's errors (needs stats)
  kBf16Tail,    ///< "bf16-tail": the last precision.tail_fraction of linear layers high, the rest low
  kFirstLastN   ///< "first-last-n": the first and last precision.first_last_n blocks high, the rest low
};
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
  Policy policy = Policy::kNone;  ///< precision.policy (with uniform_option)
  std::string uniform_option;     ///< the option of policy uniform-<option>, else ""
  std::string recipe = "none";  ///< precision.recipe ("none" once resolve_precision_alias ran)
  std::string recipe_file = "";  ///< precision.recipe_file
  double budget = 0.75;  ///< precision.budget
  std::string budget_unit = "flops";  ///< precision.budget_unit: "flops" (FP4 FLOPs share) | "time" (GEMM seconds / BF16's)
  std::string gemm_times = "";  ///< precision.gemm_times: measured GEMM-times file (plan/gemm_times.h); "" = calibrate at start
  double calibrate_seconds = 60.0;  ///< precision.calibrate_seconds: wall-clock cap of the calibration at start, s
  std::string calibration = "in_step";  ///< precision.calibration: "in_step" (timed inside training steps) | "isolated"
  std::vector<std::string> options = {"fp4", "fp8"};  ///< precision.options
  std::vector<std::string> pins = {};  ///< precision.pins
  int64_t warmup_steps = -1;  ///< precision.warmup_steps
  double warmup_fraction = 0.05;  ///< precision.warmup_fraction
  std::string warmup_precision = "bf16";  ///< precision.warmup_precision
  int64_t initial_interval = -1;  ///< precision.initial_interval
  double initial_interval_fraction = 0.2;  ///< precision.initial_interval_fraction
  int64_t final_interval = -1;  ///< precision.final_interval
  double final_interval_fraction = 1.0;  ///< precision.final_interval_fraction
  double final_high_precision_fraction = 0.1;  ///< precision.final_high_precision_fraction
  std::string final_precision = "fp8";  ///< precision.final_precision
  double smoothing = 0.1;  ///< precision.smoothing
  double alpha = 0.5;  ///< precision.alpha
  int64_t seed = 0;  ///< precision.seed
  std::string low_option = "fp4";  ///< precision.low_option
  int64_t curvature_probes = 1;  ///< precision.curvature_probes
  bool per_gemm = false;  ///< precision.granularity = "gemm" (else "layer")
  FirstOrder first_order = FirstOrder::kDrop;  ///< precision.first_order
  double tail_fraction = 0.15;  ///< precision.tail_fraction (bf16-tail)
  int64_t first_last_n = 1;  ///< precision.first_last_n (first-last-n), blocks at each end
  double autoswitch_mse = 1e-4;  ///< precision.autoswitch_mse (autoswitch), output units²
  double autoswitch_underflow = 0.05;  ///< precision.autoswitch_underflow (autoswitch), fraction
  bool final_fprop_only = false;  ///< precision.final_phase_gemms = "fprop" (else "all")
  /// The policy as written in the configuration ("uniform-fp8", "snip", ...).
  std::string policy_name() const;
  /// policy is snip or min-rel-err (they run stats steps).
  bool needs_stats() const {
    return policy == Policy::kSnip || policy == Policy::kMinRelErr || policy == Policy::kAutoswitch;
  }
};

/// What the guard can do (train/guard.h), weakest first (the order decides
/// which one runs when several conditions fire at once).
enum class GuardAction { kWarn = 0, kFp8Layer = 1, kReplan = 2, kRollback = 3, kStop = 4 };
/// "warn", "fp8-layer", "replan", "rollback", "stop".
const char* to_string(GuardAction a);
/// Inverse of to_string. Throws UserError "<what>: expected warn, fp8-layer,
/// replan, rollback or stop, got 'x'".
GuardAction parse_guard_action(const std::string& s, const std::string& what);

/// [guard] (train/guard.h says what each does).
struct GuardConfig {
  bool enabled = true;  ///< guard.enabled
  GuardAction on_nonfinite = GuardAction::kRollback;  ///< guard.on_nonfinite
  GuardAction on_loss_spike = GuardAction::kRollback;  ///< guard.on_loss_spike
  GuardAction on_quant_error = GuardAction::kWarn;  ///< guard.on_quant_error
  GuardAction on_throughput_drop = GuardAction::kWarn;  ///< guard.on_throughput_drop: warn or stop
  int64_t spike_window = 20;  ///< guard.spike_window
  double spike_ratio = 0.5;  ///< guard.spike_ratio
  double throughput_drop = 0.5;  ///< guard.throughput_drop
  double quant_error_threshold = 0.08;  ///< guard.quant_error_threshold
  double quant_error_threshold_e5m2 = 0.15;  ///< guard.quant_error_threshold_e5m2
  double quant_error_threshold_fp4 = 0.3;  ///< guard.quant_error_threshold_fp4
  int64_t quant_error_steps = 3;  ///< guard.quant_error_steps
  double stall_minutes = 10.0;  ///< guard.stall_minutes
  double budget_step = 0.10;  ///< guard.budget_step
  double smoothing = 0.3;  ///< guard.smoothing
  std::string raise_option = "fp8";  ///< guard.raise_option
  int64_t max_rollbacks = 3;  ///< guard.max_rollbacks

  /// The quantization-error threshold (relative error, a fraction) of an
  /// operand in element format `format` (registry name, formats/
  /// element_format.h): quant_error_threshold_fp4 for formats of 4 bits or
  /// fewer (E2M1, int4), quant_error_threshold_e5m2 for other floats with 2
  /// explicit mantissa bits or fewer (E5M2, E3M2), quant_error_threshold for
  /// the rest (E4M3, int8, BF16) and for "" or a name not registered. Each
  /// format's own rounding sets its healthy level: RNE's relative error
  /// grows 2x per mantissa bit dropped (E4M3 ~0.027, E5M2 ~0.053, E2M1
  /// ~0.1-0.25 per operand; docs/operations.md "Per-step quantization
  /// error" gives the measured levels the defaults sit above).
  double threshold_for(const std::string& format) const;
};

/// [lora] (model/lora.h says what each does): adapters when rank > 0.
struct LoraConfig {
  int64_t rank = 0;  ///< lora.rank
  double alpha = 16.0;  ///< lora.alpha
  double dropout = 0.0;  ///< lora.dropout
  std::vector<std::string> target = {"*_proj"};  ///< lora.target
  LoraInit init = LoraInit::kKaiming;  ///< lora.init
  bool train_norms = false;  ///< lora.train_norms
  bool pack_base = true;  ///< lora.pack_base
  bool enabled() const { return rank > 0; }
  double scale() const { return rank > 0 ? alpha / double(rank) : 0.0; }
};

/// [dist]: several ranks (dist/world.h, docs/distributed.md).
struct DistConfig {
  std::string backend = "auto";  ///< dist.backend
  double timeout_s = 300.0;  ///< dist.timeout_s
  int64_t check_interval = 100;  ///< dist.check_interval
  std::string grad_comm = "fp32";  ///< dist.grad_comm
  bool error_feedback = true;  ///< dist.error_feedback
  bool allgather = false;  ///< dist.grad_comm_path = "allgather" (else "allreduce")
  bool overlap = true;  ///< dist.overlap
  int pipeline_stages = 1;  ///< dist.pipeline_stages
  PipelineSchedule pipeline_schedule = PipelineSchedule::k1F1B;  ///< dist.pipeline_schedule
  int64_t micro_batches = 0;  ///< dist.micro_batches
  BoundaryComm boundary_comm = BoundaryComm::kFp32;  ///< dist.boundary_comm
  std::string stage_boundary = "fp8";  ///< dist.stage_boundary
  std::string stage_split = "balanced";  ///< dist.stage_split
  bool rebalance = true;  ///< dist.rebalance
  std::string stage_cost = "bits";  ///< dist.stage_cost
};

/// [monitor]: the /metrics endpoint (monitor/exporter.h parses `listen`).
struct MonitorConfig {
  std::string listen = "127.0.0.1:9464";  ///< monitor.listen
  std::string ranks = "rank0";  ///< monitor.ranks
  bool quant_error = true;  ///< monitor.quant_error
};

/// A run's whole configuration, parsed once.
struct RunConfig {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  PrecisionConfig precision;
  GuardConfig guard;
  LoraConfig lora;
  DistConfig dist;
  MonitorConfig monitor;
  /// The recipes the run can name: the built-ins plus precision.recipe_file's.
  recipes::RecipeSet recipes;
  /// Checks `cfg` (Config::validate) and parses it; loads
  /// precision.recipe_file into `recipes`. Throws UserError naming the key
  /// for a bad value (e.g. an unknown precision.policy), or the recipe
  /// file's error (recipes/recipe_file.h load_recipe_file).
  static RunConfig from(const Config& cfg);
  /// As from(cfg), with the recipe set the caller loaded from
  /// precision.recipe_file already (it must hold that file's recipes).
  static RunConfig from(const Config& cfg, recipes::RecipeSet recipes);
};

}  // namespace snip
