// snip/data/loader.h: deterministic, resumable, rank-aware batches of
// next-token-prediction windows from one token shard.
//
// Dimensions: B = batch (rows per call), T = sequence length,
// N = tokens in the shard, W = number of windows, R = world size.
//
// Windows: the token stream is cut into W = floor((N - 1) / T) windows of
// T + 1 tokens with stride T (window i = tokens [i*T, i*T + T], adjacent
// windows share one token); input = w[0:T], target = w[1:T+1], so every
// token except the first is a target exactly once per epoch. The last
// (N - 1) mod T tokens never appear as targets.
//
// Epochs: epoch e visits the windows in the permutation P_e of 0..W-1
// given by Fisher-Yates over mt19937_64 keyed by (seed, e) (platform
// independent, see src/data/rng.h). Rank r of R takes P_e[r], P_e[r + R],
// ...: E = floor(W / R) windows per rank and epoch, so all ranks run the same
// number of steps; the last W mod R windows of P_e (different ones each
// epoch) are skipped that epoch. For R = 1 every window is visited exactly
// once per epoch. Batches run on across epoch boundaries: a batch may end
// epoch e and start epoch e + 1.
//
// Resume: the position is LoaderState {epoch, cursor}, cursor = index of the
// next window in this rank's sequence of epoch `epoch` (0 <= cursor < E).
// restore(state()) on a loader built with the same shard, B, T, seed, rank
// and world gives exactly the batches the original would have produced.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "snip/data/shard.h"

namespace snip::data {

/// Position of a TokenLoader; part of a training checkpoint.
struct LoaderState {
  uint64_t epoch = 0;   ///< epochs completed by this rank
  uint64_t cursor = 0;  ///< next window index within the rank's epoch order, in [0, E)
  bool operator==(const LoaderState& o) const { return epoch == o.epoch && cursor == o.cursor; }
  bool operator!=(const LoaderState& o) const { return !(*this == o); }
};

class TokenLoader {
 public:
  /// Opens `shard_path` (ShardReader validation) and checks every token is
  /// below the shard's vocab_size (one O(N) scan). Throws UserError:
  ///   "token shard <p>: N tokens is too few for seq T and world R: needs at
  ///    least T*R + 1 (one window of T+1 tokens per rank)",
  ///   "token shard <p>: token at index i is X, outside the vocabulary [0, V)",
  ///   or on B < 1, T < 1, R < 1, rank outside [0, R).
  TokenLoader(const std::string& shard_path, int batch, int seq, uint64_t seed, int rank = 0, int world = 1);

  /// Fills inputs[B*T] and targets[B*T] (row-major [B, T], resized as needed)
  /// with the next B windows of this rank, then advances the state.
  void next(std::vector<int32_t>& inputs, std::vector<int32_t>& targets);

  /// Current position (before the next call to next()).
  LoaderState state() const { return state_; }
  /// Moves to `s`. Throws UserError "loader state: cursor C out of range
  /// [0, E) for this shard, seq, world" if s does not fit this loader.
  void restore(const LoaderState& s);

  // ---- eval mode: all windows in order, independent of seed and rank.
  /// W, the number of windows of T+1 tokens in the shard.
  uint64_t num_windows() const { return num_windows_; }
  /// Fills inputs[T] and targets[T] (resized) with window i (0 <= i < W) in
  /// shard order. SNIP_CHECK if i >= W.
  void window(uint64_t i, std::vector<int32_t>& inputs, std::vector<int32_t>& targets) const;

  /// E = floor(W / R): windows this rank visits per epoch.
  uint64_t windows_per_epoch() const { return per_rank_; }
  int batch() const { return batch_; }
  int seq() const { return seq_; }
  uint32_t vocab_size() const { return shard_.vocab_size(); }
  const ShardReader& shard() const { return shard_; }

 private:
  /// Shard window index of this rank's k-th window in epoch e.
  uint64_t window_index(uint64_t epoch, uint64_t k);

  ShardReader shard_;
  int batch_, seq_;
  uint64_t seed_;
  int rank_, world_;
  uint64_t num_windows_ = 0;
  uint64_t per_rank_ = 0;
  LoaderState state_;
  std::optional<uint64_t> perm_epoch_;  // epoch whose permutation is in perm_ (none yet: empty;
                                        // every epoch, 2^64 - 1 included, is a real one)
  std::vector<uint64_t> perm_;        // [W] P_epoch
};

}  // namespace snip::data
