// `beluga bench grammar --tokenizer DIR|FILE (--schemas DIR | --grammars DIR) [--out FILE.json]
//                       [--repeat N] [--max-whitespace N] [--batch B [--batch-threads 0,1]]`
// For every DIR/NAME.json schema (--schemas) and DIR/NAME.regex, NAME.gbnf, NAME.lark grammar
// (--grammars): compiles it --repeat times (front end + mask precompute), then walks each instance of
// DIR/NAME.instances.jsonl (one JSON value per line, written compactly, for a schema; one JSON string,
// the output text, for a grammar) token by token, timing fill_mask over the whole vocabulary at every step.
// Prints compile-time and per-token mask-time percentiles (p50, p99, p99.9, max) and writes them as JSON to
// --out. With --batch, also a decode step's masks at that batch size (bench_grammar_batch.h).
#pragma once

namespace beluga::cli {

int bench_grammar(int argc, char** argv);

}  // namespace beluga::cli
