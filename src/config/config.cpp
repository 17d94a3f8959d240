// Run configuration: the option table, TOML parsing, overrides, suggestions.
#include "snip/config/config.h"

#include <algorithm>
#include <array>
#include <type_traits>
#include <regex>
#include <map>
#include <limits>
#include <optional>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <sstream>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "snip/io/toml.h"
#include "snip/recipes/recipe_file.h"
#include "snip/core/error.h"
#include "snip/core/strings.h"

namespace snip {
namespace {

using T = OptionType;

// "fp4,fp8" from {"fp4", "fp8"} (a list option's value).
std::string join_list(const std::vector<std::string>& items) {
  std::string s;
  for (const std::string& i : items) s += (s.empty() ? "" : ",") + i;
  return s;
}

// One option's declaration in make_table(): its record, then its range or
// words, and the member of RunConfig it is read into.
struct Opt {
  OptionSpec s;
  Opt&& in(OptionRange r) && {
    s.range = r;
    return std::move(*this);
  }
  Opt&& words(std::vector<std::string> w) && {
    s.choices = std::move(w);
    return std::move(*this);
  }
  /// A member that is not the option's value as written (a word read as a
  /// flag or an enum): how to store it and read it back.
  Opt&& bind(std::function<void(const OptionValue&, RunConfig&)> set,
             std::function<OptionValue(const RunConfig&)> get) && {
    s.set = std::move(set);
    s.get = std::move(get);
    return std::move(*this);
  }
  operator OptionSpec() && { return std::move(s); }  // NOLINT: the table's entries
};

// An option whose default is given here; bound with Opt::bind.
Opt opt(std::string key, T type, OptionValue def, std::string unit, std::string help) {
  return Opt{OptionSpec{std::move(key), type, std::move(def), std::move(unit), std::move(help), {}, {}, {}, {}}};
}

// Every member at its initializer: the options' defaults.
const RunConfig& defaults() {
  static const RunConfig r;
  return r;
}

// An option stored as it is written in `section`'s member `member` (bool,
// an integer, double, std::string, or a comma-separated list as a vector of
// strings); its type follows the member's and its default is the member's
// initializer (RunConfig{}).
template <class Section, class F>
Opt field(std::string key, Section RunConfig::*section, F Section::*member, std::string unit, std::string help) {
  OptionSpec s{std::move(key), T::kString, {}, std::move(unit), std::move(help), {}, {}, {}, {}};
  if constexpr (std::is_same_v<F, bool>) s.type = T::kBool;
  else if constexpr (std::is_integral_v<F>) s.type = T::kInt;
  else if constexpr (std::is_same_v<F, double>) s.type = T::kFloat;
  s.set = [section, member](const OptionValue& v, RunConfig& r) {
    F& f = (r.*section).*member;
    if constexpr (std::is_same_v<F, bool>) f = std::get<bool>(v);
    else if constexpr (std::is_integral_v<F>) f = F(std::get<int64_t>(v));
    else if constexpr (std::is_same_v<F, double>) f = std::get<double>(v);
    else if constexpr (std::is_same_v<F, std::string>) f = std::get<std::string>(v);
    else f = split_list(std::get<std::string>(v));
  };
  s.get = [section, member](const RunConfig& r) -> OptionValue {
    const F& f = (r.*section).*member;
    if constexpr (std::is_same_v<F, bool> || std::is_same_v<F, double> || std::is_same_v<F, std::string>) return f;
    else if constexpr (std::is_integral_v<F>) return int64_t(f);
    else return join_list(f);
  };
  s.def = s.get(defaults());
  return Opt{std::move(s)};
}

// An enum's words, E(i) written names[i] (to_string and the option's words).
constexpr std::array<const char*, 3> kGemmBackendNames{"auto", "native", "emulated"};
constexpr std::array<const char*, 2> kScheduleNames{"gpipe", "1f1b"};
constexpr std::array<const char*, 2> kBoundaryNames{"fp32", "fp8"};
constexpr std::array<const char*, 2> kLoraInitNames{"kaiming", "gaussian"};

// An option whose words name an enum (names[i] is E(i)): the word as
// written, the enum in `section`'s member `member`; the default is the
// member's initializer.
template <class Section, class E, size_t N>
Opt choice(std::string key, Section RunConfig::*section, E Section::*member, const std::array<const char*, N>& names,
           std::string help) {
  const std::string what = "config: " + key;
  Opt o = opt(std::move(key), T::kString, std::string(names[size_t((defaults().*section).*member)]), "",
              std::move(help));
  return std::move(o)
      .words(std::vector<std::string>(names.begin(), names.end()))
      .bind(
          [section, member, names, what](const OptionValue& v, RunConfig& r) {
            const std::string& w = std::get<std::string>(v);
            for (size_t i = 0; i < N; ++i)
              if (w == names[i]) return void((r.*section).*member = E(i));
            fail(what, ": expected ", join_list(std::vector<std::string>(names.begin(), names.end())), ", got '", w,
                 "'");
          },
          [section, member, names](const RunConfig& r) {
            return OptionValue(std::string(names[size_t((r.*section).*member)]));
          });
}

const char* const kActionNames[] = {"warn", "fp8-layer", "replan", "rollback", "stop"};

// A guard action: the word as written, the enum in GuardConfig.
Opt action(std::string key, GuardAction GuardConfig::*member, std::string help) {
  const std::string what = "config: " + key;
  Opt o = opt(std::move(key), T::kString, std::string(to_string(defaults().guard.*member)), "", std::move(help));
  return std::move(o).bind(
      [member, what](const OptionValue& v, RunConfig& r) {
        r.guard.*member = parse_guard_action(std::get<std::string>(v), what);
      },
      [member](const RunConfig& r) { return OptionValue(std::string(to_string(r.guard.*member))); });
}

// precision.policy's word into the policy (and uniform-<option>'s option).
void set_policy(const std::string& policy, PrecisionConfig& p) {
  if (policy.rfind("uniform-", 0) == 0 && policy.size() > 8) {
    p.policy = Policy::kUniform;
    p.uniform_option = policy.substr(8);
    return;
  }
  for (Policy q : {Policy::kNone, Policy::kSnip, Policy::kMinRelErr, Policy::kLayerType, Policy::kFirstLastFp8,
                   Policy::kRandom, Policy::kAutoswitch, Policy::kBf16Tail, Policy::kFirstLastN})
    if (policy == to_string(q)) {
      p.policy = q;
      p.uniform_option.clear();
      return;
    }
  fail("config: precision.policy: expected none (or its old name bf16), uniform-<option> (e.g. uniform-fp8), snip, "
       "min-rel-err, layer-type, first-last-fp8, random, autoswitch, bf16-tail or first-last-n, got '", policy, "'");
}

// "a or b", "a, b or c".
std::string either(const std::vector<std::string>& w) {
  std::string s;
  for (size_t i = 0; i < w.size(); ++i) s += (i == 0 ? "" : i + 1 == w.size() ? " or " : ", ") + w[i];
  return s;
}

std::string number(double v, bool integer) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::ostringstream os;
  if (integer) os << int64_t(v);
  else os << v;
  return os.str();
}

std::vector<OptionSpec> make_table() {
  // Allowed values, checked by Config::validate() (sizes beyond the upper
  // bounds are typos, not models this build can train: they would overflow
  // 32-bit loader indices or allocations before step 1).
  const double inf = std::numeric_limits<double>::infinity();
  const OptionRange positive{1, inf}, non_negative{0, inf}, fraction{0, 1};
  // Floats that reach LibTorch become FP32 scalars there, and c10 refuses a
  // double beyond FP32's range (lr = 1e308 and grad_clip = 1e308 ended in
  // "internal error: value cannot be converted to type float without
  // overflow"): at most 1e30, far below FLT_MAX = 3.4e38. The learning rate
  // and weight decay also enter as their product (AdamW's 1 - lr*wd): 1e3 each.
  const OptionRange fp32_scalar{0, 1e30, true}, adamw{0, 1e3, true};
  std::vector<OptionSpec> t = {
      // [model]: Hugging Face LlamaConfig fields (same names as config.json).
      field("model.vocab_size", &RunConfig::model, &ModelConfig::vocab_size, "tokens",
            "vocabulary size V; 0 = take it from the tokenizer of data.dir")
          .in({0, double(1 << 22)}),
      field("model.hidden_size", &RunConfig::model, &ModelConfig::hidden_size, "", "model width C")
          .in({1, double(1 << 17)}),
      field("model.intermediate_size", &RunConfig::model, &ModelConfig::intermediate_size, "", "SwiGLU inner width F")
          .in({1, double(1 << 19)}),
      field("model.num_hidden_layers", &RunConfig::model, &ModelConfig::num_hidden_layers, "", "decoder blocks L")
          .in({1, 4096}),
      field("model.num_attention_heads", &RunConfig::model, &ModelConfig::num_attention_heads, "", "query heads NH")
          .in({1, double(1 << 12)}),
      field("model.num_key_value_heads", &RunConfig::model, &ModelConfig::num_key_value_heads, "",
            "key/value heads NKV (grouped-query attention; divides NH)")
          .in(positive),
      field("model.rms_norm_eps", &RunConfig::model, &ModelConfig::rms_norm_eps, "", "RMSNorm epsilon").in(fp32_scalar),
      field("model.rope_theta", &RunConfig::model, &ModelConfig::rope_theta, "", "RoPE base frequency").in(fp32_scalar),
      field("model.tie_word_embeddings", &RunConfig::model, &ModelConfig::tie_word_embeddings, "",
            "lm_head shares embed_tokens' weight"),
      field("model.max_position_embeddings", &RunConfig::model, &ModelConfig::max_position_embeddings, "tokens",
            "longest sequence RoPE tables are built for")
          .in(positive),
      field("model.init_std", &RunConfig::model, &ModelConfig::init_std, "",
            "std of the normal init of linear/embedding weights")
          .in(fp32_scalar),
      // [data]
      field("data.dir", &RunConfig::data, &DataConfig::dir, "",
            "prepared data folder (train.bin, val.bin, tokenizer.model from `snip data prepare`)"),
      // [train]
      field("train.seed", &RunConfig::train, &TrainConfig::seed, "", "seed for init and data order").in(non_negative),
      field("train.batch_size", &RunConfig::train, &TrainConfig::batch_size, "sequences", "micro-batch size B")
          .in({1, double(1 << 20)}),
      field("train.seq_len", &RunConfig::train, &TrainConfig::seq_len, "tokens", "sequence length T")
          .in({1, double(1 << 20)}),
      field("train.grad_accum", &RunConfig::train, &TrainConfig::grad_accum, "micro-batches",
            "micro-batches accumulated per optimizer step")
          .in({1, double(1 << 20)}),
      field("train.max_steps", &RunConfig::train, &TrainConfig::max_steps, "steps", "optimizer steps to run")
          .in(positive),
      field("train.lr", &RunConfig::train, &TrainConfig::lr, "", "peak learning rate").in(adamw),
      field("train.min_lr_ratio", &RunConfig::train, &TrainConfig::min_lr_ratio, "fraction",
            "final LR as a fraction of train.lr")
          .in(fraction),
      field("train.warmup_steps", &RunConfig::train, &TrainConfig::warmup_steps, "steps", "linear LR warmup")
          .in(non_negative),
      field("train.weight_decay", &RunConfig::train, &TrainConfig::weight_decay, "",
            "AdamW decoupled weight decay (2-D weights only; norms are not decayed)")
          .in({0, 1e3}),
      field("train.beta1", &RunConfig::train, &TrainConfig::beta1, "", "AdamW beta1").in({0, 1, false, true}),
      field("train.beta2", &RunConfig::train, &TrainConfig::beta2, "", "AdamW beta2").in({0, 1, false, true}),
      field("train.eps", &RunConfig::train, &TrainConfig::eps, "", "AdamW epsilon").in(adamw),
      field("train.grad_clip", &RunConfig::train, &TrainConfig::grad_clip, "", "max global gradient L2 norm; 0 = off")
          .in({0, 1e30}),
      field("train.clip_low_precision", &RunConfig::train, &TrainConfig::clip_low_precision, "fraction",
            "factor on train.grad_clip while any layer runs below FP8 (a GEMM operand with fewer than 8 element "
            "bits, e.g. fp4); docs/operations.md suggests 0.5-0.7; 1 = the same threshold")
          .in({0, 1, true}),
      field("train.zero_stage", &RunConfig::train, &TrainConfig::zero_stage, "",
            "several ranks: 0 = plain data parallel, 1 = AdamW state sharded over the ranks (ZeRO-1), "
            "2 = also the reduced gradients (ZeRO-2); docs/distributed.md")
          .in({0, 2}),
      opt("train.gemm_dtype", T::kString, std::string("bf16"), "",
          "dtype the linear-layer GEMMs run in: bf16 (FP32 accumulate) or fp32")
          .words({"bf16", "fp32"})
          .bind([](const OptionValue& v, RunConfig& r) { r.train.gemm_bf16 = std::get<std::string>(v) == "bf16"; },
                [](const RunConfig& r) { return OptionValue(std::string(r.train.gemm_bf16 ? "bf16" : "fp32")); }),
      choice("train.gemm_backend", &RunConfig::train, &TrainConfig::gemm_backend, kGemmBackendNames,
             "how BF16 GEMMs run: native (LibTorch's BF16 kernel), emulated (FP32 GEMM on BF16-rounded "
             "operands, same numerics), auto (native where it accumulates in FP32; `snip doctor` shows it)"),
      field("train.device", &RunConfig::train, &TrainConfig::device, "",
            "where training runs: auto (a CUDA device when LibTorch sees one: device 0 for one process, "
            "LOCAL_RANK with one device per local rank, 0 where each rank sees one; else the CPU), cpu, or cuda "
            "(auto's device, or an error); docs/gpu.md")
          .words({"auto", "cpu", "cuda"}),
      field("train.attention", &RunConfig::train, &TrainConfig::attention, "",
            "causal self-attention: sdpa (LibTorch's fused scaled_dot_product_attention: flash / "
            "memory-efficient kernels on CUDA), math (explicit QKᵀ, mask, softmax, AV: the CPU reference), "
            "or auto (sdpa on CUDA with native BF16 products, else math); docs/gpu.md")
          .words({"auto", "sdpa", "math"}),
      field("train.fp8_gemm", &RunConfig::train, &TrainConfig::fp8_gemm, "",
            "GEMMs whose two operands are per-tensor-scaled FP8 (e.g. recipe fp8_tensor): native (at::_scaled_mm "
            "on the FP8 codes), emulated (the fake-quantized values in train.gemm_dtype), or auto (native on "
            "CUDA, emulated on the CPU, whose oneDNN FP8 GEMM is ~1000x slower); docs/gpu.md")
          .words({"auto", "native", "emulated"}),
      field("train.eval_interval", &RunConfig::train, &TrainConfig::eval_interval, "steps",
            "evaluate every N steps (and at the end)")
          .in(positive),
      field("train.eval_batches", &RunConfig::train, &TrainConfig::eval_batches, "micro-batches",
            "validation micro-batches per evaluation; 0 = the whole validation split")
          .in(non_negative),
      field("train.checkpoint_interval", &RunConfig::train, &TrainConfig::checkpoint_interval, "steps",
            "checkpoint every N steps (and at the end); 0 = only at the end")
          .in(non_negative),
      field("train.checkpoint_minutes", &RunConfig::train, &TrainConfig::checkpoint_minutes, "minutes",
            "also checkpoint when this much wall time passed since the last checkpoint (bounds the work a "
            "crash or preemption loses); 0 = by steps only")
          .in({0, 1e6}),
      field("train.keep_checkpoints", &RunConfig::train, &TrainConfig::keep_checkpoints, "",
            "newest checkpoints kept; 0 = all")
          .in(non_negative),
      field("train.log_interval", &RunConfig::train, &TrainConfig::log_interval, "steps", "progress line every N steps")
          .in(positive),
      field("train.threads", &RunConfig::train, &TrainConfig::threads, "", "CPU threads for LibTorch; 0 = all cores")
          .in({0, 1024}),
      field("train.sample_tokens", &RunConfig::train, &TrainConfig::sample_tokens, "tokens",
            "at each evaluation, print a sample of this many tokens after train.sample_prompt; 0 = none")
          .in({0, 4096}),
      field("train.sample_prompt", &RunConfig::train, &TrainConfig::sample_prompt, "",
            "prompt of the samples printed at evaluations"),
      // [dist]: several processes (docs/distributed.md); world from torchrun or Slurm.
      field("dist.backend", &RunConfig::dist, &DistConfig::backend, "",
            "c10d backend: auto (nccl when train.device resolves to CUDA, one device per rank; else gloo), gloo "
            "(CPU ranks) or nccl (GPU ranks)")
          .words({"auto", "gloo", "nccl"}),
      field("dist.timeout_s", &RunConfig::dist, &DistConfig::timeout_s, "seconds",
            "how long a rank waits for the others (rendezvous, every collective) before it stops with an error")
          .in({1, 1e6}),
      field("dist.check_interval", &RunConfig::dist, &DistConfig::check_interval, "steps",
            "compare a checksum of every parameter across ranks every N steps (and at every checkpoint); 0 = "
            "only at checkpoints")
          .in(non_negative),
      field("dist.grad_comm", &RunConfig::dist, &DistConfig::grad_comm, "",
            "gradient communication: fp32 (the plain FP32 all-reduce), or a recipe from `snip formats --recipes` "
            "(bf16, fp8, fp4, mxfp4, nvfp4, ...): each rank sends its gradient quantized with the recipe's "
            "fprop.w spec, scales shared by all ranks; how it travels: dist.grad_comm_path (docs/distributed.md)"),
      field("dist.error_feedback", &RunConfig::dist, &DistConfig::error_feedback, "",
            "with dist.grad_comm other than fp32: keep each rank's quantization residual and add it to the next "
            "step's gradient (Karimireddy et al. 2019, error feedback)"),
      opt("dist.grad_comm_path", T::kString, std::string("allreduce"), "",
          "how quantized gradients travel: allreduce (decoded to FP32 and summed by the FP32 all-reduce: exact "
          "numerics, 4 bytes per element on the wire) or allgather (packed codes and scales all-gathered, decoded "
          "and summed in rank order on every rank: the format's bytes on the wire)")
          .words({"allreduce", "allgather"})
          .bind([](const OptionValue& v, RunConfig& r) { r.dist.allgather = std::get<std::string>(v) == "allgather"; },
                [](const RunConfig& r) {
                  return OptionValue(std::string(r.dist.allgather ? "allgather" : "allreduce"));
                }),
      field("dist.overlap", &RunConfig::dist, &DistConfig::overlap, "",
            "start each FP32 gradient bucket's all-reduce from autograd hooks as soon as its gradients are final "
            "(overlapping backward); false = every bucket after backward (same numbers)"),
      field("dist.pipeline_stages", &RunConfig::dist, &DistConfig::pipeline_stages, "",
            "pipeline parallelism: split the decoder blocks into this many contiguous stages (embedding with the "
            "first, final norm and lm_head with the last); the world is stages x data-parallel replicas, rank = "
            "stage * replicas + replica (docs/distributed.md \"Pipeline stages\"); 1 = no pipeline")
          .in({1, 1024}),
      choice("dist.pipeline_schedule", &RunConfig::dist, &DistConfig::pipeline_schedule, kScheduleNames,
             "pipeline schedule: gpipe (all forwards, then all backwards) or 1f1b (one forward, one backward in "
             "the steady state: at most stages - stage micro-batches of activations held)"),
      field("dist.micro_batches", &RunConfig::dist, &DistConfig::micro_batches, "",
            "micro-batches per step and data-parallel replica under pipeline stages; 0 = train.grad_accum")
          .in({0, 1e6}),
      choice("dist.boundary_comm", &RunConfig::dist, &DistConfig::boundary_comm, kBoundaryNames,
             "how activations and their gradients cross stage boundaries: fp32, or fp8 (activations E4M3, "
             "gradients E5M2, one FP32 per-tensor scale each, packed bytes on the wire)"),
      field("dist.stage_boundary", &RunConfig::dist, &DistConfig::stage_boundary, "",
            "precision option pinned on the first and last quantized layer of every pipeline stage (docs/method.md "
            "section 4), or none"),
      field("dist.stage_split", &RunConfig::dist, &DistConfig::stage_split, "",
            "how blocks are split into stages: balanced (equal estimated stage time, counting the precision), "
            "even (as `snip plan --stages`), or the block count of every stage, e.g. \"3,2\""),
      field("dist.rebalance", &RunConfig::dist, &DistConfig::rebalance, "",
            "with dist.stage_split = balanced: when a new precision plan makes another split faster (estimated), "
            "move the blocks at the next checkpoint (a step's arithmetic does not depend on the split; the "
            "per-stage plan rows and boundary pins follow the new split from the next plan)"),
      field("dist.stage_cost", &RunConfig::dist, &DistConfig::stage_cost, "",
            "relative GEMM time of each precision option for the stage balance: bits (element bits / 16: FP4 "
            "0.25, FP8 0.5, BF16 1), measured (one quantized layer's forward and backward timed per option on "
            "rank 0 at the start), or a list such as \"fp4=0.25,fp8=0.5,bf16=1\""),
      // [lora]: SNIP-LoRA fine-tuning of a frozen base (docs/lora.md); on when lora.rank > 0.
      field("lora.rank", &RunConfig::lora, &LoraConfig::rank, "",
            "rank r of the low-rank adapters A [r, IN] and B [OUT, r] on every targeted layer; 0 = no adapters "
            "(full training). With r > 0 the base model (--init-from HF_DIR) is frozen and only the adapters train")
          .in({0, 65536}),
      field("lora.alpha", &RunConfig::lora, &LoraConfig::alpha, "",
            "LoRA alpha: the adapter output is scaled by alpha / rank (Hu et al. 2021, PEFT's lora_alpha)")
          .in({0, 1e9}),
      field("lora.dropout", &RunConfig::lora, &LoraConfig::dropout, "fraction",
            "dropout on the adapter's input during training (PEFT's lora_dropout)")
          .in({0, 0.999}),
      field("lora.target", &RunConfig::lora, &LoraConfig::target, "list",
            "comma-separated globs over Hugging Face layer names that get adapters, e.g. '*.q_proj,*.v_proj'"),
      choice("lora.init", &RunConfig::lora, &LoraConfig::init, kLoraInitNames,
             "adapter initialisation: kaiming (A Kaiming-uniform, B zero: the LoRA paper, PEFT's default) or "
             "gaussian (A ~ N(0, 1/r^2), B zero: PEFT's init_lora_weights='gaussian')"),
      field("lora.train_norms", &RunConfig::lora, &LoraConfig::train_norms, "",
            "also train the RMSNorm weights (exported as PEFT modules_to_save)"),
      field("lora.pack_base", &RunConfig::lora, &LoraConfig::pack_base, "",
            "keep the frozen base's linear weights in their packed plan precision (FP4 codes two per byte plus "
            "scales, FP8 bytes, BF16) instead of FP32"),
      // [checkpoint]: the rollback baseline (docs/operations.md "The guard").
      field("checkpoint.keep_good", &RunConfig::train, &TrainConfig::keep_good, "",
            "also keep the newest N checkpoints that passed validation (finite, validation loss at most "
            "checkpoint.good_margin above the best), apart from train.keep_checkpoints; the guard rolls back to "
            "the newest of them; 0 = every checkpoint counts as good and only the rolling ones are kept")
          .in(non_negative),
      field("checkpoint.good_margin", &RunConfig::train, &TrainConfig::good_margin, "fraction",
            "a checkpoint passes validation when its validation loss is at most (1 + margin) x the best so far")
          .in({0, 1e6}),
      // [guard]: conditions checked every step and what to do (docs/operations.md "The guard").
      field("guard.enabled", &RunConfig::guard, &GuardConfig::enabled, "",
            "check the guard's conditions every step; false = a non-finite loss ends the run as before"),
      action("guard.on_nonfinite", &GuardConfig::on_nonfinite,
            "a non-finite loss or gradient (the step's update is always skipped): warn, fp8-layer, replan, "
            "rollback or stop")
          .words({"warn", "fp8-layer", "replan", "rollback", "stop"}),
      action("guard.on_loss_spike", &GuardConfig::on_loss_spike,
            "the loss more than guard.spike_ratio above its mean over guard.spike_window steps: warn, fp8-layer, "
            "replan, rollback or stop")
          .words({"warn", "fp8-layer", "replan", "rollback", "stop"}),
      action("guard.on_quant_error", &GuardConfig::on_quant_error,
            "a quantized operand's per-step relative error above its format's threshold (guard.quant_error_"
            "threshold, _e5m2, _fp4) for guard.quant_error_steps steps in a row: warn, fp8-layer, replan, "
            "rollback or stop (docs/operations.md)")
          .words({"warn", "fp8-layer", "replan", "rollback", "stop"}),
      action("guard.on_throughput_drop", &GuardConfig::on_throughput_drop,
            "tokens/s below (1 - guard.throughput_drop) x its mean over guard.spike_window steps: warn or stop")
          .words({"warn", "stop"}),
      field("guard.spike_window", &RunConfig::guard, &GuardConfig::spike_window, "steps",
            "steps of the running mean the loss spike and throughput drop compare against")
          .in({1, 1e6}),
      field("guard.spike_ratio", &RunConfig::guard, &GuardConfig::spike_ratio, "fraction",
            "loss spike: loss > (1 + ratio) x the window's mean (as the SnipLossSpike alert rule)")
          .in({0, 1e6, true}),
      field("guard.throughput_drop", &RunConfig::guard, &GuardConfig::throughput_drop, "fraction",
            "throughput drop: tokens/s < (1 - drop) x the window's mean")
          .in({0, 1, true, true}),
      field("guard.quant_error_threshold", &RunConfig::guard, &GuardConfig::quant_error_threshold, "fraction",
            "relative quantization error ||Q(x)-x||/||x|| above which a step's measurement of an operand in E4M3, "
            "int8 or another format with 3+ mantissa bits counts toward the streak")
          .in({0, 1e6}),
      field("guard.quant_error_threshold_e5m2", &RunConfig::guard, &GuardConfig::quant_error_threshold_e5m2,
            "fraction",
            "the same for an operand in E5M2 (or another 8-bit float with 2 mantissa bits: its rounding error is "
            "twice E4M3's, so E4M3's threshold would fire at every gradient operand)")
          .in({0, 1e6}),
      field("guard.quant_error_threshold_fp4", &RunConfig::guard, &GuardConfig::quant_error_threshold_fp4, "fraction",
            "the same for an operand in a 4-bit format (E2M1: fp4, mxfp4, nvfp4; its relative error is about 0.1-0.25 "
            "on healthy runs, so 8-bit's threshold would fire at every FP4 operand)")
          .in({0, 1e6}),
      field("guard.quant_error_steps", &RunConfig::guard, &GuardConfig::quant_error_steps, "steps",
            "consecutive steps above the threshold that trigger guard.on_quant_error")
          .in({1, 1e6}),
      field("guard.stall_minutes", &RunConfig::guard, &GuardConfig::stall_minutes, "minutes",
            "warn (log, guard state) when one step has run this long; 0 = off")
          .in({0, 1e6}),
      field("guard.budget_step", &RunConfig::guard, &GuardConfig::budget_step, "fraction",
            "replan (and after a rollback): lower precision.budget by this FLOPs share (0.75 -> 0.65)")
          .in(fraction),
      field("guard.smoothing", &RunConfig::guard, &GuardConfig::smoothing, "fraction",
            "replan (and after a rollback): raise precision.smoothing to at least this")
          .in(fraction),
      field("guard.raise_option", &RunConfig::guard, &GuardConfig::raise_option, "",
            "the option fp8-layer moves a layer to (a recipe name, or bf16)"),
      field("guard.max_rollbacks", &RunConfig::guard, &GuardConfig::max_rollbacks, "",
            "rollbacks allowed in one run; the next one stops the run instead")
          .in({0, 1e6}),
      // [monitor]: the live side of a run (docs/operations.md).
      field("monitor.listen", &RunConfig::monitor, &MonitorConfig::listen, "HOST:PORT",
            "serve Prometheus metrics at http://HOST:PORT/metrics while training; port 0 = any free port (logged); "
            "empty = off. A port in use is a warning and the run goes on without the endpoint"),
      field("monitor.ranks", &RunConfig::monitor, &MonitorConfig::ranks, "",
            "with several ranks: rank0 (only rank 0 serves monitor.listen) or all (each rank serves port + "
            "its local rank)")
          .words({"rank0", "all"}),
      field("monitor.quant_error", &RunConfig::monitor, &MonitorConfig::quant_error, "",
            "measure each quantized GEMM operand's relative error ||Q(x)-x||/||x|| at every step (metrics.jsonl "
            "quant_err, snip_quant_operand_rel_error, the guard's quant_error condition); false = not measured "
            "(docs/benchmarks.md gives its cost)"),
      // [precision]
      field("precision.recipe", &RunConfig::precision, &PrecisionConfig::recipe, "",
            "shorthand for policy uniform-<recipe> on every step (no warmup, no final phase): a name from "
            "`snip formats --recipes`, or none; only with precision.policy = none"),
      field("precision.recipe_file", &RunConfig::precision, &PrecisionConfig::recipe_file, "path",
            "TOML or JSON file of named recipes (operand roles activations/weights/gradients, error_feedback, "
            "compensation_freq; docs/formats.md \"Recipe files\"), registered beside the built-in ones so "
            "their names work in every precision option; relative to the working directory; empty = none"),
      // [precision]: the adaptive method (docs/method.md sections 3-6; docs/planner.md "In training").
      opt("precision.policy", T::kString, std::string("none"), "",
          "who chooses each layer's precision: none (no quantization: every GEMM in train.gemm_dtype; bf16 is an old "
          "name for it), uniform-<recipe> (any recipe, e.g. "
          "uniform-fp8, uniform-mxfp4), snip (stats + ILP), min-rel-err, layer-type, first-last-fp8, random, "
          "or a rival's rule (docs/method.md section 6): autoswitch (TE AutoswitchGemm per GEMM), bf16-tail "
          "(the last 15% of linear layers high), first-last-n (Megatron's first/last N blocks high)")
          .bind([](const OptionValue& v, RunConfig& r) { set_policy(std::get<std::string>(v), r.precision); },
                [](const RunConfig& r) { return OptionValue(r.precision.policy_name()); }),
      field("precision.budget", &RunConfig::precision, &PrecisionConfig::budget, "fraction",
            "budget_unit flops: FP4 FLOPs share every plan must reach (snip and the ordered heuristics); "
            "budget_unit time: the plan's linear-GEMM seconds per step at most this fraction of the same GEMMs "
            "all in bf16 (0.8 = at most 0.8x the BF16 GEMM time, measured; above 1 where the low-precision "
            "GEMMs are slower than BF16, as the emulated ones on CPUs)")
          .in({0, 1e6}),
      field("precision.budget_unit", &RunConfig::precision, &PrecisionConfig::budget_unit, "",
            "what precision.budget counts: flops (the FP4 FLOPs share, the paper's) or time (measured seconds "
            "per GEMM shape and option: precision.gemm_times, or a calibration at start; docs/method.md "
            "\"Budget in measured time\")")
          .words({"flops", "time"}),
      field("precision.gemm_times", &RunConfig::precision, &PrecisionConfig::gemm_times, "path",
            "measured GEMM-times table (RUN/gemm_times.json of snip doctor --calibrate --config FILE or of an "
            "earlier run) the plans predict GEMM time from; empty = with budget_unit time, calibrate on this "
            "machine at start (written to RUN/gemm_times.json)"),
      field("precision.calibrate_seconds", &RunConfig::precision, &PrecisionConfig::calibrate_seconds, "seconds",
            "wall-clock cap of the GEMM-time calibration at start (past it, the remaining GEMMs get one timed "
            "call each)")
          .in({1e-3, 1e6}),
      field("precision.calibration", &RunConfig::precision, &PrecisionConfig::calibration, "",
            "how the calibration at start times the GEMMs: in_step (inside forward and backward passes of the "
            "model on random tokens, as a training step runs them; snip train without pipeline stages) or "
            "isolated (each GEMM alone on random operands, as snip.Controller and pipeline stages do; "
            "under-predicts a CPU step by 11-18%); in_step costs about options x (1 + 5) training steps)")
          .words({"in_step", "isolated"}),
      field("precision.options", &RunConfig::precision, &PrecisionConfig::options, "list",
            "options a layer may run (comma-separated recipe names or bf16); must contain precision.low_option"),
      field("precision.pins", &RunConfig::precision, &PrecisionConfig::pins, "list",
            "comma-separated GLOB=OPTION pins, e.g. '*.down_proj=fp8,layers.3.mlp.*=fp8'"),
      field("precision.warmup_steps", &RunConfig::precision, &PrecisionConfig::warmup_steps, "steps",
            "steps run at warmup_precision before the first plan; -1 = warmup_fraction of train.max_steps")
          .in({-1, inf}),
      field("precision.warmup_fraction", &RunConfig::precision, &PrecisionConfig::warmup_fraction, "fraction",
            "warmup as a fraction of train.max_steps (when warmup_steps = -1)")
          .in(fraction),
      field("precision.warmup_precision", &RunConfig::precision, &PrecisionConfig::warmup_precision, "",
            "option every layer runs during warmup (bf16 or fp8, or any option)"),
      field("precision.initial_interval", &RunConfig::precision, &PrecisionConfig::initial_interval, "steps",
            "re-plan interval at the start of the run; -1 = initial_interval_fraction of train.max_steps")
          .in({-1, inf}),
      field("precision.initial_interval_fraction", &RunConfig::precision, &PrecisionConfig::initial_interval_fraction,
            "fraction", "initial re-plan interval as a fraction of train.max_steps (when initial_interval = -1)")
          .in(fraction),
      field("precision.final_interval", &RunConfig::precision, &PrecisionConfig::final_interval, "steps",
            "re-plan interval at the end of the run (grows linearly from initial_interval); "
            "-1 = final_interval_fraction of train.max_steps")
          .in({-1, inf}),
      field("precision.final_interval_fraction", &RunConfig::precision, &PrecisionConfig::final_interval_fraction,
            "fraction", "final re-plan interval as a fraction of train.max_steps (when final_interval = -1)")
          .in(fraction),
      field("precision.final_high_precision_fraction", &RunConfig::precision,
            &PrecisionConfig::final_high_precision_fraction, "fraction",
            "last fraction of train.max_steps run with every layer at final_precision")
          .in(fraction),
      field("precision.final_precision", &RunConfig::precision, &PrecisionConfig::final_precision, "",
            "option every layer runs in the final high-precision phase"),
      opt("precision.final_phase_gemms", T::kString, std::string("all"), "",
          "what the final phase raises to final_precision: all (every GEMM) or fprop (the forward GEMMs only; "
          "dgrad and wgrad keep the last plan's options: the late forward-only switch of arXiv 2509.25149); "
          "the phase starts at 1 - final_high_precision_fraction of the run")
          .words({"all", "fprop"})
          .bind([](const OptionValue& v, RunConfig& r) {
                  r.precision.final_fprop_only = std::get<std::string>(v) == "fprop";
                },
                [](const RunConfig& r) { return OptionValue(std::string(r.precision.final_fprop_only ? "fprop" : "all")); }),
      field("precision.tail_fraction", &RunConfig::precision, &PrecisionConfig::tail_fraction, "fraction",
            "bf16-tail: the fraction of linear layers, counted from the last, kept at the high option "
            "(NVIDIA's NVFP4 recipe and torchtitan's nvfp4_bf16_tail_fqns keep about 15%)")
          .in(fraction),
      field("precision.first_last_n", &RunConfig::precision, &PrecisionConfig::first_last_n, "blocks",
            "first-last-n: decoder blocks at each end kept at the high option (Megatron-Core's "
            "--num-layers-at-start/end-in-bf16)")
          .in(non_negative),
      field("precision.autoswitch_mse", &RunConfig::precision, &PrecisionConfig::autoswitch_mse, "",
            "autoswitch: a GEMM goes high when the mean squared error of its low-option output (the stats "
            "step's ||e||²/elements, output units squared) exceeds this (TE AutoswitchGemm's default 1e-4)")
          .in(non_negative),
      field("precision.autoswitch_underflow", &RunConfig::precision, &PrecisionConfig::autoswitch_underflow,
            "fraction",
            "autoswitch: a GEMM goes high when more than this fraction of its operands' non-zero elements "
            "quantize to zero at the low option (TE AutoswitchGemm's default 5%)")
          .in(fraction),
      field("precision.smoothing", &RunConfig::precision, &PrecisionConfig::smoothing, "fraction",
            "s in M <- (1-s)*M_new + s*M_old between stats steps (larger = steadier plans)")
          .in(fraction),
      field("precision.alpha", &RunConfig::precision, &PrecisionConfig::alpha, "fraction",
            "weight of the loss divergence in Q = a*LD + (1-a)*WD")
          .in(fraction),
      field("precision.seed", &RunConfig::precision, &PrecisionConfig::seed, "", "seed of the random policy"),
      field("precision.low_option", &RunConfig::precision, &PrecisionConfig::low_option, "",
            "the cheap option the budget counts (its FLOPs share is fp4_share in metrics): fp4 (NVFP4), or another "
            "4-bit recipe such as mxfp4; must be in precision.options"),
      opt("precision.granularity", T::kString, std::string("layer"), "",
          "what one plan decision covers: layer (all three GEMMs of a linear layer) or gemm (fprop, dgrad and "
          "wgrad separately, docs/method.md section 2)")
          .words({"layer", "gemm"})
          .bind([](const OptionValue& v, RunConfig& r) { r.precision.per_gemm = std::get<std::string>(v) == "gemm"; },
                [](const RunConfig& r) { return OptionValue(std::string(r.precision.per_gemm ? "gemm" : "layer")); }),
      opt("precision.first_order", T::kString, std::string("drop"), "",
          "first-order term of the loss divergence: drop (curvature term only; best in the correlation study, "
          "docs/results.md), abs (|<g,e>|) or signed (<g,e>)")
          .words({"abs", "signed", "drop"})
          .bind(
              [](const OptionValue& v, RunConfig& r) {
                r.precision.first_order = parse_first_order(std::get<std::string>(v), "config: precision.first_order");
              },
              [](const RunConfig& r) { return OptionValue(std::string(to_string(r.precision.first_order))); }),
      field("precision.curvature_probes", &RunConfig::precision, &PrecisionConfig::curvature_probes, "",
            "noise-injection probes per stats step for the LD curvature term (each one extra forward+backward)")
          .in({0, 64}),
  };
  std::sort(t.begin(), t.end(), [](const OptionSpec& a, const OptionSpec& b) { return a.key < b.key; });
  return t;
}


const char* type_name(OptionType t) {
  switch (t) {
    case T::kBool: return "a boolean (true/false)";
    case T::kInt: return "an integer";
    case T::kFloat: return "a number";
    case T::kString: return "a string";
  }
  return "?";
}

/// A number literal no double (float option) or int64 (integer option)
/// holds: refused by the option's range, like any value outside it.
[[noreturn]] void beyond_type(const std::string& what, const OptionSpec& s, const std::string& literal) {
  const bool integer = s.type == OptionType::kInt;
  const std::string range = s.range.describe(integer);
  fail(what, ": ", s.key, ": expected ", integer ? "an integer" : "a finite number", range.empty() ? "" : " ", range,
       ", got ", literal, integer ? " (beyond 64 bits)" : " (beyond a double's range)");
}

[[noreturn]] void unknown_key(const std::string& key, const std::string& what) {
  fail(what, ": unknown option '", key, "' (did you mean '", closest_option_key(key),
       "'? `snip train --help` lists every option)");
}

}  // namespace

