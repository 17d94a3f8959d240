// TokenLoader: seeded epoch permutations of T+1-token windows, rank-strided.
// Semantics in include/snip/data/loader.h.
#include "snip/data/loader.h"

#include "rng.h"
#include "snip/core/error.h"

namespace snip::data {

namespace {
// Salt separating the loader's streams from other users of the same seed.
constexpr uint64_t kLoaderSalt = 0x4C4F41444552ull;  // "LOADER"
}  // namespace

TokenLoader::TokenLoader(const std::string& shard_path, int batch, int seq, uint64_t seed, int rank, int world)
    : shard_(shard_path), batch_(batch), seq_(seq), seed_(seed), rank_(rank), world_(world) {
  if (batch < 1) fail("loader: batch must be >= 1, got ", batch);
  if (seq < 1) fail("loader: seq must be >= 1, got ", seq);
  if (world < 1) fail("loader: world size must be >= 1, got ", world);
  if (rank < 0 || rank >= world) fail("loader: rank must be in [0, ", world, "), got ", rank);
  const uint64_t n = shard_.size();
  const uint64_t t = static_cast<uint64_t>(seq);
  num_windows_ = n == 0 ? 0 : (n - 1) / t;
  per_rank_ = num_windows_ / static_cast<uint64_t>(world);
  if (per_rank_ == 0)
    fail("token shard ", shard_path, ": ", n, " tokens is too few for seq ", seq, " and world ", world,
         ": needs at least ", t * static_cast<uint64_t>(world) + 1, " (one window of ", t + 1, " tokens per rank)");
  const uint64_t bad = shard_.find_out_of_range();
  if (bad != n)
    fail("token shard ", shard_path, ": token at index ", bad, " is ", shard_[bad], ", outside the vocabulary [0, ",
         shard_.vocab_size(), ")");
}

uint64_t TokenLoader::window_index(uint64_t epoch, uint64_t k) {
  if (perm_epoch_ != epoch) {
    perm_ = detail::seeded_permutation<uint64_t>(num_windows_, detail::stream_key(seed_ ^ kLoaderSalt, epoch));
    perm_epoch_ = epoch;
  }
  return perm_[static_cast<size_t>(k * static_cast<uint64_t>(world_) + static_cast<uint64_t>(rank_))];
}

void TokenLoader::next(std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
  const size_t t = static_cast<size_t>(seq_);
  inputs.resize(static_cast<size_t>(batch_) * t);
  targets.resize(static_cast<size_t>(batch_) * t);
  std::vector<int32_t> w(t + 1);
  for (int b = 0; b < batch_; ++b) {
    const uint64_t idx = window_index(state_.epoch, state_.cursor);
    shard_.read(idx * t, t + 1, w.data());
    std::copy(w.begin(), w.end() - 1, inputs.begin() + static_cast<std::ptrdiff_t>(b * t));
    std::copy(w.begin() + 1, w.end(), targets.begin() + static_cast<std::ptrdiff_t>(b * t));
    if (++state_.cursor == per_rank_) {
      state_.cursor = 0;
      ++state_.epoch;
    }
  }
}

void TokenLoader::restore(const LoaderState& s) {
  if (s.cursor >= per_rank_)
    fail("loader state: cursor ", s.cursor, " out of range [0, ", per_rank_, ") for shard ", shard_.path(), " with seq ",
         seq_, " and world ", world_, " (was the checkpoint made with another shard or seq?)");
  state_ = s;
}

void TokenLoader::window(uint64_t i, std::vector<int32_t>& inputs, std::vector<int32_t>& targets) const {
  SNIP_CHECK(i < num_windows_, "eval window ", i, " of ", num_windows_);
  const size_t t = static_cast<size_t>(seq_);
  inputs.resize(t);
  targets.resize(t);
  shard_.read(i * t, t, inputs.data());
  shard_.read(i * t + 1, t, targets.data());
}

}  // namespace snip::data
