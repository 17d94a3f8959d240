// Hugging Face folder import/export and tensor <-> safetensors conversion.
#include "snip/model/hf.h"

#include <cstring>
#include <filesystem>
#include <variant>
#include <set>

#include "snip/config/config.h"
#include "snip/io/atomic_file.h"
#include "snip/io/json.h"
#include "snip/io/tensor_values.h"
#include "snip/core/error.h"

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
    case at::kComplexFloat: dt = io::DType::C64; break;
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
    case io::DType::C64: st = at::kComplexFloat; break;
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

namespace {
/// The FP32 values of `r` as a tensor of `shape` (decode_to_f32).
torch::Tensor decoded(const io::TensorRecord& r, const std::string& what) {
  std::vector<float> v = io::decode_to_f32(r, what);
  return torch::from_blob(v.data(), r.shape, torch::kFloat).clone();
}

/// The value of `r` for a parameter of dtype `to`: decoded to FP32 (exact,
/// or F64 rounded with its range checked) and converted. F32, F16 and BF16,
/// whose LibTorch conversion to FP32 is exact too, skip the extra copy (a
/// checkpoint's weights); an F64 record for a parameter wider than FP32 (a
/// float64 model, as the reference tests build) is converted directly,
/// without the FP32 rounding.
torch::Tensor value_for(const io::TensorRecord& r, at::ScalarType to, const std::string& what) {
  const bool exact_in_torch = r.dtype == io::DType::F32 || r.dtype == io::DType::F16 || r.dtype == io::DType::BF16;
  if (exact_in_torch || (r.dtype == io::DType::F64 && to != at::kFloat)) return from_record(r).to(to);
  return decoded(r, what).to(to);
}
}  // namespace

std::vector<std::string> load_model_from_safetensors(LlamaForCausalLM& model, const io::SafeTensors& st,
                                                     const std::string& what, std::optional<bool> file_tied) {
  torch::NoGradGuard ng;
  const bool model_tied = model->cfg.tie_word_embeddings;
  const bool tied_in_file = file_tied.value_or(model_tied);
  std::vector<std::string> notes;
  std::set<std::string> used;
  // Every tensor's shape and dtype is checked before any parameter changes.
  auto record = [&](const std::string& name, const std::vector<int64_t>& shape) -> const io::TensorRecord& {
    const io::TensorRecord* r = st.find(name);
    if (!r) fail(what, ": missing tensor '", name, "'");
    if (r->shape != shape)
      fail(what, ": tensor '", name, "' has shape ", shape_str(r->shape), ", expected ", shape_str(shape));
    if (io::f32_conversion(r->dtype) == io::F32Conversion::kNone) io::decode_to_f32(*r, what);  // throws
    used.insert(name);
    return *r;
  };
  const std::string embed = "model.embed_tokens.weight", head = "lm_head.weight";
  const io::TensorRecord* head_rec = st.find(head);
  torch::Tensor head_from_embed;  // an untied model's head, copied from a tied file's embeddings
  std::vector<std::pair<torch::Tensor, const io::TensorRecord*>> plan;  // parameter <- record
  for (auto& [name, p] : model->hf_parameters()) {
    if (name == head && !head_rec && tied_in_file) {  // an untied model, a tied file without a head
      head_from_embed = p;
      notes.push_back("lm_head.weight starts as a copy of model.embed_tokens.weight (the file ties them; this "
                      "model does not)");
      continue;
    }
    plan.emplace_back(p, &record(name, p.sizes().vec()));
  }
  if (model_tied && head_rec) {
    // The one tensor that may be present and unused: a head equal to the
    // embeddings it is tied to.
    const io::TensorRecord& e = record(embed, model->model->embed_tokens->weight.sizes().vec());
    record(head, e.shape);
    if (head_rec->dtype != e.dtype || head_rec->data != e.data) {  // bit for bit, as stored
      if (tied_in_file)
        fail(what, ": lm_head.weight differs from model.embed_tokens.weight, but the file's config ties them "
             "(tie_word_embeddings true): a contradictory file");
      fail(what, ": the file's model is untied (tie_word_embeddings false) and its lm_head.weight differs from "
           "model.embed_tokens.weight, but the model it is loaded into ties them (model.tie_word_embeddings true): "
           "its head would be dropped; set model.tie_word_embeddings = false to keep it");
    }
    notes.push_back("lm_head.weight equals model.embed_tokens.weight bit for bit: redundant with the tied "
                    "embeddings, not loaded");
  } else if (model_tied && !tied_in_file) {
    fail(what, ": missing tensor 'lm_head.weight' (the file's config unties it from the embeddings: "
         "tie_word_embeddings false)");
  }
  for (const auto& r : st.tensors)
    if (!used.count(r.name)) fail(what, ": unexpected tensor '", r.name, "' (not a parameter of this model)");
  // Only now: the copies, each value checked finite first (a NaN or Inf
  // weight would only show later as a NaN loss, naming no file).
  for (auto& [p, r] : plan) {
    const torch::Tensor v = value_for(*r, p.scalar_type(), what);
    if (!torch::isfinite(v).all().item<bool>()) {
      const int64_t i = torch::logical_not(torch::isfinite(v)).flatten().nonzero()[0][0].item<int64_t>();
      fail(what, ": tensor '", r->name, "' holds a non-finite value (", v.flatten()[i].item<double>(),
           " at flat index ", i, "): the weights are corrupt");
    }
    p.copy_(v);
  }
  if (head_from_embed.defined()) head_from_embed.copy_(model->model->embed_tokens->weight);
  return notes;
}

