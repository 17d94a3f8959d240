// Writing and loading a run's checkpoints (session.h Checkpointer,
// load_training_state; the files are train/checkpoint.h's).
#include <cstring>

#include "session.h"

#include "snip/io/safetensors.h"
#include "snip/model/hf.h"
#include "snip/train/checkpoint.h"
#include "snip/core/error.h"

namespace snip {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// grad_residuals.safetensors (dist.grad_comm with error feedback): one F32
// tensor "rank<r>" [N] per rank, N = elements of the distinct parameters,
// their residuals concatenated in model order; metadata grad_comm and
// world_size. Gathered to every rank with one all-gather (collective); the
// caller on rank 0 writes the bytes. Why a gather and not a file per rank:
// the checkpoint folder is written by rank 0 as a temporary folder and one
// rename (checkpoint.h); one writer keeps that atomicity and the CRC check
// without a second protocol between ranks for a shared folder. The cost is R
// x N x 4 bytes once per checkpoint.
std::string grad_residuals_file(dist::Communicator& comm, const dist::GradComm& gc, const std::string& format) {
  std::vector<torch::Tensor> flat;
  for (const torch::Tensor& e : gc.residuals) flat.push_back(e.reshape({-1}));
  // On the host (residuals on a GPU under dist.backend = nccl): the gathered bytes are read below.
  const torch::Tensor mine = flat.empty() ? torch::zeros({0}, torch::kFloat) : torch::cat(flat).to(torch::kCPU);
  const std::vector<torch::Tensor> all = comm.allgather(mine);
  io::SafeTensors st;
  st.metadata["grad_comm"] = format;
  st.metadata["world_size"] = std::to_string(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    io::TensorRecord t;
    t.name = "rank" + std::to_string(r);
    t.dtype = io::DType::F32;
    t.shape = {all[r].numel()};
    t.data.resize(size_t(all[r].numel()) * 4);
    if (!t.data.empty()) std::memcpy(t.data.data(), all[r].data_ptr<float>(), t.data.size());
    st.tensors.push_back(std::move(t));
  }
  return io::serialize_safetensors(st);
}

// This rank's residuals from checkpoint `dir` (grad_residuals_file), shaped
// like the distinct parameters of `params`. Zeros with a warning when the
// checkpoint has none (written with fp32 communication or without error
// feedback), another grad_comm, or another world size.
std::vector<torch::Tensor> load_grad_residuals(const std::string& dir, const json& state,
                                               const std::vector<torch::Tensor>& params, int rank, int R,
                                               const std::string& format) {
  const std::vector<torch::Tensor> distinct = dist::distinct_params(params);
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : distinct) out.push_back(torch::zeros_like(p, torch::kFloat));
  const fs::path f = fs::path(dir) / "grad_residuals.safetensors";
  if (!fs::exists(f)) {
    if (rank == 0)
      spdlog::warn("--resume: {} holds no error-feedback residuals (written with dist.grad_comm = fp32 or "
                   "dist.error_feedback = false): they start from zero", dir);
    return out;
  }
  const json crc = state.value("crc32", json::object()).value("grad_residuals.safetensors", json());
  if (!crc.is_number_unsigned() || crc.get<uint64_t>() != file_crc32(f.string()))
    fail("--resume: ", f.string(), ": CRC-32 does not match trainer_state.json (corrupt)");
  const io::SafeTensors st = io::read_safetensors(f.string());
  const auto meta = [&](const char* k) { return st.metadata.count(k) ? st.metadata.at(k) : std::string(); };
  if (meta("world_size") != std::to_string(R)) {
    if (rank == 0)
      spdlog::warn("--resume: {} holds error-feedback residuals of {} ranks, this run has {}: they start from zero",
                   f.string(), meta("world_size"), R);
    return out;
  }
  if (meta("grad_comm") != format && rank == 0)
    spdlog::warn("--resume: the error-feedback residuals in {} were kept under dist.grad_comm = {}, this run uses "
                 "{}: they are carried over as they are", f.string(), meta("grad_comm"), format);
  const io::TensorRecord* t = st.find("rank" + std::to_string(rank));
  int64_t n = 0;
  for (const torch::Tensor& e : out) n += e.numel();
  if (!t || t->dtype != io::DType::F32 || t->shape != std::vector<int64_t>{n})
    fail("--resume: ", f.string(), ": expected an F32 tensor rank", rank, " of ", n, " elements (corrupt, or "
         "another model)");
  int64_t off = 0;
  for (torch::Tensor& e : out) {
    torch::Tensor h = e.is_cpu() ? e : torch::empty(e.sizes(), torch::kFloat);  // a GPU's residual via the host
    std::memcpy(h.data_ptr<float>(), t->data.data() + off * 4, size_t(e.numel()) * 4);
    if (!e.is_cpu()) e.copy_(h);
    off += e.numel();
  }
  return out;
}

}  // namespace