const OptionSpec* find_spec(const std::string& key) {
  for (const auto& s : option_table())
    if (s.key == key) return &s;
  return nullptr;
}

const std::vector<OptionSpec>& option_table() {
  static const std::vector<OptionSpec> table = make_table();
  return table;
}

std::string closest_option_key(const std::string& full_key) {
  // Edit distances cost |key| x |option| each: a key of kilobytes (a file's
  // junk line) made the suggestion take seconds under the fuzzer. No option
  // is longer than 64 characters, so neither is a useful look-up.
  const std::string key = full_key.substr(0, 64);
  // Names other trainers use for the same thing (Hugging Face Trainer,
  // nanoGPT, Megatron), matched on the key's last component.
  static const std::map<std::string, std::string> kSynonyms = {
      {"learning_rate", "train.lr"},
      {"steps", "train.max_steps"},
      {"num_steps", "train.max_steps"},
      {"max_iters", "train.max_steps"},
      {"train_iters", "train.max_steps"},
      {"bsz", "train.batch_size"},
      {"micro_batch_size", "train.batch_size"},
      {"per_device_train_batch_size", "train.batch_size"},
      {"block_size", "train.seq_len"},
      {"seq_length", "train.seq_len"},
      {"sequence_length", "train.seq_len"},
      {"gradient_accumulation_steps", "train.grad_accum"},
      {"max_grad_norm", "train.grad_clip"},
      {"clip_grad", "train.grad_clip"},
      {"warmup", "train.warmup_steps"},
      {"lr_warmup_iters", "train.warmup_steps"},
      {"n_layer", "model.num_hidden_layers"},
      {"num_layers", "model.num_hidden_layers"},
      {"n_head", "model.num_attention_heads"},
      {"n_embd", "model.hidden_size"},
      {"d_model", "model.hidden_size"},
      {"ffn_hidden_size", "model.intermediate_size"},
  };
  const std::string last = key.substr(key.rfind('.') == std::string::npos ? 0 : key.rfind('.') + 1);
  if (auto it = kSynonyms.find(last); it != kSynonyms.end()) return it->second;
  std::string best;
  size_t best_d = SIZE_MAX;
  // Compare against the full key and against the last component, so that
  // "train.learning_rat" and "lr" both find "train.lr".
  // The distance is at least the difference in length: a candidate that
  // cannot beat the best so far is not computed (same result, less work).
  auto distance = [&](const std::string& b) {
    const size_t gap = key.size() > b.size() ? key.size() - b.size() : b.size() - key.size();
    return gap >= best_d ? SIZE_MAX : edit_distance(key, b);
  };
  for (const auto& s : option_table()) {
    size_t d = distance(s.key);
    const auto dot = s.key.find('.');
    if (key.find('.') == std::string::npos && dot != std::string::npos)
      d = std::min(d, distance(s.key.substr(dot + 1)));
    if (d < best_d) best_d = d, best = s.key;
  }
  return best;
}

