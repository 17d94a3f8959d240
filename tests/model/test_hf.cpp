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
#include "snip/core/error.h"
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
  EXPECT_NE(error_of([&] { import_hf(dir); }).find("expected valid config JSON, got a syntax error"), std::string::npos);
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
// Every float dtype of the format loads with its exact value; everything else,
// and every tensor nothing uses, is refused; config.json's fields are honoured,
// equal or refused.
// ---------------------------------------------------------------------------

namespace {

/// model_to_safetensors(m) with `name` replaced by a tensor of `dtype`.
io::SafeTensors with_tensor(LlamaForCausalLM& m, const std::string& name, io::DType dtype,
                            const std::vector<int64_t>& shape, const std::vector<uint8_t>& bytes) {
  io::SafeTensors st = model_to_safetensors(m);
  for (auto& r : st.tensors)
    if (r.name == name) {
      r.dtype = dtype;
      r.shape = shape;
      r.data = bytes;
    }
  return st;
}

/// `n` copies of `v`, concatenated.
template <typename T>
std::vector<T> repeat(const std::vector<T>& v, int n) {
  std::vector<T> out;
  for (int i = 0; i < n; ++i) out.insert(out.end(), v.begin(), v.end());
  return out;
}

/// A folder with config.json = `cfg` and model.safetensors = `st`.
std::string folder(const std::string& name, const nlohmann::json& cfg, const io::SafeTensors& st) {
  const std::string dir = tmpdir(name);
  fs::create_directories(dir);
  io::write_file_atomic(dir + "/config.json", cfg.dump());
  io::write_safetensors(dir + "/model.safetensors", st);
  return dir;
}

std::vector<float> values(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

}  // namespace

TEST(HuggingFace, ImportDecodesEveryFloatDTypeExactly) {
  // model.norm.weight [16] stored in each float dtype; the expected values
  // are the formats' hand tables (tests/io/test_tensor_values.cpp derives
  // them code by code), four codes repeated four times.
  struct Case { io::DType d; std::vector<uint8_t> bytes; std::vector<float> want; };
  const std::vector<Case> cases = {
      {io::DType::F8_E4M3, repeat<uint8_t>({0x38, 0x7E, 0x01, 0xC0}, 4), {1.0f, 448.0f, 0.001953125f, -2.0f}},
      {io::DType::F8_E5M2, repeat<uint8_t>({0x3C, 0x7B, 0x01, 0xC0}, 4), {1.0f, 57344.0f, 1.52587890625e-05f, -2.0f}},
      {io::DType::F8_E4M3FNUZ, repeat<uint8_t>({0x40, 0x7F, 0x01, 0xC8}, 4), {1.0f, 240.0f, 0.0009765625f, -2.0f}},
      {io::DType::F8_E5M2FNUZ, repeat<uint8_t>({0x40, 0x7F, 0x01, 0xC4}, 4), {1.0f, 57344.0f, 7.62939453125e-06f, -2.0f}},
      {io::DType::F8_E8M0, repeat<uint8_t>({0x7F, 0x80, 0x00, 0xFE}, 4), {1.0f, 2.0f, 5.877471754111438e-39f, 1.7014118346046923e38f}},
      {io::DType::F4, repeat<uint8_t>({0x72, 0xA1}, 4), {1.0f, 6.0f, 0.5f, -1.0f}},
      {io::DType::F16, repeat<uint8_t>({0x00, 0x3C, 0x00, 0xC0, 0xFF, 0x7B, 0x01, 0x00}, 4), {1.0f, -2.0f, 65504.0f, 5.960464477539063e-08f}},
      {io::DType::BF16, repeat<uint8_t>({0x80, 0x3F, 0x7F, 0x7F, 0x01, 0x00, 0x00, 0xC0}, 4), {1.0f, 3.3895313892515355e38f, 9.183549615799121e-41f, -2.0f}},
  };
  LlamaForCausalLM m(small(true));
  for (const Case& c : cases) {
    SCOPED_TRACE(io::dtype_name(c.d));
    const std::string dir = folder("dtype", small(true).to_hf_json(), with_tensor(m, "model.norm.weight", c.d, {16}, c.bytes));
    LlamaForCausalLM back = import_hf(dir);
    EXPECT_EQ(values(back->model->norm->weight), repeat(c.want, 4));
    fs::remove_all(dir);
  }
  // F64: rounded to the nearest FP32, ties to even (1 + 2^-24 -> 1; 1/3 ->
  // 0x3eaaaaab), 1e-50 -> +0.
  const std::vector<double> d = repeat<double>({1.0 + std::ldexp(1.0, -24), 1.0 / 3.0, 1e-50, -3.0}, 4);
  std::vector<uint8_t> b(d.size() * 8);
  std::memcpy(b.data(), d.data(), b.size());
  const std::string dir = folder("f64", small(true).to_hf_json(), with_tensor(m, "model.norm.weight", io::DType::F64, {16}, b));
  EXPECT_EQ(values(import_hf(dir)->model->norm->weight), repeat<float>({1.0f, 0.3333333432674408f, 0.0f, -3.0f}, 4));
  fs::remove_all(dir);
}

TEST(HuggingFace, ImportRefusesWhatIsNotARealFloatAndLeavesTheModelUnchanged) {
  torch::manual_seed(5);
  LlamaForCausalLM m(small(true));
  struct Case { io::DType d; size_t bytes; std::string msg; };
  const std::vector<Case> cases = {
      {io::DType::I64, 16 * 8, "tensor 'model.norm.weight': I64 is not floating point"},
      {io::DType::I8, 16, "tensor 'model.norm.weight': I8 is not floating point"},
      {io::DType::U16, 32, "tensor 'model.norm.weight': U16 is not floating point"},
      {io::DType::BOOL, 16, "tensor 'model.norm.weight': BOOL is not floating point"},
      {io::DType::C64, 16 * 8, "tensor 'model.norm.weight': C64 is complex"},
      {io::DType::F6_E2M3, 12, "tensor 'model.norm.weight': F6_E2M3 is not decoded"},
      {io::DType::F6_E3M2, 12, "tensor 'model.norm.weight': F6_E3M2 is not decoded"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(io::dtype_name(c.d));
    const io::SafeTensors st = with_tensor(m, "model.norm.weight", c.d, {16}, std::vector<uint8_t>(c.bytes, 1));
    LlamaForCausalLM target(small(true));
    const auto before = values(target->model->embed_tokens->weight);
    const std::string e = error_of([&] { load_model_from_safetensors(target, st, "w.safetensors"); });
    EXPECT_EQ(e.rfind("w.safetensors: " + c.msg, 0), 0u) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos);
    EXPECT_EQ(values(target->model->embed_tokens->weight), before);  // nothing copied before the refusal
  }
}

TEST(HuggingFace, TensorsNothingUsesAreRefused) {
  LlamaForCausalLM m(small(false));
  // An FP8 checkpoint's scales, an old RoPE buffer: present and unused.
  for (const std::string extra : {"model.layers.0.mlp.gate_proj.weight_scale_inv",
                                  "model.layers.0.self_attn.rotary_emb.inv_freq"}) {
    io::SafeTensors st = model_to_safetensors(m);
    const float one = 1.0f;
    st.add(extra, io::DType::F32, {1}, &one);
    LlamaForCausalLM target(small(false));
    EXPECT_EQ(error_of([&] { load_model_from_safetensors(target, st, "w"); }),
              "w: unexpected tensor '" + extra + "' (not a parameter of this model)");
  }
}

TEST(HuggingFace, TiedHeadIsRedundantOnlyWhenEqualToTheEmbeddings) {
  torch::manual_seed(7);
  LlamaForCausalLM untied(small(false));
  io::SafeTensors st = model_to_safetensors(untied);  // has lm_head.weight, != embeddings
  auto embed_bytes = st.find("model.embed_tokens.weight")->data;
  // A tied model from a file whose untied head differs: refused, naming the field.
  {
    LlamaForCausalLM tied(small(true));
    const std::string e = error_of([&] { load_model_from_safetensors(tied, st, "w", /*file_tied=*/false); });
    EXPECT_NE(e.find("tie_word_embeddings false"), std::string::npos) << e;
    EXPECT_NE(e.find("its head would be dropped; set model.tie_word_embeddings = false"), std::string::npos) << e;
  }
  // The same file saying it is tied: a contradictory file.
  {
    LlamaForCausalLM tied(small(true));
    EXPECT_NE(error_of([&] { load_model_from_safetensors(tied, st, "w", true); })
                  .find("lm_head.weight differs from model.embed_tokens.weight, but the file's config ties them"),
              std::string::npos);
  }
  // A head equal to the embeddings bit for bit: redundant, a note.
  io::SafeTensors same = st;
  for (auto& r : same.tensors)
    if (r.name == "lm_head.weight") r.data = embed_bytes;
  for (bool file_tied : {false, true}) {
    LlamaForCausalLM tied(small(true));
    const auto notes = load_model_from_safetensors(tied, same, "w", file_tied);
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_NE(notes[0].find("lm_head.weight equals model.embed_tokens.weight bit for bit"), std::string::npos);
    EXPECT_TRUE(torch::equal(tied->model->embed_tokens->weight, untied->model->embed_tokens->weight));
  }
  // One bit off (the sign of one element) is a different head.
  io::SafeTensors off = same;
  for (auto& r : off.tensors)
    if (r.name == "lm_head.weight") r.data[3] ^= 0x80;
  LlamaForCausalLM tied(small(true));
  EXPECT_NE(error_of([&] { load_model_from_safetensors(tied, off, "w", false); }).find("its head would be dropped"),
            std::string::npos);
  // An untied file without its head: missing, even for a tied model.
  io::SafeTensors headless = st;
  headless.tensors.erase(std::remove_if(headless.tensors.begin(), headless.tensors.end(),
                                        [](const io::TensorRecord& r) { return r.name == "lm_head.weight"; }),
                         headless.tensors.end());
  EXPECT_NE(error_of([&] { load_model_from_safetensors(tied, headless, "w", false); }).find("missing tensor 'lm_head.weight'"),
            std::string::npos);
  // An untied model from a tied file (no head): the head starts as the embeddings.
  LlamaForCausalLM target(small(false));
  const auto notes = load_model_from_safetensors(target, headless, "w", /*file_tied=*/true);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("lm_head.weight starts as a copy of model.embed_tokens.weight"), std::string::npos);
  EXPECT_TRUE(torch::equal(target->lm_head->weight, untied->model->embed_tokens->weight));
  EXPECT_FALSE(target->lm_head->weight.is_same(target->model->embed_tokens->weight));  // a copy, not shared
}

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