data::LoaderState checkpoint_position(const TrainSession& s, const json& st, const TrainerState& ts,
                                      const std::string& what) {
  return checkpoint_loader_state(st, s.B, s.accum * ts.loader_ranks(), s.loader->windows_per_epoch(), what);
}

void load_training_state(TrainSession& s, const std::string& dir, const json& st, int64_t to, bool resume) {
  const std::string what = (fs::path(dir) / "trainer_state.json").string();
  try {
    load_checkpoint_weights(dir, s.model);
  } catch (const UserError& e) {
    if (!resume) throw;
    fail("--resume: ", e.what());
  }
  load_checkpoint_optimizer(dir, st, *s.optimizer, s.model, s.tc(), to, s.shard_part);
  if (s.ctl->active() && st.contains("precision")) {
    s.ctl->restore(st["precision"], what);
    install_precision(s.model->linear_layers(), s.ctl->assignment());
  }
  if (s.keeps_residuals)
    s.gcomm.residuals = load_grad_residuals(dir, st, s.params, s.world.rank, s.R, s.dopt().grad_comm);
}

Checkpointer::Checkpointer(TrainSession& s, History& h, Evaluator& ev) : s_(s), h_(h), ev_(ev) {}

json Checkpointer::state() {
  TrainSession& s = s_;
  TrainerState st;
  st.step = s.step;
  st.tokens = s.tokens_trained;
  st.loader = s.loader->state();
  st.seed = s.seed;
  if (std::isfinite(h_.last_val)) st.val_loss = h_.last_val;
  st.elapsed_s = s.elapsed0 + s.elapsed();
  st.resumed_at = s.resumed_at;
  st.data = TrainerStateData{fs::absolute(s.data_dir).lexically_normal().string(),
                             s.data_info.tokenizer_sha256,
                             int64_t(s.data_info.vocab_size),
                             s.val_sha256,
                             tokenizer_record(s.data_info),
                             s.T};
  if (std::isfinite(s.init_val)) st.init_val_loss = s.init_val;
  if (s.ctl->active()) st.precision = s.ctl->state();
  if (s.ctl->active() && s.stages)
    st.precision["quantizers"] = s.stages->quantizer_state(st.precision["quantizers"], false);
  if (s.R > 1) st.world_size = s.R;  // resume checks it (absent = 1)
  if (s.stages) {
    st.data_parallel = s.DP;  // the loader's ranks (absent = world_size)
    st.pipeline = TrainerStatePipeline{s.S, s.DP, s.stages->pc.layout.bounds, to_string(s.stages->pc.schedule),
                                       s.accum};
  }
  if (s.zero_stage > 0) st.zero_stage = s.zero_stage;
  st.loader_base = s.loader_base;
  if (s.guard->enabled()) st.guard = s.guard->to_json();
  st.lora = s.lora.ref;
  st.rollback_record = rollback_record;
  return st.to_json();
}

