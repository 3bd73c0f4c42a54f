#!/usr/bin/env python3
"""Writes a byte-level BPE tokenizer of exactly VOCAB tokens with the DeepSeek special tokens, for test
checkpoints whose vocabulary no real tokenizer fits (the DeepSeek-V4 fixtures: 1024 and 800), so
`beluga serve` and the chat formats run on them end to end and every id the model can produce decodes.

usage: make_byte_tokenizer.py OUT_DIR VOCAB
Ids: 0 = BOS, 1 = EOS (the fixtures' bos/eos_token_id), then the other specials, the 256 bytes, then
merges of two printable ASCII characters (in a fixed order) up to VOCAB.
"""
import json
import os
import sys

SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>",
            "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
            "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜▁pad▁｜>"]


def bytes_to_unicode():
    """GPT-2's byte -> printable character table (the ByteLevel pre-tokenizer's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def main():
    out, size = sys.argv[1], int(sys.argv[2])
    os.makedirs(out, exist_ok=True)
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    table = bytes_to_unicode()
    for b, ch in sorted(table.items()):
        vocab[ch] = len(vocab)
    merges = []
    chars = [table[b] for b in b"etaoinsrhldcumfpgwybvkxjqz ETAOINSRHLDCUMFPGWYBVKXJQZ0123456789.,"]
    for a in chars:
        for b in chars:
            if len(vocab) >= size:
                break
            merges.append([a, b])
            vocab[a + b] = len(vocab)
    assert len(vocab) == size, (len(vocab), size)
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in enumerate(SPECIALS)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
    cfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": SPECIALS[0], "eos_token": SPECIALS[1],
           "pad_token": SPECIALS[1], "model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