std::string format_option_value(const OptionValue& v) {
  std::ostringstream os;
  if (const auto* b = std::get_if<bool>(&v)) os << (*b ? "true" : "false");
  else if (const auto* i = std::get_if<int64_t>(&v)) os << *i;
  else if (const auto* d = std::get_if<double>(&v)) {
    // The shortest decimal that reads back as the same double (0.9, not
    // 0.90000000000000002), with every digit of the integer part below 1e16
    // (10.0 and 300.0, not 1e+01 and 3e+02).
    std::string s;
    const double mag = std::fabs(*d);
    const int int_digits = std::isfinite(mag) && mag >= 1 && mag < 1e16 ? int(std::floor(std::log10(mag))) + 1 : 1;
    for (int prec = int_digits; prec <= 17; ++prec) {
      std::ostringstream t;
      t.precision(prec);
      t << *d;
      s = t.str();
      if (std::stod(s) == *d || !std::isfinite(*d)) break;
    }
    if (s.find_first_of(".eEni") == std::string::npos) s += ".0";
    os << s;
  } else os << toml::value<std::string>(std::get<std::string>(v));
  return os.str();
}

Config::Config() {}

const OptionValue& Config::raw(const std::string& key) const {
  auto it = values_.find(key);
  if (it != values_.end()) return it->second;
  const OptionSpec* s = find_spec(key);
  SNIP_CHECK(s != nullptr, "no option named ", key);
  return s->def;
}

