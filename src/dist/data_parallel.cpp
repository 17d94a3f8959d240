// Bucketed gradient all-reduce and weight checksums (see dist/data_parallel.h).
#include "snip/dist/data_parallel.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstring>

#include "snip/formats/fake_quant.h"
#include "snip/formats/fake_quant_cuda.h"
#include "snip/formats/minifloat.h"
#include "snip/formats/scale_format.h"
#include "snip/recipes/recipe.h"
#include "snip/core/error.h"
#include "snip/core/hash.h"

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

int64_t fp32_bytes(const std::vector<torch::Tensor>& all_params) {
  int64_t n = 0;
  for (const torch::Tensor& p : distinct_params(all_params)) n += p.numel();
  return 4 * n;
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

namespace {

// Runs on the autograd engine's thread right after AccumulateGrad wrote the
// parameter's .grad (torch/csrc/autograd/engine.cpp call_function: a node's
// post hooks run after the node): the parameter's gradient for this backward
// is final. The engine sums every use of a tensor (a tied weight) into one
// input before it runs the node, so it runs once per backward.
struct ReadyHook final : torch::autograd::FunctionPostHook {
  ReadyHook(GradSync* s, size_t k) : sync(s), param(k) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    sync->ready(param);
    return outputs;
  }
  GradSync* sync;
  size_t param;
};

}  // namespace

GradSync::GradSync(Communicator& comm, const std::vector<torch::Tensor>& all_params)
    : comm_(comm), params_(distinct_params(all_params)), buckets_(grad_buckets(params_)) {
  bucket_of_.resize(params_.size());
  waiting_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (size_t k : buckets_[b]) bucket_of_[k] = b;
    waiting_[b] = buckets_[b].size();
  }
  flat_.resize(buckets_.size());
  work_.resize(buckets_.size());
}

GradSync::~GradSync() { disarm(); }

void GradSync::arm() {
  SNIP_CHECK(hooks_.empty() && next_ == 0, "GradSync::arm: already armed or used");
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!params_[k].requires_grad()) continue;  // never gets a gradient: its bucket waits for finish()
    std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(params_[k]);
    if (!acc) continue;
    const uintptr_t key = acc->add_post_hook(std::make_unique<ReadyHook>(this, k));
    hooks_.emplace_back(std::move(acc), key);  // holding the accumulator keeps it (and the hook) alive
  }
}

void GradSync::disarm() {
  for (auto& [acc, key] : hooks_) acc->del_post_hook(key);
  hooks_.clear();
}

void GradSync::ready(size_t k) {
  const size_t b = bucket_of_[k];
  SNIP_CHECK(waiting_[b] > 0, "GradSync: parameter ", k, " reported ready twice");
  --waiting_[b];
  // Buckets start in bucket order on every rank (collectives are matched by
  // order): a full bucket behind an unfinished one waits for it.
  while (next_ < buckets_.size() && waiting_[next_] == 0) {
    launch(next_++);
    ++launched_in_backward_;
  }
}

void GradSync::launch(size_t b) {
  std::vector<torch::Tensor> parts;
  for (size_t k : buckets_[b]) {
    torch::Tensor p = params_[k];
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    SNIP_CHECK(p.grad().scalar_type() == torch::kFloat, "gradient of parameter ", k, " is not FP32");
    parts.push_back(p.grad().reshape({-1}));
  }
  flat_[b] = torch::cat(parts);
  std::vector<torch::Tensor> one{flat_[b]};
  work_[b] = comm_.allreduce_sum_async(one);
}

void GradSync::finish() {
  disarm();
  while (next_ < buckets_.size()) launch(next_++);  // not started during backward (or no backward)
  for (size_t b = 0; b < buckets_.size(); ++b) {
    work_[b]->wait();
    int64_t off = 0;
    for (size_t k : buckets_[b]) {
      torch::Tensor g = params_[k].grad();
      const int64_t n = g.numel();
      g.copy_(flat_[b].narrow(0, off, n).view_as(g));
      off += n;
    }
  }
}

