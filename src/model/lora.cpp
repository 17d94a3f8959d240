// SNIP-LoRA: adapters, the frozen packed base, PEFT files (see lora.h).
#include "snip/model/lora.h"

#include "snip/model/device.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <filesystem>
#include <cstring>
#include <limits>
#include <set>
#include <stdexcept>

#include "snip/data/data_folder.h"
#include "snip/formats/fake_quant.h"
#include "snip/io/atomic_file.h"
#include "snip/io/tensor_values.h"
#include "snip/model/hf.h"
#include "snip/model/matmul.h"
#include "snip/plan/planner.h"
#include "snip/core/error.h"

namespace snip {

namespace {

// `pattern` against the whole layer name and every suffix after a '.', as
// precision pins match (plan/planner.h pin_matches).
bool target_matches(const std::string& pattern, const std::string& name) {
  if (plan::glob_match(pattern, name)) return true;
  for (size_t i = name.find('.'); i != std::string::npos; i = name.find('.', i + 1))
    if (plan::glob_match(pattern, name.substr(i + 1))) return true;
  return false;
}

// A packed operand from a quantizer's codes and scales.
FrozenWeight::Stored stored_from(const formats::QuantizedTensor& q) {
  FrozenWeight::Stored s;
  s.rows = q.rows;
  s.cols = q.cols;
  s.bits = q.spec.element.bits;
  s.codes = q.data;
  s.block_rows = q.scales.block_rows;
  s.block_cols = q.scales.block_cols;
  s.grid_cols = q.scales.grid_cols;
  s.block_decode.reserve(q.scales.blocks.size());
  for (const auto& b : q.scales.blocks) s.block_decode.push_back(b.decode);
  const uint32_t n = q.spec.element.num_codes();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  s.lut.resize(n);
  for (uint32_t c = 0; c < n; ++c) {
    const float e = formats::decode(q.spec.element, c);
    s.lut[c] = std::isnan(e) ? nan : e;
  }
  return s;
}

// The short name of a layer ("q_proj" of "model.layers.0.self_attn.q_proj").
std::string short_name(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

void check_finite(const torch::Tensor& t, const std::string& what, const std::string& name) {
  if (!torch::isfinite(t).all().item<bool>()) fail(what, ": tensor '", name, "' holds a non-finite value");
}

}  // namespace

// ---- FrozenWeight

int64_t FrozenWeight::Stored::bytes() const {
  if (bits == 0) return plain.defined() ? plain.numel() * int64_t(plain.element_size()) : 0;
  return int64_t(codes.size()) + int64_t(block_decode.size() * sizeof(float));
}

torch::Tensor FrozenWeight::Stored::decode() const {
  if (bits == 0) return plain.to(torch::kFloat);
  // Codes and scales live on the host; the operand goes where training runs (model/device.h).
  torch::Tensor out = torch::empty({rows, cols}, torch::kFloat);
  float* o = out.data_ptr<float>();
  const uint32_t nan_bits = 0x7FC00000u;  // formats::dequantize's canonical NaN
  float nan;
  std::memcpy(&nan, &nan_bits, sizeof nan);
  // Codes as formats::pack_codes lays them out: two per byte (low nibble
  // first) for bits <= 4, one per byte for bits <= 8.
  for (int64_t r = 0; r < rows; ++r) {
    const float* drow = block_decode.data() + (r / block_rows) * grid_cols;
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      uint32_t code;
      if (bits <= 4) code = (codes[size_t(i >> 1)] >> ((i & 1) * 4)) & 0xFu;
      else code = codes[size_t(i)];
      const float e = lut[code], d = drow[c / block_cols];
      o[i] = (std::isnan(e) || std::isnan(d)) ? nan : e * d;
    }
  }
  return out.to(compute_device());
}

torch::Tensor FrozenWeight::operand(Operand op) const {
  if (op == Operand::kFpropW) return gemm_operand(fprop.decode(), gemm_dtype);
  if (op == Operand::kDgradW) {
    if (dgrad_is_fprop_t) return gemm_operand(fprop.decode().t().contiguous(), gemm_dtype);
    return gemm_operand(dgrad.decode(), gemm_dtype);
  }
  throw std::logic_error("FrozenWeight::operand: not a weight operand");
}

std::string FrozenWeight::describe() const {
  if (!quantizer) return "bf16";
  return quantizer->name() + " packed";
}

std::shared_ptr<const FrozenWeight> freeze_weight(const torch::Tensor& w, const LinearPrecision& p,
                                                  const QuantKey& key) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kFloat, "freeze_weight: expected W [OUT, IN] FP32, got ",
              w.sizes(), " ", w.scalar_type());
  auto f = std::make_shared<FrozenWeight>();
  f->quantizer = p.quantizer.get();
  f->gemm_dtype = p.gemm_dtype;
  torch::NoGradGuard ng;
  if (!p.quantizer) {
    // The GEMM reads W cast to BF16: store exactly that (2 bytes a weight).
    if (p.gemm_dtype != at::kBFloat16) return nullptr;
    f->fprop.rows = w.size(0);
    f->fprop.cols = w.size(1);
    f->fprop.plain = gemm_operand(w, at::kBFloat16).to(at::kBFloat16).contiguous();
    f->dgrad_is_fprop_t = true;
    return f;
  }
  QuantKey kf = key, kd = key;
  kf.operand = Operand::kFpropW;
  kd.operand = Operand::kDgradW;
  const torch::Tensor wc = w.contiguous();
  auto pf = p.quantizer->quantize_packed(wc, kf);
  auto pd = p.quantizer->quantize_packed(wc.t().contiguous(), kd);
  if (!pf || !pd) return nullptr;
  f->fprop = stored_from(*pf);
  f->dgrad = stored_from(*pd);
  // Square blocks (fp8's 128x128, nvfp4's 16x16 weights) give the same
  // values both ways: keep one copy.
  if (torch::equal(f->fprop.decode().t(), f->dgrad.decode())) {
    f->dgrad_is_fprop_t = true;
    f->dgrad = FrozenWeight::Stored{};
  }
  return f;
}

