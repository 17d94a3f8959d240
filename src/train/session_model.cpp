// Opening a run (session.h): the data folder and the model with its
// optimizer, partitions, controller and guard.
#include <thread>

#include "session.h"

#include "snip/data/data_folder.h"
#include "snip/dist/broadcast_text.h"
#include "snip/dist/pipeline.h"
#include "snip/hw/platform.h"
#include "snip/io/atomic_file.h"
#include "snip/io/json.h"
#include "snip/io/safetensors.h"
#include "snip/formats/fake_quant_cuda.h"
#include "snip/model/blas.h"
#include "snip/model/device.h"
#include "snip/model/matmul.h"
#include "snip/method/gemm_calibrate.h"
#include "snip/train/memory.h"
#include "snip/train/optimizer.h"
#include "snip/train/checkpoint.h"
#include "snip/core/error.h"

namespace snip {

namespace fs = std::filesystem;
using json = nlohmann::json;

// train.bin and val.bin, their folder's tokenizer and vocabulary, against
// --init-from's model and model.vocab_size.
void open_data(TrainSession& s) {
  const TrainConfig& tc = s.tc();
  const TrainOptions& opts = s.opts;
  s.data_dir = fs::path(s.rc.data.dir);
  s.train_bin = (s.data_dir / "train.bin").string();
  s.val_bin = (s.data_dir / "val.bin").string();
  for (const auto& p : {s.train_bin, s.val_bin})
    if (!fs::exists(p))
      fail("data.dir: ", p, " does not exist (",
           opts.resume ? "moved? continue with --set data.dir=NEW_DIR; else make it with " : "make it with ",
           data::prepare_hint(s.data_dir.string()), ")");
  // meta.json, tokenizer.model and the shards must agree (vocabulary, dtype,
  // token counts, the tokenizer's SHA-256): samples and exports decode the
  // ids with that tokenizer.
  s.data_info = data::verify_data_folder(s.data_dir.string(), "data.dir");
  s.val_sha256 = data::sha256_hex(io::read_file(s.val_bin));
  s.B = tc.batch_size, s.T = tc.seq_len, s.max_steps = tc.max_steps;
  s.accum = s.S > 1 && s.dopt().micro_batches > 0 ? s.dopt().micro_batches : tc.grad_accum;
  s.seed = uint64_t(tc.seed);
  s.loader = std::make_unique<data::TokenLoader>(s.train_bin, int(s.B), int(s.T), s.seed);
  {
    data::TokenLoader check_val(s.val_bin, 1, int(s.T), 0);
    if (check_val.vocab_size() != s.loader->vocab_size())
      fail("data.dir: ", s.val_bin, " has vocabulary ", check_val.vocab_size(), " but ", s.train_bin, " has ",
           s.loader->vocab_size(), " (prepared with different tokenizers?)");
  }
  const int64_t shard_vocab = s.loader->vocab_size();
  const int64_t cfg_vocab = s.rc.model.vocab_size;
  const std::optional<HfFolder>& init = s.init;
  if (init && init->config.vocab_size < shard_vocab)
    fail("--init-from ", init->config_path, ": vocab_size ", init->config.vocab_size,
         " is smaller than the tokenizer's vocabulary ", shard_vocab, " (", s.train_bin,
         "): the model has no embedding for its larger token ids");
  // --init-from: the ids mean the pieces of the model's tokenizer. A folder
  // that ships its tokenizer.model (`snip export` writes it, as Hugging Face
  // model folders do) is checked against the data's, as `snip eval` and
  // `snip plan --init-from` check it.
  if (init && !opts.init_from.empty() && s.resume_ckpt.empty()) {
    const fs::path tok = fs::path(init->dir) / "tokenizer.model";
    if (!fs::is_regular_file(tok)) {
      if (!s.quiet)
        spdlog::warn("--init-from {} has no tokenizer.model: whether data.dir was tokenized by the model's tokenizer "
                     "cannot be checked", init->dir);
    } else if (const std::string sha = data::sha256_hex(io::read_file(tok.string()));
               sha != s.data_info.tokenizer_sha256) {
      if (!opts.allow_other_tokenizer)
        fail("--init-from ", init->dir, ": data.dir ", s.data_dir.string(), " was tokenized with another tokenizer "
             "(SHA-256 ", s.data_info.tokenizer_sha256.substr(0, 12), "...) than the model (", tok.string(), ": ",
             sha.substr(0, 12), "...): the token ids would mean other pieces; prepare the data with the model's "
             "tokenizer (snip data prepare --tokenizer ", tok.string(), "), or pass --allow-other-tokenizer");
      if (!s.quiet)
        spdlog::warn("--allow-other-tokenizer: training {} on data tokenized by another tokenizer than its own",
                     init->dir);
    }
  }
  if (init && init->config.vocab_size > shard_vocab)
    s.init_notes.push_back(str_cat("vocab_size ", init->config.vocab_size, " (", init->config_path,
                                   ") is larger than the tokenizer's vocabulary ", shard_vocab,
                                   ": the embeddings of ids >= ", shard_vocab, " are kept but never trained"));
  if (cfg_vocab > 0 && cfg_vocab < shard_vocab)
    fail("model.vocab_size ", cfg_vocab, " is smaller than the tokenizer's vocabulary ", shard_vocab, " (",
         s.train_bin, "); set it to 0 to use the tokenizer's");
}

namespace {

// The model from the seed (and --init-from's weights), in the GEMM dtype,
// with its optimizer (ZeRO: over the parameters this rank owns).
void make_model(TrainSession& s) {
  const TrainConfig& tc = s.tc();
  // Threads per rank: train.threads, or the cores shared by this machine's ranks.
  set_threads(tc.threads > 0 || s.world.local_size <= 1
                  ? tc.threads
                  : std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()) / s.world.local_size));
  // Where training runs: parameters, optimizer state and batches (model/device.h),
  // resolved with dist.backend by connect_ranks (dist::place_rank).
  set_compute_device(s.device);
  torch::manual_seed(s.seed);
  s.mcfg = LlamaConfig::from_run_config(s.rc.model, s.loader->vocab_size());
  // This machine's ranks share its memory; ZeRO shards the AdamW state (and the gradients at stage 2).
  // On a GPU the device's free memory bounds it (one process per device).
  const MemoryEstimate need =
      training_memory(s.mcfg, s.B, s.T,
                      RankLayout{s.R, s.device.is_cuda() ? 1 : std::max(1, s.world.local_size), s.zero_stage});
  size_t gpu_free = 0, gpu_total = 0;
  if (s.device.is_cuda() && formats::cuda::memory_info(s.device.index(), &gpu_free, &gpu_total))
    check_memory(need, (long long)gpu_free, "snip train (train.device = cuda: the GPU's free memory)");
  else
    check_memory(need, hw::available_memory_bytes(), "snip train");
  s.model = LlamaForCausalLM(s.mcfg);
  if (s.init) {
    // Every parameter from the file (shapes and dtypes checked, unused
    // tensors refused), with the file's own tie_word_embeddings deciding
    // what its lm_head.weight means.
    for (std::string& n : load_model_from_safetensors(s.model, io::read_safetensors(s.init->weights_path),
                                                      "--init-from " + s.init->weights_path,
                                                      s.init->config.tie_word_embeddings))
      s.init_notes.push_back(std::move(n));
  }
  s.gemm = prepare_model(s.model, tc, s.device);  // on the device before the optimizer sees the parameters
  s.optimizer = make_optimizer(s.model, tc);
  // ZeRO: this rank's AdamW holds the parameters it owns, nothing else.
  if (s.zero_stage > 0) {
    std::vector<std::string> names;
    std::vector<torch::Tensor> ps;
    for (const auto& np : s.model->named_parameters()) names.push_back(np.key()), ps.push_back(np.value());
    s.zpart = dist::zero_partition(names, ps, s.R);
    s.optimizer = make_optimizer(s.zpart->owned(s.world.rank), tc);
  }
}