const OptionValue& Config::get(const std::string& key) const {
  if (!find_spec(key)) unknown_key(key, "config");
  return raw(key);
}

std::string Config::origin(const std::string& key) const {
  const auto it = origins_.find(key);
  if (it == origins_.end()) return "config";
  // "--set k=v" names where already, as the parse errors of --set do.
  return it->second.rfind("--set ", 0) == 0 ? it->second : "config: " + it->second;
}

bool Config::differs_from_default(const std::string& key) const {
  const OptionSpec* s = find_spec(key);
  SNIP_CHECK(s != nullptr, "no option named ", key);
  return !(raw(key) == s->def);
}

bool Config::get_bool(const std::string& key) const { return std::get<bool>(raw(key)); }
int64_t Config::get_int(const std::string& key) const { return std::get<int64_t>(raw(key)); }
double Config::get_float(const std::string& key) const { return std::get<double>(raw(key)); }
const std::string& Config::get_string(const std::string& key) const {
  return std::get<std::string>(raw(key));
}

void Config::set(const std::string& key, const OptionValue& v, const std::string& what) {
  const OptionSpec* s = find_spec(key);
  if (!s) unknown_key(key, what);
  OptionValue val = v;
  // Dtype names are the same everywhere: PyTorch's long names are accepted
  // for the short ones (train.gemm_dtype = "bfloat16" is "bf16").
  if (const auto* str = std::get_if<std::string>(&v);
      str && std::find(s->choices.begin(), s->choices.end(), "bf16") != s->choices.end()) {
    if (*str == "bfloat16") val = std::string("bf16");
    if (*str == "float32") val = std::string("fp32");
  }
  // The unquantized policy was called "bf16" in earlier versions, though its
  // GEMMs run in train.gemm_dtype (FP32 too): the old name is read as "none".
  if (const auto* str = std::get_if<std::string>(&v); str && key == "precision.policy" && *str == "bf16")
    val = std::string("none");
  // An integer is accepted where a number is expected.
  if (s->type == T::kFloat && std::holds_alternative<int64_t>(v))
    val = static_cast<double>(std::get<int64_t>(v));
  const bool ok = (s->type == T::kBool && std::holds_alternative<bool>(val)) ||
                  (s->type == T::kInt && std::holds_alternative<int64_t>(val)) ||
                  (s->type == T::kFloat && std::holds_alternative<double>(val)) ||
                  (s->type == T::kString && std::holds_alternative<std::string>(val));
  if (!ok) {
    // `lr = "3e-4"`, `fp8_tail = "true"`: the value is right but quoted,
    // which makes it a TOML string; say so.
    std::string hint;
    if (const auto* str = std::get_if<std::string>(&v); str && s->type != T::kString) {
      char* end = nullptr;
      const bool number = !str->empty() && (std::strtod(str->c_str(), &end), end && *end == '\0');
      const bool boolean = *str == "true" || *str == "false";
      if ((s->type == T::kBool && boolean) || (s->type != T::kBool && number))
        hint = str_cat(" (a quoted string; write it without quotes: ", key.substr(key.find('.') + 1), " = ", *str, ")");
    }
    fail(what, ": ", key, ": expected ", type_name(s->type), ", got ", format_option_value(v), hint);
  }
  values_[key] = val;
  origins_[key] = what;
}

