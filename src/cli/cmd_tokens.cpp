// `snip data encode` / `snip data decode`: the run's SentencePiece tokenizer
// for processes that cannot load SentencePiece themselves (LibTorch ones, see
// src/data/CMakeLists.txt): `snip sample` and the trainer's samples talk to
// these through data/token_client.h.
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "snip/data/tokenizer.h"
#include "snip/core/error.h"

namespace snip::cli {

void add_token_commands(CLI::App* data) {
  auto model = std::make_shared<std::string>();
  auto bos = std::make_shared<bool>(false);
  CLI::App* enc = data->add_subcommand(
      "encode", "Token ids of the UTF-8 text on standard input, space-separated on one line");
  enc->add_option("--tokenizer", *model, "SentencePiece model (e.g. data/kjv/tokenizer.model)")->required();
  enc->add_flag("--bos", *bos, "start with the BOS id, as every document of a prepared shard does");
  enc->callback([model, bos] {
    const data::Tokenizer tok = data::Tokenizer::load(*model);
    const std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    std::vector<int32_t> ids = tok.encode(text);
    if (*bos && tok.bos_id() >= 0) ids.insert(ids.begin(), tok.bos_id());
    std::ostringstream os;
    for (size_t i = 0; i < ids.size(); ++i) os << (i ? " " : "") << ids[i];
    std::cout << os.str() << "\n";
  });
  auto dmodel = std::make_shared<std::string>();
  CLI::App* dec = data->add_subcommand(
      "decode", "Text of the whitespace-separated token ids on standard input (BOS/EOS decode to nothing)");
  dec->add_option("--tokenizer", *dmodel, "SentencePiece model")->required();
  dec->callback([dmodel] {
    const data::Tokenizer tok = data::Tokenizer::load(*dmodel);
    std::vector<int32_t> ids;
    for (std::string w; std::cin >> w;) {
      try {
        size_t used = 0;
        const long v = std::stol(w, &used);
        if (used != w.size()) throw std::invalid_argument(w);
        ids.push_back(int32_t(v));
      } catch (const std::exception&) {
        fail("decode: expected integer token ids on standard input, got '", w, "'");
      }
    }
    std::cout << tok.decode(ids);
  });
}

}  // namespace snip::cli
