// mckp.cpp: the planner's method for large problems (planner.h, "Methods"):
// the ILP is a multiple-choice knapsack problem (MCKP) with one budget row
// per scope. Steps, with their sources:
//
//  1. Dominance and the lower convex hull of each item's options in the
//     (use, Q) plane; the LP relaxation of an MCKP with one row is solved
//     exactly by taking hull edges in order of decreasing efficiency -ΔQ/Δu
//     until the row is full, with at most one fractional item (Sinha &
//     Zoltners, Oper. Res. 27(3), 1979; Kellerer, Pferschy & Pisinger,
//     "Knapsack Problems", Springer 2004, ch. 11, the LP relaxation of MCKP).
//  2. Greedy rounding: the same walk, skipping the edge that does not fit and
//     taking every later edge that still fits.
//  3. The gap: with λ the efficiency of the edge that did not fit (the LP
//     dual of the row), every plan x meeting the row satisfies
//       Q(x) >= L(λ) + Σ_i rc_i(x_i) + λ·slack(x) >= L(λ),
//       L(λ) = Σ_i min_p (Q_i(p) + λ u_{i,p}) - λ U,
//       rc_i(p) = Q_i(p) + λ u_{i,p} - min_p' (Q_i(p') + λ u_{i,p'}) >= 0,
//     (Lagrangian relaxation, Geoffrion, Math. Prog. Study 2, 1974), and
//     L(λ) is the LP optimum. So gap(x) = Σ_i rc_i(x_i) + λ slack(x) bounds
//     Q(x) - optimum; it is computed from per-item differences, which keeps
//     it accurate for 10^5 items.
//  4. Reduced-cost fixing: an option with rc_i(p) > gap cannot be in a plan
//     better than x (Nemhauser & Wolsey, "Integer and Combinatorial
//     Optimization", 1988, reduced-cost fixing; the MCKP "core" of Pisinger,
//     EJOR 83(2), 1995). What is left (the core: items with two or more
//     options) goes to CBC, warm-started with x; CBC's optimum on the core is
//     then optimal for the whole problem.
// Scopes are independent: with per-stage rows the global row is implied, so
// every step runs per stage.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "planner_internal.h"
#include "milp.h"
#include "snip/plan/planner.h"
#include "snip/core/error.h"

