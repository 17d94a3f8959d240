// Checkpoints of a run (see checkpoint.h).
#include "snip/train/checkpoint.h"

#include "snip/model/lora.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <regex>
#include <sstream>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "snip/dist/zero.h"
#include "snip/hw/platform.h"
#include "snip/io/atomic_file.h"
#include "snip/io/json.h"
#include "snip/io/safetensors.h"
#include "snip/config/config.h"
#include "snip/data/data_folder.h"
#include "snip/model/hf.h"
#include "snip/train/memory.h"
#include "snip/train/optimizer.h"
#include "snip/run/trainer_state.h"
#include "snip/core/error.h"

namespace snip {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// RUN/checkpoints/good.json: {"steps": [...]} ascending, the newest
// checkpoint.keep_good good checkpoints (absent or unreadable = none).
std::vector<int64_t> read_good_steps(const fs::path& root) {
  std::vector<int64_t> out;
  const fs::path f = root / "good.json";
  if (!fs::is_regular_file(f)) return out;
  const json j = json::parse(io::read_file(f.string()), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("steps") || !j["steps"].is_array()) return out;
  for (const json& v : j["steps"])
    if (v.is_number_unsigned()) out.push_back(v.get<int64_t>());
  return out;
}

void write_good_steps(const fs::path& root, const std::vector<int64_t>& steps) {
  io::write_file_atomic((root / "good.json").string(), json{{"steps", steps}}.dump() + "\n");
}

// The rollback target markers after checkpoint `step` was written as one:
// last_good.json names it; with keep_good > 0, good.json lists it among the
// newest keep_good good ones.
void mark_good(const fs::path& root, int64_t step, int64_t keep_good) {
  io::write_file_atomic((root / "last_good.json").string(), json{{"step", step}}.dump() + "\n");
  if (keep_good > 0) {
    std::vector<int64_t> good = read_good_steps(root);
    good.erase(std::remove(good.begin(), good.end(), step), good.end());
    good.push_back(step);
    if (int64_t(good.size()) > keep_good) good.erase(good.begin(), good.end() - keep_good);
    write_good_steps(root, good);
  }
}

}  // namespace

std::vector<int64_t> good_checkpoint_steps(const std::string& run_dir) {
  return read_good_steps(fs::path(run_dir) / "checkpoints");
}

