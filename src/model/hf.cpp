// Hugging Face folder import/export and tensor <-> safetensors conversion.
#include "snip/model/hf.h"

#include <filesystem>
#include <set>

#include "snip/io/atomic_file.h"
#include "snip/util/error.h"

namespace snip {

namespace fs = std::filesystem;

namespace {
std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}
}  // namespace

io::TensorRecord to_record(const std::string& name, const torch::Tensor& t0) {
  const torch::Tensor t = t0.detach().to(torch::kCPU).contiguous();
  io::DType dt;
  switch (t.scalar_type()) {
    case at::kFloat: dt = io::DType::F32; break;
    case at::kDouble: dt = io::DType::F64; break;
    case at::kBFloat16: dt = io::DType::BF16; break;
    case at::kHalf: dt = io::DType::F16; break;
    case at::kLong: dt = io::DType::I64; break;
    case at::kInt: dt = io::DType::I32; break;
    default: throw std::logic_error("to_record: unsupported dtype for " + name);
  }
  io::TensorRecord r;
  r.name = name;
  r.dtype = dt;
  r.shape = t.sizes().vec();
  const auto* p = static_cast<const uint8_t*>(t.data_ptr());
  r.data.assign(p, p + t.numel() * t.element_size());
  return r;
}

torch::Tensor from_record(const io::TensorRecord& r) {
  at::ScalarType st;
  switch (r.dtype) {
    case io::DType::F32: st = at::kFloat; break;
    case io::DType::F64: st = at::kDouble; break;
    case io::DType::BF16: st = at::kBFloat16; break;
    case io::DType::F16: st = at::kHalf; break;
    case io::DType::I64: st = at::kLong; break;
    case io::DType::I32: st = at::kInt; break;
    case io::DType::I16: st = at::kShort; break;
    case io::DType::I8: st = at::kChar; break;
    case io::DType::U8: st = at::kByte; break;
    case io::DType::BOOL: st = at::kBool; break;
    default: fail("tensor '", r.name, "': dtype ", io::dtype_name(r.dtype), " is not supported here");
  }
  torch::Tensor t = torch::empty(r.shape, torch::TensorOptions().dtype(st));
  if (!r.data.empty()) std::memcpy(t.data_ptr(), r.data.data(), r.data.size());
  return t;
}

io::SafeTensors model_to_safetensors(LlamaForCausalLM& model, at::ScalarType dtype) {
  io::SafeTensors st;
  st.metadata["format"] = "pt";
  for (auto& [name, p] : model->hf_parameters()) st.tensors.push_back(to_record(name, p.detach().to(dtype)));
  return st;
}

void load_model_from_safetensors(LlamaForCausalLM& model, const io::SafeTensors& st, const std::string& what) {
  torch::NoGradGuard ng;
  std::set<std::string> expected;
  for (auto& [name, p] : model->hf_parameters()) {
    expected.insert(name);
    const io::TensorRecord* r = st.find(name);
    if (!r) fail(what, ": missing tensor '", name, "'");
    if (r->shape != p.sizes().vec())
      fail(what, ": tensor '", name, "' has shape ", shape_str(r->shape), ", expected ", shape_str(p.sizes().vec()));
    if (r->dtype != io::DType::F32 && r->dtype != io::DType::BF16 && r->dtype != io::DType::F16 &&
        r->dtype != io::DType::F64)
      fail(what, ": tensor '", name, "' has dtype ", io::dtype_name(r->dtype), ", expected F32, BF16, F16 or F64");
    p.copy_(from_record(*r).to(p.scalar_type()));
  }
  for (const auto& r : st.tensors) {
    if (expected.count(r.name)) continue;
    if (r.name == "lm_head.weight" && model->cfg.tie_word_embeddings) continue;  // HF may store tied heads
    fail(what, ": unexpected tensor '", r.name, "' (not a parameter of this model)");
  }
}

void export_hf(LlamaForCausalLM& model, const std::string& dir, at::ScalarType dtype, bool force) {
  if (dir.empty()) fail("--out: expected a folder name, got an empty string");
  const fs::path d = fs::absolute(dir).lexically_normal();
  const fs::path name = d.filename().empty() ? d.parent_path().filename() : d.filename();
  const fs::path parent = d.filename().empty() ? d.parent_path().parent_path() : d.parent_path();
  if (fs::exists(d / "trainer_state.json") || name == "checkpoints" || parent.filename() == "checkpoints")
    fail("--out: ", dir, " is a checkpoint folder of a run; export into a folder of its own");
  if (fs::is_directory(d) && !fs::is_empty(d) && !force)
    fail("--out: ", dir, " is not empty; choose a new folder, or pass --force to replace its config.json and "
         "model.safetensors");
  const bool created = !fs::exists(d);
  io::ensure_writable_dir(dir);
  nlohmann::json cfg = model->cfg.to_hf_json();
  cfg["torch_dtype"] = dtype == at::kBFloat16 ? "bfloat16" : "float32";
  try {
    io::write_safetensors((fs::path(dir) / "model.safetensors").string(), model_to_safetensors(model, dtype));
    io::write_file_atomic((fs::path(dir) / "config.json").string(), cfg.dump(2) + "\n");
  } catch (...) {
    // Nothing partial: the writes are atomic; a folder this call made goes too.
    std::error_code ec;
    if (created && fs::is_empty(d, ec)) fs::remove(d, ec);
    throw;
  }
}

LlamaForCausalLM import_hf(const std::string& dir) {
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(io::read_file(cfg_path));
  } catch (const nlohmann::json::parse_error& e) {
    fail(cfg_path, ": invalid JSON: ", e.what());
  }
  LlamaConfig c = LlamaConfig::from_hf_json(j, cfg_path);
  LlamaForCausalLM m(c);
  const std::string w = (fs::path(dir) / "model.safetensors").string();
  load_model_from_safetensors(m, io::read_safetensors(w), w);
  return m;
}

}  // namespace snip