namespace {
/// An HfFolder in memory for `j` (no files).
HfFolder hf_folder(const nlohmann::json& j) {
  HfFolder f;
  f.dir = "D";
  f.config_path = "D/config.json";
  f.weights_path = "D/model.safetensors";
  f.config_json = j;
  f.config = LlamaConfig::from_hf_json(j, f.config_path);
  return f;
}
/// The HF config of the run below: every [model] option equal to the run's.
nlohmann::json matching() {
  LlamaConfig c = small(true);
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  return c.to_hf_json();
}
const char* const kRun = R"([model]
vocab_size = 50
hidden_size = 16
intermediate_size = 24
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
max_position_embeddings = 32
rms_norm_eps = 1e-5
rope_theta = 10000.0
tie_word_embeddings = true
)";
}  // namespace

// rope_theta 500000 in the file was trained as 10000.
TEST(HuggingFace, InitFromTakesFieldsTheRunLeavesUnset) {
  nlohmann::json j = matching();
  j["rope_theta"] = 500000.0;
  j["rms_norm_eps"] = 1e-6;
  j["max_position_embeddings"] = 64;
  Config cfg;  // the run sets nothing: every [model] option is a default
  cfg.load_toml_string("[model]\nhidden_size = 16\nintermediate_size = 24\nnum_hidden_layers = 2\n"
                       "num_attention_heads = 4\nnum_key_value_heads = 2\n", "run.toml");
  const auto notes = adopt_hf_config(hf_folder(j), cfg);
  EXPECT_EQ(cfg.get_float("model.rope_theta"), 500000.0);
  EXPECT_EQ(cfg.get_float("model.rms_norm_eps"), 1e-6);
  EXPECT_EQ(cfg.get_int("model.max_position_embeddings"), 64);
  EXPECT_EQ(cfg.get_int("model.vocab_size"), 50);
  EXPECT_TRUE(cfg.get_bool("model.tie_word_embeddings"));  // equal: nothing to say
  const std::vector<std::string> want = {
      "model.max_position_embeddings = 64 from D/config.json; the run's default was 2048",
      "model.rms_norm_eps = 1e-06 from D/config.json; the run's default was 1e-05",
      "model.rope_theta = 500000.0 from D/config.json; the run's default was 10000.0",
  };
  EXPECT_EQ(notes, want);
  // Shape fields the run leaves unset are taken too.
  Config bare;
  bare.set("train.seq_len", int64_t{16}, "test");  // within the file's max_position_embeddings 32
  adopt_hf_config(hf_folder(matching()), bare);
  EXPECT_EQ(bare.get_int("model.hidden_size"), 16);
  EXPECT_EQ(bare.get_int("model.num_key_value_heads"), 2);
  EXPECT_NO_THROW(RunConfig::from(bare));
}