std::string save_checkpoint(const std::string& run_dir, int64_t step, LlamaForCausalLM& model,
                            torch::optim::Optimizer& opt, const json& state, const Retention& keep_rule,
                            const std::map<std::string, std::string>& extra_files, const OptimizerShards* shards) {
  const int64_t keep = keep_rule.keep;
  // Never from a non-finite state (the guard skips such updates; this is
  // the last line of defence): one pass over the parameters.
  {
    torch::NoGradGuard ng;
    for (const auto& np : model->named_parameters())
      if (!torch::isfinite(np.value()).all().item<bool>())
        fail("checkpoint at step ", step, ": parameter ", np.key(), " holds a non-finite value; not written "
             "(the last checkpoint is intact)");
  }
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const fs::path final_dir = root / ("step-" + std::to_string(step));
  const fs::path tmp = root / ("step-" + std::to_string(step) + ".tmp");
  const bool rewrite = fs::exists(final_dir);  // the guard's rollback writes its target again
  dist::Communicator* comm = shards ? shards->comm : nullptr;
  const int me = comm ? comm->rank() : 0;
  auto remove_tmp = [&] {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  };
  // ZeRO: every rank writes its optimizer shard into step-N.tmp, which rank 0
  // made first; then the ranks agree that every shard is there (all-gather of
  // one flag each) before rank 0 writes the rest and renames. A rank that
  // fails or stops before that leaves a .tmp folder, never a step-N.
  auto agree = [&](bool ok, const char* what) {
    const auto flags = comm->allgather(torch::tensor({int64_t(ok)}, torch::kLong));
    for (size_t r = 0; r < flags.size(); ++r)
      if (flags[r].item<int64_t>() == 0) {
        if (me == 0) remove_tmp();
        fail("checkpoint ", final_dir.string(), ": rank ", r, " could not ", what);
      }
  };
  if (me == 0) {
    try {
      fs::create_directories(root);
      fs::remove_all(tmp);
      fs::create_directories(tmp);
    } catch (const std::exception& e) {
      if (!comm) throw;
      spdlog::error("checkpoint {}: {}", tmp.string(), e.what());
      agree(false, "create the temporary folder");
    }
  }
  if (comm) {
    agree(true, "create the temporary folder");
    std::string err;
    try {
      io::write_file_atomic((tmp / dist::optimizer_shard_name(me)).string(), shards->shard_bytes);
    } catch (const std::exception& e) {
      err = e.what();
    }
    if (!err.empty()) spdlog::error("rank {}: {}", me, err);
    test_kill_point("shard-written@" + std::to_string(step));  // tests/cli/kill_resume.py
    try {
      agree(err.empty(), "write its optimizer shard");
    } catch (const UserError& e) {
      if (!err.empty()) fail(err);  // this rank's own cause, not the summary
      throw;
    }
    if (me != 0) return final_dir.string();
  }
  std::vector<std::string> opt_files;
  try {
    // A LoRA run (model/lora.h) keeps its trainable tensors only: the base is
    // referenced by path and SHA-256 in trainer_state.json ("lora").
    io::write_safetensors((tmp / "model.safetensors").string(),
                          has_lora(model) ? trainable_safetensors(model) : model_to_safetensors(model));
    test_kill_point(rewrite ? std::string("rewrite-writing") : "writing@" + std::to_string(step));
    if (shards) {
      io::write_file_atomic((tmp / "optimizer_index.json").string(), shards->index_json);
      opt_files.push_back("optimizer_index.json");
      for (int r = 0; r < comm->size(); ++r) opt_files.push_back(dist::optimizer_shard_name(r));
    } else {
      // Serialised in memory, then written like every other file, so that a
      // full disk is a UserError (LibTorch's own file writer aborts the
      // process when a write fails inside its destructor).
      torch::serialize::OutputArchive a;
      opt.save(a);
      std::ostringstream bytes;
      a.save_to(bytes);
      io::write_file_atomic((tmp / "optimizer.pt").string(), bytes.str());
      opt_files.push_back("optimizer.pt");
    }
    io::write_file_atomic((tmp / "config.json").string(), model->cfg.to_hf_json().dump(2) + "\n");
    for (const auto& [name, bytes] : extra_files) io::write_file_atomic((tmp / name).string(), bytes);
    json st = state;
    // Whether this checkpoint is a rollback target (last_good.json names it
    // after the rename): recorded in it too, so that a resume can mark it
    // when a kill came between the rename and the marker (tidy_checkpoints).
    st["rollback_target"] = keep_rule.good;
    std::vector<std::string> covered{"model.safetensors", "config.json"};
    covered.insert(covered.end(), opt_files.begin(), opt_files.end());
    for (const std::string& f : covered) st["crc32"][f] = file_crc32((tmp / f).string());
    // The tokenizer's copy is checked by its SHA-256 where it is used
    // (checkpoint_tokenizer), so that a damaged copy never costs the weights.
    for (const auto& [name, bytes] : extra_files)
      if (!is_checkpoint_tokenizer_file(name)) st["crc32"][name] = file_crc32((tmp / name).string());
    io::write_file_atomic((tmp / "trainer_state.json").string(), st.dump(2) + "\n");
    write_checkpoint_manifest(tmp.string(), opt_files);
    io::fsync_dir(tmp.string());
    // A rewrite of step-N (the guard's rollback writes its target again) sets
    // the old one aside before the new one takes its name: killed between the
    // two renames, the run still has step-N.old, which complete_checkpoints
    // reads as step N. Never remove the old one first: it may be the run's
    // only good checkpoint. An old one already aside with no step-N beside it
    // is that checkpoint, and stays until the new step-N is in place.
    const fs::path aside = root / ("step-" + std::to_string(step) + ".old");
    if (fs::exists(final_dir)) {
      fs::remove_all(aside);
      io::rename_atomic(final_dir.string(), aside.string());
      if (rewrite) test_kill_point("rewrite-aside");
    }
    io::rename_atomic(tmp.string(), final_dir.string());
    std::error_code ec;
    fs::remove_all(aside, ec);
  } catch (...) {
    remove_tmp();
    throw;
  }
  test_kill_point("before-marker@" + std::to_string(step));
  if (keep_rule.good) mark_good(root, step, keep_rule.keep_good);
  const std::vector<int64_t> good = read_good_steps(root);
  if (keep > 0) {  // drop the oldest complete checkpoints beyond `keep`, never a good one or the last good one
    const std::string lg = last_good_checkpoint(run_dir);
    const auto all = complete_checkpoints(root.string(), /*warn=*/false);
    for (size_t i = 0; i + keep < all.size(); ++i)
      if (all[i].first != step && all[i].second != lg &&
          std::find(good.begin(), good.end(), all[i].first) == good.end())
        fs::remove_all(all[i].second);
  }
  return final_dir.string();
}

