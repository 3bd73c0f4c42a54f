// `beluga bench tokenizer --tokenizer FILE --input FILE [--out FILE.json] [--chunk BYTES]
//                         [--repeat N] [--no-hf] [--hf-script PATH]`
// Encodes the input (cut at line ends into chunks of about --chunk bytes) single-threaded with
// Beluga's tokenizer and, in the same run, with Hugging Face `tokenizers` (node, tests/tools), and
// prints MB/s and tokens/s of both, the speed ratio, and whether the ids are identical.
// argv holds the options after `bench tokenizer`.
#pragma once

namespace beluga::cli {

int bench_tokenizer(int argc, char** argv);

}  // namespace beluga::cli