// ---- FrozenBase

namespace {

// Layer `l`'s FP32 weight [OUT, IN] from the base file `st` (path `path`),
// into l.weight.
void load_base_weight(QuantLinearImpl& l, const io::SafeTensors& st, const std::string& path) {
  const std::string name = l.name + ".weight";
  const io::TensorRecord* r = st.find(name);
  if (!r || r->shape != std::vector<int64_t>{l.out_features, l.in_features})
    fail("lora base ", path, ": tensor '", name, "' is missing or of another shape than the run's model (the base "
         "changed under the run?)");
  const std::vector<float> v = io::decode_to_f32(*r, path + ": tensor '" + name + "'");
  torch::Tensor t = torch::empty({l.out_features, l.in_features}, torch::kFloat);
  std::memcpy(t.data_ptr<float>(), v.data(), v.size() * sizeof(float));
  torch::NoGradGuard ng;
  l.weight.set_(t.to(compute_device()));
}

}  // namespace

void FrozenBase::materialize(const std::vector<QuantLinear>& layers) {
  bool any = false;
  for (const auto& l : layers)
    if (l->weight.numel() == 0) any = true;
  if (!any) return;
  const io::SafeTensors st = io::read_safetensors(path_);
  for (auto l : layers)
    if (l->weight.numel() == 0) load_base_weight(*l, st, path_);
}

int FrozenBase::sync(const std::vector<QuantLinear>& layers) {
  if (!pack_) return 0;  // the FP32 weights stay; the GEMMs quantize them every step, as in full training
  int changed = 0;
  for (auto l : layers) {
    if (l->frozen && l->frozen->made_for(l->precision)) continue;
    if (l->weight.numel() == 0) materialize(layers);
    QuantKey key = l->key_base;
    key.layer = l->layer_index;
    l->frozen = freeze_weight(l->weight.detach(), l->precision, key);
    ++changed;
  }
  torch::NoGradGuard ng;
  for (const auto& l : layers)
    if (l->frozen && l->weight.numel() != 0) l->weight.set_(torch::empty({0}, l->weight.options()));  // on its device
  return changed;
}