std::vector<std::string> tidy_checkpoints(const std::string& run_dir, int64_t keep_good) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::vector<std::string> done;
  if (!fs::is_directory(root)) return done;
  // Cut short: step-N.tmp folders, a step-N.old beside a complete step-N,
  // and the temporary files of an atomic write (NAME.tmp.PID).
  const std::regex unfinished("step-[0-9]+\\.(tmp|old)"), atomic_tmp(".+\\.tmp\\.[0-9]+");
  std::vector<std::pair<int64_t, std::string>> complete = complete_checkpoints(root.string(), /*warn=*/false);
  auto in_use = [&](const fs::path& p) {
    for (const auto& [s, dir] : complete)
      if (fs::path(dir) == p) return true;
    return false;
  };
  std::vector<fs::path> doomed;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if ((e.is_directory() && std::regex_match(n, unfinished) && !in_use(e.path())) ||
        (e.is_regular_file() && std::regex_match(n, atomic_tmp)))
      doomed.push_back(e.path());
  }
  std::sort(doomed.begin(), doomed.end());
  for (const fs::path& p : doomed) {
    fs::remove_all(p);
    done.push_back("removed " + p.string() + ": a write that did not finish");
  }
  // A step-N.old standing for step N (killed between a rewrite's renames)
  // takes its name back.
  for (auto& [s, dir] : complete) {
    const fs::path d(dir), want = root / ("step-" + std::to_string(s));
    if (d == want) continue;
    io::rename_atomic(d.string(), want.string());
    done.push_back("renamed " + d.string() + " to " + want.string() + ": a rewrite that did not finish");
    dir = want.string();
  }
  // The newest checkpoint was written as a rollback target but the markers
  // do not name it (killed between its rename and last_good.json).
  if (!complete.empty()) {
    const auto& [s, dir] = complete.back();
    const json st = io::parse_json(io::read_file((fs::path(dir) / "trainer_state.json").string()),
                                   (fs::path(dir) / "trainer_state.json").string());
    const std::string lg = last_good_checkpoint(run_dir);
    const bool target = st.contains("rollback_target") && st["rollback_target"].is_boolean() &&
                        st["rollback_target"].get<bool>();
    if (target && fs::path(lg) != fs::path(dir)) {
      mark_good(root, s, keep_good);
      done.push_back("marked " + dir + " as the last good checkpoint: the run stopped before it could");
    }
  }
  return done;
}

std::vector<int64_t> discard_checkpoints_after(const std::string& run_dir, int64_t step) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::vector<int64_t> gone;
  for (const auto& [s, dir] : complete_checkpoints(root.string(), /*warn=*/false))
    if (s > step) {
      fs::remove_all(dir);
      gone.push_back(s);
    }
  std::vector<int64_t> good = read_good_steps(root);
  const size_t n = good.size();
  good.erase(std::remove_if(good.begin(), good.end(), [&](int64_t s) { return s > step; }), good.end());
  if (good.size() != n) write_good_steps(root, good);
  return gone;
}