TEST(HuggingFace, InitFromRefusesAFieldTheRunSetsOtherwise) {
  // (field, file value, expected one-line message)
  const std::vector<std::tuple<std::string, nlohmann::json, std::string>> cases = {
      {"rope_theta", 500000.0,
       "--init-from D/config.json: rope_theta 500000.0 differs from the run's model.rope_theta 10000.0; "
       "set model.rope_theta = 500000.0 (or leave model.rope_theta out of the run's configuration to take the "
       "file's)"},
      {"rms_norm_eps", 1e-6, "rms_norm_eps 1e-06 differs from the run's model.rms_norm_eps 1e-05"},
      {"vocab_size", 64, "vocab_size 64 differs from the run's model.vocab_size 50"},
      {"hidden_size", 32, "hidden_size 32 differs from the run's model.hidden_size 16"},
      {"intermediate_size", 48, "intermediate_size 48 differs from the run's model.intermediate_size 24"},
      {"num_hidden_layers", 3, "num_hidden_layers 3 differs from the run's model.num_hidden_layers 2"},
      {"num_attention_heads", 2, "num_attention_heads 2 differs from the run's model.num_attention_heads 4"},
      {"num_key_value_heads", 4, "num_key_value_heads 4 differs from the run's model.num_key_value_heads 2"},
      {"max_position_embeddings", 4096,
       "max_position_embeddings 4096 differs from the run's model.max_position_embeddings 32"},
      // rope_theta inside transformers 5's rope_parameters, the same.
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 500000.0}},
       "rope_theta 500000.0 differs from the run's model.rope_theta 10000.0"},
  };
  for (const auto& [k, v, msg] : cases) {
    SCOPED_TRACE(k);
    nlohmann::json j = matching();
    if (k == "rope_parameters") j.erase("rope_theta");
    j[k] = v;
    Config cfg;
    cfg.load_toml_string(kRun, "run.toml");
    const std::string e = error_of([&] { adopt_hf_config(hf_folder(j), cfg); });
    EXPECT_NE(e.find(msg), std::string::npos) << e;
    EXPECT_EQ(e.rfind("--init-from D/config.json: ", 0), 0u) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos);
  }
  // A field the file leaves out stands for transformers' default, and says so.
  nlohmann::json j = matching();
  j.erase("rms_norm_eps");
  Config cfg;
  cfg.load_toml_string(kRun, "run.toml");
  EXPECT_NE(error_of([&] { adopt_hf_config(hf_folder(j), cfg); })
                .find("rms_norm_eps 1e-06 (not in the file: transformers' default) differs from the run's "
                      "model.rms_norm_eps 1e-05"),
            std::string::npos);
  // Equal everywhere: no change, no note.
  Config same;
  same.load_toml_string(kRun, "run.toml");
  EXPECT_TRUE(adopt_hf_config(hf_folder(matching()), same).empty());
}

