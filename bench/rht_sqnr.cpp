// Quantization error of the wgrad GEMM with and without the random Hadamard
// transform, on real gradients (results in docs/benchmarks.md, "Random
// Hadamard transform").
//
//   build/bench/rht_sqnr --checkpoint RUN/checkpoints/step-N --data data/brown [--batches 4]
//
// For every linear layer of the model and every micro-batch: one forward and
// backward at full precision (FP32 GEMMs) records the wgrad GEMM's operands
// A = dYᵀ [OUT, N] and B = Xᵀ [IN, N] (K = N tokens); the exact
// dW = A·Bᵀ (float64) is compared with Q(A)·Q(B)ᵀ for each recipe's wgrad
// specs, as they are and with the transform switched off (or on):
//   SQNR(dW) = 10 log10(||dW||² / ||Q(A)·Q(B)ᵀ - dW||²)   [dB]
// summed over layers (errors and references added before the ratio), plus
// the median over layers. Stochastic rounding keys follow (batch, layer).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "snip/data/loader.h"
#include "snip/formats/fake_quant.h"
#include "snip/formats/hadamard.h"
#include "snip/model/llama.h"
#include "snip/recipes/recipe.h"
#include "snip/train/checkpoint.h"
#include "snip/train/step.h"
#include "snip/core/error.h"

using namespace snip;

namespace {

// Identity on every operand; keeps a copy of the two wgrad operands.
class WgradRecorder final : public OperandQuantizer {
 public:
  torch::Tensor quantize(const torch::Tensor& t, const QuantKey& key) const override {
    if (key.operand == Operand::kWgradDY || key.operand == Operand::kWgradX) {
      std::lock_guard<std::mutex> g(mu_);
      seen_[{key.layer, int(key.operand)}] = t.to(torch::kFloat).contiguous().clone();
    }
    return t;
  }
  std::string name() const override { return "wgrad-recorder"; }
  std::map<std::pair<int64_t, int>, torch::Tensor> take() const {
    std::lock_guard<std::mutex> g(mu_);
    return std::move(seen_);
  }

 private:
  mutable std::mutex mu_;
  mutable std::map<std::pair<int64_t, int>, torch::Tensor> seen_;
};

torch::Tensor fq(const torch::Tensor& t, const formats::QuantSpec& spec, const formats::RoundingKey& key) {
  torch::Tensor out = torch::empty_like(t);
  formats::fake_quantize(t.data_ptr<float>(), out.data_ptr<float>(), t.size(0), t.size(1), spec, key);
  return out;
}

struct Variant {
  std::string label;
  formats::QuantSpec dy, x;
  double err = 0, ref = 0;
  std::vector<double> per_layer_db;
};

}  // namespace

int main(int argc, char** argv) {
  std::string ckpt, data;
  int batches = 4;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--checkpoint" && i + 1 < argc) ckpt = argv[++i];
    else if (a == "--data" && i + 1 < argc) data = argv[++i];
    else if (a == "--batches" && i + 1 < argc) batches = std::stoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: rht_sqnr --checkpoint DIR --data DIR [--batches N]\n");
      return 2;
    }
  }
  if (ckpt.empty() || data.empty()) {
    std::fprintf(stderr, "usage: rht_sqnr --checkpoint DIR --data DIR [--batches N]\n");
    return 2;
  }
  try {
    LlamaForCausalLM model = load_checkpoint_model(ckpt);
    auto rec = std::make_shared<WgradRecorder>();
    model->set_precision(LinearPrecision{rec, at::kFloat});
    const std::vector<QuantLinear> layers = model->linear_layers();

    std::vector<Variant> variants;
    for (const std::string r : {"nvfp4", "mxfp4", "fp4"}) {
      const recipes::Recipe rc = recipes::RecipeSet().find(r);
      Variant v;
      v.dy = rc[Operand::kWgradDY];
      v.x = rc[Operand::kWgradX];
      Variant w = v;
      const bool has = v.dy.hadamard_size > 0;
      for (auto* s : {&w.dy, &w.x}) {
        s->hadamard_size = has ? 0 : 16;
        s->hadamard_seed = formats::kHadamardTeSigns;
      }
      v.label = r + (has ? " (RHT 16, TE signs)" : " (no RHT)");
      w.label = r + (has ? " without RHT" : " + RHT 16, TE signs");
      variants.push_back(v);
      variants.push_back(w);
    }

    const int64_t B = 8, T = 256;
    data::TokenLoader loader(data + "/train.bin", int(B), int(T), 1234);
    std::vector<int32_t> in, tg;
    for (int b = 0; b < batches; ++b) {
      loader.next(in, tg);
      model->zero_grad();
      LlamaForCausalLMImpl::loss(model(to_ids(in, B, T)), to_ids(tg, B, T)).backward();
      auto ops = rec->take();
      for (const QuantLinear& l : layers) {
        const torch::Tensor A = ops.at({l->layer_index, int(Operand::kWgradDY)});
        const torch::Tensor Bx = ops.at({l->layer_index, int(Operand::kWgradX)});
        const torch::Tensor dw = torch::mm(A.to(torch::kDouble), Bx.to(torch::kDouble).t());
        const double ref = dw.pow(2).sum().item<double>();
        for (Variant& v : variants) {
          const formats::RoundingKey kd{7, uint64_t(b), uint64_t(l->layer_index), uint32_t(Operand::kWgradDY)};
          const formats::RoundingKey kx{7, uint64_t(b), uint64_t(l->layer_index), uint32_t(Operand::kWgradX)};
          const torch::Tensor q = torch::mm(fq(A, v.dy, kd).to(torch::kDouble), fq(Bx, v.x, kx).to(torch::kDouble).t());
          const double err = (q - dw).pow(2).sum().item<double>();
          v.err += err;
          v.ref += ref;
          v.per_layer_db.push_back(10.0 * std::log10(ref / err));
        }
      }
      std::fprintf(stderr, "batch %d/%d done\n", b + 1, batches);
    }
    std::printf("| wgrad operands | SQNR of dW, all layers [dB] | median over layers x batches [dB] |\n");
    std::printf("|---|---|---|\n");
    for (Variant& v : variants) {
      std::sort(v.per_layer_db.begin(), v.per_layer_db.end());
      std::printf("| %s | %.2f | %.2f |\n", v.label.c_str(), 10.0 * std::log10(v.ref / v.err),
                  v.per_layer_db[v.per_layer_db.size() / 2]);
    }
    std::printf("\n%zu linear layers, %d micro-batches of %ld x %ld tokens, checkpoint %s\n", layers.size(),
                batches, long(B), long(T), ckpt.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rht_sqnr: %s\n", e.what());
    return 1;
  }
  return 0;
}