void load_checkpoint_weights(const std::string& dir, LlamaForCausalLM& model) {
  const std::string cp = (fs::path(dir) / "config.json").string();
  if (checkpoint_model_config(dir).to_hf_json() != model->cfg.to_hf_json())
    fail("the model in ", cp, " differs from the configured model ([model] options changed)");
  const std::string wp = (fs::path(dir) / "model.safetensors").string();
  const bool lora_ckpt = fs::exists(fs::path(dir) / "adapter_config.json");
  if (lora_ckpt != has_lora(model))
    fail(wp, ": ", lora_ckpt ? "holds LoRA adapters but the run has none (lora.rank = 0)"
                              : "holds a whole model but the run trains LoRA adapters (lora.rank > 0)");
  if (lora_ckpt) {
    io::SafeTensors st = io::read_safetensors(wp);
    load_adapter_tensors(model, st, wp, st.tensors.size() > lora_parameters(model, false).size());
    return;
  }
  load_model_from_safetensors(model, io::read_safetensors(wp), wp);
}

bool has_lora(LlamaForCausalLM& model) {
  for (const auto& l : model->linear_layers())
    if (l->lora_rank > 0) return true;
  return false;
}

io::SafeTensors trainable_safetensors(LlamaForCausalLM& model) {
  io::SafeTensors st;
  st.metadata["format"] = "pt";
  for (const auto& p : model->named_parameters(/*recurse=*/true)) {
    if (!p.value().requires_grad()) continue;
    const torch::Tensor c = p.value().detach().to(torch::kCPU, torch::kFloat).contiguous();
    st.add(p.key(), io::DType::F32, c.sizes().vec(), c.data_ptr());
  }
  return st;
}

LoraCheckpoint lora_checkpoint_base(const std::string& dir, const nlohmann::json& state, const std::string& what,
                                    const std::string& moved_to) {
  LoraCheckpoint b;
  const std::string ap = (fs::path(dir) / "adapter_config.json").string();
  if (!state.contains("lora") || !state["lora"].is_object() || !state["lora"].contains("base"))
    fail(what, ": ", dir, "/trainer_state.json has no \"lora\".base (the base model's reference; corrupt?)");
  const json& ref = state["lora"]["base"];
  try {
    b.dir = ref.at("dir").get<std::string>();
    b.weights = ref.at("weights").get<std::string>();
    b.sha256 = ref.at("sha256").get<std::string>();
  } catch (const json::exception&) {
    fail(what, ": ", dir, "/trainer_state.json: lora.base: expected dir, weights and sha256 strings (corrupt)");
  }
  b.config = lora_config_from_peft(io::parse_json(io::read_file(ap), ap), ap);
  if (!moved_to.empty()) {
    b.dir = fs::absolute(moved_to).lexically_normal().string();
    b.weights = (fs::path(b.dir) / "model.safetensors").string();
  }
  if (!fs::is_regular_file(b.weights))
    fail(what, ": the base model ", b.weights, " of ", dir, " is missing (the adapters are trained on it; moved? "
         "resume with --init-from NEW_FOLDER: its SHA-256 must be the recorded one)");
  const std::string now = base_checksum(b.weights);
  if (now != b.sha256)
    fail(what, ": the base model ", b.weights, (moved_to.empty() ? " changed since the run started" : " is not the "
         "base the run started from"), " (SHA-256 ", now.substr(0, 12),
         "..., the adapters were trained on ", b.sha256.substr(0, 12), "...): refusing to use adapters on "
         "other weights; restore that file");
  return b;
}