void Config::load_toml_string(const std::string& text, const std::string& what) {
  io::check_toml_depth(text, what);
  toml::table tbl;
  try {
    tbl = toml::parse(text, what);
  } catch (const toml::parse_error& e) {
    // `recipe = fp4`: TOML strings need quotes; say so.
    std::string hint;
    const size_t line_no = size_t(e.source().begin.line);
    std::istringstream lines(text);
    std::string line;
    for (size_t i = 1; std::getline(lines, line) && i <= line_no; ++i)
      if (i == line_no) {
        static const std::regex bare(R"(^\s*([A-Za-z0-9_.-]+)\s*=\s*([A-Za-z_][A-Za-z0-9_.,/-]*)\s*(#.*)?$)");
        std::smatch m;
        if (std::regex_match(line, m, bare))
          hint = str_cat(" (strings need quotes: ", m[1].str(), " = \"", m[2].str(), "\")");
        // `lr = 1e309`, `max_steps = 99999999999999999999`: toml++ cannot
        // hold the number; the option's range refuses it by name.
        static const std::regex num(R"(^\s*([A-Za-z0-9_-]+)\s*=\s*([-+]?[0-9][0-9_]*(\.[0-9_]*)?([eE][-+]?[0-9_]+)?)\s*(#.*)?$)");
        if (std::regex_match(line, m, num)) {
          std::string section;
          std::istringstream before(text);
          static const std::regex header(R"(^\s*\[\s*([A-Za-z0-9_-]+)\s*\]\s*(#.*)?$)");
          std::string l;
          std::smatch h;
          for (size_t k = 1; k < line_no && std::getline(before, l); ++k)
            if (std::regex_match(l, h, header)) section = h[1].str();
          std::string digits = m[2].str();
          digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
          const double x = std::strtod(digits.c_str(), nullptr);
          const OptionSpec* spec = find_spec(section + "." + m[1].str());
          if (spec && ((spec->type == T::kFloat && !std::isfinite(x)) ||
                       (spec->type == T::kInt && std::fabs(x) >= 9.2e18)))
            beyond_type(str_cat(what, ":", line_no), *spec, m[2].str());
        }
      }
    fail(what, ":", e.source().begin.line, ":", e.source().begin.column, ": TOML syntax error: ",
         e.description(), hint);
  }
  for (auto&& [section, node] : tbl) {
    const std::string sec(section.str());
    const toml::table* sub = node.as_table();
    if (!sub) unknown_key(sec, what);
    for (auto&& [name, val] : *sub) {
      const std::string key = sec + "." + std::string(name.str());
      OptionValue v;
      if (auto b = val.value_exact<bool>()) v = *b;
      else if (auto i = val.value_exact<int64_t>()) v = *i;
      else if (auto d = val.value_exact<double>()) v = *d;
      else if (auto s = val.value_exact<std::string>()) v = *s;
      else if (const toml::array* arr = val.as_array();
               arr && find_spec(key) && find_spec(key)->unit == "list") {
        // A list option written as a TOML array: ["fp4", "fp8"] = "fp4,fp8".
        std::string joined;
        for (const toml::node& e : *arr) {
          const auto str = e.value_exact<std::string>();
          if (!str || str->empty() || str->find(',') != std::string::npos)
            fail(what, ":", val.source().begin.line, ": ", key,
                 ": expected a list of non-empty strings without commas, e.g. [\"fp4\", \"fp8\"]");
          joined += (joined.empty() ? "" : ",") + *str;
        }
        v = joined;
      } else {
        if (!find_spec(key)) unknown_key(key, what);
        fail(what, ":", val.source().begin.line, ": ", key, ": expected ",
             type_name(find_spec(key)->type), ", got a TOML ", val.type());
      }
      set(key, v, str_cat(what, ":", val.source().begin.line));
    }
  }
}

