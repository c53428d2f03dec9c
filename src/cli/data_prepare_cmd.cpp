#include "cli/data_prepare_cmd.h"

#include "cli/cli_util.h"

#include <CLI/CLI.hpp>
#include <iostream>

#include "paratrain/base/error.h"
#include "paratrain/data/text_prepare.h"

namespace paratrain::cli {

int run_data_prepare(int argc, char** argv) {
  data::PrepareOptions opt;
  CLI::App app{
      "Train a sentencepiece BPE tokenizer on text and write OUT/train.bin, OUT/val.bin (llm.c token files) and "
      "OUT/tokenizer.model. One non-empty line = one document; documents are split into train and validation at "
      "random (seeded).",
      "paratrain data prepare"};
  app.option_defaults()->always_capture_default();
  app.add_option("--text", opt.text_files, "UTF-8 text files, one document per line")->check(CLI::ExistingFile);
  app.add_flag("--wordnet", opt.wordnet,
               "use the gloss text of WordNet (Debian's wordnet-base) as corpus, in addition to --text");
  app.add_option("--wordnet-dir", opt.wordnet_dir, "directory holding WordNet's data.{noun,verb,adj,adv}");
  app.add_option("--vocab-size", opt.vocab_size, "tokenizer vocabulary size (260..65536)");
  app.add_option("--out", opt.out_dir, "output directory (created if missing)")->required();
  app.add_option("--val-fraction", opt.val_fraction, "fraction of documents held out for validation, in [0, 1)");
  app.add_option("--seed", opt.seed, "seed of the split and of the tokenizer's sentence sampling");
  app.add_option("--threads", opt.num_threads, "threads for tokenizer training and encoding (0 = all cores)");
  app.add_option("--max-sentences", opt.input_sentence_size, "at most this many documents train the tokenizer");
  if (!parse_or_throw(app, argc, argv, "data prepare")) return 0;
  if (opt.text_files.empty() && !opt.wordnet) throw InputError("data prepare: give --text FILE... or --wordnet");
  auto summary = data::prepare_text(opt, &std::cerr);
  std::cout << data::format_summary(summary) << std::flush;
  return 0;
}

}  // namespace paratrain::cli
