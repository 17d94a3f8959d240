// A saved plan (`snip plan show RUN`: RUN/plans/step-N.json) ->
// io::parse_json -> format_plan_table (plan/plan_file.cpp).
#include "harness.h"
#include "snip/io/json.h"
#include "snip/plan/plan_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  snip::fuzz::guarded(data, size, [](std::string_view in) {
    snip::format_plan_table(snip::io::parse_json(in, "plans/step-1.json"));
  });
  return 0;
}
