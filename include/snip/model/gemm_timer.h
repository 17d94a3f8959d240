// snip/model/gemm_timer.h: the wall seconds of every QuantLinear GEMM inside
// real training steps, for the in-step GEMM-time calibration
// (method/gemm_calibrate.h calibrate_gemm_times_in_step; docs/method.md
// "Budget in measured time").
//
// While a GemmTimer is installed, QuantLinear's autograd function adds to it,
// per layer (the QuantLinearImpl's address: lm_head is a QuantLinear too,
// outside linear_layers' indices) and GEMM (fprop, dgrad, wgrad),
// the seconds of what the step pays for that GEMM: the quantization (or the
// cast) of both operands and the GEMM itself, as one training step runs them
// (operands as the step leaves them in the caches, the per-step quantization
// error when monitor.quant_error is on). The LoRA adapter, the stats-step
// probes' noise and everything outside the linear layers are not counted.
// On CUDA the device is synchronized before and after each timed GEMM, so
// the seconds are the GEMM's own (and the step runs slower while timed).
#pragma once

#include <array>
#include <map>
#include <mutex>

#include "snip/recipes/gemm.h"

namespace snip {

class GemmTimer {
 public:
  /// Installs this timer process-wide (every thread: autograd may run a
  /// backward on its own thread). `cuda_sync`: synchronize the current CUDA
  /// device around each GEMM. Throws std::logic_error if another GemmTimer
  /// is installed.
  explicit GemmTimer(bool cuda_sync);
  /// Uninstalls it.
  ~GemmTimer();
  GemmTimer(const GemmTimer&) = delete;
  GemmTimer& operator=(const GemmTimer&) = delete;

  /// Seconds summed since construction or the last take(), per layer
  /// (QuantLinearImpl*), indexed by Gemm (0 = not run); starts afresh.
  std::map<const void*, std::array<double, 3>> take();

  /// The installed timer, or nullptr (QuantLinear's GEMMs ask this).
  static GemmTimer* active();
  /// Called by QuantLinear: adds `seconds` to layer `layer`'s `gemm`.
  void add(const void* layer, Gemm gemm, double seconds);
  bool cuda_sync() const { return cuda_sync_; }

 private:
  bool cuda_sync_;
  std::mutex mu_;
  std::map<const void*, std::array<double, 3>> seconds_;
};

}  // namespace snip