TEST(HuggingFace, InitFromTieAndOtherFields) {
  // A tied run over an untied file is left to the weights (the head must
  // equal the embeddings); an untied run over a tied file keeps its choice.
  nlohmann::json untied = matching();
  untied["tie_word_embeddings"] = false;
  Config cfg;
  cfg.load_toml_string(kRun, "run.toml");
  EXPECT_TRUE(adopt_hf_config(hf_folder(untied), cfg).empty());
  EXPECT_TRUE(cfg.get_bool("model.tie_word_embeddings"));
  // Unset in the run: the file's untied head is taken.
  Config unset;
  std::string run_untouched = kRun;
  run_untouched.erase(run_untouched.find("tie_word_embeddings"));
  unset.load_toml_string(run_untouched, "run.toml");
  EXPECT_EQ(adopt_hf_config(hf_folder(untied), unset).at(0),
            "model.tie_word_embeddings = false from D/config.json; the run's default was true");
  EXPECT_FALSE(unset.get_bool("model.tie_word_embeddings"));
  // Fields with no effect on the weights' function pass silently; keys snip
  // does not know are named in one note.
  nlohmann::json j = matching();
  j["initializer_range"] = 0.5;
  j["use_cache"] = false;
  j["pretraining_tp"] = 2;
  j["bos_token_id"] = 128000;
  j["eos_token_id"] = {128001, 128009};
  j["transformers_version"] = "4.45.0";
  j["torch_dtype"] = "bfloat16";
  j["_name_or_path"] = "meta-llama/Llama-3.2-1B";
  j["sliding_window"] = 4096;
  j["my_field"] = 1;
  Config run;
  run.load_toml_string(kRun, "run.toml");
  EXPECT_EQ(adopt_hf_config(hf_folder(j), run),
            std::vector<std::string>{"D/config.json: fields snip does not know, ignored: my_field, sliding_window"});
}