void allreduce_gradients(Communicator& comm, const std::vector<torch::Tensor>& all_params) {
  // A tensor registered twice (e.g. a tied weight) is summed once.
  GradSync sync(comm, all_params);
  sync.finish();
}

GradCompressor::GradCompressor(const recipes::RecipeSet& recipes, const std::string& format, bool error_feedback)
    : format_(format), fp32_(format == "fp32"), ef_(error_feedback) {
  if (fp32_) return;
  recipes::Recipe r;
  try {
    r = recipes.find(format);
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
  SNIP_CHECK(g.dim() == 2 && g.scalar_type() == torch::kFloat && g.is_contiguous() &&
                 (g.device().is_cpu() || g.device().is_cuda()),
             "compress: expected a contiguous FP32 CPU or CUDA [rows, cols] gradient");
  SNIP_CHECK(e.sizes() == g.sizes() && e.scalar_type() == torch::kFloat && e.device() == g.device(),
             "compress: residual shape or device differs");
  const torch::Tensor v = ef_ ? (g + e).contiguous() : g;  // fl(g + e), element-wise FP32
  if (fp32_) return v.clone();                              // q = v, e - unchanged: v - q = 0
  const int64_t rows = v.size(0), cols = v.size(1);
  torch::Tensor q;
  if (v.is_cuda()) {
    if (!formats::cuda::supported(spec_)) {
      // The host codec, copied off the device and back (the same bits).
      torch::Tensor eh = e.to(torch::kCPU);
      q = compress(g.to(torch::kCPU), eh, shared_amax, key).to(g.device());
      if (ef_) e.copy_(eh);
      return q;
    }
    // The CUDA kernels (formats/fake_quant_cuda.h: the CPU codec's bits), on
    // PyTorch's current stream, on the buffer the host path quantizes.
    const c10::DeviceGuard dg(v.device());
    torch::Tensor buf = v;
    if (shares_amax() && rows * cols > 0) {
      const int64_t br = spec_.block.rows == 0 ? 1 : std::max<int64_t>(1, spec_.block.rows);
      const int64_t padded = spec_.block.rows == 0 ? rows : (rows + br - 1) / br * br;
      buf = torch::zeros({padded + 1, cols}, v.options());
      buf.narrow(0, 0, rows).copy_(v);
      buf[padded][0].fill_(shared_amax);
    }
    torch::Tensor out = torch::empty_like(buf);
    if (rows * cols > 0) {
      const int64_t br_rows = buf.size(0);
      const torch::Tensor scratch = torch::empty(
          {int64_t(formats::cuda::fake_quantize_scratch_bytes(br_rows, cols, spec_))}, v.options().dtype(torch::kUInt8));
      const formats::cuda::DeviceLaunch launch{
          c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(v.device()).native_handle(),
          scratch.numel() > 0 ? scratch.data_ptr() : nullptr};
      formats::cuda::fake_quantize_device(buf.data_ptr<float>(), out.data_ptr<float>(), br_rows, cols, spec_, key,
                                          launch);
    }
    q = out.narrow(0, 0, rows).contiguous();
    if (ef_) e.copy_(v - q);  // fl(v - q)
    return q;
  }
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

namespace {

// The scale blocks that travel for a [rows, cols] gradient: compress() and
// compress_packed() quantize a buffer of buf_rows rows (with the shared amax
// appended as one more block row), whose block grid over the first `rows`
// rows is [gr, gc] blocks of [br, bc].
struct WireGrid {
  int64_t br = 1, bc = 1, gr = 0, gc = 0, buf_rows = 0;
};

WireGrid wire_grid(const formats::QuantSpec& spec, bool shares_amax, int64_t rows, int64_t cols) {
  WireGrid w;
  w.buf_rows = rows;
  if (shares_amax) {
    const int64_t br = spec.block.rows == 0 ? 1 : std::max<int64_t>(1, spec.block.rows);
    w.buf_rows = (spec.block.rows == 0 ? rows : (rows + br - 1) / br * br) + 1;
  }
  w.br = std::max<int64_t>(1, spec.block.rows_over(w.buf_rows));
  w.bc = std::max<int64_t>(1, spec.block.cols_over(cols));
  w.gr = (rows + w.br - 1) / w.br;
  w.gc = (cols + w.bc - 1) / w.bc;
  return w;
}

// Bytes of one block scale's code on the wire (0: no scales).
int scale_code_bytes(const formats::QuantSpec& spec) {
  if (spec.rule == formats::ScaleRule::kNone) return 0;
  return spec.scale_format == formats::ScaleFormat::kE8M0 || spec.scale_format == formats::ScaleFormat::kE4M3 ? 1 : 4;
}

void put_u32(uint8_t*& o, uint32_t v) {
  for (int i = 0; i < 4; ++i) *o++ = uint8_t(v >> (8 * i));  // little-endian
}
uint32_t get_u32(const uint8_t*& p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(*p++) << (8 * i);
  return v;
}
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

torch::Tensor GradCompressor::compress_packed(const torch::Tensor& g, torch::Tensor& e, float shared_amax,
                                              const formats::RoundingKey& key, uint8_t* out) const {
  SNIP_CHECK(g.dim() == 2 && g.scalar_type() == torch::kFloat && g.is_contiguous() &&
                 (g.device().is_cpu() || g.device().is_cuda()),
             "compress_packed: expected a contiguous FP32 CPU or CUDA [rows, cols] gradient");
  SNIP_CHECK(e.sizes() == g.sizes() && e.scalar_type() == torch::kFloat && e.device() == g.device(),
             "compress_packed: residual shape or device differs");
  if (g.is_cuda()) {
    // The codes are packed by the host codec: the gradient and residual are
    // copied off the device and the residual and q back (the same bits).
    torch::Tensor eh = e.to(torch::kCPU);
    const torch::Tensor q = compress_packed(g.to(torch::kCPU), eh, shared_amax, key, out).to(g.device());
    if (ef_) e.copy_(eh);
    return q;
  }
  const int64_t rows = g.size(0), cols = g.size(1), n = rows * cols;
  if (fp32_) {
    const torch::Tensor q = compress(g, e, shared_amax, key);
    if (n > 0) std::memcpy(out, q.data_ptr<float>(), size_t(n) * 4);  // host byte order (every rank alike)
    return q;
  }
  const torch::Tensor v = ef_ ? (g + e).contiguous() : g;  // fl(g + e)
  if (n == 0) return v.clone();
  const WireGrid w = wire_grid(spec_, shares_amax(), rows, cols);
  torch::Tensor buf = v;
  if (w.buf_rows != rows) {  // the shared amax as one appended block row (compress())
    buf = torch::zeros({w.buf_rows, cols}, torch::kFloat);
    buf.narrow(0, 0, rows).copy_(v);
    buf.data_ptr<float>()[(w.buf_rows - 1) * cols] = shared_amax;
  }
  const formats::QuantizedTensor qt = formats::quantize_packed(buf.data_ptr<float>(), w.buf_rows, cols, spec_, key);
  torch::Tensor deq = torch::empty({w.buf_rows, cols}, torch::kFloat);
  formats::dequantize(qt, deq.data_ptr<float>());
  const torch::Tensor q = deq.narrow(0, 0, rows).contiguous();
  if (ef_) e.copy_(v - q);  // fl(v - q)
  SNIP_CHECK(qt.scales.block_rows == w.br && qt.scales.grid_cols == w.gc, "compress_packed: block grid differs");
  uint8_t* o = out;
  const int64_t cb = formats::packed_bytes(n, spec_.element.bits);
  std::memcpy(o, qt.data.data(), size_t(cb));  // the first `rows` rows' codes are a prefix
  if (spec_.element.bits <= 4 && n % 2 == 1) o[cb - 1] &= 0x0F;  // not this tensor's: the next row's code
  o += cb;
  const int sb = scale_code_bytes(spec_);
  for (int64_t i = 0; sb > 0 && i < w.gr * w.gc; ++i) {
    const uint32_t code = qt.scales.blocks[size_t(i)].code;
    if (sb == 1) {
      SNIP_CHECK(code < 256, "compress_packed: a one-byte scale code is ", code);
      *o++ = uint8_t(code);
    } else {
      put_u32(o, code);  // the FP32 bits of the decode scale
    }
  }
  if (spec_.rule == formats::ScaleRule::kTwoLevel) put_u32(o, bits_of(qt.scales.tensor.decode));
  SNIP_CHECK(o - out == wire_bytes(rows, cols), "compress_packed: wrote ", o - out, " bytes, wire_bytes says ",
             wire_bytes(rows, cols));
  return q;
}

void GradCompressor::decode_packed(const uint8_t* in, int64_t rows, int64_t cols, float* out) const {
  const int64_t n = rows * cols;
  if (n == 0) return;
  if (fp32_) {
    std::memcpy(out, in, size_t(n) * 4);
    return;
  }
  const WireGrid w = wire_grid(spec_, shares_amax(), rows, cols);
  formats::QuantizedTensor qt;
  qt.spec = spec_;
  qt.rows = rows;
  qt.cols = cols;
  const int64_t cb = formats::packed_bytes(n, spec_.element.bits);
  qt.data.assign(in, in + cb);
  const uint8_t* p = in + cb;
  formats::ScaleArray& sa = qt.scales;
  sa.block_rows = w.br;
  sa.block_cols = w.bc;
  sa.grid_rows = w.gr;
  sa.grid_cols = w.gc;
  sa.blocks.resize(size_t(w.gr * w.gc));
  const int sb = scale_code_bytes(spec_);
  for (auto& b : sa.blocks) b.code = sb == 0 ? 0u : sb == 1 ? uint32_t(*p++) : get_u32(p);
  float tensor_decode = 1.0f;
  if (spec_.rule == formats::ScaleRule::kTwoLevel) tensor_decode = float_of(get_u32(p));
  // Each block's decode scale from its code, as formats/scale.cpp block_scale_reference derives it.
  for (auto& b : sa.blocks) {
    if (spec_.rule == formats::ScaleRule::kNone) b.decode = 1.0f;
    else if (spec_.rule == formats::ScaleRule::kTwoLevel)
      b.decode = formats::decode(formats::kE4M3, b.code) * tensor_decode;
    else if (spec_.scale_format == formats::ScaleFormat::kE8M0) b.decode = formats::e8m0_decode(uint8_t(b.code));
    else if (sb == 4) b.decode = float_of(b.code);
    else SNIP_CHECK(false, "decode_packed: no decoder for scale format ", formats::scale_format_name(spec_.scale_format));
  }
  formats::dequantize(qt, out);
}

int64_t allreduce_gradients_quantized(Communicator& comm, const std::vector<torch::Tensor>& all_params, GradComm& gc,
                                      uint64_t seed, int64_t step) {
  const std::vector<torch::Tensor> params = distinct_params(all_params);
  const GradCompressor& c = gc.compressor;
  const int64_t bytes = c.wire_bytes(params);
  if (c.is_fp32() && !gc.allgather) {
    allreduce_gradients(comm, params);
    gc.sent_bytes = bytes;
    return bytes;
  }
  if (gc.residuals.empty())
    for (const torch::Tensor& p : params) gc.residuals.push_back(torch::zeros_like(p, torch::kFloat));
  SNIP_CHECK(gc.residuals.size() == params.size(), "grad_comm: ", gc.residuals.size(), " residuals for ",
             params.size(), " parameters");
  const int64_t P = int64_t(params.size());
  std::vector<torch::Tensor> g2(static_cast<size_t>(P)), e2(static_cast<size_t>(P));
  std::vector<torch::Tensor> maxima;  // [P] x 0-d max |g + e|, on the gradients' device (no copy per parameter)
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
      maxima.push_back(v.abs().max());
    }
  }
  torch::Tensor amax = torch::zeros({P}, torch::kFloat);  // [P] max |g + e| per parameter, on the host
  if (c.shares_amax() && P > 0) {
    // One [P] tensor on the gradients' device, one all-reduce (device tensors go to NCCL as they are), one copy
    // to the host; on the CPU the same values as writing each maximum into `amax` (a maximum is exact).
    std::vector<torch::Tensor> a{torch::stack(maxima).to(torch::kFloat).contiguous()};
    comm.allreduce_max(a);
    amax = a[0].to(torch::kCPU);
  }
  const float* am = amax.data_ptr<float>();
  const int64_t amax_bytes = c.shares_amax() ? 4 * P : 0;
  if (gc.allgather) {
    // This rank's bytes of every parameter, in model order, then one all-gather.
    std::vector<int64_t> off(size_t(P) + 1, 0);
    for (int64_t k = 0; k < P; ++k)
      off[size_t(k) + 1] = off[size_t(k)] + c.wire_bytes(g2[size_t(k)].size(0), g2[size_t(k)].size(1));
    SNIP_CHECK(off.back() == bytes, "grad_comm: ", off.back(), " bytes packed, wire_bytes says ", bytes);
    torch::Tensor mine = torch::empty({off.back()}, torch::kUInt8);
    for (int64_t k = 0; k < P; ++k) {
      const formats::RoundingKey key{seed, uint64_t(step), uint64_t(k), 0};
      c.compress_packed(g2[size_t(k)], e2[size_t(k)], am[k], key, mine.data_ptr<uint8_t>() + off[size_t(k)]);
    }
    const std::vector<torch::Tensor> all = comm.allgather(mine);  // [R] x [bytes] uint8, rank order
    for (int64_t k = 0; k < P; ++k) {
      const int64_t rows = g2[size_t(k)].size(0), cols = g2[size_t(k)].size(1);
      torch::Tensor sum = torch::empty({rows, cols}, torch::kFloat), part = torch::empty({rows, cols}, torch::kFloat);
      for (size_t r = 0; r < all.size(); ++r) {  // q_0 + q_1 + ... in rank order
        c.decode_packed(all[r].data_ptr<uint8_t>() + off[size_t(k)], rows, cols, (r == 0 ? sum : part).data_ptr<float>());
        if (r > 0) sum.add_(part);
      }
      params[size_t(k)].grad().copy_(sum.view(params[size_t(k)].sizes()));
    }
    gc.sent_bytes = bytes + amax_bytes;
    return bytes;
  }
  for (int64_t k = 0; k < P; ++k) {
    const formats::RoundingKey key{seed, uint64_t(step), uint64_t(k), 0};
    const torch::Tensor q = c.compress(g2[size_t(k)], e2[size_t(k)], am[k], key);
    params[size_t(k)].grad().copy_(q.view(params[size_t(k)].sizes()));
  }
  allreduce_gradients(comm, params);
  gc.sent_bytes = fp32_bytes(params) + amax_bytes;
  return bytes;
}

torch::Tensor param_checksums(const std::vector<torch::Tensor>& params) {
  torch::Tensor out = torch::empty({int64_t(params.size())}, torch::kLong);
  int64_t* o = out.data_ptr<int64_t>();
  for (size_t k = 0; k < params.size(); ++k) {
    const torch::Tensor c = params[k].detach().to(torch::kCPU).contiguous();
    const uint64_t h = fnv1a64(c.data_ptr(), size_t(c.numel()) * c.element_size());
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
        if (first < 0 || first == k) ranks.push_back(comm.world_rank_of(int(r)));
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
       rs, " differs from rank ", comm.world_rank_of(0), " (", differing, " of ", P, " tensors differ; mismatched communication libraries, "
       "or a faulty machine)");
}

}  // namespace snip::dist
