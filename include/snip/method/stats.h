// snip/method/stats.h: the stats step (docs/method.md section 3). Per quantizable
// layer and candidate option p, the local quantization errors of the layer's
// three GEMMs on the real operands of one micro-batch, reduced to a loss
// divergence LD, a weight divergence WD and the planner's quality loss Q.
//
// Shapes (the glossary is in model/llama.h): N = B·T tokens of the micro-batch,
// IN = in_features, OUT = out_features, L = number of layers, K = probes.
//
// ---------------------------------------------------------------------------
// What run_stats_step() runs (all at full precision: every layer's quantizer is
// switched off and its GEMMs run in the operand dtype; restored afterwards)
//
//  pass A  forward + backward of loss_fn with LinearProbe on every layer:
//          X [N,IN] from the forward; dW = ∂loss/∂W [OUT,IN] from
//          torch::autograd::grad (no wgrad GEMM runs: each layer's dW is
//          computed by its processing below and parked in weight.grad, which
//          run_stats_step() borrows and restores). The graph is not retained.
//  per layer, inside pass A's backward (LinearProbe::on_dy: the moment
//          the layer's g = dY = dL/dY [N,OUT] arrives; dY is then dropped, so
//          at most one layer's dY and temporaries are alive beyond autograd's
//          own), with the layer's dW = dYᵀ·X recomputed there:
//          Y = X·Wᵀ [N,OUT], dX = dY·W [N,IN] and for every option p with
//          quantizer Q (operands laid out [rows, K] as in linear.h, keys
//          {key_base.seed, step, layer_index, operand}; options are built
//          afresh per call, so a delayed-scaling recipe measures with
//          current scaling and the training quantizers' state is untouched):
//            e_fprop = Q(X)·Q(W)ᵀ     − Y    [N,OUT]
//            e_dgrad = Q(dY)·Q(Wᵀ)ᵀ   − dX   [N,IN]
//            e_wgrad = Q(dYᵀ)·Q(Xᵀ)ᵀ  − dW   [OUT,IN]
//          kept only as sums: <g,e_fprop>, ||e_*||², ||Y||², ||dX||², ||dW||²,
//          ||U(dW+e_wgrad) − U(dW)||² (see WD own), and for each curvature
//          probe <ε,g(0)>, ||ε||².
//  pass C  one extra forward + backward (the forward repeats pass A's) with
//          relative gradient noise ξ_l added to every layer's dX
//          (LinearProbe::input_grad_noise): calibrates WD upstream.
//  pass B  per curvature probe: one extra forward + backward with output
//          noise ε_l on every layer (LinearProbe::output_noise); the
//          backward asks autograd for dL/dε_l = g_l(ε) only (no wgrad GEMMs).
//
// Formulas (source: docs/method.md section 3 unless said otherwise)
//
//  Relative errors  rel_fprop = ||e_fprop||/||Y||, rel_dgrad = ||e_dgrad||/||dX||,
//                   rel_wgrad = ||e_wgrad||/||dW|| (Frobenius; 0/0 = 0). The cost
//                   table's per-layer rel_err is their mean (the FLOPs-weighted
//                   mean of plan::make_problem, the three GEMMs cost the same).
//
//  Curvature   ε_l[t,:] = noise_scale · rms(Y_l[t,:]) · z,  z ~ N(0, I) seeded by
//              (seed, step, layer_index, probe), rms(y) = sqrt(mean_j y_j²).
//              c_l = Σ_k <ε_lk, g_l(ε_k) − g_l(0)> / Σ_k ||ε_lk||²  (probes averaged
//              as a ratio of sums: the ||ε||²-weighted mean of the per-probe
//              ratios, which keeps numerator and denominator all-reducible).
//              For L = ½||Y−Y*||²/n (n output elements) this is exactly 1/n. Cross-layer terms
//              (noise of other layers moving g_l) vanish in expectation.
//
//  LD          LD_l(p) = max(0, F + ½·max(c_l,0)·||e_fprop||²), with the first-
//              order term F from s = <g, e_fprop> (loss units) per first_order:
//                "drop"   F = 0     (default: curvature term only. Settled by
//                                   the section 8 study, docs/results.md: over
//                                   28 layers it correlated best with the
//                                   measured loss change, Pearson 0.47 vs 0.15
//                                   for abs and 0.34 for signed; the first-
//                                   order term's sign flips between batches,
//                                   so one batch's value is mostly noise)
//                "abs"    F = |s|   (its magnitude)
//                "signed" F = s     (the exact Taylor expansion; the tests use it)
//
//  WD own      wd_own_l(p) = ||U(dW + e_wgrad) − U(dW)||_F / ||W||_F, U the
//              AdamW update of torch::optim::AdamW (LibTorch 1.13 adamw.cpp,
//              = torch.optim.AdamW) from the optimizer's current state for W:
//                t = step+1, bc1 = 1−β1^t, bc2 = 1−β2^t
//                m' = β1·m + (1−β1)·g,  v' = β2·v + (1−β2)·g²  (amsgrad: v' ← max(v_max, v'))
//                U(g) = −(lr/bc1) · m' / (sqrt(v')/sqrt(bc2) + eps)
//              (m = v = 0, step 0 when the optimizer has no state yet). The
//              decoupled weight decay W ← W·(1−lr·wd) is the same for both
//              gradients and cancels. g is grad_scale·(dW or dW+e_wgrad).
//              Nothing is written to the optimizer or the weights.
//
//  WD upstream (this project's estimator; docs/method.md leaves it open)
//              A dgrad error at layer l enters dX_l, flows backward and moves
//              the gradients, hence the AdamW updates, of every layer k
//              upstream of l. Backward is linear in the injected gradient
//              for a fixed forward, so calibrate with one backward (pass C):
//                ξ_l = r · ||dX_l||_F · z_l/||z_l||_F   (r = dgrad_noise_rel,
//                      z_l ~ N(0,I) seeded by (seed, step, layer_index))
//              on every layer that has an upstream layer, all at once. Each
//              layer k then measures its own-update change
//                Δ_k = ||U(dW_k + δ_k) − U(dW_k)||_F / ||W_k||_F,
//              δ_k = the gradient change caused by all ξ downstream of k.
//              Independent sources add in quadrature in expectation
//              (E||Σ_l A_kl ξ_l||² = Σ_l E||A_kl ξ_l||²); we attribute k's
//              perturbation energy to its sources in proportion to their
//              injected energy E_l = ||ξ_l||² = r²||dX_l||² (an equal-gain
//              assumption: every source reaches k through the same residual
//              path; exact for a single source). Source l's part of Δ_k is
//              Δ_k·sqrt(E_l / Σ_{l'∈D(k)} E_l'), linear in r for small r, so
//                S_l = (1/r) Σ_{k∈U(l)} Δ_k · sqrt(E_l / Σ_{l'∈D(k)} E_l')
//                wd_up_l(p) = rel_dgrad_l(p) · S_l
//              i.e. the sum over upstream layers of the relative update
//              divergence that a dgrad error of relative size rel_dgrad, taken
//              as noise of that energy, causes there (same units as wd_own).
//              One calibration backward for all layers instead of one per
//              layer: that is what the quadrature + equal-gain assumptions buy.
//              U(l) (upstream of l) = layers earlier in `layers` whose input
//              is not the same tensor as l's (q/k/v and gate/up share their
//              input, so none is upstream of its siblings); D(k) = the l with
//              k ∈ U(l). So `layers` must be in forward order, as
//              LlamaForCausalLMImpl::linear_layers() returns them.
//              WD_l(p) = wd_own_l(p) + wd_up_l(p).
//
//  Normalisation  LDn = LD / Σ_l LD_l(low), WDn = WD / Σ_l WD_l(low) (low =
//              the cheapest option, "fp4"; a zero sum leaves the metric
//              unscaled), Q_l(p) = α·LDn + (1−α)·WDn, so Σ_l Q_l(low) = 1.
//              The reference option ("bf16") has Q = 0 by definition.
//
//  Smoothing   M ← (1−s)·M_new + s·M_old on every recorded number, Q included
//              (smoothing Q itself keeps Σ_l Q_l(low) = 1).
//
// Data-parallel ranks: every per-rank quantity above is first gathered into
// one float64 tensor of sums [L·fields + 1] (the +1 is a 1 per rank, so the
// reduced value is the rank count R). StatsOptions::all_reduce_sum, when set,
// is called on it exactly once (e.g. an NCCL/Gloo all-reduce SUM); all
// outputs are then derived from the reduced tensor divided by R, i.e. from
// the mean over ranks of each sum (losses are per-rank means, so <g,e> and
// ||e||² average; ratios such as c_l and rel_err become ratios of the
// averaged sums; wd_own is sqrt(mean_r ||ΔU_r||²)/||W||; first_order "abs"
// takes |mean_r <g,e>_r|, the signed mean over micro-batches). Every rank thus
// ends with bit-identical numbers. Without the hook R = 1.
//
// Memory: beyond the training step's own tensors, run_stats_step() holds one
// gradient copy per weight (dW, from pass A to pass C, and in pass C dW + δ),
// the noise tensors of one pass (ε or ξ, one per layer: the probes need them
// on every layer at once), per layer a [N] row-RMS vector and O(options)
// scalars, and the temporaries of the one layer being processed (quantized
// operands, e_*, U). bench/bench_stats.cpp measures the extra peak.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snip/config/config.h"
#include "snip/model/linear.h"
#include "snip/recipes/gemm.h"
#include "snip/recipes/recipe.h"
#include "snip/plan/cost_table.h"
#include "snip/plan/planner.h"