void FrozenBase::refreeze(QuantLinearImpl& l) {
  torch::NoGradGuard ng;
  if (l.weight.numel() == 0) load_base_weight(l, io::read_safetensors(path_), path_);
  QuantKey key = l.key_base;
  key.layer = l.layer_index;
  l.frozen = freeze_weight(l.weight.detach(), l.precision, key);
  if (pack_ && l.frozen) l.weight.set_(torch::empty({0}, l.weight.options()));
}

FrozenMemory FrozenBase::memory(const std::vector<QuantLinear>& layers) const {
  FrozenMemory m;
  for (auto l : layers) {
    const int64_t fp32 = 4 * l->in_features * l->out_features;
    m.fp32_bytes += fp32;
    ++m.layers;
    if (l->frozen && l->weight.numel() == 0) {
      m.stored_bytes += l->frozen->bytes();
      ++m.packed_layers;
    } else {
      m.stored_bytes += fp32 + (l->frozen ? l->frozen->bytes() : 0);
    }
  }
  return m;
}

// ---- adapters

std::vector<std::string> attach_lora(LlamaForCausalLM& model, const LoraConfig& cfg, uint64_t seed) {
  if (cfg.rank <= 0) fail("lora.rank: expected a positive rank, got ", cfg.rank);
  const auto layers = model->linear_layers();
  std::vector<bool> used(cfg.target.size(), false);
  std::vector<std::string> out;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed ^ 0x4C6F5241ull);  // "LoRA"
  for (auto l : layers) {
    bool hit = false;
    for (size_t i = 0; i < cfg.target.size(); ++i)
      if (target_matches(cfg.target[i], l->name)) used[i] = hit = true;
    if (!hit) continue;
    torch::Tensor a;
    if (cfg.init == LoraInit::kGaussian) {
      a = at::normal(0.0, 1.0 / double(cfg.rank), {cfg.rank, l->in_features}, gen, torch::kFloat);
    } else {
      // kaiming_uniform_(a = sqrt(5)) on [r, IN]: gain sqrt(2 / (1 + 5)),
      // bound gain x sqrt(3 / fan_in) = 1 / sqrt(IN).
      const double bound = 1.0 / std::sqrt(double(l->in_features));
      a = at::rand({cfg.rank, l->in_features}, gen, torch::kFloat).mul_(2 * bound).sub_(bound);
    }
    l->add_lora(a, torch::zeros({l->out_features, cfg.rank}, torch::kFloat), cfg.alpha / double(cfg.rank),
                cfg.dropout);
    out.push_back(l->name);
  }
  for (size_t i = 0; i < cfg.target.size(); ++i)
    if (!used[i])
      fail("lora.target: '", cfg.target[i], "' matches no linear layer of the model (names such as ",
           layers.empty() ? std::string("?") : layers.front()->name, ")");
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> lora_parameters(LlamaForCausalLM& model, bool with_norms) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : model->named_parameters(/*recurse=*/true)) {
    const std::string& n = p.key();
    const bool adapter = n.find(".lora_A.") != std::string::npos || n.find(".lora_B.") != std::string::npos;
    const bool norm = n.find("layernorm.") != std::string::npos || n == "model.norm.weight";
    if (adapter || (with_norms && norm)) out.emplace_back(n, p.value());
  }
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> freeze_base(LlamaForCausalLM& model, const LoraConfig& cfg) {
  const auto train = lora_parameters(model, cfg.train_norms);
  std::set<const void*> keep;
  for (const auto& [n, t] : train) keep.insert(t.unsafeGetTensorImpl());
  for (auto& p : model->parameters()) p.set_requires_grad(keep.count(p.unsafeGetTensorImpl()) > 0);
  return train;
}