void load_optimizer_state(torch::optim::Optimizer& opt, const std::string& bytes, const std::string& what,
                          int64_t step) {
  // The run's configured hyper-parameters win over the file's (the archive
  // carries each group's options; lr is set every step anyway).
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> configured;
  std::vector<size_t> group_sizes;
  for (auto& g : opt.param_groups()) {
    configured.push_back(g.options().clone());
    group_sizes.push_back(g.params().size());
  }
  try {
    std::istringstream is(bytes);
    torch::serialize::InputArchive a;
    // AdamW's moments onto the parameters' device: a run resumes across CPU and GPU.
    const auto& ps = opt.param_groups().front().params();
    a.load_from(is, ps.empty() ? std::optional<torch::Device>() : ps.front().device());
    opt.load(a);
  } catch (const c10::Error& e) {
    fail("checkpoint ", what, ": cannot be loaded: ", e.what_without_backtrace());
  } catch (const std::exception& e) {  // std::out_of_range and kin from a damaged archive
    fail("checkpoint ", what, ": cannot be loaded (corrupt archive: ", e.what(), ")");
  }
  if (opt.param_groups().size() != configured.size())
    fail("checkpoint ", what, ": ", opt.param_groups().size(), " parameter groups, the model's optimizer has ",
         configured.size());
  for (size_t gi = 0; gi < configured.size(); ++gi) {
    auto& g = opt.param_groups()[gi];
    if (g.params().size() != group_sizes[gi])
      fail("checkpoint ", what, ": parameter group ", gi, " holds ", g.params().size(), " tensors, the model's ",
           group_sizes[gi]);
    g.set_options(std::move(configured[gi]));
    // Each parameter's AdamW state must fit it: the moments shaped and typed
    // like the parameter, finite, exp_avg_sq >= 0, and step in [1, step].
    for (size_t pi = 0; pi < g.params().size(); ++pi) {
      const torch::Tensor& p = g.params()[pi];
      const auto it = opt.state().find(p.unsafeGetTensorImpl());
      if (it == opt.state().end()) continue;  // never stepped (no gradient yet)
      const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get());
      if (!s) continue;  // another optimizer: only AdamW's state is checked
      const std::string where = str_cat("checkpoint ", what, ": parameter group ", gi, " tensor ", pi, " (shape ",
                                        p.sizes(), "): ");
      if (s->step() < 1 || s->step() > step)
        fail(where, "AdamW step ", s->step(), " is outside [1, ", step, "] (corrupt)");
      for (const auto& [name, t] : {std::pair<const char*, torch::Tensor>{"exp_avg", s->exp_avg()},
                                    {"exp_avg_sq", s->exp_avg_sq()}}) {
        if (!t.defined() || t.sizes() != p.sizes() || t.scalar_type() != p.scalar_type())
          fail(where, name, " has shape ", t.defined() ? t.sizes() : c10::IntArrayRef{}, " and dtype ",
               t.defined() ? c10::toString(t.scalar_type()) : "none", ", expected the parameter's (corrupt)");
        if (!torch::isfinite(t).all().item<bool>()) fail(where, name, " holds non-finite values (corrupt)");
      }
      if ((s->exp_avg_sq() < 0).any().item<bool>()) fail(where, "exp_avg_sq holds negative values (corrupt)");
    }
  }
}

void load_checkpoint_optimizer(const std::string& dir, const json& state, torch::optim::AdamW& opt,
                               LlamaForCausalLM& model, const TrainConfig& tc, int64_t step,
                               const dist::ZeroPartition* part) {
  const std::vector<std::string> files = checkpoint_optimizer_files(dir);
  if (files.front() == "optimizer.pt") {
    const std::string op = (fs::path(dir) / "optimizer.pt").string();
    if (!part) return load_optimizer_state(opt, io::read_file(op), op, step);
    // Re-shard: the whole archive into a full AdamW, then this rank's share by parameter.
    auto full = make_optimizer(model, tc);
    load_optimizer_state(*full, io::read_file(op), op, step);
    dist::copy_adam_state(*full, opt, *part);
    return;
  }
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  for (const auto& np : model->named_parameters()) {
    names.push_back(np.key());
    params.push_back(np.value());
  }
  const dist::ZeroPartition all = part ? *part : dist::zero_partition(names, params, 1);
  dist::load_optimizer_shards(dir, state.value("crc32", json::object()), opt, all, step);
}

LlamaForCausalLM load_checkpoint_model(const std::string& dir) {
  const json st = verify_checkpoint(dir);
  const LlamaConfig cfg = checkpoint_model_config(dir);
  check_memory(inference_memory(cfg, 0, 0), hw::available_memory_bytes(),
               "checkpoint " + (fs::path(dir) / "config.json").string());
  LlamaForCausalLM m(cfg);
  if (fs::exists(fs::path(dir) / "adapter_config.json")) {  // LoRA: base from its reference, then the adapters
    const LoraCheckpoint b = lora_checkpoint_base(dir, st, "checkpoint " + dir);
    const HfFolder base = read_hf_folder(b.dir);
    load_model_from_safetensors(m, io::read_safetensors(b.weights), b.weights, base.config.tie_word_embeddings);
    attach_lora(m, b.config, 0);
    freeze_base(m, b.config);
  }
  load_checkpoint_weights(dir, m);
  return m;
}