void Checkpointer::write(bool scheduled, bool eval_step, const json* validated) {
  TrainSession& s = s_;
  const TrainConfig& tc = s.tc();
  Retention keep(tc.keep_checkpoints);
  keep.keep_good = tc.keep_good;
  keep.good = scheduled;
  json validation = validated ? *validated : json(nullptr);
  const bool validate_now = tc.keep_good > 0 && scheduled && !validated;
  if (validate_now) {
    if (!eval_step) s.sync_weights();
    const double v = eval_step ? h_.last_val : ev_.validation_loss();
    const double best = std::isfinite(h_.best_val) ? h_.best_val : v;  // no evaluation recorded yet: itself
    keep.good = std::isfinite(v) && v <= best * (1.0 + tc.good_margin);
    validation = {{"val_loss", std::isfinite(v) ? json(v) : json(nullptr)},
                  {"best_val_loss", std::isfinite(best) ? json(best) : json(nullptr)},
                  {"margin", tc.good_margin}, {"good", keep.good}};
    // Warned once; later ones are info lines (an overfitting run would say it
    // at every checkpoint). trainer_state.json "validation" records each.
    if (!keep.good && s.writer)
      spdlog::log(not_good_warned_ ? spdlog::level::info : spdlog::level::warn,
                  "checkpoint at step {}: validation loss {:.4f} is not within {:.3g} of the best {:.4f}: kept, "
                  "but not a rollback target (checkpoint.good_margin){}", s.step, v, tc.good_margin, best,
                  not_good_warned_ ? "" : "; later such checkpoints are info lines");
    if (!keep.good) not_good_warned_ = true;
  }
  if (validated) keep.good = validated->is_object() ? validated->value("good", true) : true;
  json st = state();
  if (!validation.is_null()) st["validation"] = validation;
  // The tokenizer travels with the model (checkpoint_tokenizer): a run
  // folder does not depend on data.dir staying put.
  std::map<std::string, std::string> extra =
      s.writer ? hf_tokenizer_files(HfTokenizer::of_data_folder(s.data_info), s.model->cfg.max_position_embeddings)
               : std::map<std::string, std::string>{};
  if (s.lora.enabled())  // PEFT's adapter_config.json: the checkpoint folder is a PEFT adapter folder too
    extra["adapter_config.json"] =
        peft_adapter_config(s.model, s.rc.lora, s.lora.ref["base"]["dir"].get<std::string>()).dump(2) + "\n";
  if (s.keeps_residuals) {  // every rank's residuals to rank 0, which writes them with the checkpoint
    const std::string bytes = grad_residuals_file(*s.comm, s.gcomm, s.dopt().grad_comm);
    if (s.writer) extra["grad_residuals.safetensors"] = bytes;
  }
  if (!(validate_now && !eval_step)) s.sync_weights();  // else synced for the validation above
  if (s.shard_part) {  // every rank writes its optimizer shard (checkpoint.h)
    const OptimizerShards sh{s.comm.get(), dist::optimizer_shard_bytes(*s.optimizer, *s.shard_part, s.world.rank),
                             s.writer ? dist::optimizer_index(*s.shard_part, s.zero_stage).dump(2) + "\n" : ""};
    last = save_checkpoint(s.opts.run_dir, s.step, s.model, *s.optimizer, st, keep, extra, &sh);
    if (s.writer && s.step != s.max_steps) write_run_report(s.opts.run_dir);
  } else if (s.writer) {
    last = save_checkpoint(s.opts.run_dir, s.step, s.model, *s.optimizer, st, keep, extra);
    if (s.step != s.max_steps) write_run_report(s.opts.run_dir);
  } else {
    last = (s.run / "checkpoints" / ("step-" + std::to_string(s.step))).string();
  }
  last_s = s.elapsed();
  if (s.exporter) s.exporter->checkpoint_written(s.step);
  if (s.comm) s.comm->barrier();  // the checkpoint exists before any rank goes on (or stops)
}

}  // namespace snip
