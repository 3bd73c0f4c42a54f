// `beluga bench grammar --tokenizer DIR|FILE --schemas DIR [--out FILE.json] [--repeat N]
//                       [--max-whitespace N]`
// For every DIR/NAME.json schema: compiles it --repeat times (front end + mask precompute), then walks
// each instance of DIR/NAME.instances.jsonl (one JSON value per line, written compactly) token by
// token, timing fill_mask over the whole vocabulary at every step. Prints compile-time and per-token
// mask-time percentiles (p50, p99, p99.9, max) and writes them as JSON to --out.
#pragma once

namespace beluga::cli {

int bench_grammar(int argc, char** argv);

}  // namespace beluga::cli