json tokenizer_record(const data::DataFolderInfo& info) {
  return {{"bos_id", info.bos_id}, {"eos_id", info.eos_id}, {"bos_piece", info.bos_piece},
          {"eos_piece", info.eos_piece}, {"unk_piece", info.unk_piece}};
}

namespace {

// The config.toml of the run checkpoint `dir` sits in (RUN/checkpoints/step-N),
// for what checkpoints of earlier versions do not record; none when the
// checkpoint is not in its run.
std::optional<Config> checkpoint_run_config(const std::string& dir) {
  const fs::path run_cfg = fs::path(dir).parent_path().parent_path() / "config.toml";
  if (!fs::is_regular_file(run_cfg)) return std::nullopt;
  Config rc;
  rc.load_toml_file(run_cfg.string());
  return rc;
}

}  // namespace

int64_t checkpoint_seq_len(const std::string& dir, const json& state) {
  const TrainerState ts = TrainerState::from_json(state, (fs::path(dir) / "trainer_state.json").string());
  if (ts.data && ts.data->seq_len) return *ts.data->seq_len;
  const std::optional<Config> rc = checkpoint_run_config(dir);
  return rc ? rc->get_int("train.seq_len") : -1;
}

bool is_checkpoint_tokenizer_file(const std::string& name) {
  return name == "tokenizer.model" || name == "tokenizer_config.json" || name == "special_tokens_map.json";
}

HfTokenizer checkpoint_tokenizer(const std::string& dir, const json& state) {
  const std::string want = checkpoint_tokenizer_sha256(state);
  const fs::path own = fs::path(dir) / "tokenizer.model";
  std::string own_problem;  // why the checkpoint's own copy is not used ("" = there is none)
  if (fs::is_regular_file(own)) {
    // The SHA-256 ties the copy to the data the model was trained on.
    std::string bytes;
    try {
      bytes = io::read_file(own.string());
    } catch (const UserError& e) {
      own_problem = e.what();
    }
    if (own_problem.empty() && !want.empty() && data::sha256_hex(bytes) != want)
      own_problem = str_cat(own.string(), " is not the tokenizer the model was trained with (SHA-256 ",
                            want.substr(0, 12), "... in trainer_state.json): damaged or replaced");
  }
  if (fs::is_regular_file(own) && own_problem.empty()) {
    const json t = state.contains("data") ? state["data"].value("tokenizer", json::object()) : json::object();
    auto id = [&](const char* k) { return t.contains(k) && t[k].is_number_integer() ? t[k].get<int64_t>() : -1; };
    auto piece = [&](const char* k) { return t.contains(k) && t[k].is_string() ? t[k].get<std::string>() : ""; };
    return {own.string(), id("bos_id"), id("eos_id"), piece("bos_piece"), piece("eos_piece"), piece("unk_piece")};
  }
  const std::string older = own_problem.empty() ? "holds no tokenizer.model (written by an older snip)"
                                                : "has an unusable tokenizer.model (" + own_problem + ")";
  std::string data_dir = checkpoint_data_dir(state);
  if (data_dir.empty())
    if (const std::optional<Config> rc = checkpoint_run_config(dir)) data_dir = rc->get_string("data.dir");
  if (data_dir.empty()) fail("checkpoint ", dir, " ", older, " and does not name its data folder");
  data::DataFolderInfo info;
  try {
    info = data::verify_data_folder(data_dir, "data folder");
  } catch (const UserError& e) {
    fail("checkpoint ", dir, " ", older, ", and the data folder it names is not usable: ", e.what());
  }
  if (!want.empty() && want != info.tokenizer_sha256)
    fail("checkpoint ", dir, " ", older, ", and ", info.tokenizer_path,
         " is no longer the tokenizer the model was trained with");
  if (!own_problem.empty()) spdlog::warn("checkpoint {}: {}; using {} (the same SHA-256)", dir, own_problem, info.tokenizer_path);
  return HfTokenizer::of_data_folder(info);
}

}  // namespace snip