namespace snip {

/// The knobs of run_stats_step(). Validated by run_stats_step() (UserError naming the field).
struct StatsOptions {
  /// Candidate options, measured per layer: names of `recipes`, or keys of
  /// `quantizers`. Non-empty, unique, without `reference`.
  std::vector<std::string> options = {"fp4", "fp8"};
  /// The recipes the options name (the run's, RunConfig::recipes; the
  /// built-ins by default).
  recipes::RecipeSet recipes;
  /// Quantizers by option name, overriding `recipes` (nullptr = identity,
  /// zero error). For custom or test options.
  std::map<std::string, std::shared_ptr<const OperandQuantizer>> quantizers;
  /// The cheapest option: LD and WD are normalised by their sum over layers
  /// at this option. Must be in `options`.
  std::string low_option = "fp4";
  /// The full-precision reference option, Q = 0 in the cost table.
  std::string reference = "bf16";
  /// Curvature probes K (extra forward+backward each), >= 0; 0 = c_l = 0.
  int curvature_probes = 1;
  /// Output-noise std as a fraction of each output row's RMS, > 0.
  double noise_scale = 1e-2;
  /// Weight of LD in Q = α·LDn + (1−α)·WDn, in [0, 1].
  double alpha = 0.5;
  /// The first-order LD term: drop (default), abs or signed.
  FirstOrder first_order = FirstOrder::kDrop;
  /// r: relative size ||ξ_l||/||dX_l|| of the WD-upstream calibration noise, > 0.
  double dgrad_noise_rel = 0.05;
  /// Multiplier of dW before the AdamW update U (e.g. the trainer's clip
  /// coefficient, or 1/accumulation steps when loss_fn is not pre-scaled), > 0.
  double grad_scale = 1.0;
  /// Seed of the probe noise (ε, ξ); quantization keys use each layer's key_base.seed.
  uint64_t seed = 0;
  /// Optional: sums the float64 tensor in place across data-parallel ranks
  /// (called exactly once per run_stats_step(); see the header comment).
  std::function<void(torch::Tensor&)> all_reduce_sum;
  /// Optional, with all_reduce_sum: gathers a small int64 tensor from every
  /// rank, returning [R] tensors in rank order (dist::Communicator::allgather).
  /// Called once, after the clean pass: each rank sends [L + 1] flags (1 per
  /// layer it measured, then 1 if its hooks raised an error), so that a rank
  /// that missed a layer stops every rank with UserError "stats step at step
  /// s: rank k did not measure layer 'name' (index i) ..." instead of leaving
  /// the others waiting in the reduction.
  std::function<std::vector<torch::Tensor>(const torch::Tensor&)> all_gather;
  // ---- pipeline stages (dist/pipeline.h; docs/distributed.md "Pipeline stages")
  /// [L] 1 for the layers this rank measures (its stage's), 0 for the
  /// others, which are neither hooked nor read (their sums are 0 here and
  /// come from their stage through all_reduce_sum); empty = every layer.
  /// U(l) then spans stages: every layer of an earlier stage is upstream.
  std::vector<char> local;
  /// What this rank adds to the rank-count slot of the reduction: 1, or
  /// under pipeline stages 1 on the first stage and 0 elsewhere, so that the
  /// count is the number of data-parallel replicas that measured each layer.
  double count_weight = 1.0;
  /// Replaces each pass's loss_fn() and backward (pipeline stages): runs the
  /// micro-batch's forward and backward through this rank's stage, together
  /// with the other stages, so that the hooks of the local layers run.
  /// `weights` are the local layers' weights (autograd inputs whose
  /// gradients are not wanted: the probes compute dW themselves).
  std::function<void(const std::vector<torch::Tensor>& weights)> pass_fn;
  // ---- a frozen base (LoRA, model/lora.h; docs/lora.md "The method on a frozen base")
  /// The layers' weights do not train: weight divergence has no meaning (no
  /// update moves them), so the step measures the loss divergence alone.
  /// WD is reported as 0, `alpha` is taken as 1 (Q = LD normalised), `opt`
  /// is not read (it holds no base weight) and no calibration pass runs. The
  /// weights are marked requires_grad for the passes (so that every layer's
  /// backward runs and hands over its dY; the probes skip wgrad) and
  /// unmarked after. The layers' `weight` must hold the FP32 base
  /// (FrozenBase::materialize).
  bool frozen = false;
};

/// One layer at one option.
struct OptionStats {
  double ld_first_order = 0;   ///< <g, e_fprop> (signed, loss units)
  double ld_curvature = 0;  ///< ½·max(c,0)·||e_fprop||² (loss units)
  double ld = 0;         ///< LD after the first_order rule, clamped >= 0 (loss units)
  double wd_own = 0;     ///< ||U(dW+e_wgrad) − U(dW)|| / ||W|| (fraction)
  double wd_upstream = 0;      ///< rel_dgrad · S_l (fraction)
  double q = 0;          ///< α·LDn + (1−α)·WDn (dimensionless)
  PerGemm<double> rel_err;  ///< per GEMM: ||e_gemm||_F / ||exact output||_F (fractions)
  /// per GEMM: ||e_gemm||_F² / elements of its output (fprop N·OUT, dgrad
  /// N·IN, wgrad OUT·IN; per rank): the output's mean squared error, in its
  /// units squared (loss-gradient units for dgrad/wgrad). The autoswitch rule's MSE.
  PerGemm<double> mse;
  /// per GEMM: the fraction of its two operands' non-zero elements that
  /// quantize to zero (TE's "underflow"), 0 for an identity quantizer.
  PerGemm<double> underflow;
};

/// One quantizable layer.
struct LayerStats {
  std::string name;
  int64_t layer_index = 0;
  int64_t tokens = 0, in_features = 0, out_features = 0;  ///< N, IN, OUT
  double gemm_flops = 0;       ///< FLOPs of ONE GEMM: 2·N·IN·OUT (the layer runs 3)
  double curvature = 0;        ///< c_l (loss units per squared output unit)
  double upstream_sensitivity = 0;   ///< S_l: Σ upstream Δ per unit relative dgrad error
  int n_upstream = 0;          ///< |U(l)|
  std::map<std::string, OptionStats> options;  ///< option name -> stats
};

/// Everything one stats step measured (or its smoothed running value).
struct StatsStep {
  int64_t step = -1;
  std::vector<std::string> options;  ///< in StatsOptions order
  std::string low_option = "fp4", reference = "bf16";
  FirstOrder first_order = FirstOrder::kDrop;
  double alpha = 0.5;
  double ld_sum_low = 0;  ///< Σ_l LD_l(low) (the LD normaliser, loss units)
  double wd_sum_low = 0;  ///< Σ_l WD_l(low) (the WD normaliser, fraction)
  int64_t ranks = 1;      ///< R, data-parallel ranks the sums came from
  std::vector<LayerStats> layers;  ///< in `layers` order
};

// ---------------------------------------------------------------------------
// The pieces of run_stats_step(), for a caller that runs the passes itself
// (the Python controller, python/snip/controller.py, through
// src/python/ops.cpp): the same arithmetic, so its numbers equal the C++
// step's on the same operands bit for bit.

/// A measured layer's identity: Hugging Face name, key index (stochastic
/// rounding and probe noise), IN and OUT.
struct LayerShape {
  std::string name;
  int64_t layer_index = 0;
  int64_t in_features = 0, out_features = 0;
};

/// The AdamW state U reads for one weight (header comment, "WD own"):
/// m, v, vmax [param shape] or undefined (no state yet: zeros); `step` the
/// optimizer steps done for it; lr, betas, eps as the optimizer's group.
struct AdamwState {
  torch::Tensor m, v, vmax;
  int64_t step = 0;
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0;
  bool amsgrad = false;
};

/// The state of `param` in `opt`. Throws UserError naming `what` when `opt`
/// does not hold `param`.
AdamwState adamw_state_of(const torch::optim::AdamW& opt, const torch::Tensor& param, const std::string& what);

/// Number of float64 sums per layer in the reduction buffer for `n_options`
/// options (the buffer is [L·stats_fields(n) + 1], the last a rank count).
int64_t stats_fields(size_t n_options);

/// Pass A's sums of one layer (header comment, "per layer").
struct LayerSums {
  std::vector<torch::Tensor> sums;          ///< [stats_fields] 0-d float64
  torch::Tensor row_rms;                    ///< [N, 1] rms of Y's rows
  std::vector<torch::Tensor> eps_dot_g0;    ///< [K] <ε_k, g(0)>
  torch::Tensor dw;                         ///< dW [OUT, IN] in the weight's dtype (kept for the calibration)
};

/// One layer's pass-A sums from its input X [N, IN], dY [N, OUT] and weight
/// [OUT, IN], for every option of `o` with quantizers `quant` (nullptr =
/// identity), keys {key_seed, step, layer.layer_index, operand}, AdamW state
/// `st` (unread when o.frozen). The kTokens field holds N; kGroup is left 0
/// (derive_stats() reads the caller's groups).
LayerSums measure_layer(const torch::Tensor& x, const torch::Tensor& dy, const torch::Tensor& weight,
                        const std::vector<std::shared_ptr<const OperandQuantizer>>& quant, const AdamwState& st,
                        const StatsOptions& o, uint64_t key_seed, const LayerShape& layer, int64_t step);

/// Curvature probe k's output noise ε [N, OUT] for a layer with row RMS
/// `row_rms` [N, 1] (header comment, "Curvature").
torch::Tensor curvature_noise(const StatsOptions& o, int64_t step, const LayerShape& layer, int k,
                              const torch::Tensor& row_rms);

/// The calibration pass's noise ξ [N, IN] for a layer whose pass-A ||dX||²
/// is `dx_sq` (0-d float64), in `like`'s dtype (header comment, "WD upstream").
torch::Tensor calibration_noise(const StatsOptions& o, int64_t step, const LayerShape& layer, int64_t rows,
                                const torch::Tensor& dx_sq, const torch::Tensor& like);

/// ||U(dW_c) − U(dW)||² (0-d float64) of the calibration pass: dW_c = dYᵀ·X
/// from its dY [N, OUT] and X [N, IN], dW pass A's (LayerSums::dw).
torch::Tensor calibration_du_sq(const torch::Tensor& x, const torch::Tensor& dy, const torch::Tensor& dw,
                                const AdamwState& st, const StatsOptions& o);

/// Index of fields in one layer's slice of the buffer that a caller reads
/// or fills between passes: ||dX||² (pass A; the calibration noise's
/// size), Σ_k <ε_k, g(ε_k) − g(0)> (pass B), the calibration's ||ΔU||²
/// (pass C), and the group id (the first layer index sharing this layer's
/// input tensor).
enum class StatsField : int { kDxSq = 1, kCurvatureNum = 4, kCalibrationDuSq = 6, kGroup = 8 };

/// The statistics of a reduced buffer [L·stats_fields + 1] float64 (the
/// sums of every rank; the last slot the rank count R): everything after
/// run_stats_step()'s reduction. Throws NonFiniteStatsError as it does.
StatsStep derive_stats(const torch::Tensor& reduced, const std::vector<LayerShape>& layers, const StatsOptions& o,
                       int64_t step);

/// Runs the stats step on the micro-batch that `loss_fn` evaluates (forward
/// only, returning the scalar loss; it must be deterministic: same batch,
/// no dropout). `layers` in forward order; every layer must take part in the
/// loss and its weight must be in `opt`. Leaves weights, their .grad, the
/// optimizer and every layer's precision / capture / noise probes as they
/// were (also when it throws). Throws UserError on bad options, a layer the
/// loss does not reach, a weight `opt` does not hold, or non-finite results.
StatsStep run_stats_step(std::vector<QuantLinear> layers, const std::function<torch::Tensor()>& loss_fn,
                  torch::optim::AdamW& opt, const StatsOptions& options, int64_t step);

/// prev ← (1−s)·fresh + s·prev on every number (step, options, names from
/// fresh). An empty prev (no layers) becomes fresh. Throws UserError if
/// s ∉ [0,1] or the layer names differ.
void smooth(StatsStep& prev_smoothed, const StatsStep& fresh, double s = 0.1);

/// The planner's cost table (plan/cost_table.h), typed: per layer "flops"
/// (3 GEMMs, FLOPs per step), "q": {options..., reference: 0}, "rel_err":
/// {option: mean of the three GEMMs' relative errors}. per_gemm: per layer
/// "gemms" {fprop: {flops, q: α·LDn, rel_err}, dgrad: {.., (1−α)·wd_upstream/ΣWD},
/// wgrad: {.., (1−α)·wd_own/ΣWD}} (for fresh stats the three sum to the
/// layer's Q: LD depends on fprop only, wd_upstream on dgrad, wd_own on wgrad).
plan::CostTable to_cost_table(const StatsStep& s, bool per_gemm = false);

/// The stats file (RUN/stats/step-N.json): plan::to_json(to_cost_table(s,
/// per_gemm)) plus "step" and "details" (every number: ld, wd, c, ...).
nlohmann::json to_json(const StatsStep& s, bool per_gemm = false);

/// Inverse of to_json(StatsStep) (layer granularity or per-GEMM: both carry
/// "details", which holds every number). Throws UserError naming `what`.
StatsStep stats_from_json(const nlohmann::json& j, const std::string& what);

/// The planning problem of the stats at granularity g
/// (plan::make_problem(to_cost_table(s, ...)); no JSON in between).
plan::PlanProblem to_plan_problem(const StatsStep& s,
                                    plan::Granularity g = plan::Granularity::layer);

/// The AdamW update U(g) of `param` from `opt`'s current state (formula in
/// the header comment; without the decoupled weight decay −lr·wd·W, which
/// cancels in every difference the stats take): [same shape as param],
/// nothing modified. Throws
/// UserError if `param` is not in `opt`.
torch::Tensor adamw_update(const torch::optim::AdamW& opt, const torch::Tensor& param,
                           const torch::Tensor& grad);

}  // namespace snip