namespace snip::plan::detail {

namespace {

using Clock = std::chrono::steady_clock;

// Tolerance on Q: plans within this of the bound count as proven, the same
// "1e-9 of the largest per-item Q difference" as the MILP path.
double q_tolerance(const Mckp& m) { return 1e-9 * m.qscale; }

// λ of a scope at capacity `cap_lp` (U plus the row tolerance): the
// efficiency of the first hull edge that does not fit, 0 when all fit.
double scope_lambda(const McScope& sc, double cap_lp) {
  double r = cap_lp - sc.pinned_use - sc.base_use;
  for (const McSegment& s : sc.segs) {
    if (s.du <= r) {
      r -= s.du;
    } else {
      return s.eff;
    }
  }
  return 0.0;
}

double capacity(const Mckp& m, double value) { return m.share ? -value : value; }

// Per-scope gap of a plan given as (use, q) of each free item's choice.
// `use_q(i)` returns {use, q} of item i's chosen option.
template <typename UseQ>
std::vector<double> scope_gaps(const Mckp& m, double value, const std::vector<double>& lambda,
                               UseQ use_q) {
  std::vector<double> gaps(m.scopes.size(), 0.0);
  const double cap = capacity(m, value);
  for (size_t s = 0; s < m.scopes.size(); ++s) {
    const McScope& sc = m.scopes[s];
    const double lam = lambda[s];
    // slack = (U + tol) - Σ use, from per-item differences to the base.
    double slack = cap + kBudgetTolerance - sc.pinned_use - sc.base_use;
    double rc_sum = 0.0;
    for (int i : sc.items) {
      const auto [u, q] = use_q(static_cast<size_t>(i));
      const McOption& base = m.opts[m.first[i]];
      slack -= u - base.use;
      double best = std::numeric_limits<double>::infinity();
      for (int j = m.first[i]; j < m.first[i + 1]; ++j)
        best = std::min(best, (m.opts[j].q - base.q) + lam * (m.opts[j].use - base.use));
      rc_sum += std::max(0.0, (q - base.q) + lam * (u - base.use) - best);
    }
    gaps[s] = rc_sum + lam * std::max(0.0, slack);
  }
  return gaps;
}

// A heuristic for the warm start, run after greedy rounding in one scope:
// the best exchange of one hull step down on one item (or none) and one
// hull step up on another that fits the row's remaining room `r`, repeated
// while it lowers Q. It fills the room the rounding left, which shrinks the
// gap and so the core CBC has to search. Candidates: the kExchange moves of
// each kind with the smallest reduced cost at λ.
void improve_by_exchange(const Mckp& m, const McScope& sc, double lam, double& r,
                         std::vector<int>& pos) {
  constexpr size_t kExchange = 2048;
  struct Move {
    double du, dq, rc;
    int item, to;
  };
  std::vector<Move> up, down;
  const double min_gain = 1e-15 * m.qscale;
  for (int iter = 0; iter < 64; ++iter) {
    up.clear();
    down.clear();
    for (int i : sc.items) {
      const int h0 = m.hull_first[i], hn = m.hull_first[i + 1] - h0;
      int k = 0;
      while (k < hn && m.hull[h0 + k] != pos[i]) ++k;
      if (k == hn) continue;  // not on the hull (cannot happen after rounding)
      const McOption& cur = m.opts[m.first[i] + pos[i]];
      auto add = [&](std::vector<Move>& v, int to) {
        const McOption& x = m.opts[m.first[i] + to];
        const double du = x.use - cur.use, dq = x.q - cur.q;
        v.push_back(Move{du, dq, dq + lam * du, i, to});
      };
      if (k + 1 < hn) add(up, m.hull[h0 + k + 1]);
      if (k > 0) add(down, m.hull[h0 + k - 1]);
    }
    auto nearest = [&](std::vector<Move>& v) {
      if (v.size() <= kExchange) return;
      std::nth_element(v.begin(), v.begin() + kExchange, v.end(),
                       [](const Move& a, const Move& b) { return a.rc < b.rc; });
      v.resize(kExchange);
    };
    nearest(up);
    nearest(down);
    // Downs by capacity freed (-du) ascending; suffix bests of dq (Q cost)
    // with two distinct items, so that an up move can skip its own item.
    std::sort(down.begin(), down.end(), [](const Move& a, const Move& b) { return a.du > b.du; });
    const size_t nd = down.size();
    std::vector<int> best1(nd + 1, -1), best2(nd + 1, -1);
    for (size_t j = nd; j-- > 0;) {
      best1[j] = best1[j + 1];
      best2[j] = best2[j + 1];
      const int c = static_cast<int>(j);
      if (best1[j] < 0 || down[c].dq < down[best1[j]].dq) {
        if (best1[j] >= 0 && down[best1[j]].item != down[c].item) best2[j] = best1[j];
        best1[j] = c;
      } else if (down[c].item != down[best1[j]].item &&
                 (best2[j] < 0 || down[c].dq < down[best2[j]].dq)) {
        best2[j] = c;
      }
    }
    double best_gain = min_gain;
    int bu = -1, bd = -1;
    for (size_t u = 0; u < up.size(); ++u) {
      const Move& a = up[u];
      if (a.du <= r && -a.dq > best_gain) {
        best_gain = -a.dq;
        bu = static_cast<int>(u);
        bd = -1;
      }
      // First down freeing at least a.du - r.
      const double need = a.du - r;
      size_t lo = 0, hi = nd;
      while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (-down[mid].du >= need) hi = mid; else lo = mid + 1;
      }
      int d = best1[lo];
      if (d >= 0 && down[d].item == a.item) d = best2[lo];
      if (d < 0) continue;
      const double gain = -(a.dq + down[d].dq);
      if (gain > best_gain) {
        best_gain = gain;
        bu = static_cast<int>(u);
        bd = d;
      }
    }
    if (bu < 0) break;
    pos[up[bu].item] = up[bu].to;
    r -= up[bu].du;
    if (bd >= 0) {
      pos[down[bd].item] = down[bd].to;
      r -= down[bd].du;
    }
  }
}

}  // namespace

