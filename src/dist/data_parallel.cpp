// Bucketed gradient all-reduce and weight checksums (see dist/data_parallel.h).
#include "snip/dist/data_parallel.h"

#include <algorithm>
#include <cstring>

#include "snip/formats/fake_quant.h"
#include "snip/quant/recipe.h"
#include "snip/util/error.h"

namespace snip::dist {

std::vector<std::vector<size_t>> grad_buckets(const std::vector<torch::Tensor>& params, int64_t first_cap,
                                              int64_t cap) {
  std::vector<std::vector<size_t>> out;
  int64_t bytes = 0;
  for (size_t k = params.size(); k-- > 0;) {
    const int64_t b = params[k].numel() * int64_t(params[k].element_size());
    if (out.empty() || (bytes > 0 && bytes + b > (out.size() == 1 ? first_cap : cap))) {  // out.back() is being filled
      out.emplace_back();
      bytes = 0;
    }
    out.back().push_back(k);
    bytes += b;
  }
  return out;
}

std::vector<torch::Tensor> distinct_params(const std::vector<torch::Tensor>& all_params) {
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& p : all_params) {
    bool seen = false;
    for (const torch::Tensor& q : params) seen = seen || q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl();
    if (!seen) params.push_back(p);
  }
  return params;
}

void allreduce_gradients(Communicator& comm, const std::vector<torch::Tensor>& all_params) {
  // A tensor registered twice (e.g. a tied weight) is summed once.
  const std::vector<torch::Tensor> params = distinct_params(all_params);
  const auto buckets = grad_buckets(params);
  std::vector<torch::Tensor> flat;
  flat.reserve(buckets.size());
  for (const auto& bucket : buckets) {
    std::vector<torch::Tensor> parts;
    for (size_t k : bucket) {
      torch::Tensor p = params[k];
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      SNIP_CHECK(p.grad().scalar_type() == torch::kFloat, "gradient of parameter ", k, " is not FP32");
      parts.push_back(p.grad().reshape({-1}));
    }
    flat.push_back(torch::cat(parts));
  }
  comm.allreduce_sum(flat);
  for (size_t i = 0; i < buckets.size(); ++i) {
    int64_t off = 0;
    for (size_t k : buckets[i]) {
      torch::Tensor g = params[k].grad();
      const int64_t n = g.numel();
      g.copy_(flat[i].narrow(0, off, n).view_as(g));
      off += n;
    }
  }
}

GradCompressor::GradCompressor(const std::string& format, bool error_feedback)
    : format_(format), fp32_(format == "fp32"), ef_(error_feedback) {
  if (fp32_) return;
  quant::Recipe r;
  try {
    r = quant::find_recipe(format);
  } catch (const UserError& e) {
    fail("dist.grad_comm: ", e.what(), "; or fp32");
  }
  spec_ = r[Operand::kFpropW];
  if (spec_.hadamard_size > 0)
    fail("dist.grad_comm: recipe '", format, "' quantizes weights after a Hadamard transform, which gradient "
         "communication does not support (q would approximate g·H); choose another recipe");
  if (spec_.rule == formats::ScaleRule::kDelayed) {  // a shared amax per step needs no history
    spec_.rule = formats::ScaleRule::kCurrent;
    spec_.block = formats::BlockShape::tensor();
  }
  formats::validate_quant_spec(spec_, "dist.grad_comm");
}

bool GradCompressor::shares_amax() const {
  if (fp32_) return false;
  return spec_.rule == formats::ScaleRule::kTwoLevel ||
         (spec_.rule == formats::ScaleRule::kCurrent && spec_.block.rows == 0 && spec_.block.cols == 0);
}

