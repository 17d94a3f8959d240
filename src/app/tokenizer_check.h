// src/app/tokenizer_check.h: the one check that data was tokenized by the
// model's tokenizer, shared by `snip eval` and `snip plan --init-from`.
#pragma once

#include <string>

#include "snip/core/error.h"

namespace snip::app {

/// Compares the SHA-256 (hex) of the data folder's tokenizer with the
/// model's (`model_from` names where the model's came from). Equal: false.
/// Different and not `allow`: throws UserError "--data DIR was tokenized with
/// another tokenizer (...) than the model (...): <consequence> with the
/// model's tokenizer (snip data prepare --tokenizer), or pass
/// --allow-other-tokenizer". Different and `allow`: true (the caller warns).
inline bool other_tokenizer(const std::string& data_dir, const std::string& data_sha, const std::string& model_from,
                            const std::string& model_sha, bool allow, const std::string& consequence) {
  if (model_sha == data_sha) return false;
  if (!allow)
    fail("--data ", data_dir, " was tokenized with another tokenizer (SHA-256 ", data_sha.substr(0, 12),
         "...) than the model (", model_from, ": ", model_sha.substr(0, 12), "...): ", consequence,
         " with the model's tokenizer (snip data prepare --tokenizer), or pass --allow-other-tokenizer");
  return true;
}

}  // namespace snip::app