void Config::load_toml_file(const std::string& path) {
  if (std::filesystem::is_directory(path)) fail("config file '", path, "' is a directory, expected a TOML file");
  std::ifstream in(path);
  if (!in) fail("config file '", path, "' cannot be read: ", std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  load_toml_string(ss.str(), path);
}

void Config::set_override(const std::string& assignment) {
  const std::string what = "--set " + assignment;
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) fail(what, ": expected section.key=value");
  const std::string key = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  const OptionSpec* s = find_spec(key);
  if (!s) unknown_key(key, what);
  // --set k="0.2" reaches us with the quotes when the shell kept them
  // (--set 'k="0.2"'): a number, boolean or one of an option's words needs
  // none (a free string, a path or a prompt, may hold quotes).
  if ((s->type != T::kString || !s->choices.empty()) && text.size() >= 2 && (text.front() == '"' || text.front() == '\'') && text.back() == text.front())
    fail(what, ": ", key, ": the value is quoted; --set takes it without quotes: --set ", key, "=",
         text.substr(1, text.size() - 2));
  OptionValue v;
  switch (s->type) {
    case T::kBool:
      if (text == "true" || text == "1") v = true;
      else if (text == "false" || text == "0") v = false;
      else fail(what, ": ", key, ": expected true or false, got '", text, "'");
      break;
    case T::kInt: {
      size_t pos = 0;
      long long x = 0;
      try {
        x = std::stoll(text, &pos);
      } catch (const std::out_of_range&) {
        beyond_type(what, *s, text);
      } catch (...) {
        pos = 0;
      }
      if (pos == 0 || pos != text.size()) fail(what, ": ", key, ": expected an integer, got '", text, "'");
      v = int64_t{x};
      break;
    }
    case T::kFloat: {
      size_t pos = 0;
      double x = 0;
      try {
        x = std::stod(text, &pos);
      } catch (const std::out_of_range&) {
        // stod also throws for a subnormal result (1e-310); only overflow is out of range.
        char* end = nullptr;
        const double y = std::strtod(text.c_str(), &end);
        if (*end != '\0') pos = 0;
        else if (std::isfinite(y)) x = y, pos = text.size();
        else beyond_type(what, *s, text);
      } catch (...) {
        pos = 0;
      }
      if (pos == 0 || pos != text.size()) fail(what, ": ", key, ": expected a number, got '", text, "'");
      v = x;
      break;
    }
    case T::kString: v = text; break;
  }
  set(key, v, what);
}