Mckp build_mckp(const Prepared& p, const PlanOptions& o) {
  Mckp m;
  const auto& items = p.problem.items;
  const size_t n = items.size();
  m.share = o.budget.kind == Budget::Kind::fp4_share;
  m.timed = timed(o);

  std::map<std::string, int> id;
  for (const PlanItem& it : items)
    for (const auto& kv : it.q) id.emplace(kv.first, 0);
  int k = 0;
  for (auto& [name, v] : id) {
    v = k++;
    m.names.push_back(name);
  }
  m.rate.assign(k, 0.0);
  std::vector<double> tie_cost(k);
  for (int j = 0; j < k; ++j) {
    const std::string& name = m.names[j];
    m.rate[j] = m.share ? (name == o.low_option ? -1.0 : 0.0) : m.timed ? 0.0 : option_cost(o, name);
    auto c = o.budget.cost_per_flop.find(name);
    tie_cost[j] = c == o.budget.cost_per_flop.end() ? 1e300 : c->second;
  }
  // Dominance exactly as the MILP path's undominated(): r dominates p when
  // Q_r <= Q_p and use_r <= use_p, strictly in one, or tied and r first
  // (cheaper known cost, then name).
  auto tie_before = [&](int a, int b) {
    return tie_cost[a] != tie_cost[b] ? tie_cost[a] < tie_cost[b] : a < b;
  };

  const int n_scopes = o.per_stage_budget ? p.n_stages : 1;
  m.scopes.resize(n_scopes);
  for (int s = 0; s < n_scopes; ++s) m.scopes[s].stage = o.per_stage_budget ? s : -1;
  m.pinned.assign(n, -1);
  m.scope.assign(n, 0);
  m.f.assign(n, 0.0);
  m.first.assign(n + 1, 0);
  m.hull_first.assign(n + 1, 0);
  m.qscale = 0.0;

  std::vector<std::pair<int, double>> offered;  // (name id, Q)
  std::vector<McOption> keep;
  std::vector<int> hull;
  for (size_t i = 0; i < n; ++i) {
    const PlanItem& it = items[i];
    const int s = o.per_stage_budget ? it.stage : 0;
    const double scope_flops = o.per_stage_budget ? p.stage_flops[s] : p.total_flops;
    const double f = it.flops / scope_flops;
    m.scope[i] = s;
    m.f[i] = f;
    McScope& sc = m.scopes[s];
    m.first[i + 1] = m.first[i];
    m.hull_first[i + 1] = m.hull_first[i];
    if (!p.pins.option[i].empty()) {
      const int j = id.at(p.pins.option[i]);
      m.pinned[i] = j;
      sc.pinned_use += m.timed ? time_use(p, i, p.pins.option[i], sc.stage) : m.rate[j] * f;
      continue;
    }
    offered.clear();
    for (const auto& kv : it.q) offered.emplace_back(id.at(kv.first), kv.second);
    // Use of option a (a name id): rate x f, or the item's measured time.
    auto use_of = [&](int a) {
      return m.timed ? time_use(p, i, m.names[a], sc.stage) : m.rate[a] * f;
    };
    keep.clear();
    for (const auto& [a, qa] : offered) {
      bool dominated = false;
      for (const auto& [r, qr] : offered) {
        if (r == a) continue;
        // goodness = -rate (a larger share or a lower cost is better)
        const double ga = m.timed ? -use_of(a) : -m.rate[a], gr = m.timed ? -use_of(r) : -m.rate[r];
        if (qr <= qa && gr >= ga && (qr < qa || gr > ga || tie_before(r, a))) {
          dominated = true;
          break;
        }
      }
      if (!dominated) keep.push_back(McOption{use_of(a), qa, a});
    }
    SNIP_CHECK(!keep.empty(), "every option of ", it.name, " dominated");
    std::sort(keep.begin(), keep.end(), [](const McOption& a, const McOption& b) {
      return a.use != b.use ? a.use < b.use : a.q > b.q;
    });
    double qmin = keep.front().q, qmax = keep.front().q;
    for (const McOption& x : keep) {
      qmin = std::min(qmin, x.q);
      qmax = std::max(qmax, x.q);
    }
    m.qscale = std::max(m.qscale, qmax - qmin);
    m.opts.insert(m.opts.end(), keep.begin(), keep.end());
    m.first[i + 1] = static_cast<int>(m.opts.size());
    sc.items.push_back(static_cast<int>(i));
    sc.base_use += keep.front().use;
    // Lower convex hull (Andrew's monotone chain on use-sorted points):
    // drop B when it lies above the line from A to the new point P.
    hull.clear();
    for (int a = 0; a < static_cast<int>(keep.size()); ++a) {
      while (hull.size() >= 2) {
        const McOption& A = keep[hull[hull.size() - 2]];
        const McOption& B = keep[hull.back()];
        const McOption& P = keep[a];
        if ((B.q - A.q) * (P.use - A.use) > (P.q - A.q) * (B.use - A.use))
          hull.pop_back();
        else
          break;
      }
      hull.push_back(a);
    }
    m.hull.insert(m.hull.end(), hull.begin(), hull.end());
    m.hull_first[i + 1] = static_cast<int>(m.hull.size());
    double prev = std::numeric_limits<double>::infinity();
    for (size_t t = 0; t + 1 < hull.size(); ++t) {
      const McOption& A = keep[hull[t]];
      const McOption& B = keep[hull[t + 1]];
      const double du = B.use - A.use, dq = B.q - A.q;
      if (!(du > 0.0) || !(dq < 0.0)) break;  // cannot happen after dominance
      // Convexity makes efficiencies non-increasing along an item's hull;
      // clamp so that rounding cannot reorder an item's own edges.
      const double eff = std::min(-dq / du, prev);
      prev = eff;
      sc.segs.push_back(McSegment{eff, du, dq, static_cast<int>(i), hull[t], hull[t + 1]});
    }
  }
  if (!(m.qscale > 0.0)) m.qscale = 1.0;
  for (McScope& sc : m.scopes)
    std::sort(sc.segs.begin(), sc.segs.end(), [](const McSegment& a, const McSegment& b) {
      if (a.eff != b.eff) return a.eff > b.eff;
      if (a.item != b.item) return a.item < b.item;
      return a.from < b.from;
    });
  return m;
}

