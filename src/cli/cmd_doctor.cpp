// cmd_doctor.cpp: the command line of `snip doctor` (app::run_doctor,
// snip/app/doctor.h): exit status 0 when the main job can run here; when it
// cannot, one line `snip: error: the main job cannot run here: <reasons>`
// and status 2.
#include <memory>

#include "commands.h"
#include "snip/app/doctor.h"
#include "snip/core/error.h"

namespace snip::cli {

using app::DoctorOpts;
using app::run_doctor;

void add_doctor_commands(CLI::App& app) {
  auto o = std::make_shared<DoctorOpts>();
  CLI::App* cmd = app.add_subcommand(
      "doctor", "What this machine can do for snip: CPU/BLAS/LibTorch/GPU, the GEMM support matrix with measured "
                "throughput, warnings with fixes; exit status 2 and the reason when the main job cannot run here");
  cmd->add_flag("--json", o->json_out, "print JSON instead of text");
  cmd->add_option("--min-time", o->min_time, "seconds each GEMM throughput is measured for")
      ->check(CLI::Number & CLI::Range(0.0, 60.0))
      ->capture_default_str();
  cmd->add_option("--config", o->config, "also check this training config (valid, data prepared, fits in memory)")
      ->type_name("FILE");
  CLI::Option* calibrate = cmd->add_flag("--calibrate", o->calibrate,
                "time every distinct GEMM of --config's model under each option it can choose (fprop, dgrad, "
                "wgrad; median of --repeats calls or, in step, training steps) and write RUN/gemm_times.json for precision.budget_unit = time");
  cmd->add_option("--run", o->run, "with --calibrate: the run directory gemm_times.json is written to")
      ->type_name("RUN")
      ->needs(calibrate);
  cmd->add_option("--repeats", o->repeats,
                  "with --calibrate: timed training steps per option (in_step) or timed calls per GEMM (isolated); "
                  "the median is kept")
      ->capture_default_str()
      ->needs(calibrate);
  cmd->add_option("--max-seconds", o->max_seconds,
                  "with --calibrate: wall-clock cap; past it the remaining options get one timed step each "
                  "(in_step) or the remaining GEMMs one timed call each (isolated)")
      ->capture_default_str()
      ->needs(calibrate);
  cmd->add_option("--calibration", o->calibration,
                  "with --calibrate: in_step (the GEMMs timed inside forward and backward passes of the model, as "
                  "training runs them) or isolated (each GEMM alone); default: the config's precision.calibration")
      ->check(CLI::IsMember({"in_step", "isolated"}))
      ->needs(calibrate);
  // The calibration prints its own text (and writes RUN/gemm_times.json).
  calibrate->excludes(cmd->get_option("--json"))->excludes(cmd->get_option("--min-time"));
  cmd->callback([o, cmd] {
    o->config_given = cmd->count("--config") > 0;
    if (!(o->min_time >= 0)) fail("snip doctor: --min-time: expected seconds in [0, 60], got ", o->min_time);
    run_doctor(*o);
  });
}

}  // namespace snip::cli