nlohmann::json peft_adapter_config(LlamaForCausalLM& model, const LoraConfig& cfg, const std::string& base) {
  std::vector<std::string> adapted;
  std::map<std::string, std::pair<int, int>> kinds;  // short name -> (adapted, all)
  for (auto l : model->linear_layers()) {
    auto& k = kinds[short_name(l->name)];
    ++k.second;
    if (l->lora_rank > 0) {
      ++k.first;
      adapted.push_back(l->name);
    }
  }
  nlohmann::json targets = nlohmann::json::array();
  bool whole_kinds = true;
  for (const auto& [n, k] : kinds)
    if (k.first != 0 && k.first != k.second) whole_kinds = false;
  if (whole_kinds) {
    for (const auto& [n, k] : kinds)
      if (k.first > 0) targets.push_back(n);
  } else {
    for (const auto& n : adapted) targets.push_back(n);
  }
  nlohmann::json j = {{"peft_type", "LORA"},
                      {"task_type", "CAUSAL_LM"},
                      {"base_model_name_or_path", base},
                      {"r", cfg.rank},
                      {"lora_alpha", cfg.alpha},
                      {"lora_dropout", cfg.dropout},
                      {"target_modules", targets},
                      {"bias", "none"},
                      {"fan_in_fan_out", false},
                      {"inference_mode", true},
                      {"init_lora_weights", cfg.init == LoraInit::kGaussian ? nlohmann::json("gaussian") : nlohmann::json(true)},
                      {"use_rslora", false},
                      {"use_dora", false},
                      {"layers_to_transform", nullptr},
                      {"layers_pattern", nullptr},
                      {"rank_pattern", nlohmann::json::object()},
                      {"alpha_pattern", nlohmann::json::object()},
                      {"revision", nullptr}};
  j["modules_to_save"] = cfg.train_norms ? nlohmann::json{"input_layernorm", "post_attention_layernorm", "norm"}
                                         : nlohmann::json(nullptr);
  return j;
}

io::SafeTensors peft_adapter_tensors(LlamaForCausalLM& model, bool with_norms, at::ScalarType dtype) {
  if (dtype != at::kFloat && dtype != at::kBFloat16)
    throw std::invalid_argument("peft_adapter_tensors: dtype must be float32 or bfloat16");
  io::SafeTensors st;
  st.metadata["format"] = "pt";
  for (const auto& [n, t] : lora_parameters(model, with_norms)) {
    const torch::Tensor c = t.detach().to(dtype).contiguous();
    st.add("base_model.model." + n, dtype == at::kFloat ? io::DType::F32 : io::DType::BF16, c.sizes().vec(),
           c.data_ptr());
  }
  return st;
}

LoraConfig lora_config_from_peft_fields(const nlohmann::json& j, const std::string& what);

void export_peft(LlamaForCausalLM& model, const LoraConfig& cfg, const std::string& base, const std::string& dir,
                 bool force, at::ScalarType dtype) {
  namespace fs = std::filesystem;
  const fs::path d = fs::absolute(dir).lexically_normal();
  const bool created = prepare_export_folder(dir, force, /*adapters=*/true);
  const io::SafeTensors st = peft_adapter_tensors(model, cfg.train_norms, dtype);
  const std::string config = peft_adapter_config(model, cfg, base).dump(2) + "\n";
  try {
    io::write_safetensors((d / "adapter_model.safetensors").string(), st);
    io::write_file_atomic((d / "adapter_config.json").string(), config);
  } catch (...) {
    std::error_code ec;
    if (created) fs::remove_all(d, ec);
    throw;
  }
}

LoraConfig lora_config_from_peft(const nlohmann::json& j, const std::string& what) {
  try {
    return lora_config_from_peft_fields(j, what);
  } catch (const nlohmann::json::exception& e) {
    fail(what, ": a field of the wrong type (", e.what(), ")");
  }
}