bool prepare_export_folder(const std::string& dir, bool force, bool adapters) {
  if (dir.empty()) fail("--out: expected a folder name, got an empty string");
  const fs::path d = fs::absolute(dir).lexically_normal();
  const fs::path name = d.filename().empty() ? d.parent_path().filename() : d.filename();
  const fs::path parent = d.filename().empty() ? d.parent_path().parent_path() : d.parent_path();
  if (fs::exists(d / "trainer_state.json") || name == "checkpoints" || parent.filename() == "checkpoints")
    fail("--out: ", dir, " is a checkpoint folder of a run; export into a folder of its own");
  if (fs::is_directory(d) && !fs::is_empty(d) && !force)
    fail("--out: ", dir, " is not empty; choose a new folder, or pass --force to replace its ",
         adapters ? "adapter files" : "config.json, model.safetensors and tokenizer files");
  // A PEFT adapter folder and a model folder never share a place: PEFT and
  // transformers would read it as one or the other.
  const std::vector<std::string> other = adapters ? std::vector<std::string>{"config.json", "model.safetensors"}
                                                  : std::vector<std::string>{"adapter_config.json",
                                                                             "adapter_model.safetensors"};
  for (const std::string& f : other)
    if (fs::exists(d / f))
      fail("--out: ", dir, " holds ", adapters ? "a model" : "LoRA adapters", " (", f, "); write the ",
           adapters ? "adapters" : "model", " into a folder of their own (PEFT would read the folder as one or the "
           "other)");
  const bool created = !fs::exists(d);
  io::ensure_writable_dir(dir);
  return created;
}

HfTokenizer HfTokenizer::of_data_folder(const data::DataFolderInfo& info) {
  return {info.tokenizer_path, info.bos_id, info.eos_id, info.bos_piece, info.eos_piece, info.unk_piece};
}

std::map<std::string, std::string> hf_tokenizer_files(const HfTokenizer& tok, int64_t max_positions) {
  nlohmann::json special = nlohmann::json::object();
  for (auto [key, piece] : {std::pair<const char*, const std::string*>{"bos_token", &tok.bos_piece},
                            {"eos_token", &tok.eos_piece}, {"unk_token", &tok.unk_piece}})
    if (!piece->empty()) special[key] = *piece;
  nlohmann::json tok_cfg = special;
  tok_cfg["tokenizer_class"] = "LlamaTokenizer";
  tok_cfg["add_bos_token"] = tok.bos_id >= 0;
  tok_cfg["add_eos_token"] = false;
  tok_cfg["model_max_length"] = max_positions;
  tok_cfg["legacy"] = true;
  tok_cfg["clean_up_tokenization_spaces"] = false;
  return {{"tokenizer.model", io::read_file(tok.model_path)},
          {"tokenizer_config.json", tok_cfg.dump(2) + "\n"},
          {"special_tokens_map.json", special.dump(2) + "\n"}};
}

