// Bucketed gradient all-reduce and weight checksums (see dist/data_parallel.h).
#include "snip/dist/data_parallel.h"

#include <cstring>

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

void allreduce_gradients(Communicator& comm, const std::vector<torch::Tensor>& all_params) {
  // A tensor registered twice (e.g. a tied weight) is summed once.
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& p : all_params) {
    bool seen = false;
    for (const torch::Tensor& q : params) seen = seen || q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl();
    if (!seen) params.push_back(p);
  }
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
