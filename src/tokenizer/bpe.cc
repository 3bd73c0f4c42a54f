#include "tokenizer/bpe.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <memory>

#include <xxhash.h>
#include <nlohmann/json.hpp>

#include "tokenizer/byte_level.h"
#include "tokenizer/word_cache.h"
#include "util/error.h"

namespace beluga::tok {

namespace {

std::atomic<uint64_t> g_next_instance{1};

// A few caches per thread, keyed by model instance (ids are never reused, so a cache can never be
// read by a model it was not filled for). Evicts round-robin when a thread uses many models.
WordCache& thread_cache(uint64_t instance) {
  struct Slot {
    uint64_t owner = 0;
    std::unique_ptr<WordCache> cache;
  };
  thread_local std::array<Slot, 4> slots;
  thread_local size_t victim = 0;
  for (Slot& s : slots)
    if (s.owner == instance) return *s.cache;
  Slot& s = slots[victim++ % slots.size()];
  if (!s.cache) {
    s.cache = std::make_unique<WordCache>();
  } else {
    s.cache->clear();
  }
  s.owner = instance;
  return *s.cache;
}

struct Symbol {
  int id;
  int prev, next;
};

}  // namespace

Bpe Bpe::from_json(const nlohmann::json& m) {
  BELUGA_CHECK(m.is_object() && m.value("type", std::string("BPE")) == "BPE",
               "tokenizer model: only BPE models are supported");
  auto opt_string = [&](const char* k) {
    return m.contains(k) && m[k].is_string() ? m[k].get<std::string>() : std::string();
  };
  BELUGA_CHECK(opt_string("continuing_subword_prefix").empty() && opt_string("end_of_word_suffix").empty(),
               "tokenizer model: continuing_subword_prefix / end_of_word_suffix are not supported");
  BELUGA_CHECK(!m.value("byte_fallback", false), "tokenizer model: byte_fallback is not supported");
  BELUGA_CHECK(!m.contains("dropout") || m["dropout"].is_null() || m["dropout"].get<double>() == 0.0,
               "tokenizer model: BPE dropout is not supported");

  Bpe b;
  b.instance_ = g_next_instance.fetch_add(1);
  b.ignore_merges_ = m.value("ignore_merges", false);
  b.fuse_unk_ = m.value("fuse_unk", false);
  const auto& vocab = m.at("vocab");
  int limit = 0;
  for (const auto& [tok, id] : vocab.items()) limit = std::max(limit, id.get<int>() + 1);
  b.spelling_.resize(limit);
  b.bytes_.resize(limit);
  b.present_.assign(limit, 0);
  b.by_spelling_.reserve(vocab.size());
  b.by_bytes_.reserve(vocab.size());
  for (const auto& [tok, idj] : vocab.items()) {
    int id = idj.get<int>();
    BELUGA_CHECK(id >= 0, "tokenizer vocab: negative id for '", tok, "'");
    BELUGA_CHECK(!b.present_[id], "tokenizer vocab: id ", id, " is used twice");
    b.present_[id] = 1;
    b.spelling_[id] = tok;
    b.by_spelling_.emplace(tok, id);
    // Tokens outside the byte alphabet (e.g. "<｜begin▁of▁sentence｜>") can only come from merges.
    if (auto raw = byte_level_decode(tok)) {
      b.bytes_[id] = *raw;
      b.by_bytes_.emplace(*raw, id);
    } else {
      b.bytes_[id] = tok;
    }
  }
  for (int c = 0; c < 256; ++c) {
    auto it = b.by_bytes_.find(std::string(1, static_cast<char>(c)));
    b.byte_id_[c] = it == b.by_bytes_.end() ? -1 : it->second;
  }
  if (auto unk = opt_string("unk_token"); !unk.empty()) {
    b.unk_id_ = b.id_of_spelling(unk);
    BELUGA_CHECK(b.unk_id_ >= 0, "tokenizer model: unk_token '", unk, "' is not in the vocabulary");
  }

  const auto& merges = m.at("merges");
  b.merges_.reserve(merges.size());
  int rank = 0;
  for (const auto& mj : merges) {
    std::string left, right;
    if (mj.is_string()) {
      // Legacy form "left right": exactly one space separates the halves.
      const std::string& s = mj.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      BELUGA_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
                   "tokenizer merges: malformed entry '", s, "'");
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else {
      BELUGA_CHECK(mj.is_array() && mj.size() == 2, "tokenizer merges: expected [left, right]");
      left = mj[0].get<std::string>();
      right = mj[1].get<std::string>();
    }
    int l = b.id_of_spelling(left), r = b.id_of_spelling(right), res = b.id_of_spelling(left + right);
    BELUGA_CHECK(l >= 0 && r >= 0, "tokenizer merges: '", left, "' or '", right,
                 "' is not in the vocabulary");
    BELUGA_CHECK(res >= 0, "tokenizer merges: merged token '", left + right, "' is not in the vocabulary");
    b.merges_.insert(l, r, {rank++, res});
  }
  return b;
}

int Bpe::id_of_spelling(std::string_view s) const {
  auto it = by_spelling_.find(s);
  return it == by_spelling_.end() ? -1 : it->second;
}

void Bpe::encode_word(std::string_view word, std::vector<int>& out) const {
  if (word.size() == 1) {
    int id = byte_id_[static_cast<unsigned char>(word[0])];
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (ignore_merges_) {
    // Llama-3 style: a word that is itself a token is emitted whole, without merging.
    auto it = by_bytes_.find(word);
    if (it != by_bytes_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  uint64_t hash = 0;
  WordCache* cache = nullptr;
  if (word.size() <= WordCache::kMaxWordBytes) {
    hash = XXH3_64bits(word.data(), word.size());
    cache = &thread_cache(instance_);
    if (cache->lookup(word, hash, out)) return;
  }
  size_t start = out.size();
  merge_word(word, out);
  if (cache) cache->insert(word, hash, out.data() + start, out.size() - start);
}

void Bpe::merge_word(std::string_view word, std::vector<int>& out) const {
  thread_local std::vector<Symbol> syms;
  thread_local std::vector<uint64_t> heap;  // (rank << 32 | position), smallest first
  const int n = static_cast<int>(word.size());
  syms.resize(n);
  // One symbol per byte; bytes missing from the vocabulary become unk (fused if asked) or vanish.
  int count = 0;
  for (int i = 0; i < n; ++i) {
    int id = byte_id_[static_cast<unsigned char>(word[i])];
    if (id < 0) {
      if (unk_id_ < 0) continue;
      if (fuse_unk_ && count > 0 && syms[count - 1].id == unk_id_) continue;
      id = unk_id_;
    }
    syms[count] = {id, count - 1, count + 1};
    ++count;
  }
  if (count == 0) return;
  syms[count - 1].next = -1;

  auto push = [&](int pos) {
    const auto* m = merges_.find(syms[pos].id, syms[syms[pos].next].id);
    if (m) {
      heap.push_back((uint64_t(uint32_t(m->rank)) << 32) | uint32_t(pos));
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  };
  heap.clear();
  for (int i = 0; i + 1 < count; ++i) {
    const auto* m = merges_.find(syms[i].id, syms[i + 1].id);
    if (m) heap.push_back((uint64_t(uint32_t(m->rank)) << 32) | uint32_t(i));
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    uint64_t top = heap.back();
    heap.pop_back();
    int pos = static_cast<int>(top & 0xFFFFFFFFu);
    auto rank = static_cast<int32_t>(top >> 32);
    Symbol& s = syms[pos];
    if (s.id < 0 || s.next < 0) continue;  // merged away, or now last
    // The entry is stale if the pair at pos changed since it was pushed; a pair's rank identifies it.
    const auto* m = merges_.find(s.id, syms[s.next].id);
    if (!m || m->rank != rank) continue;
    Symbol& right = syms[s.next];
    s.id = m->result;
    right.id = -1;
    s.next = right.next;
    if (s.next >= 0) syms[s.next].prev = pos;
    if (s.prev >= 0) push(s.prev);
    if (s.next >= 0) push(pos);
  }
  for (int i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

}  // namespace beluga::tok
