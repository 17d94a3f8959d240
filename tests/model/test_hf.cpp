// Hugging Face folder export/import: round trip, dtype conversion, and
// rejection of folders that do not describe this model.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <tuple>

#include "snip/config/config.h"
#include "snip/model/hf.h"
#include "snip/io/atomic_file.h"
#include "snip/util/error.h"
#include "micro.h"

using namespace snip;
namespace fs = std::filesystem;

namespace {

LlamaConfig small(bool tied) {
  LlamaConfig c;
  c.vocab_size = 50;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = tied;
  return c;
}

std::string tmpdir(const std::string& n) {
  const auto d = fs::temp_directory_path() / ("snip-hf-" + n + "-" + std::to_string(getpid()));
  fs::remove_all(d);
  return d.string();
}

using test::error_of;

}  // namespace

TEST(HuggingFace, ExportImportRoundTripIsExact) {
  for (bool tied : {false, true}) {
    torch::manual_seed(1);
    LlamaForCausalLM m(small(tied));
    const std::string dir = tmpdir(tied ? "tied" : "untied");
    export_hf(m, dir);
    const auto cfg = nlohmann::json::parse(io::read_file(dir + "/config.json"));
    EXPECT_EQ(cfg["architectures"][0], "LlamaForCausalLM");
    EXPECT_EQ(cfg["num_key_value_heads"], 2);
    EXPECT_EQ(cfg["tie_word_embeddings"], tied);
    LlamaForCausalLM back = import_hf(dir);
    auto a = m->hf_parameters(), b = back->hf_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].first, b[i].first);
      EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
    }
    torch::Tensor ids = torch::randint(0, 50, {2, 7}, torch::kLong);
    EXPECT_TRUE(torch::equal(m(ids), back(ids)));
    // BF16 export over the F32 one (--force): every weight rounds to BF16
    // (relative error <= 2^-9).
    export_hf(m, dir, at::kBFloat16, /*force=*/true);
    LlamaForCausalLM b16 = import_hf(dir);
    for (auto& [n, p] : m->hf_parameters()) {
      const auto q = b16->named_parameters()[n];
      EXPECT_TRUE(torch::equal(q, p.detach().to(at::kBFloat16).to(at::kFloat))) << n;
    }
    fs::remove_all(dir);
  }
}

TEST(HuggingFace, MismatchedFoldersAreRejected) {
  LlamaForCausalLM m(small(false));
  const std::string dir = tmpdir("bad");
  export_hf(m, dir);
  // Weights of another shape.
  LlamaConfig other = small(false);
  other.hidden_size = 32;
  LlamaForCausalLM o(other);
  io::write_safetensors(dir + "/model.safetensors", model_to_safetensors(o));
  EXPECT_NE(error_of([&] { import_hf(dir); }).find("has shape [50, 32], expected [50, 16]"), std::string::npos);
  // A missing tensor.
  io::SafeTensors st = model_to_safetensors(m);
  st.tensors.pop_back();
  io::write_safetensors(dir + "/model.safetensors", st);
  EXPECT_NE(error_of([&] { import_hf(dir); }).find("missing tensor 'lm_head.weight'"), std::string::npos);
  // Config problems.
  io::write_file_atomic(dir + "/config.json", "{\"vocab_size\": 50}");
  EXPECT_NE(error_of([&] { import_hf(dir); }).find("missing field 'hidden_size'"), std::string::npos);
  io::write_file_atomic(dir + "/config.json", "not json");
  EXPECT_NE(error_of([&] { import_hf(dir); }).find("invalid JSON"), std::string::npos);
  nlohmann::json j = small(false).to_hf_json();
  j["num_key_value_heads"] = 3;
  io::write_file_atomic(dir + "/config.json", j.dump());
  EXPECT_NE(error_of([&] { import_hf(dir); }).find("not divisible by num_key_value_heads 3"), std::string::npos);
  fs::remove_all(dir);
}

TEST(HuggingFace, ExportRefusesNonEmptyAndCheckpointFolders) {
  torch::manual_seed(3);
  LlamaForCausalLM m(small(true));
  const std::string root = tmpdir("refuse");
  fs::create_directories(root + "/out");
  io::write_file_atomic(root + "/out/notes.txt", "keep me\n");
  // A non-empty folder: refused, nothing written.
  EXPECT_NE(error_of([&] { export_hf(m, root + "/out"); }).find("is not empty; choose a new folder, or pass --force"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(root + "/out/model.safetensors"));
  // --force: written beside the other file, which stays.
  export_hf(m, root + "/out", at::kFloat, /*force=*/true);
  EXPECT_TRUE(fs::exists(root + "/out/model.safetensors"));
  EXPECT_EQ(io::read_file(root + "/out/notes.txt"), "keep me\n");
  // A checkpoint folder of a run, even with --force, and the checkpoints/ folder itself.
  const std::string ckpt = root + "/run/checkpoints/step-4";
  fs::create_directories(ckpt);
  io::write_file_atomic(ckpt + "/trainer_state.json", "{}\n");
  for (const std::string& d : {ckpt, ckpt + "/", root + "/run/checkpoints", root + "/run/checkpoints/step-9"}) {
    SCOPED_TRACE(d);
    EXPECT_NE(error_of([&] { export_hf(m, d, at::kFloat, true); }).find("is a checkpoint folder of a run"),
              std::string::npos);
  }
  EXPECT_FALSE(fs::exists(ckpt + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(root + "/run/checkpoints/step-9"));
  // An empty folder needs no --force.
  fs::create_directories(root + "/empty");
  export_hf(m, root + "/empty");
  EXPECT_TRUE(fs::exists(root + "/empty/config.json"));
  fs::remove_all(root);
}

TEST(HuggingFace, FailedExportLeavesNoFolderBehind) {
  torch::manual_seed(3);
  LlamaForCausalLM m(small(true));
  const std::string root = tmpdir("full");
  fs::create_directories(root);
  // Disk full, as the export sees it: no file may grow past 4 KiB
  // (model.safetensors of this model is ~20 KiB; writes fail with EFBIG).
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* old_handler = signal(SIGXFSZ, SIG_IGN);
  rlimit small_limit = old;
  small_limit.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small_limit), 0);
  const std::string m1 = error_of([&] { export_hf(m, root + "/new"); });
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);
  EXPECT_NE(m1.find("File too large"), std::string::npos) << m1;
  EXPECT_FALSE(fs::exists(root + "/new"));  // created by the export, removed with its failure
  EXPECT_TRUE(fs::is_empty(root));
  fs::remove_all(root);
}