std::string Config::to_toml() const {
  std::ostringstream os;
  os << "# Resolved snip configuration (every option, defaults included).\n";
  std::string section;
  for (const auto& s : option_table()) {
    const auto dot = s.key.find('.');
    const std::string sec = s.key.substr(0, dot);
    if (sec != section) {
      os << (section.empty() ? "" : "\n") << "[" << sec << "]\n";
      section = sec;
    }
    os << s.key.substr(dot + 1) << " = " << format_option_value(raw(s.key)) << "  # " << s.help;
    if (!s.unit.empty()) os << " [" << s.unit << "]";
    os << "\n";
  }
  return os.str();
}

void Config::validate() const {
  // Each option alone: its range or its allowed words (option_table()).
  for (const auto& s : option_table()) {
    if (s.type == T::kInt || s.type == T::kFloat) {
      const bool integer = s.type == T::kInt;
      const double v = integer ? double(get_int(s.key)) : get_float(s.key);
      if ((!integer && !std::isfinite(v)) || !s.range.contains(v))
        fail(origin(s.key), ": ", s.key, ": expected ", integer ? "an integer" : "a finite number", " ",
             s.range.describe(integer), ", got ", integer ? std::to_string(get_int(s.key)) : number(v, false));
    } else if (s.type == T::kString && !s.choices.empty()) {
      const std::string& v = get_string(s.key);
      if (std::find(s.choices.begin(), s.choices.end(), v) == s.choices.end())
        fail(origin(s.key), ": ", s.key, ": expected ", either(s.choices), ", got '", v, "'");
    }
  }
  // Options together.
  // precision.budget: a share in [0, 1] under budget_unit flops, a positive
  // ratio to the BF16 GEMM time under time (docs/method.md).
  const double budget = get_float("precision.budget");
  if (get_string("precision.budget_unit") == "time") {
    if (!(budget > 0))
      fail(origin("precision.budget"), ": precision.budget: expected a positive ratio to the BF16 GEMM time "
           "(precision.budget_unit = time), got ", number(budget, false));
  } else if (budget > 1) {
    fail(origin("precision.budget"), ": precision.budget: expected a finite number in [0, 1], got ",
         number(budget, false), " (an FP4 FLOPs share; a ratio to the BF16 GEMM time needs precision.budget_unit = "
         "time)");
  }
  const int64_t C = get_int("model.hidden_size"), NH = get_int("model.num_attention_heads"),
                NKV = get_int("model.num_key_value_heads");
  if (C % NH != 0)
    fail("config: model.hidden_size (", C, ") must be divisible by model.num_attention_heads (", NH, ")");
  if ((C / NH) % 2 != 0)
    fail("config: head dimension hidden_size/num_attention_heads = ", C / NH, " must be even (RoPE)");
  if (NH % NKV != 0)
    fail("config: model.num_attention_heads (", NH, ") must be divisible by model.num_key_value_heads (",
         NKV, ")");
  if (get_int("train.seq_len") > get_int("model.max_position_embeddings"))
    fail("config: train.seq_len (", get_int("train.seq_len"), ") exceeds model.max_position_embeddings (",
         get_int("model.max_position_embeddings"), ")");
  if (get_int("train.batch_size") * get_int("train.seq_len") > (int64_t{1} << 24))
    fail("config: train.batch_size x train.seq_len = ", get_int("train.batch_size") * get_int("train.seq_len"),
         " tokens per micro-batch, expected at most ", int64_t{1} << 24);
}