// Every rank starts from the same weights (same seed, same file), or stops
// here; the controller's links to the ranks and the ZeRO optimizer state.
void join_ranks(TrainSession& s) {
  if (s.comm)
    dist::check_same_weights(*s.comm, s.param_names, s.params, s.resume_ckpt.empty() ? "initialisation" : "resume");
  if (s.comm && s.ctl->active()) s.ctl->set_comm(s.comm.get());  // stats summed, plans solved by rank 0 and broadcast
  if (s.zpart && s.ctl->active())  // the stats step reads every layer's m and v: each owner broadcasts them
    s.ctl->set_stats_optimizer([&s] {
      const double lr = s.optimizer->param_groups()[0].options().get_lr();
      return dist::gather_adam_state(*s.comm, *s.zpart, *s.optimizer, [&s, lr] {
        auto full = make_optimizer(s.model, s.tc());
        set_lr(*full, lr);
        return full;
      });
    });
}

}  // namespace

void build_model(TrainSession& s) {
  make_model(s);
  // The checkpoint a resume starts from, verified once (CRC of every file).
  // Its typed fields are checked here too, before anything reads them.
  if (!s.resume_ckpt.empty()) {
    s.resume_state = verify_checkpoint(s.resume_ckpt);
    s.resume_typed = TrainerState::from_json(s.resume_state, (fs::path(s.resume_ckpt) / "trainer_state.json").string());
  }
  setup_lora(s);
  if (s.S > 1) s.stages = std::make_unique<PipelineStages>(s);
  s.shard_part = s.zpart ? &*s.zpart : s.stages ? &s.stages->stage_part : nullptr;
  if (s.stages && s.dopt().stage_cost == "measured") s.stages->measure_costs();
  // The adaptive precision controller (inactive for policy none). Validates
  // the [precision] options against the layer list, pins and budget included.
  s.ctl = std::make_unique<PrecisionController>(s.rc, s.model->linear_layers(), s.gemm);
  // monitor.quant_error = false: the quantizers record no per-step error.
  if (!s.rc.monitor.quant_error) {
    for (QuantLinear l : s.model->linear_layers()) l->operand_errors = nullptr;
    if (s.rc.guard.enabled && s.rc.guard.on_quant_error != GuardAction::kWarn && s.world.rank == 0)
      spdlog::warn("monitor.quant_error = false: the guard's quant_error condition sees no error, so "
                   "guard.on_quant_error = {} never acts", to_string(s.rc.guard.on_quant_error));
  }
  // precision.budget_unit = time: the measured GEMM seconds (a given table,
  // or calibrated here, in training steps of the model as the run will run
  // them, per-step error measurement included; set_output writes it to
  // RUN/gemm_times.json).
  if (s.ctl->uses_gemm_times()) {
    const bool say = s.world.rank == 0;
    // A resumed run plans with the table its plans so far used (RUN/gemm_times.json,
    // saved at its start), not a new calibration or a file that may be gone.
    PrecisionConfig pc = s.rc.precision;
    const fs::path saved = fs::path(s.opts.run_dir) / "gemm_times.json";
    const bool have = fs::is_regular_file(saved);
    if (!s.resume_ckpt.empty()) {
      if (have && !pc.gemm_times.empty() && fs::absolute(pc.gemm_times) != fs::absolute(saved) && say)
        spdlog::warn("precision.gemm_times = {} is not read on --resume: the run plans with its own {} as before",
                     pc.gemm_times, saved.string());
      if (!have && say)
        spdlog::warn("{} is not in the run folder (deleted, or the run began under budget_unit flops): {} (the "
                     "resumed run may plan differently from its start)", saved.string(),
                     pc.gemm_times.empty() ? "calibrating again" : "reading precision.gemm_times = " + pc.gemm_times);
      if (have) pc.gemm_times = saved.string();
    } else if (have && pc.gemm_times.empty()) {
      // A new run in the folder `snip doctor --calibrate --run RUN` wrote: its table, not a new calibration.
      pc.gemm_times = saved.string();
      if (say) spdlog::info("calibrate: planning with {} (snip doctor --calibrate)", saved.string());
    }
    // In step needs the whole model in this process: pipeline stages time each GEMM alone.
    InStepModel whole{s.model, s.B, s.T, s.seed};
    if (s.stages && pc.gemm_times.empty() && pc.calibration == "in_step" && say)
      spdlog::info("calibrate: precision.calibration = in_step needs the whole model in one process; with "
                   "pipeline stages each GEMM is timed in isolation");
    plan::GemmTimes table =
        gemm_times_for_run(pc, s.rc.recipes, s.ctl->timed_layers(), s.ctl->known_options(), s.gemm, s.device,
                           s.B * s.T, [say](const std::string& line) { if (say) spdlog::info("{}", line); },
                           s.stages ? nullptr : &whole);
    // Every rank measured (under the contention of training on this
    // machine); every rank plans and checks the budget with rank 0's table,
    // as rank 0 solves the plans they all apply.
    if (s.comm && s.comm->size() > 1)
      table = plan::parse_gemm_times(
          io::parse_json(dist::broadcast_text(*s.comm, plan::to_json(table).dump(), 0, "the GEMM-times table"),
                         "the GEMM-times table broadcast by rank 0"),
          table.source);
    // A table calibrated here goes with the run folder when it cannot be
    // applied (an infeasible budget; nothing partial is left): say how to keep one.
    const bool calibrated_here = pc.gemm_times.empty() && s.resume_ckpt.empty();
    try {
      s.ctl->set_gemm_times(std::move(table), s.B * s.T, double(s.accum));
    } catch (const UserError& e) {
      if (!calibrated_here) throw;
      fail(e.what(), "; this run's calibration is not kept: `snip doctor --calibrate --config FILE --run DIR` "
                     "measures once, and precision.gemm_times = DIR/gemm_times.json reuses it");
    }
  }
  if (s.stages) s.stages->set_controller_stages();
  if (s.lora.enabled())  // LoRA: loss divergence alone, on the FP32 base read back for the stats step
    s.ctl->set_frozen_base([&s] { s.lora.frozen_base->materialize(s.model->linear_layers()); });
  // The guard (train/guard.h): conditions every step, actions on the run.
  s.guard = std::make_unique<Guard>(s.rc.guard);
  for (const auto& np : s.model->named_parameters()) {
    s.param_names.push_back(np.key());
    s.params.push_back(np.value());
  }
  restore_checkpoint(s);
  join_ranks(s);
}

}  // namespace snip
