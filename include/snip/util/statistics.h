// snip/util/statistics.h: correlation coefficients (the correlation study,
// the report's scatter plots, `snip correlate`). Header-only, no
// dependencies.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace snip {

/// Ranks of v, 1-based; ties share their mean rank (1, 2.5, 2.5, 4).
inline std::vector<double> ranks(const std::vector<double>& v) {
  std::vector<size_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> r(v.size());
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
    const double mean_rank = (double(i) + double(j)) / 2.0 + 1.0;
    for (size_t k = i; k <= j; ++k) r[idx[k]] = mean_rank;
    i = j + 1;
  }
  return r;
}

/// Pearson correlation of x and y over the pairs (x[k], y[k]) where both are
/// finite (k < min(x.size(), y.size())); NaN with fewer than 2 such pairs or
/// zero variance. Unitless, in [-1, 1].
inline double pearson(const std::vector<double>& x, const std::vector<double>& y) {
  std::vector<double> a, b;
  for (size_t k = 0; k < std::min(x.size(), y.size()); ++k)
    if (std::isfinite(x[k]) && std::isfinite(y[k])) {
      a.push_back(x[k]);
      b.push_back(y[k]);
    }
  if (a.size() < 2) return std::numeric_limits<double>::quiet_NaN();
  const double n = double(a.size());
  const double ma = std::accumulate(a.begin(), a.end(), 0.0) / n, mb = std::accumulate(b.begin(), b.end(), 0.0) / n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    sab += (a[k] - ma) * (b[k] - mb);
    saa += (a[k] - ma) * (a[k] - ma);
    sbb += (b[k] - mb) * (b[k] - mb);
  }
  if (!(saa > 0) || !(sbb > 0)) return std::numeric_limits<double>::quiet_NaN();
  return sab / std::sqrt(saa * sbb);
}

/// Spearman rank correlation: Pearson of the ranks (ties get their mean
/// rank) over the same finite pairs.
inline double spearman(const std::vector<double>& x, const std::vector<double>& y) {
  std::vector<double> a, b;
  for (size_t k = 0; k < std::min(x.size(), y.size()); ++k)
    if (std::isfinite(x[k]) && std::isfinite(y[k])) {
      a.push_back(x[k]);
      b.push_back(y[k]);
    }
  return pearson(ranks(a), ranks(b));
}

}  // namespace snip