LoraConfig lora_config_from_peft_fields(const nlohmann::json& j, const std::string& what) {
  if (!j.is_object()) fail(what, ": expected a JSON object");
  auto get = [&](const char* k) -> const nlohmann::json& {
    if (!j.contains(k)) fail(what, ": missing field '", k, "'");
    return j.at(k);
  };
  if (get("peft_type") != "LORA") fail(what, ": peft_type: expected \"LORA\", got ", get("peft_type").dump());
  if (j.value("bias", std::string("none")) != "none")
    fail(what, ": bias: expected \"none\" (snip's adapters have no bias), got ", j.at("bias").dump());
  for (const char* k : {"fan_in_fan_out", "use_rslora", "use_dora"})
    if (j.contains(k) && j.at(k).is_boolean() && j.at(k).get<bool>())
      fail(what, ": ", k, ": expected false (not implemented), got true");
  LoraConfig c;
  if (!get("r").is_number_integer() || get("r").get<int64_t>() < 1)
    fail(what, ": r: expected a positive integer, got ", get("r").dump());
  c.rank = get("r").get<int64_t>();
  if (!get("lora_alpha").is_number()) fail(what, ": lora_alpha: expected a number, got ", get("lora_alpha").dump());
  c.alpha = get("lora_alpha").get<double>();
  c.dropout = j.value("lora_dropout", 0.0);
  const nlohmann::json& tm = get("target_modules");
  if (tm.is_string()) fail(what, ": target_modules: a regular expression is not supported; expected a list");
  c.target.clear();  // not lora.target's default
  for (const auto& t : tm) c.target.push_back(t.get<std::string>());
  const nlohmann::json init = j.value("init_lora_weights", nlohmann::json(true));
  c.init = init == "gaussian" ? LoraInit::kGaussian : LoraInit::kKaiming;
  c.train_norms = j.contains("modules_to_save") && !j.at("modules_to_save").is_null() && !j.at("modules_to_save").empty();
  return c;
}

void load_adapter_tensors(LlamaForCausalLM& model, const io::SafeTensors& st, const std::string& what,
                          bool with_norms) {
  const std::string prefix = "base_model.model.";
  std::map<std::string, const io::TensorRecord*> by_name;
  for (const auto& r : st.tensors) {
    const std::string n = r.name.rfind(prefix, 0) == 0 ? r.name.substr(prefix.size()) : r.name;
    by_name[n] = &r;
  }
  torch::NoGradGuard ng;
  std::set<std::string> seen;
  for (auto& [n, t] : lora_parameters(model, with_norms)) {
    auto it = by_name.find(n);
    if (it == by_name.end()) fail(what, ": missing tensor '", prefix + n, "'");
    const io::TensorRecord& r = *it->second;
    if (r.shape != t.sizes().vec())
      fail(what, ": tensor '", r.name, "' has shape ", torch::IntArrayRef(r.shape), ", expected ", t.sizes());
    const std::vector<float> v = io::decode_to_f32(r, what + ": tensor '" + r.name + "'");
    torch::Tensor src = torch::from_blob(const_cast<float*>(v.data()), t.sizes(), torch::kFloat);
    check_finite(src, what, r.name);
    t.copy_(src);
    seen.insert(n);
  }
  for (const auto& [n, r] : by_name)
    if (!seen.count(n)) fail(what, ": unexpected tensor '", r->name, "' (not an adapter of this run's model)");
}

void merge_lora(LlamaForCausalLM& model) {
  torch::NoGradGuard ng;
  for (auto l : model->linear_layers()) {
    if (l->lora_rank == 0) continue;
    TORCH_CHECK(l->weight.numel() == l->in_features * l->out_features, "merge_lora: layer ", l->name,
                ": the base weight is not materialized");
    l->weight.add_(torch::mm(l->lora_B, l->lora_A).mul_(l->lora_scale));
    l->remove_lora();
  }
}

std::string base_checksum(const std::string& weights_path) {
  return data::sha256_hex(io::read_file(weights_path));
}

}  // namespace snip
