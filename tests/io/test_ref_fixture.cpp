// Reads the fixtures written by tools/ref_llama.py (Python's hand-written
// safetensors writer) with the C++ reader: proves the two agree on the format
// and that every tensor the model test needs is present with the right shape.
//
// Files: $SNIP_REF_FIXTURE if set, else the CTest fixture `llama_ref`
// (gen_ref_fixture writes SNIP_REF_FIXTURE_DIR/llama_ref{,_tied}.safetensors).
// Skipped when no file exists (no /usr/bin/python3 with torch).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "snip/io/atomic_file.h"
#include "snip/io/safetensors.h"

#ifndef SNIP_REF_FIXTURE_DIR
#define SNIP_REF_FIXTURE_DIR ""
#endif

namespace snip::io {
namespace {

using json = nlohmann::json;
using Shape = std::vector<int64_t>;

std::vector<std::string> fixture_files() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("SNIP_REF_FIXTURE"); env && *env) {
    out.push_back(env);
    return out;
  }
  const std::string dir = SNIP_REF_FIXTURE_DIR;
  for (const char* f : {"llama_ref.safetensors", "llama_ref_tied.safetensors"}) {
    const std::string p = dir + "/" + f;
    if (!dir.empty() && std::filesystem::exists(p)) out.push_back(p);
  }
  return out;
}

std::vector<double> f64(const TensorRecord& r) {
  std::vector<double> v(r.data.size() / 8);
  std::memcpy(v.data(), r.data.data(), r.data.size());
  return v;
}

std::vector<int64_t> i64(const TensorRecord& r) {
  std::vector<int64_t> v(r.data.size() / 8);
  std::memcpy(v.data(), r.data.data(), r.data.size());
  return v;
}

TEST(RefFixture, PythonFileReadsWithExpectedTensors) {
  const auto files = fixture_files();
  if (files.empty()) GTEST_SKIP() << "no fixture (set SNIP_REF_FIXTURE or run ctest -R gen_ref)";
  for (const std::string& path : files) {
    SCOPED_TRACE(path);
    const SafeTensors st = read_safetensors(path);
    ASSERT_EQ(st.metadata.count("magic"), 1u);
    EXPECT_EQ(st.metadata.at("magic"), "snip-llama-ref");
    EXPECT_EQ(st.metadata.at("version"), "1");
    const json cfg = json::parse(st.metadata.at("config"));
    const json adamw = json::parse(st.metadata.at("adamw"));
    const int64_t V = cfg.at("vocab_size"), D = cfg.at("hidden_size"),
                  F = cfg.at("intermediate_size"), L = cfg.at("num_hidden_layers"),
                  H = cfg.at("num_attention_heads"), KV = cfg.at("num_key_value_heads");
    const bool tied = cfg.at("tie_word_embeddings");
    EXPECT_DOUBLE_EQ(cfg.at("rms_norm_eps").get<double>(), 1e-5);
    EXPECT_DOUBLE_EQ(cfg.at("rope_theta").get<double>(), 10000.0);
    EXPECT_DOUBLE_EQ(adamw.at("lr").get<double>(), 1e-2);
    EXPECT_DOUBLE_EQ(adamw.at("beta1").get<double>(), 0.9);
    EXPECT_DOUBLE_EQ(adamw.at("beta2").get<double>(), 0.95);
    EXPECT_DOUBLE_EQ(adamw.at("eps").get<double>(), 1e-8);
    EXPECT_DOUBLE_EQ(adamw.at("weight_decay").get<double>(), 0.1);
    const int64_t steps = adamw.at("steps");
    const int64_t hd = D / H;
    ASSERT_EQ(D % H, 0);

    const TensorRecord* ids = st.find("input_ids");
    ASSERT_NE(ids, nullptr);
    ASSERT_EQ(ids->shape.size(), 2u);
    const int64_t B = ids->shape[0], T = ids->shape[1];
    EXPECT_EQ(st.metadata.at("batch"), std::to_string(B));
    EXPECT_EQ(st.metadata.at("seq"), std::to_string(T));

    // Expected contents, derived from the HF Llama layout by hand.
    std::vector<std::pair<std::string, Shape>> params = {{"model.embed_tokens.weight", {V, D}}};
    for (int64_t i = 0; i < L; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      params.push_back({p + "input_layernorm.weight", {D}});
      params.push_back({p + "self_attn.q_proj.weight", {H * hd, D}});
      params.push_back({p + "self_attn.k_proj.weight", {KV * hd, D}});
      params.push_back({p + "self_attn.v_proj.weight", {KV * hd, D}});
      params.push_back({p + "self_attn.o_proj.weight", {D, H * hd}});
      params.push_back({p + "post_attention_layernorm.weight", {D}});
      params.push_back({p + "mlp.gate_proj.weight", {F, D}});
      params.push_back({p + "mlp.up_proj.weight", {F, D}});
      params.push_back({p + "mlp.down_proj.weight", {D, F}});
    }
    params.push_back({"model.norm.weight", {D}});
    if (!tied) params.push_back({"lm_head.weight", {V, D}});

    std::vector<std::tuple<std::string, Shape, DType>> expect = {
        {"input_ids", {B, T}, DType::I64}, {"targets", {B, T}, DType::I64},
        {"logits", {B, T, V}, DType::F64}, {"loss", {}, DType::F64},
        {"adamw_losses", {steps}, DType::F64}};
    for (const auto& [n, s] : params) {
      expect.emplace_back(n, s, DType::F64);
      expect.emplace_back("grad." + n, s, DType::F64);
      expect.emplace_back("final." + n, s, DType::F64);
    }
    EXPECT_EQ(st.tensors.size(), expect.size()) << "unexpected extra or missing tensors";
    for (const auto& [n, s, d] : expect) {
      const TensorRecord* r = st.find(n);
      ASSERT_NE(r, nullptr) << "missing " << n;
      EXPECT_EQ(r->shape, s) << n;
      EXPECT_EQ(r->dtype, d) << n;
    }

    // Content decoded correctly: the stored loss is the mean cross-entropy of
    // the stored logits against the stored targets (computed here), and the
    // first AdamW loss (before any update) is that same loss.
    const auto logits = f64(*st.find("logits"));
    const auto targets = i64(*st.find("targets"));
    for (int64_t t : i64(*ids)) ASSERT_TRUE(t >= 0 && t < V);
    double ce = 0;
    for (int64_t row = 0; row < B * T; ++row) {
      const double* z = logits.data() + row * V;
      ASSERT_TRUE(targets[row] >= 0 && targets[row] < V);
      double m = z[0];
      for (int64_t j = 1; j < V; ++j) m = std::max(m, z[j]);
      double s = 0;
      for (int64_t j = 0; j < V; ++j) s += std::exp(z[j] - m);
      ce += m + std::log(s) - z[targets[row]];
    }
    ce /= static_cast<double>(B * T);
    const double loss = f64(*st.find("loss"))[0];
    EXPECT_NEAR(loss, ce, 1e-12);
    EXPECT_NEAR(f64(*st.find("adamw_losses"))[0], loss, 1e-12);
    // Random init at std 0.02 gives nearly uniform predictions: loss ~ ln V.
    EXPECT_NEAR(loss, std::log(static_cast<double>(V)), 0.5);

    // Byte for byte, the C++ writer reproduces the Python writer's file.
    EXPECT_TRUE(serialize_safetensors(st) == read_file(path))
        << "C++ serialization differs from the Python writer's bytes";
  }
}

}  // namespace
}  // namespace snip::io