std::string OptionRange::describe(bool integer) const {
  const bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
  if (has_lo && has_hi)
    return std::string("in ") + (lo_open ? "(" : "[") + number(lo, integer) + ", " + number(hi, integer) +
           (hi_open ? ")" : "]");
  if (has_lo) return std::string(lo_open ? "> " : ">= ") + number(lo, integer);
  if (has_hi) return std::string(hi_open ? "< " : "<= ") + number(hi, integer);
  return "";
}

bool OptionRange::contains(double v) const {
  return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
}

std::map<std::string, std::string> read_toml_display(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path, ": cannot be read: ", std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  io::check_toml_depth(ss.str(), path);
  toml::table tbl;
  try {
    tbl = toml::parse(ss.str(), path);
  } catch (const toml::parse_error& e) {
    fail(path, ":", e.source().begin.line, ":", e.source().begin.column, ": TOML syntax error: ", e.description());
  }
  std::map<std::string, std::string> out;
  auto text = [](const toml::node& v) -> std::optional<std::string> {
    if (auto s = v.value_exact<std::string>()) return *s;
    if (auto b = v.value_exact<bool>()) return std::string(*b ? "true" : "false");
    if (auto i = v.value_exact<int64_t>()) return std::to_string(*i);
    if (auto d = v.value_exact<double>()) return format_option_value(*d);
    return std::nullopt;
  };
  for (auto&& [section, node] : tbl) {
    if (const toml::table* sub = node.as_table()) {
      for (auto&& [name, val] : *sub)
        if (auto t = text(val)) out[std::string(section.str()) + "." + std::string(name.str())] = *t;
    } else if (auto t = text(node)) {
      out[std::string(section.str())] = *t;
    }
  }
  return out;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

const char* to_string(Policy p) {
  switch (p) {
    case Policy::kNone: return "none";
    case Policy::kUniform: return "uniform";
    case Policy::kSnip: return "snip";
    case Policy::kMinRelErr: return "min-rel-err";
    case Policy::kLayerType: return "layer-type";
    case Policy::kFirstLastFp8: return "first-last-fp8";
    case Policy::kRandom: return "random";
    case Policy::kAutoswitch: return "autoswitch";
    case Policy::kBf16Tail: return "bf16-tail";
    case Policy::kFirstLastN: return "first-last-n";
  }
  return "?";
}

const char* to_string(GemmBackend b) { return kGemmBackendNames[size_t(b)]; }
const char* to_string(PipelineSchedule s) { return kScheduleNames[size_t(s)]; }
const char* to_string(BoundaryComm c) { return kBoundaryNames[size_t(c)]; }
const char* to_string(LoraInit i) { return kLoraInitNames[size_t(i)]; }
void to_json(nlohmann::json& j, GemmBackend b) { j = to_string(b); }
void to_json(nlohmann::json& j, PipelineSchedule s) { j = to_string(s); }
void to_json(nlohmann::json& j, BoundaryComm c) { j = to_string(c); }
void to_json(nlohmann::json& j, LoraInit i) { j = to_string(i); }

const char* to_string(FirstOrder f) {
  switch (f) {
    case FirstOrder::kDrop: return "drop";
    case FirstOrder::kAbs: return "abs";
    case FirstOrder::kSigned: return "signed";
  }
  return "?";
}

FirstOrder parse_first_order(const std::string& s, const std::string& what) {
  for (FirstOrder f : {FirstOrder::kAbs, FirstOrder::kSigned, FirstOrder::kDrop})
    if (s == to_string(f)) return f;
  fail(what, ": expected abs, signed or drop, got '", s, "'");
}

const char* to_string(GuardAction a) { return kActionNames[int(a)]; }

double GuardConfig::threshold_for(const std::string& format) const {
  const std::optional<formats::ElementFormat> f = formats::lookup_element_format(format);
  if (!f) return quant_error_threshold;
  if (f->bits <= 4) return quant_error_threshold_fp4;
  if (f->kind == formats::ElementKind::kFloat && f->mbits <= 2) return quant_error_threshold_e5m2;
  return quant_error_threshold;
}

GuardAction parse_guard_action(const std::string& s, const std::string& what) {
  for (int i = 0; i < 5; ++i)
    if (s == kActionNames[i]) return GuardAction(i);
  fail(what, ": expected warn, fp8-layer, replan, rollback or stop, got '", s, "'");
}

std::string PrecisionConfig::policy_name() const {
  return policy == Policy::kUniform ? "uniform-" + uniform_option : to_string(policy);
}

namespace {

// RunConfig::from's parse of a validated `c`.
RunConfig parse_run_config(const Config& c, recipes::RecipeSet recipes) {
  RunConfig r;
  r.recipes = std::move(recipes);
  for (const OptionSpec& o : option_table()) o.set(c.get(o.key), r);
  const LoraConfig& l = r.lora;
  if (l.rank > 0 && l.target.empty()) fail("config: lora.target: expected at least one glob, got an empty list");
  if (l.rank > 0 && !(l.alpha > 0))
    fail("config: lora.alpha: expected a positive number (the adapters' output is scaled by alpha / rank), got ",
         l.alpha);
  return r;
}

}  // namespace

RunConfig RunConfig::from(const Config& c) {
  c.validate();  // the options first, then the recipe file they name
  return parse_run_config(c, recipes::load_recipe_set(c.get_string("precision.recipe_file")));
}

RunConfig RunConfig::from(const Config& c, recipes::RecipeSet recipes) {
  c.validate();
  return parse_run_config(c, std::move(recipes));
}

}  // namespace snip