int64_t GradCompressor::wire_bytes(int64_t rows, int64_t cols) const {
  const int64_t n = rows * cols;
  if (fp32_) return n * 4;
  int64_t bytes = formats::packed_bytes(n, spec_.element.bits);
  if (spec_.rule == formats::ScaleRule::kNone || n == 0) return bytes;
  const int64_t br = std::max<int64_t>(1, spec_.block.rows_over(rows));
  const int64_t bc = std::max<int64_t>(1, spec_.block.cols_over(cols));
  const int64_t blocks = ((rows + br - 1) / br) * ((cols + bc - 1) / bc);
  const bool one_byte = spec_.scale_format == formats::ScaleFormat::kE8M0 ||
                        spec_.scale_format == formats::ScaleFormat::kE4M3;
  bytes += blocks * (one_byte ? 1 : 4);
  if (spec_.rule == formats::ScaleRule::kTwoLevel) bytes += 4;  // the FP32 tensor scale
  return bytes;
}

int64_t GradCompressor::wire_bytes(const std::vector<torch::Tensor>& params) const {
  int64_t total = 0;
  for (const torch::Tensor& p : distinct_params(params)) {
    const torch::Tensor m = grad_matrix(p.detach());
    total += wire_bytes(m.size(0), m.size(1));
  }
  return total;
}

torch::Tensor grad_matrix(const torch::Tensor& t) {
  if (t.dim() == 2) return t;
  if (t.dim() == 0) return t.reshape({1, 1});
  if (t.dim() == 1) return t.reshape({1, t.size(0)});
  return t.reshape({-1, t.size(-1)});
}

torch::Tensor GradCompressor::compress(const torch::Tensor& g, torch::Tensor& e, float shared_amax,
                                       const formats::RoundingKey& key) const {
  SNIP_CHECK(g.dim() == 2 && g.scalar_type() == torch::kFloat && g.is_contiguous() && g.device().is_cpu(),
             "compress: expected a contiguous FP32 CPU [rows, cols] gradient");
  SNIP_CHECK(e.sizes() == g.sizes() && e.scalar_type() == torch::kFloat, "compress: residual shape differs");
  const torch::Tensor v = ef_ ? (g + e).contiguous() : g;  // fl(g + e), element-wise FP32
  if (fp32_) return v.clone();                              // q = v, e - unchanged: v - q = 0
  const int64_t rows = v.size(0), cols = v.size(1);
  torch::Tensor q;
  if (shares_amax() && rows * cols > 0) {
    // One appended block row holding the shared amax (header comment).
    const int64_t br = spec_.block.rows == 0 ? 1 : std::max<int64_t>(1, spec_.block.rows);
    const int64_t padded = spec_.block.rows == 0 ? rows : (rows + br - 1) / br * br;
    torch::Tensor buf = torch::zeros({padded + 1, cols}, torch::kFloat);
    buf.narrow(0, 0, rows).copy_(v);
    buf.data_ptr<float>()[padded * cols] = shared_amax;
    formats::fake_quantize(buf.data_ptr<float>(), buf.data_ptr<float>(), padded + 1, cols, spec_, key);
    q = buf.narrow(0, 0, rows).contiguous();
  } else {
    q = torch::empty_like(v);
    formats::fake_quantize(v.data_ptr<float>(), q.data_ptr<float>(), rows, cols, spec_, key);
  }
  if (ef_) e.copy_(v - q);  // fl(v - q)
  return q;
}

