// Run configuration: the option table, TOML parsing, overrides, suggestions.
#include "snip/config/config.h"

#include <algorithm>
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
#include <toml++/toml.h>

#include "snip/io/toml.h"
#include "snip/util/error.h"
#include "snip/util/strings.h"

namespace snip {
namespace {

using T = OptionType;

OptionSpec opt(std::string key, T type, OptionValue def, std::string unit, std::string help) {
  return OptionSpec{std::move(key), type, std::move(def), std::move(unit), std::move(help), {}, {}};
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
  std::vector<OptionSpec> t = {
      // [model]: Hugging Face LlamaConfig fields (same names as config.json).
      opt("model.vocab_size", T::kInt, int64_t{0}, "tokens",
          "vocabulary size V; 0 = take it from the tokenizer of data.dir"),
      opt("model.hidden_size", T::kInt, int64_t{256}, "", "model width C"),
      opt("model.intermediate_size", T::kInt, int64_t{688}, "", "SwiGLU inner width F"),
      opt("model.num_hidden_layers", T::kInt, int64_t{4}, "", "decoder blocks L"),
      opt("model.num_attention_heads", T::kInt, int64_t{8}, "", "query heads NH"),
      opt("model.num_key_value_heads", T::kInt, int64_t{4}, "",
          "key/value heads NKV (grouped-query attention; divides NH)"),
      opt("model.rms_norm_eps", T::kFloat, 1e-5, "", "RMSNorm epsilon"),
      opt("model.rope_theta", T::kFloat, 10000.0, "", "RoPE base frequency"),
      opt("model.tie_word_embeddings", T::kBool, true, "", "lm_head shares embed_tokens' weight"),
      opt("model.max_position_embeddings", T::kInt, int64_t{2048}, "tokens",
          "longest sequence RoPE tables are built for"),
      opt("model.init_std", T::kFloat, 0.02, "", "std of the normal init of linear/embedding weights"),
      // [data]
      opt("data.dir", T::kString, std::string("data/kjv"), "",
          "prepared data folder (train.bin, val.bin, tokenizer.model from `snip data prepare`)"),
      // [train]
      opt("train.seed", T::kInt, int64_t{1234}, "", "seed for init and data order"),
      opt("train.batch_size", T::kInt, int64_t{16}, "sequences", "micro-batch size B"),
      opt("train.seq_len", T::kInt, int64_t{128}, "tokens", "sequence length T"),
      opt("train.grad_accum", T::kInt, int64_t{1}, "micro-batches",
          "micro-batches accumulated per optimizer step"),
      opt("train.max_steps", T::kInt, int64_t{1000}, "steps", "optimizer steps to run"),
      opt("train.lr", T::kFloat, 3e-3, "", "peak learning rate"),
      opt("train.min_lr_ratio", T::kFloat, 0.1, "fraction", "final LR as a fraction of train.lr"),
      opt("train.warmup_steps", T::kInt, int64_t{50}, "steps", "linear LR warmup"),
      opt("train.weight_decay", T::kFloat, 0.1, "",
          "AdamW decoupled weight decay (2-D weights only; norms are not decayed)"),
      opt("train.beta1", T::kFloat, 0.9, "", "AdamW beta1"),
      opt("train.beta2", T::kFloat, 0.95, "", "AdamW beta2"),
      opt("train.eps", T::kFloat, 1e-8, "", "AdamW epsilon"),
      opt("train.grad_clip", T::kFloat, 1.0, "", "max global gradient L2 norm; 0 = off"),
      opt("train.clip_low_precision", T::kFloat, 1.0, "fraction",
          "factor on train.grad_clip while any layer runs below FP8 (a GEMM operand with fewer than 8 element "
          "bits, e.g. fp4); docs/operations.md suggests 0.5-0.7; 1 = the same threshold"),
      opt("train.zero_stage", T::kInt, int64_t{0}, "",
          "several ranks: 0 = plain data parallel, 1 = AdamW state sharded over the ranks (ZeRO-1), "
          "2 = also the reduced gradients (ZeRO-2); docs/distributed.md"),
      opt("train.gemm_dtype", T::kString, std::string("bf16"), "",
          "dtype the linear-layer GEMMs run in: bf16 (FP32 accumulate) or fp32"),
      opt("train.gemm_backend", T::kString, std::string("auto"), "",
          "how BF16 GEMMs run: native (LibTorch's BF16 kernel), emulated (FP32 GEMM on BF16-rounded "
          "operands, same numerics), auto (native where it accumulates in FP32; `snip doctor` shows it)"),
      opt("train.eval_interval", T::kInt, int64_t{100}, "steps", "evaluate every N steps (and at the end)"),
      opt("train.eval_batches", T::kInt, int64_t{16}, "micro-batches",
          "validation micro-batches per evaluation; 0 = the whole validation split"),
      opt("train.checkpoint_interval", T::kInt, int64_t{500}, "steps",
          "checkpoint every N steps (and at the end); 0 = only at the end"),
      opt("train.checkpoint_minutes", T::kFloat, 30.0, "minutes",
          "also checkpoint when this much wall time passed since the last checkpoint (bounds the work a "
          "crash or preemption loses); 0 = by steps only"),
      opt("train.keep_checkpoints", T::kInt, int64_t{2}, "", "newest checkpoints kept; 0 = all"),
      opt("train.log_interval", T::kInt, int64_t{10}, "steps", "progress line every N steps"),
      opt("train.threads", T::kInt, int64_t{0}, "", "CPU threads for LibTorch; 0 = all cores"),
      opt("train.sample_tokens", T::kInt, int64_t{32}, "tokens",
          "at each evaluation, print a sample of this many tokens after train.sample_prompt; 0 = none"),
      opt("train.sample_prompt", T::kString, std::string("The"), "", "prompt of the samples printed at evaluations"),
      // [dist]: several processes (docs/distributed.md); world from torchrun or Slurm.
      opt("dist.backend", T::kString, std::string("auto"), "",
          "c10d backend: auto (nccl when LibTorch has it and the model is on a GPU, else gloo), gloo or nccl"),
      opt("dist.timeout_s", T::kFloat, 300.0, "seconds",
          "how long a rank waits for the others (rendezvous, every collective) before it stops with an error"),
      opt("dist.check_interval", T::kInt, int64_t{100}, "steps",
          "compare a checksum of every parameter across ranks every N steps (and at every checkpoint); 0 = "
          "only at checkpoints"),
      opt("dist.grad_comm", T::kString, std::string("fp32"), "",
          "gradient communication: fp32 (the plain FP32 all-reduce), or a recipe from `snip formats --recipes` "
          "(bf16, fp8, fp4, mxfp4, nvfp4, ...): each rank sends its gradient quantized with the recipe's "
          "fprop.w spec, scales shared by all ranks; how it travels: dist.grad_comm_path (docs/distributed.md)"),
      opt("dist.error_feedback", T::kBool, true, "",
          "with dist.grad_comm other than fp32: keep each rank's quantization residual and add it to the next "
          "step's gradient (Karimireddy et al. 2019, error feedback)"),
      opt("dist.grad_comm_path", T::kString, std::string("allreduce"), "",
          "how quantized gradients travel: allreduce (decoded to FP32 and summed by the FP32 all-reduce: exact "
          "numerics, 4 bytes per element on the wire) or allgather (packed codes and scales all-gathered, decoded "
          "and summed in rank order on every rank: the format's bytes on the wire)"),
      opt("dist.overlap", T::kBool, true, "",
          "start each FP32 gradient bucket's all-reduce from autograd hooks as soon as its gradients are final "
          "(overlapping backward); false = every bucket after backward (same numbers)"),
      opt("dist.pipeline_stages", T::kInt, int64_t{1}, "",
          "pipeline parallelism: split the decoder blocks into this many contiguous stages (embedding with the "
          "first, final norm and lm_head with the last); the world is stages x data-parallel replicas, rank = "
          "stage * replicas + replica (docs/distributed.md \"Pipeline stages\"); 1 = no pipeline"),
      opt("dist.pipeline_schedule", T::kString, std::string("1f1b"), "",
          "pipeline schedule: gpipe (all forwards, then all backwards) or 1f1b (one forward, one backward in "
          "the steady state: at most stages - stage micro-batches of activations held)"),
      opt("dist.micro_batches", T::kInt, int64_t{0}, "",
          "micro-batches per step and data-parallel replica under pipeline stages; 0 = train.grad_accum"),
      opt("dist.boundary_comm", T::kString, std::string("fp32"), "",
          "how activations and their gradients cross stage boundaries: fp32, or fp8 (activations E4M3, "
          "gradients E5M2, one FP32 per-tensor scale each, packed bytes on the wire)"),
      opt("dist.stage_boundary", T::kString, std::string("fp8"), "",
          "precision option pinned on the first and last quantized layer of every pipeline stage (docs/method.md "
          "section 4), or none"),
      opt("dist.stage_split", T::kString, std::string("balanced"), "",
          "how blocks are split into stages: balanced (equal estimated stage time, counting the precision), "
          "even (as `snip plan --stages`), or the block count of every stage, e.g. \"3,2\""),
      opt("dist.rebalance", T::kBool, true, "",
          "with dist.stage_split = balanced: when a new precision plan makes another split faster (estimated), "
          "move the blocks at the next checkpoint (a step's arithmetic does not depend on the split; the "
          "per-stage plan rows and boundary pins follow the new split from the next plan)"),
      opt("dist.stage_cost", T::kString, std::string("bits"), "",
          "relative GEMM time of each precision option for the stage balance: bits (element bits / 16: FP4 "
          "0.25, FP8 0.5, BF16 1), measured (one quantized layer's forward and backward timed per option on "
          "rank 0 at the start), or a list such as \"fp4=0.25,fp8=0.5,bf16=1\""),
      // [lora]: SNIP-LoRA fine-tuning of a frozen base (docs/lora.md); on when lora.rank > 0.
      opt("lora.rank", T::kInt, int64_t{0}, "",
          "rank r of the low-rank adapters A [r, IN] and B [OUT, r] on every targeted layer; 0 = no adapters "
          "(full training). With r > 0 the base model (--init-from HF_DIR) is frozen and only the adapters train"),
      opt("lora.alpha", T::kFloat, 16.0, "",
          "LoRA alpha: the adapter output is scaled by alpha / rank (Hu et al. 2021, PEFT's lora_alpha)"),
      opt("lora.dropout", T::kFloat, 0.0, "fraction", "dropout on the adapter's input during training (PEFT's lora_dropout)"),
      opt("lora.target", T::kString, std::string("*_proj"), "list",
          "comma-separated globs over Hugging Face layer names that get adapters, e.g. '*.q_proj,*.v_proj'"),
      opt("lora.init", T::kString, std::string("kaiming"), "",
          "adapter initialisation: kaiming (A Kaiming-uniform, B zero: the LoRA paper, PEFT's default) or "
          "gaussian (A ~ N(0, 1/r^2), B zero: PEFT's init_lora_weights='gaussian')"),
      opt("lora.train_norms", T::kBool, false, "",
          "also train the RMSNorm weights (exported as PEFT modules_to_save)"),
      opt("lora.pack_base", T::kBool, true, "",
          "keep the frozen base's linear weights in their packed plan precision (FP4 codes two per byte plus "
          "scales, FP8 bytes, BF16) instead of FP32"),
      // [checkpoint]: the rollback baseline (docs/operations.md "The guard").
      opt("checkpoint.keep_good", T::kInt, int64_t{1}, "",
          "also keep the newest N checkpoints that passed validation (finite, validation loss at most "
          "checkpoint.good_margin above the best), apart from train.keep_checkpoints; the guard rolls back to "
          "the newest of them; 0 = every checkpoint counts as good and only the rolling ones are kept"),
      opt("checkpoint.good_margin", T::kFloat, 0.05, "fraction",
          "a checkpoint passes validation when its validation loss is at most (1 + margin) x the best so far"),
      // [guard]: conditions checked every step and what to do (docs/operations.md "The guard").
      opt("guard.enabled", T::kBool, true, "",
          "check the guard's conditions every step; false = a non-finite loss ends the run as before"),
      opt("guard.on_nonfinite", T::kString, std::string("rollback"), "",
          "a non-finite loss or gradient (the step's update is always skipped): warn, fp8-layer, replan, "
          "rollback or stop"),
      opt("guard.on_loss_spike", T::kString, std::string("rollback"), "",
          "the loss more than guard.spike_ratio above its mean over guard.spike_window steps: warn, fp8-layer, "
          "replan, rollback or stop"),
      opt("guard.on_quant_error", T::kString, std::string("warn"), "",
          "a layer's relative quantization error above guard.quant_error_threshold for guard.quant_error_steps "
          "(guard.quant_error_threshold_fp4 for 4-bit formats) measurements in a row: warn, fp8-layer, replan, "
          "rollback or stop (docs/operations.md)"),
      opt("guard.on_throughput_drop", T::kString, std::string("warn"), "",
          "tokens/s below (1 - guard.throughput_drop) x its mean over guard.spike_window steps: warn or stop"),
      opt("guard.spike_window", T::kInt, int64_t{20}, "steps",
          "steps of the running mean the loss spike and throughput drop compare against"),
      opt("guard.spike_ratio", T::kFloat, 0.5, "fraction",
          "loss spike: loss > (1 + ratio) x the window's mean (as the SnipLossSpike alert rule)"),
      opt("guard.throughput_drop", T::kFloat, 0.5, "fraction",
          "throughput drop: tokens/s < (1 - drop) x the window's mean"),
      opt("guard.quant_error_threshold", T::kFloat, 0.05, "fraction",
          "relative quantization error above which a measurement of a layer in an 8-bit format (E4M3/E5M2) "
          "counts toward the streak"),
      opt("guard.quant_error_threshold_fp4", T::kFloat, 0.2, "fraction",
          "the same for a layer whose fprop operands are 4-bit (E2M1: fp4, mxfp4, nvfp4; their relative error "
          "is 0.1-0.15 on healthy runs, so 8-bit's threshold would fire at every FP4 layer)"),
      opt("guard.quant_error_steps", T::kInt, int64_t{3}, "measurements",
          "consecutive measurements above the threshold that trigger guard.on_quant_error"),
      opt("guard.stall_minutes", T::kFloat, 10.0, "minutes",
          "warn (log, guard state) when one step has run this long; 0 = off"),
      opt("guard.budget_step", T::kFloat, 0.10, "fraction",
          "replan (and after a rollback): lower precision.budget by this FLOPs share (0.75 -> 0.65)"),
      opt("guard.smoothing", T::kFloat, 0.3, "fraction",
          "replan (and after a rollback): raise precision.smoothing to at least this"),
      opt("guard.raise_option", T::kString, std::string("fp8"), "",
          "the option fp8-layer moves a layer to (a recipe name, or bf16)"),
      opt("guard.max_rollbacks", T::kInt, int64_t{3}, "",
          "rollbacks allowed in one run; the next one stops the run instead"),
      // [monitor]: the live side of a run (docs/operations.md).
      opt("monitor.listen", T::kString, std::string("127.0.0.1:9464"), "HOST:PORT",
          "serve Prometheus metrics at http://HOST:PORT/metrics while training; port 0 = any free port (logged); "
          "empty = off. A port in use is a warning and the run goes on without the endpoint"),
      opt("monitor.ranks", T::kString, std::string("rank0"), "",
          "with several ranks: rank0 (only rank 0 serves monitor.listen) or all (each rank serves port + "
          "its local rank)"),
      // [precision]
      opt("precision.recipe", T::kString, std::string("none"), "",
          "shorthand for policy uniform-<recipe> on every step (no warmup, no final phase): a name from "
          "`snip formats --recipes`, or none; only with precision.policy = none"),
      opt("precision.recipe_file", T::kString, std::string(""), "path",
          "TOML or JSON file of named recipes (operand roles activations/weights/gradients, error_feedback, "
          "compensation_freq; docs/formats.md \"Recipe files\"), registered beside the built-in ones so "
          "their names work in every precision option; relative to the working directory; empty = none"),
      // [precision]: the adaptive method (docs/method.md sections 3-6; docs/planner.md "In training").
      opt("precision.policy", T::kString, std::string("none"), "",
          "who chooses each layer's precision: none (no quantization: every GEMM in train.gemm_dtype; bf16 is an old name for it), uniform-<recipe> (any recipe, e.g. "
          "uniform-fp8, uniform-mxfp4), snip (stats + ILP), min-rel-err, layer-type, first-last-fp8, random"),
      opt("precision.budget", T::kFloat, 0.75, "fraction",
          "FP4 FLOPs share every plan must reach (snip and the ordered heuristics)"),
      opt("precision.options", T::kString, std::string("fp4,fp8"), "list",
          "options a layer may run (comma-separated recipe names or bf16); must contain precision.low_option"),
      opt("precision.pins", T::kString, std::string(""), "list",
          "comma-separated GLOB=OPTION pins, e.g. '*.down_proj=fp8,layers.3.mlp.*=fp8'"),
      opt("precision.warmup_steps", T::kInt, int64_t{-1}, "steps",
          "steps run at warmup_precision before the first plan; -1 = warmup_fraction of train.max_steps"),
      opt("precision.warmup_fraction", T::kFloat, 0.05, "fraction",
          "warmup as a fraction of train.max_steps (when warmup_steps = -1)"),
      opt("precision.warmup_precision", T::kString, std::string("bf16"), "",
          "option every layer runs during warmup (bf16 or fp8, or any option)"),
      opt("precision.initial_interval", T::kInt, int64_t{-1}, "steps",
          "re-plan interval at the start of the run; -1 = initial_interval_fraction of train.max_steps"),
      opt("precision.initial_interval_fraction", T::kFloat, 0.2, "fraction",
          "initial re-plan interval as a fraction of train.max_steps (when initial_interval = -1)"),
      opt("precision.final_interval", T::kInt, int64_t{-1}, "steps",
          "re-plan interval at the end of the run (grows linearly from initial_interval); "
          "-1 = final_interval_fraction of train.max_steps"),
      opt("precision.final_interval_fraction", T::kFloat, 1.0, "fraction",
          "final re-plan interval as a fraction of train.max_steps (when final_interval = -1)"),
      opt("precision.final_high_precision_fraction", T::kFloat, 0.1, "fraction",
          "last fraction of train.max_steps run with every layer at final_precision"),
      opt("precision.final_precision", T::kString, std::string("fp8"), "",
          "option every layer runs in the final high-precision phase"),
      opt("precision.smoothing", T::kFloat, 0.1, "fraction",
          "s in M <- (1-s)*M_new + s*M_old between stats steps (larger = steadier plans)"),
      opt("precision.alpha", T::kFloat, 0.5, "fraction", "weight of the loss divergence in Q = a*LD + (1-a)*WD"),
      opt("precision.seed", T::kInt, int64_t{0}, "", "seed of the random policy"),
      opt("precision.low_option", T::kString, std::string("fp4"), "",
          "the cheap option the budget counts (its FLOPs share is fp4_share in metrics): fp4 (NVFP4), or another "
          "4-bit recipe such as mxfp4; must be in precision.options"),
      opt("precision.granularity", T::kString, std::string("layer"), "",
          "what one plan decision covers: layer (all three GEMMs of a linear layer) or gemm (fprop, dgrad and "
          "wgrad separately, docs/method.md section 2)"),
      opt("precision.first_order", T::kString, std::string("drop"), "",
          "first-order term of the loss divergence: drop (curvature term only; best in the correlation study, "
          "docs/results.md), abs (|<g,e>|) or signed (<g,e>)"),
      opt("precision.curvature_probes", T::kInt, int64_t{1}, "",
          "noise-injection probes per stats step for the LD curvature term (each one extra forward+backward)"),
  };
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
  const std::vector<std::pair<const char*, OptionRange>> ranges = {
      {"model.vocab_size", {0, double(1 << 22)}},
      {"model.hidden_size", {1, double(1 << 17)}},
      {"model.intermediate_size", {1, double(1 << 19)}},
      {"model.num_hidden_layers", {1, 4096}},
      {"model.num_attention_heads", {1, double(1 << 12)}},
      {"model.num_key_value_heads", positive},
      {"model.max_position_embeddings", positive},
      {"model.rms_norm_eps", fp32_scalar},
      {"model.rope_theta", fp32_scalar},
      {"model.init_std", fp32_scalar},
      {"train.seed", non_negative},
      {"train.batch_size", {1, double(1 << 20)}},
      {"train.seq_len", {1, double(1 << 20)}},
      {"train.grad_accum", {1, double(1 << 20)}},
      {"train.max_steps", positive},
      {"train.lr", adamw},
      {"train.min_lr_ratio", fraction},
      {"train.warmup_steps", non_negative},
      {"train.weight_decay", {0, 1e3}},
      {"train.beta1", {0, 1, false, true}},
      {"train.beta2", {0, 1, false, true}},
      {"train.eps", adamw},
      {"train.grad_clip", {0, 1e30}},
      {"train.clip_low_precision", {0, 1, true}},
      {"checkpoint.keep_good", non_negative},
      {"checkpoint.good_margin", {0, 1e6}},
      {"guard.spike_window", {1, 1e6}},
      {"guard.spike_ratio", {0, 1e6, true}},
      {"guard.throughput_drop", {0, 1, true, true}},
      {"guard.quant_error_threshold", {0, 1e6}},
      {"guard.quant_error_threshold_fp4", {0, 1e6}},
      {"guard.quant_error_steps", {1, 1e6}},
      {"guard.stall_minutes", {0, 1e6}},
      {"guard.budget_step", fraction},
      {"guard.smoothing", fraction},
      {"guard.max_rollbacks", {0, 1e6}},
      {"train.zero_stage", {0, 2}},
      {"train.eval_interval", positive},
      {"train.eval_batches", non_negative},
      {"train.checkpoint_interval", non_negative},
      {"train.checkpoint_minutes", {0, 1e6}},
      {"train.keep_checkpoints", non_negative},
      {"train.log_interval", positive},
      {"train.threads", {0, 1024}},
      {"train.sample_tokens", {0, 4096}},
      {"dist.timeout_s", {1, 1e6}},
      {"dist.check_interval", non_negative},
      {"dist.pipeline_stages", {1, 1024}},
      {"dist.micro_batches", {0, 1e6}},
      {"precision.budget", fraction},
      {"precision.warmup_steps", {-1, inf}},
      {"precision.warmup_fraction", fraction},
      {"precision.initial_interval", {-1, inf}},
      {"precision.initial_interval_fraction", fraction},
      {"precision.final_interval", {-1, inf}},
      {"precision.final_interval_fraction", fraction},
      {"precision.final_high_precision_fraction", fraction},
      {"precision.smoothing", fraction},
      {"precision.alpha", fraction},
      {"precision.curvature_probes", {0, 64}},
      {"lora.rank", {0, 65536}},
      {"lora.alpha", {0, 1e9}},
      {"lora.dropout", {0, 0.999}},
  };
  const std::vector<std::pair<const char*, std::vector<std::string>>> words = {
      {"train.gemm_dtype", {"bf16", "fp32"}},
      {"dist.backend", {"auto", "gloo", "nccl"}},
      {"dist.grad_comm_path", {"allreduce", "allgather"}},
      {"dist.pipeline_schedule", {"gpipe", "1f1b"}},
      {"dist.boundary_comm", {"fp32", "fp8"}},
      {"monitor.ranks", {"rank0", "all"}},
      {"guard.on_nonfinite", {"warn", "fp8-layer", "replan", "rollback", "stop"}},
      {"guard.on_loss_spike", {"warn", "fp8-layer", "replan", "rollback", "stop"}},
      {"guard.on_quant_error", {"warn", "fp8-layer", "replan", "rollback", "stop"}},
      {"guard.on_throughput_drop", {"warn", "stop"}},
      {"train.gemm_backend", {"auto", "native", "emulated"}},
      {"precision.granularity", {"layer", "gemm"}},
      {"precision.first_order", {"abs", "signed", "drop"}},
      {"lora.init", {"kaiming", "gaussian"}},
  };
  auto spec = [&](const char* key) -> OptionSpec& {
    for (auto& s : t)
      if (s.key == key) return s;
    SNIP_CHECK(false, "no option ", key);
  };
  for (const auto& [key, r] : ranges) spec(key).range = r;
  for (const auto& [key, w] : words) spec(key).choices = w;
  std::sort(t.begin(), t.end(), [](const OptionSpec& a, const OptionSpec& b) { return a.key < b.key; });
  return t;
}

const OptionSpec* find_spec(const std::string& key) {
  for (const auto& s : option_table())
    if (s.key == key) return &s;
  return nullptr;
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
    // 0.90000000000000002).
    std::string s;
    for (int prec = 1; prec <= 17; ++prec) {
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

std::string Config::origin(const std::string& key) const {
  const auto it = origins_.find(key);
  return it == origins_.end() ? std::string("config") : "config: " + it->second;
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
  }
  return "?";
}

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

std::string PrecisionConfig::policy_name() const {
  return policy == Policy::kUniform ? "uniform-" + uniform_option : to_string(policy);
}

RunConfig RunConfig::from(const Config& c) {
  c.validate();
  RunConfig r;
  ModelConfig& m = r.model;
  m.vocab_size = c.get_int("model.vocab_size");
  m.hidden_size = c.get_int("model.hidden_size");
  m.intermediate_size = c.get_int("model.intermediate_size");
  m.num_hidden_layers = c.get_int("model.num_hidden_layers");
  m.num_attention_heads = c.get_int("model.num_attention_heads");
  m.num_key_value_heads = c.get_int("model.num_key_value_heads");
  m.max_position_embeddings = c.get_int("model.max_position_embeddings");
  m.rms_norm_eps = c.get_float("model.rms_norm_eps");
  m.rope_theta = c.get_float("model.rope_theta");
  m.init_std = c.get_float("model.init_std");
  m.tie_word_embeddings = c.get_bool("model.tie_word_embeddings");
  r.data.dir = c.get_string("data.dir");
  TrainConfig& t = r.train;
  t.seed = c.get_int("train.seed");
  t.batch_size = c.get_int("train.batch_size");
  t.seq_len = c.get_int("train.seq_len");
  t.grad_accum = c.get_int("train.grad_accum");
  t.max_steps = c.get_int("train.max_steps");
  t.warmup_steps = c.get_int("train.warmup_steps");
  t.lr = c.get_float("train.lr");
  t.min_lr_ratio = c.get_float("train.min_lr_ratio");
  t.weight_decay = c.get_float("train.weight_decay");
  t.beta1 = c.get_float("train.beta1");
  t.beta2 = c.get_float("train.beta2");
  t.eps = c.get_float("train.eps");
  t.grad_clip = c.get_float("train.grad_clip");
  t.clip_low_precision = c.get_float("train.clip_low_precision");
  t.keep_good = c.get_int("checkpoint.keep_good");
  t.good_margin = c.get_float("checkpoint.good_margin");
  t.zero_stage = c.get_int("train.zero_stage");
  t.gemm_bf16 = c.get_string("train.gemm_dtype") == "bf16";
  t.gemm_backend = c.get_string("train.gemm_backend");
  t.eval_interval = c.get_int("train.eval_interval");
  t.eval_batches = c.get_int("train.eval_batches");
  t.checkpoint_interval = c.get_int("train.checkpoint_interval");
  t.keep_checkpoints = c.get_int("train.keep_checkpoints");
  t.checkpoint_minutes = c.get_float("train.checkpoint_minutes");
  t.log_interval = c.get_int("train.log_interval");
  t.threads = c.get_int("train.threads");
  t.sample_tokens = c.get_int("train.sample_tokens");
  t.sample_prompt = c.get_string("train.sample_prompt");
  PrecisionConfig& p = r.precision;
  const std::string& policy = c.get_string("precision.policy");
  if (policy.rfind("uniform-", 0) == 0 && policy.size() > 8) {
    p.policy = Policy::kUniform;
    p.uniform_option = policy.substr(8);
  } else {
    bool known = false;
    for (Policy q : {Policy::kNone, Policy::kSnip, Policy::kMinRelErr, Policy::kLayerType, Policy::kFirstLastFp8,
                     Policy::kRandom})
      if (policy == to_string(q)) p.policy = q, known = true;
    if (!known)
      fail("config: precision.policy: expected none (or its old name bf16), uniform-<option> (e.g. uniform-fp8), snip, min-rel-err, "
           "layer-type, first-last-fp8 or random, got '", policy, "'");
  }
  p.recipe = c.get_string("precision.recipe");
  p.budget = c.get_float("precision.budget");
  p.options = split_list(c.get_string("precision.options"));
  p.pins = split_list(c.get_string("precision.pins"));
  p.warmup_steps = c.get_int("precision.warmup_steps");
  p.warmup_fraction = c.get_float("precision.warmup_fraction");
  p.warmup_precision = c.get_string("precision.warmup_precision");
  p.initial_interval = c.get_int("precision.initial_interval");
  p.initial_interval_fraction = c.get_float("precision.initial_interval_fraction");
  p.final_interval = c.get_int("precision.final_interval");
  p.final_interval_fraction = c.get_float("precision.final_interval_fraction");
  p.final_high_precision_fraction = c.get_float("precision.final_high_precision_fraction");
  p.final_precision = c.get_string("precision.final_precision");
  p.smoothing = c.get_float("precision.smoothing");
  p.alpha = c.get_float("precision.alpha");
  p.seed = c.get_int("precision.seed");
  p.low_option = c.get_string("precision.low_option");
  p.per_gemm = c.get_string("precision.granularity") == "gemm";
  p.first_order = parse_first_order(c.get_string("precision.first_order"), "config: precision.first_order");
  p.curvature_probes = c.get_int("precision.curvature_probes");
  GuardConfig& g = r.guard;
  g.enabled = c.get_bool("guard.enabled");
  g.on_nonfinite = c.get_string("guard.on_nonfinite");
  g.on_loss_spike = c.get_string("guard.on_loss_spike");
  g.on_quant_error = c.get_string("guard.on_quant_error");
  g.on_throughput_drop = c.get_string("guard.on_throughput_drop");
  g.spike_window = c.get_int("guard.spike_window");
  g.spike_ratio = c.get_float("guard.spike_ratio");
  g.throughput_drop = c.get_float("guard.throughput_drop");
  g.quant_error_threshold = c.get_float("guard.quant_error_threshold");
  g.quant_error_threshold_fp4 = c.get_float("guard.quant_error_threshold_fp4");
  g.quant_error_steps = c.get_int("guard.quant_error_steps");
  g.stall_minutes = c.get_float("guard.stall_minutes");
  g.budget_step = c.get_float("guard.budget_step");
  g.smoothing = c.get_float("guard.smoothing");
  g.raise_option = c.get_string("guard.raise_option");
  g.max_rollbacks = c.get_int("guard.max_rollbacks");
  LoraConfig& l = r.lora;
  l.rank = c.get_int("lora.rank");
  l.alpha = c.get_float("lora.alpha");
  l.dropout = c.get_float("lora.dropout");
  l.target = split_list(c.get_string("lora.target"));
  l.init = c.get_string("lora.init");
  l.train_norms = c.get_bool("lora.train_norms");
  l.pack_base = c.get_bool("lora.pack_base");
  if (l.rank > 0 && l.target.empty()) fail("config: lora.target: expected at least one glob, got an empty list");
  if (l.rank > 0 && !(l.alpha > 0))
    fail("config: lora.alpha: expected a positive number (the adapters' output is scaled by alpha / rank), got ",
         l.alpha);
  return r;
}

}  // namespace snip