double lp_gap(const Prepared& p, const Mckp& m, double value,
              const std::vector<std::string>& choice) {
  const double cap = capacity(m, value);
  std::vector<double> lambda(m.scopes.size());
  for (size_t s = 0; s < m.scopes.size(); ++s)
    lambda[s] = scope_lambda(m.scopes[s], cap + kBudgetTolerance);
  std::map<std::string, int> id;
  for (size_t j = 0; j < m.names.size(); ++j) id[m.names[j]] = static_cast<int>(j);
  const auto gaps = scope_gaps(m, value, lambda, [&](size_t i) {
    const int name = id.at(choice[i]);
    const double u = m.timed ? time_use(p, i, choice[i], m.scopes[m.scope[i]].stage)
                             : m.rate[name] * m.f[i];
    return std::pair<double, double>{u, p.problem.items[i].q.at(choice[i])};
  });
  double g = 0.0;
  for (double x : gaps) g += x;
  return g;
}

MckpSolution solve_mckp(const Prepared& p, const PlanOptions& o, const Mckp& m, double value,
                        double time_limit_s) {
  const auto t0 = Clock::now();
  const size_t n = p.problem.items.size();
  const double cap = capacity(m, value);
  const double qtol = q_tolerance(m);

  // 1-2. LP λ and greedy rounding, per scope. pos[i]: local option index.
  std::vector<int> pos(n, 0);
  std::vector<double> lambda(m.scopes.size(), 0.0);
  for (size_t s = 0; s < m.scopes.size(); ++s) {
    const McScope& sc = m.scopes[s];
    lambda[s] = scope_lambda(sc, cap + kBudgetTolerance);
    // Rounding keeps half the row tolerance in reserve against the
    // different summation order of the final check.
    double r = cap + 0.5 * kBudgetTolerance - sc.pinned_use - sc.base_use;
    for (const McSegment& seg : sc.segs)
      if (pos[seg.item] == seg.from && seg.du <= r) {
        r -= seg.du;
        pos[seg.item] = seg.to;
      }
    if (lambda[s] > 0.0) improve_by_exchange(m, sc, lambda[s], r, pos);
  }
  auto opt_of = [&](size_t i) -> const McOption& { return m.opts[m.first[i] + pos[i]]; };
  auto greedy_use_q = [&](size_t i) {
    const McOption& x = opt_of(i);
    return std::pair<double, double>{x.use, x.q};
  };
  // 3. Gap per scope.
  const std::vector<double> gaps = scope_gaps(m, value, lambda, greedy_use_q);

  MckpSolution out;
  out.algorithm = "mckp";
  auto finish_choice = [&]() {
    out.choice.assign(n, "");
    for (size_t i = 0; i < n; ++i)
      out.choice[i] = m.pinned[i] >= 0 ? m.names[m.pinned[i]] : m.names[opt_of(i).name];
  };
  double gap = 0.0;
  bool all_proven = true;
  for (double g : gaps) {
    gap += g;
    all_proven = all_proven && g <= qtol;
  }
  if (all_proven) {
    finish_choice();
    out.status = "optimal";
    out.proven = true;
    out.gap = 0.0;
    return out;
  }

  // 4. Reduced-cost fixing; the core of every scope not yet proven.
  struct CoreItem {
    int item;
    std::vector<int> local;  // surviving local options, use ascending
  };
  std::vector<std::vector<CoreItem>> cores(m.scopes.size());
  size_t core_vars = 0, core_items = 0;
  for (size_t s = 0; s < m.scopes.size(); ++s) {
    if (gaps[s] <= qtol) continue;
    const double lam = lambda[s];
    const double limit = gaps[s] + qtol;
    for (int i : m.scopes[s].items) {
      const McOption& base = m.opts[m.first[i]];
      double best = std::numeric_limits<double>::infinity();
      for (int j = m.first[i]; j < m.first[i + 1]; ++j)
        best = std::min(best, (m.opts[j].q - base.q) + lam * (m.opts[j].use - base.use));
      CoreItem c{i, {}};
      for (int j = m.first[i]; j < m.first[i + 1]; ++j) {
        const double rc = (m.opts[j].q - base.q) + lam * (m.opts[j].use - base.use) - best;
        if (rc <= limit || j - m.first[i] == pos[i]) c.local.push_back(j - m.first[i]);
      }
      if (c.local.size() >= 2) {
        core_vars += c.local.size() - 1;
        cores[s].push_back(std::move(c));
      }
    }
    core_items += cores[s].size();
  }
  out.core_vars = core_vars;
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  if (o.verbosity >= 1)
    std::fprintf(stderr,
                 "[mckp] %zu items, %zu scopes: rounded plan within %.6g of the LP bound; "
                 "core %zu items, %zu option variables after reduced-cost fixing (%.3f s)\n",
                 n, m.scopes.size(), gap, core_items, core_vars, elapsed);
  const double left = std::min(time_limit_s - elapsed, o.core_time_limit_s);
  if (core_items == 0) {
    // Every option but the rounded plan's is fixed: the plan is optimal.
    finish_choice();
    out.status = "optimal";
    out.proven = true;
    return out;
  }
  if (core_vars > o.max_core_vars || left <= 0.0) {
    // Nothing CBC can add within the limits: the rounded plan, its gap.
    finish_choice();
    out.status = left <= 0.0 ? "time_limit_feasible" : "feasible";
    out.gap = gap;
    return out;
  }

  // The core MILP of one scope at a time (scopes are independent; smaller
  // models are easier for CBC): per core item a base option (its first
  // surviving one) and a binary per other option; rows: at most one option
  // per item, the scope's budget row (everything outside the core a
  // constant), ordering rows for interchangeable two-option items (planner.h,
  // "Exactness"). The time left is shared among the scopes still to solve.
  const auto t_core = Clock::now();
  auto solver = make_milp_solver(o.solver);
  std::vector<double> cbc_gap(m.scopes.size(), std::numeric_limits<double>::infinity());
  std::vector<char> cbc_proven(m.scopes.size(), 0);
  bool any_limit = false;
  size_t scopes_left = 0;
  for (const auto& c : cores) scopes_left += !c.empty();
  out.algorithm = "mckp+cbc";
  // Smallest cores first: time they leave goes to the larger ones.
  std::vector<size_t> order(m.scopes.size());
  for (size_t s = 0; s < order.size(); ++s) order[s] = s;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return cores[a].size() < cores[b].size(); });
  for (size_t s : order) {
    const std::vector<CoreItem>& core = cores[s];
    if (core.empty()) continue;
    const McScope& sc = m.scopes[s];
    MilpModel model;
    std::vector<double> obj;
    std::vector<std::pair<int, int>> var_of;  // (core index, local option)
    std::vector<std::vector<int>> vars_of(core.size());
    for (size_t c = 0; c < core.size(); ++c) {
      const int i = core[c].item;
      const McOption& base = m.opts[m.first[i] + core[c].local[0]];
      for (size_t k = 1; k < core[c].local.size(); ++k) {
        vars_of[c].push_back(static_cast<int>(obj.size()));
        var_of.emplace_back(static_cast<int>(c), core[c].local[k]);
        obj.push_back(m.opts[m.first[i] + core[c].local[k]].q - base.q);
      }
    }
    double qscale = 0.0;
    for (double v : obj) qscale = std::max(qscale, std::fabs(v));
    if (qscale == 0.0) qscale = 1.0;
    for (double v : obj) model.add_binary(v / qscale);
    for (size_t c = 0; c < core.size(); ++c)
      if (vars_of[c].size() >= 2)
        model.add_row(vars_of[c], std::vector<double>(vars_of[c].size(), 1.0),
                      -std::numeric_limits<double>::infinity(), 1.0);
    // Budget row: Σ_core (u - u_corebase) y <= U - Σ_outside u - Σ_core
    // u_corebase, the right side from per-item differences to the scope base.
    double hi = cap - sc.pinned_use - sc.base_use;
    std::vector<char> in_core(n, 0);
    for (const CoreItem& c : core) in_core[c.item] = 1;
    for (int i : sc.items)
      if (!in_core[i]) hi -= opt_of(i).use - m.opts[m.first[i]].use;
    std::vector<int> row_idx;
    std::vector<double> row_coef;
    for (size_t c = 0; c < core.size(); ++c) {
      const int i = core[c].item;
      const McOption& base = m.opts[m.first[i] + core[c].local[0]];
      hi -= base.use - m.opts[m.first[i]].use;
      for (size_t k = 1; k < core[c].local.size(); ++k) {
        const double coef = m.opts[m.first[i] + core[c].local[k]].use - base.use;
        if (coef != 0.0) {
          row_idx.push_back(vars_of[c][k - 1]);
          row_coef.push_back(coef);
        }
      }
    }
    if (!row_idx.empty())
      model.add_row(row_idx, row_coef, -std::numeric_limits<double>::infinity(), hi);
    // The rounded plan, kept when CBC does not beat it.
    std::vector<int> x0(obj.size(), 0);
    for (size_t v = 0; v < var_of.size(); ++v)
      x0[v] = pos[core[var_of[v].first].item] == var_of[v].second ? 1 : 0;
    // Ordering rows; the rounded plan is re-sorted within each class (same
    // count of y = 1, on the members with the smallest Δ first: rows and
    // budget unchanged, objective not higher).
    std::map<std::tuple<double, int, int>, std::vector<int>> classes;
    for (size_t c = 0; c < core.size(); ++c)
      if (vars_of[c].size() == 1) {
        const int i = core[c].item;
        // Interchangeable: same FLOPs (time budget: same change of use).
        const McOption& a0 = m.opts[m.first[i] + core[c].local[0]];
        const McOption& a1 = m.opts[m.first[i] + core[c].local[1]];
        classes[{m.timed ? a1.use - a0.use : p.problem.items[i].flops, a0.name, a1.name}]
            .push_back(vars_of[c][0]);
      }
    for (auto& [key, members] : classes) {
      std::stable_sort(members.begin(), members.end(),
                       [&](int a, int b) { return obj[a] < obj[b]; });
      int ones = 0;
      for (int v : members) ones += x0[v];
      for (size_t k = 0; k < members.size(); ++k) x0[members[k]] = static_cast<int>(k) < ones;
      for (size_t k = 0; k + 1 < members.size(); ++k)
        model.add_row({members[k], members[k + 1]}, {1.0, -1.0}, 0.0,
                      std::numeric_limits<double>::infinity());
    }
    MilpSolveOptions so;
    const double spent = std::chrono::duration<double>(Clock::now() - t_core).count();
    so.time_limit_s = std::max(1e-3, (left - spent) / static_cast<double>(scopes_left--));
    so.verbosity = o.verbosity;
    so.feasibility_tolerance = kBudgetTolerance;
    const MilpSolution sol = solver->solve(model, so);
    // CBC's plan unless it is worse than the rounded one (x0; possible at a
    // time limit, as CBC is not warm-started: milp_cbc.cpp says why).
    double obj0 = 0.0;
    for (size_t v = 0; v < x0.size(); ++v) obj0 += x0[v] * (obj[v] / qscale);
    const bool has_x =
        sol.status == MilpStatus::optimal || sol.status == MilpStatus::time_limit_feasible;
    if (has_x && (sol.status == MilpStatus::optimal || sol.objective <= obj0)) {
      for (const CoreItem& c : core) pos[c.item] = c.local[0];  // y = 0: the core base
      for (size_t v = 0; v < var_of.size(); ++v)
        if (sol.x[v]) pos[core[var_of[v].first].item] = var_of[v].second;
    }
    cbc_proven[s] = sol.status == MilpStatus::optimal;
    any_limit = any_limit || sol.status == MilpStatus::time_limit_feasible ||
                sol.status == MilpStatus::time_limit_no_solution;
    if (sol.status == MilpStatus::time_limit_feasible && std::isfinite(sol.bound))
      cbc_gap[s] = std::max(0.0, (sol.objective - sol.bound) * qscale);
  }
  finish_choice();
  // Per scope: proven (rounding or CBC), or the better of the LP gap of the
  // (possibly improved) plan and CBC's own gap on the core (every plan
  // better than the rounded one lies in the core).
  const auto new_gaps = scope_gaps(m, value, lambda, greedy_use_q);
  double g = 0.0;
  bool proven = true;
  for (size_t s = 0; s < m.scopes.size(); ++s) {
    if (gaps[s] <= qtol || cores[s].empty() || cbc_proven[s]) continue;
    proven = false;
    g += std::min(new_gaps[s], cbc_gap[s]);
  }
  out.proven = proven;
  out.gap = proven ? 0.0 : g;
  out.status = proven ? "optimal" : any_limit ? "time_limit_feasible" : "feasible";
  return out;
}

}  // namespace snip::plan::detail