void export_hf(LlamaForCausalLM& model, const std::string& dir, at::ScalarType dtype, bool force,
               const HfTokenizer* tokenizer, const std::map<std::string, std::string>& extra_files) {
  const fs::path d = fs::absolute(dir).lexically_normal();
  // The tokenizer is read before anything is written.
  const std::map<std::string, std::string> tok_files =
      tokenizer ? hf_tokenizer_files(*tokenizer, model->cfg.max_position_embeddings)
                : std::map<std::string, std::string>{};
  const bool created = prepare_export_folder(dir, force, /*adapters=*/false);
  nlohmann::json cfg = model->cfg.to_hf_json();
  cfg["torch_dtype"] = dtype == at::kBFloat16 ? "bfloat16" : "float32";
  if (tokenizer && tokenizer->bos_id >= 0) cfg["bos_token_id"] = tokenizer->bos_id;
  if (tokenizer && tokenizer->eos_id >= 0) cfg["eos_token_id"] = tokenizer->eos_id;
  try {
    io::write_safetensors((fs::path(dir) / "model.safetensors").string(), model_to_safetensors(model, dtype));
    io::write_file_atomic((fs::path(dir) / "config.json").string(), cfg.dump(2) + "\n");
    for (const auto& [name, bytes] : tok_files) io::write_file_atomic((fs::path(dir) / name).string(), bytes);
    for (const auto& [name, bytes] : extra_files) io::write_file_atomic((fs::path(dir) / name).string(), bytes);
    if (!tokenizer)  // --force over an earlier export: not another model's tokenizer beside this one
      for (const char* f : {"tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json"})
        fs::remove(fs::path(dir) / f);
  } catch (...) {
    // Nothing partial: each write is atomic, and a folder this call made
    // goes with whatever it already holds.
    std::error_code ec;
    if (created) fs::remove_all(d, ec);
    throw;
  }
}

bool is_hf_folder(const std::string& dir) {
  return !fs::exists(fs::path(dir) / "trainer_state.json") && fs::exists(fs::path(dir) / "config.json");
}

HfFolder read_hf_folder(const std::string& dir) {
  HfFolder f;
  f.dir = dir;
  f.config_path = (fs::path(dir) / "config.json").string();
  f.weights_path = (fs::path(dir) / "model.safetensors").string();
  if (!fs::is_directory(dir)) fail(dir, " is not a folder (expected a Hugging Face model folder)");
  if (!fs::exists(f.config_path))
    fail(dir, " is not a Hugging Face model folder: it has no config.json",
         fs::exists(fs::path(dir) / "trainer_state.json") ? " (a snip checkpoint: write one with `snip export`)" : "");
  // io::read_json_file: syntax, duplicate keys, depth and 1e309 (which
  // json::parse threw as out_of_range, an internal error) named by path.
  f.config_json = io::read_json_file(f.config_path, "config");
  f.config = LlamaConfig::from_hf_json(f.config_json, f.config_path);
  return f;
}

namespace {

// config.json keys --init-from accepts with no action: they do not change
// the function the weights compute (README.md, "Starting from a Hugging Face
// model"). transformers' LlamaConfig: initializer_range (init only; the
// weights are loaded), use_cache (inference KV cache), pretraining_tp
// (older transformers versions split the projections' GEMMs into that many
// slices: the same sums in another order; later ones ignore it), the token
// ids (they belong to the tokenizer; the run's is data.dir's).
// PretrainedConfig's generic keys (configuration_utils.py): the dtype the
// weights were saved in (each tensor's dtype is what is read), provenance,
// output switches, labels and generation defaults.
const char* const kNoActionFields[] = {
    "initializer_range", "use_cache", "pretraining_tp", "pad_token_id", "bos_token_id", "eos_token_id",
    "sep_token_id", "decoder_start_token_id", "torch_dtype", "dtype", "transformers_version",
    "_name_or_path", "_commit_hash", "_attn_implementation", "return_dict", "output_hidden_states",
    "output_attentions", "torchscript", "use_bfloat16", "tf_legacy_loss", "id2label", "label2id",
    "tokenizer_class", "finetuning_task", "problem_type", "prefix", "task_specific_params",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", "chunk_size_feed_forward"};

// Keys LlamaConfig::from_hf_json reads or checks.
const char* const kCheckedFields[] = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
    "hidden_act", "attention_bias", "mlp_bias", "attention_dropout", "head_dim", "rope_scaling",
    "rope_parameters", "model_type", "architectures", "quantization_config"};

/// A value as config.json and TOML both write it: 500000.0, 1e-05, 512, true.
std::string show(const OptionValue& v) {
  return std::visit([](const auto& x) { return nlohmann::json(x).dump(); }, v);
}

}  // namespace

