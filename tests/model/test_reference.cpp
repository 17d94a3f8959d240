// The golden test (llm.c test_gpt2 habit): snip's Llama against the
// independent plain-PyTorch float64 reference tools/ref_llama.py, tensor by
// tensor: logits, loss, every parameter gradient by Hugging Face name, then
// the losses of N AdamW steps and the parameters after them.
//
// The fixture is written by the CTest setup test `gen_ref_fixture`
// (tests/io/CMakeLists.txt) into $SNIP_BINARY_DIR/fixtures/. Tolerances: both
// sides run in float64; the only differences are summation order and RoPE
// tables (the reference builds them from float64 as we do), so 1e-10
// relative holds with a wide margin for logits, loss and gradients. After
// AdamW steps, eps=1e-8 in the denominator amplifies ~1e-16 gradient
// differences for near-zero second moments, hence 1e-8 for the parameters.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>

#include "snip/model/hf.h"
#include "snip/model/llama.h"
#include "snip/io/safetensors.h"

using namespace snip;

namespace {

std::string fixture_path(const std::string& name) {
  return std::string(SNIP_BINARY_DIR) + "/fixtures/" + name;
}

torch::Tensor get(const io::SafeTensors& st, const std::string& name) {
  const io::TensorRecord* r = st.find(name);
  if (!r) throw std::runtime_error("fixture lacks tensor " + name);
  return from_record(*r);
}

double max_rel_err(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item<double>();
}

void check_against_reference(const std::string& file) {
  const std::string path = fixture_path(file);
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no fixture " << path << " (python3-torch missing?)";
  const io::SafeTensors st = io::read_safetensors(path);
  ASSERT_EQ(st.metadata.at("magic"), "snip-llama-ref");
  ASSERT_EQ(st.metadata.at("version"), "1");
  const auto hf = nlohmann::json::parse(st.metadata.at("config"));
  const auto hp = nlohmann::json::parse(st.metadata.at("adamw"));
  LlamaConfig cfg = LlamaConfig::from_hf_json(hf, path);
  LlamaForCausalLM model(cfg);
  model->to(torch::kDouble);
  // Parameters: every HF name must be in the fixture.
  io::SafeTensors params;
  for (auto& [name, p] : model->hf_parameters()) params.tensors.push_back(*st.find(name));
  load_model_from_safetensors(model, params, path);

  const torch::Tensor ids = get(st, "input_ids"), tgt = get(st, "targets");
  torch::Tensor logits = model(ids);
  torch::Tensor loss = LlamaForCausalLMImpl::loss(logits, tgt);
  EXPECT_LT(max_rel_err(logits, get(st, "logits")), 1e-10);
  EXPECT_NEAR(loss.item<double>(), get(st, "loss").item<double>(), 1e-12);
  loss.backward();
  for (auto& [name, p] : model->hf_parameters()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(p.grad().defined());
    EXPECT_LT(max_rel_err(p.grad(), get(st, "grad." + name)), 1e-9);
  }

  // N AdamW steps on the same batch, all parameters decayed (as the reference).
  torch::optim::AdamW opt(model->parameters(),
                          torch::optim::AdamWOptions(hp["lr"].get<double>())
                              .betas({hp["beta1"].get<double>(), hp["beta2"].get<double>()})
                              .eps(hp["eps"].get<double>())
                              .weight_decay(hp["weight_decay"].get<double>()));
  const torch::Tensor ref_losses = get(st, "adamw_losses");
  const int64_t steps = hp["steps"].get<int64_t>();
  ASSERT_EQ(ref_losses.numel(), steps);
  for (int64_t s = 0; s < steps; ++s) {
    opt.zero_grad();
    torch::Tensor l = LlamaForCausalLMImpl::loss(model(ids), tgt);
    EXPECT_NEAR(l.item<double>(), ref_losses[s].item<double>(), 1e-9) << "AdamW step " << s;
    l.backward();
    opt.step();
  }
  for (auto& [name, p] : model->hf_parameters()) {
    SCOPED_TRACE(name);
    EXPECT_LT(max_rel_err(p.detach(), get(st, "final." + name)), 1e-8);
  }
}

}  // namespace

TEST(Reference, UntiedLlamaMatchesPlainPyTorch) { check_against_reference("llama_ref.safetensors"); }
TEST(Reference, TiedLlamaMatchesPlainPyTorch) { check_against_reference("llama_ref_tied.safetensors"); }