// ---------------------------------------------------------------------------
// Issue 13, item 3: config.json fields snip does not implement are refused
// by name; both transformers 4 and 5 spellings are read.
// ---------------------------------------------------------------------------

TEST(HuggingFace, ConfigFieldsSnipDoesNotImplementAreRefused) {
  const nlohmann::json base = small(false).to_hf_json();
  // (field, value, expected message part); each is one line naming the field.
  const std::vector<std::tuple<std::string, nlohmann::json, std::string>> cases = {
      {"model_type", "mistral", "field 'model_type': expected \"llama\", got \"mistral\""},
      {"architectures", {"LlamaModel"}, "field 'architectures': expected [\"LlamaForCausalLM\"], got [\"LlamaModel\"]"},
      {"quantization_config", {{"quant_method", "fp8"}}, "field 'quantization_config': the weights are stored quantized"},
      {"hidden_act", "gelu", "field 'hidden_act': expected \"silu\", got \"gelu\""},
      {"attention_bias", true, "field 'attention_bias': true, but snip's attention projections have no bias"},
      {"attention_bias", "no", "field 'attention_bias': expected a boolean, got \"no\""},
      {"mlp_bias", true, "field 'mlp_bias': true, but snip's MLP projections have no bias"},
      {"attention_dropout", 0.1, "field 'attention_dropout': 0.1, but snip trains without dropout"},
      {"head_dim", 8, "field 'head_dim': 8, but snip's head_dim is hidden_size / num_attention_heads = 4"},
      {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}, "field 'rope_scaling': rope_type \"llama3\" is not supported"},
      {"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}, "field 'rope_scaling': rope_type \"linear\" is not supported"},
      {"rope_scaling", {{"rope_type", "default"}, {"factor", 2.0}}, "field 'rope_scaling': parameter 'factor' = 2.0 is not supported"},
      {"rope_parameters", {{"rope_type", "yarn"}, {"rope_theta", 1e6}}, "field 'rope_parameters': rope_type \"yarn\" is not supported"},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e6}}, "rope_theta 10000 and rope_parameters.rope_theta 1e+06 disagree"},
      {"rope_scaling", 2.0, "field 'rope_scaling': expected an object or null, got 2.0"},
  };
  for (const auto& [k, v, msg] : cases) {
    SCOPED_TRACE(k + " = " + v.dump());
    nlohmann::json j = base;
    j[k] = v;
    const std::string e = error_of([&] { LlamaConfig::from_hf_json(j, "c.json"); });
    EXPECT_EQ(e.rfind("c.json: ", 0), 0u) << e;
    EXPECT_NE(e.find(msg), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos);
  }
}

TEST(HuggingFace, ConfigVariantsOfTransformers4And5AreRead) {
  nlohmann::json j = small(false).to_hf_json();
  // transformers 5: rope_theta inside rope_parameters, "dtype" for
  // "torch_dtype"; optional fields null; head_dim spelled out.
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j.erase("torch_dtype");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  j["dtype"] = "bfloat16";
  j["head_dim"] = 4;
  j["mlp_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["num_key_value_heads"] = nullptr;
  j["pad_token_id"] = nullptr;
  LlamaConfig c = LlamaConfig::from_hf_json(j, "c.json");
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.num_key_value_heads, 4);  // null: = num_attention_heads (transformers' rule)
  // transformers 4 with an explicit default rope_scaling.
  j = small(false).to_hf_json();
  j["rope_scaling"] = {{"rope_type", "default"}};
  j["rope_theta"] = 250000.0;
  EXPECT_EQ(LlamaConfig::from_hf_json(j, "c.json").rope_theta, 250000.0);
  // Absent optional fields: transformers' defaults.
  j = {{"vocab_size", 50}, {"hidden_size", 16}, {"intermediate_size", 24}, {"num_hidden_layers", 2},
       {"num_attention_heads", 4}};
  c = LlamaConfig::from_hf_json(j, "c.json");
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.num_key_value_heads, 4);
}

