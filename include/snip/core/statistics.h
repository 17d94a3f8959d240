// snip/core/statistics.h: correlation coefficients (the correlation study,
// the report's scatter plots, `snip correlate`), and the statistics of
// repeated runs (`snip experiment --seeds`, `snip correlate --repeats`):
// median, mean and sample standard deviation, Student-t intervals of a mean
// (Boost.Math's t quantile), percentile-bootstrap intervals of a
// correlation. Header-only; Boost.Math (headers) is the only dependency.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <boost/math/distributions/students_t.hpp>

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

/// The pairs (x[k], y[k]), k < min(x.size(), y.size()), where both are
/// finite, appended to a and b in order.
inline void finite_pairs(const std::vector<double>& x, const std::vector<double>& y, std::vector<double>& a,
                         std::vector<double>& b) {
  for (size_t k = 0; k < std::min(x.size(), y.size()); ++k)
    if (std::isfinite(x[k]) && std::isfinite(y[k])) {
      a.push_back(x[k]);
      b.push_back(y[k]);
    }
}

/// Pearson correlation of x and y over the pairs (x[k], y[k]) where both are
/// finite (k < min(x.size(), y.size())); NaN with fewer than 2 such pairs or
/// zero variance. Unitless, in [-1, 1].
inline double pearson(const std::vector<double>& x, const std::vector<double>& y) {
  std::vector<double> a, b;
  finite_pairs(x, y, a, b);
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
  finite_pairs(x, y, a, b);
  return pearson(ranks(a), ranks(b));
}

/// The median of v (the mean of the two middle values for an even count),
/// in v's units; NaN when v is empty. Takes v by value: it sorts a copy.
inline double median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

/// Mean and spread of repeated measurements (e.g. one arm's final
/// validation loss over seeds, in nats/token).
struct SampleSummary {
  size_t n = 0;  ///< finite values
  double mean = std::numeric_limits<double>::quiet_NaN();
  /// Sample standard deviation, sqrt(sum (v - mean)^2 / (n - 1)); NaN for n < 2.
  double sd = std::numeric_limits<double>::quiet_NaN();
  /// Standard error of the mean, sd / sqrt(n); NaN for n < 2.
  double se() const { return n >= 2 ? sd / std::sqrt(double(n)) : std::numeric_limits<double>::quiet_NaN(); }
};

/// The summary of the finite values of v (non-finite ones are skipped);
/// n = 0 gives mean NaN.
inline SampleSummary summarize(const std::vector<double>& v) {
  SampleSummary s;
  double sum = 0;
  for (double x : v)
    if (std::isfinite(x)) sum += x, ++s.n;
  if (s.n == 0) return s;
  s.mean = sum / double(s.n);
  if (s.n < 2) return s;
  double ss = 0;
  for (double x : v)
    if (std::isfinite(x)) ss += (x - s.mean) * (x - s.mean);
  s.sd = std::sqrt(ss / double(s.n - 1));
  return s;
}

/// The p-quantile of Student's t distribution with df degrees of freedom
/// (Boost.Math students_t; e.g. p = 0.975, df = 2: 4.302653). NaN unless
/// 0 < p < 1 and df > 0.
inline double t_quantile(double p, double df) {
  if (!(p > 0 && p < 1) || !(df > 0)) return std::numeric_limits<double>::quiet_NaN();
  return boost::math::quantile(boost::math::students_t_distribution<double>(df), p);
}

/// A mean with its two-sided confidence interval [lo, hi].
struct MeanInterval {
  SampleSummary summary;  ///< n, mean, sd of the values
  double level = 0.95;    ///< coverage of [lo, hi]
  double lo = std::numeric_limits<double>::quiet_NaN(), hi = std::numeric_limits<double>::quiet_NaN();
  /// +1 when the whole interval is above 0, -1 when below, 0 when it holds
  /// 0 or is unknown (n < 2).
  int sign() const { return lo > 0 ? 1 : hi < 0 ? -1 : 0; }
};

/// The Student-t confidence interval of the mean of the finite values of v:
/// mean ± t_{(1+level)/2, n-1} · sd / sqrt(n) (e.g. paired differences, the
/// t interval of any statistics text). lo/hi NaN for n < 2. Exact coverage
/// needs normally distributed values; with 3-5 seeds that is an assumption.
inline MeanInterval t_interval(const std::vector<double>& v, double level = 0.95) {
  MeanInterval m;
  m.summary = summarize(v);
  m.level = level;
  if (m.summary.n < 2) return m;
  const double h = t_quantile(0.5 + level / 2, double(m.summary.n - 1)) * m.summary.se();
  m.lo = m.summary.mean - h;
  m.hi = m.summary.mean + h;
  return m;
}

/// A statistic with a bootstrap interval.
struct BootstrapInterval {
  double value = std::numeric_limits<double>::quiet_NaN();  ///< the statistic of the data itself
  double lo = std::numeric_limits<double>::quiet_NaN(), hi = std::numeric_limits<double>::quiet_NaN();
  int resamples = 0;  ///< resamples with a finite statistic
};

/// Percentile-bootstrap interval (Efron & Tibshirani 1993, ch. 13) of a
/// paired statistic f(x, y) (pearson or spearman): `resamples` resamples of
/// the n pairs drawn with replacement (std::mt19937_64 seeded with `seed`,
/// so the interval is reproducible), [lo, hi] the (1-level)/2 and
/// (1+level)/2 quantiles (linear interpolation) of the finite resampled
/// statistics. Only pairs where both values are finite take part; NaN with
/// fewer than 3 such pairs.
inline BootstrapInterval bootstrap_interval(const std::vector<double>& x, const std::vector<double>& y,
                                            const std::function<double(const std::vector<double>&,
                                                                       const std::vector<double>&)>& f,
                                            int resamples = 2000, double level = 0.95, uint64_t seed = 1) {
  BootstrapInterval b;
  std::vector<double> a, c;
  finite_pairs(x, y, a, c);
  if (a.size() < 3) return b;
  b.value = f(a, c);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, a.size() - 1);
  std::vector<double> stats, ra(a.size()), rc(a.size());
  for (int r = 0; r < resamples; ++r) {
    for (size_t k = 0; k < a.size(); ++k) {
      const size_t j = pick(rng);
      ra[k] = a[j];
      rc[k] = c[j];
    }
    const double s = f(ra, rc);
    if (std::isfinite(s)) stats.push_back(s);
  }
  b.resamples = int(stats.size());
  if (stats.empty()) return b;
  std::sort(stats.begin(), stats.end());
  auto q = [&](double p) {
    const double pos = p * double(stats.size() - 1);
    const size_t i = size_t(pos);
    const double fr = pos - double(i);
    return i + 1 < stats.size() ? stats[i] * (1 - fr) + stats[i + 1] * fr : stats[i];
  };
  b.lo = q((1 - level) / 2);
  b.hi = q((1 + level) / 2);
  return b;
}

}  // namespace snip