int64_t allreduce_gradients_quantized(Communicator& comm, const std::vector<torch::Tensor>& all_params, GradComm& gc,
                                      uint64_t seed, int64_t step) {
  const std::vector<torch::Tensor> params = distinct_params(all_params);
  const GradCompressor& c = gc.compressor;
  const int64_t bytes = c.wire_bytes(params);
  if (c.is_fp32()) {
    allreduce_gradients(comm, params);
    return bytes;
  }
  if (gc.residuals.empty())
    for (const torch::Tensor& p : params) gc.residuals.push_back(torch::zeros_like(p, torch::kFloat));
  SNIP_CHECK(gc.residuals.size() == params.size(), "grad_comm: ", gc.residuals.size(), " residuals for ",
             params.size(), " parameters");
  const int64_t P = int64_t(params.size());
  std::vector<torch::Tensor> g2(static_cast<size_t>(P)), e2(static_cast<size_t>(P));
  torch::Tensor amax = torch::zeros({P}, torch::kFloat);  // [P] max |g + e| per parameter
  for (int64_t k = 0; k < P; ++k) {
    torch::Tensor p = params[size_t(k)];
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    SNIP_CHECK(p.grad().scalar_type() == torch::kFloat, "gradient of parameter ", k, " is not FP32");
    SNIP_CHECK(gc.residuals[size_t(k)].sizes() == p.sizes(), "grad_comm: residual ", k, " has shape ",
               gc.residuals[size_t(k)].sizes(), ", parameter ", p.sizes());
    g2[size_t(k)] = grad_matrix(p.grad().contiguous());
    e2[size_t(k)] = grad_matrix(gc.residuals[size_t(k)]);  // a view: compress updates the residual
    if (c.shares_amax()) {
      const torch::Tensor v = c.error_feedback() ? g2[size_t(k)] + e2[size_t(k)] : g2[size_t(k)];
      amax[k] = v.abs().max();
    }
  }
  if (c.shares_amax()) {
    std::vector<torch::Tensor> a{amax};
    comm.allreduce_max(a);
  }
  const float* am = amax.data_ptr<float>();
  for (int64_t k = 0; k < P; ++k) {
    const formats::RoundingKey key{seed, uint64_t(step), uint64_t(k), 0};
    const torch::Tensor q = c.compress(g2[size_t(k)], e2[size_t(k)], am[k], key);
    params[size_t(k)].grad().copy_(q.view(params[size_t(k)].sizes()));
  }
  allreduce_gradients(comm, params);
  return bytes;
}

torch::Tensor param_checksums(const std::vector<torch::Tensor>& params) {
  torch::Tensor out = torch::empty({int64_t(params.size())}, torch::kLong);
  int64_t* o = out.data_ptr<int64_t>();
  for (size_t k = 0; k < params.size(); ++k) {
    const torch::Tensor c = params[k].detach().to(torch::kCPU).contiguous();
    const auto* p = static_cast<const unsigned char*>(c.data_ptr());
    const size_t n = size_t(c.numel()) * c.element_size();
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64 offset basis (14695981039346656037)
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;  // FNV-1a 64 prime (1099511628211)
    std::memcpy(&o[k], &h, sizeof h);
  }
  return out;
}

void check_same_weights(Communicator& comm, const std::vector<std::string>& names,
                        const std::vector<torch::Tensor>& params, const std::string& when) {
  SNIP_CHECK(names.size() == params.size(), "names and params differ in length");
  const std::vector<torch::Tensor> all = comm.allgather(param_checksums(params));
  const int64_t P = int64_t(params.size());
  int64_t first = -1, differing = 0;
  std::vector<int> ranks;
  for (int64_t k = 0; k < P; ++k) {
    bool differs = false;
    for (size_t r = 1; r < all.size(); ++r)
      if (all[r][k].item<int64_t>() != all[0][k].item<int64_t>()) {
        differs = true;
        if (first < 0 || first == k) ranks.push_back(int(r));
      }
    if (differs) {
      if (first < 0) first = k;
      ++differing;
    }
  }
  if (first < 0) return;
  std::string rs;
  for (size_t i = 0; i < ranks.size(); ++i) rs += (i ? ", " : "") + std::to_string(ranks[i]);
  fail("dist: weights differ across ranks at ", when, ": ", names[size_t(first)], " on rank", ranks.size() > 1 ? "s " : " ",
       rs, " differs from rank 0 (", differing, " of ", P, " tensors differ; mismatched communication libraries, "
       "or a faulty machine)");
}

}  // namespace snip::dist