std::vector<std::string> adopt_hf_config(const HfFolder& f, Config& cfg) {
  const LlamaConfig& m = f.config;
  const nlohmann::json& j = f.config_json;
  std::vector<std::string> notes;
  struct Field {
    const char* hf;      // config.json key
    OptionValue value;   // the file's (transformers' default when absent)
    bool in_file;
  };
  auto has = [&](const char* k) { return j.contains(k) && !j.at(k).is_null(); };
  const bool theta_in_file = has("rope_theta") || (has("rope_parameters") && j["rope_parameters"].contains("rope_theta")) ||
                             (has("rope_scaling") && j["rope_scaling"].contains("rope_theta"));
  const std::vector<Field> fields = {
      {"vocab_size", m.vocab_size, true},
      {"hidden_size", m.hidden_size, true},
      {"intermediate_size", m.intermediate_size, true},
      {"num_hidden_layers", m.num_hidden_layers, true},
      {"num_attention_heads", m.num_attention_heads, true},
      {"num_key_value_heads", m.num_key_value_heads, has("num_key_value_heads")},
      {"max_position_embeddings", m.max_position_embeddings, has("max_position_embeddings")},
      {"rms_norm_eps", m.rms_norm_eps, has("rms_norm_eps")},
      {"rope_theta", m.rope_theta, theta_in_file},
      {"tie_word_embeddings", m.tie_word_embeddings, has("tie_word_embeddings")},
  };
  const std::string where = "--init-from " + f.config_path;
  for (const Field& fd : fields) {
    const std::string key = std::string("model.") + fd.hf;
    OptionValue run;
    if (std::holds_alternative<bool>(fd.value)) run = cfg.get_bool(key);
    else if (std::holds_alternative<int64_t>(fd.value)) run = cfg.get_int(key);
    else run = cfg.get_float(key);
    if (run == fd.value) continue;
    const bool vocab_unset = key == "model.vocab_size" && std::get<int64_t>(run) == 0;
    const bool set_by_run = cfg.values().count(key) && !vocab_unset;
    const std::string file_v = show(fd.value) + (fd.in_file ? "" : " (not in the file: transformers' default)");
    if (!set_by_run) {
      cfg.set(key, fd.value, where);
      // model.vocab_size 0 means "take it from elsewhere": the file's, no
      // note (the trainer compares it with the tokenizer's).
      if (!vocab_unset)
        notes.push_back(str_cat(key, " = ", show(fd.value), " from ", f.config_path,
                                fd.in_file ? "" : " (transformers' default: the file has no " + std::string(fd.hf) + ")",
                                "; the run's default was ", show(run)));
      continue;
    }
    if (key == "model.tie_word_embeddings") {
      // Tied run, untied file: the weights decide (a head equal to the
      // embeddings is redundant, any other is refused when they are read).
      // Untied run, tied file: the head starts as a copy of the embeddings.
      continue;
    }
    fail(where, ": ", fd.hf, " ", file_v, " differs from the run's ", key, " ", show(run), "; set ", key, " = ",
         show(fd.value), " (or leave ", key, " out of the run's configuration to take the file's)");
  }
  std::string unknown;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    auto in = [&](const auto& list) {
      for (const char* x : list)
        if (k == x) return true;
      return false;
    };
    if (!in(kCheckedFields) && !in(kNoActionFields)) unknown += (unknown.empty() ? "" : ", ") + k;
  }
  if (!unknown.empty())
    notes.push_back(str_cat(f.config_path, ": fields snip does not know, ignored: ", unknown));
  return notes;
}

LlamaForCausalLM import_hf(const std::string& dir) {
  const HfFolder f = read_hf_folder(dir);
  LlamaForCausalLM m(f.config);
  load_model_from_safetensors(m, io::read_safetensors(f.weights_path), f.weights_path, f.config.tie_word_embeddings);
  return m;
}

}  // namespace snip
