#include "kvstore/transfer_wire.h"

#include <xxhash.h>

#include <cstring>

namespace beluga::kv {

namespace {

constexpr char kBatchMagic[8] = {'B', 'L', 'U', 'G', 'K', 'V', 'T', '1'};
constexpr char kAnswerMagic[8] = {'B', 'L', 'U', 'G', 'K', 'V', 'A', '1'};

template <class T>
void put(unsigned char*& p, T v) {
  std::memcpy(p, &v, sizeof(T));
  p += sizeof(T);
}

template <class T>
T get(const unsigned char*& p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  p += sizeof(T);
  return v;
}

}  // namespace

const char* transfer_status_name(TransferStatus s) {
  switch (s) {
    case TransferStatus::kOk:
      return "ok";
    case TransferStatus::kBadBatch:
      return "bad_batch";
    case TransferStatus::kBlockSize:
      return "block_size";
    case TransferStatus::kForeign:
      return "foreign";
    case TransferStatus::kCorrupt:
      return "corrupt";
    case TransferStatus::kShort:
      return "short";
    case TransferStatus::kInternal:
      return "internal";
  }
  return "unknown";
}

void encode_batch_header(const BatchHeader& h, unsigned char* out) {
  unsigned char* p = out;
  std::memcpy(p, kBatchMagic, 8);
  p += 8;
  put(p, kTransferVersion);
  put(p, h.blocks);
  put(p, h.block_bytes);
  put(p, uint64_t(XXH3_64bits(out, 24)));
}

bool decode_batch_header(const unsigned char* in, BatchHeader* h) {
  if (std::memcmp(in, kBatchMagic, 8) != 0) return false;
  const unsigned char* p = in + 8;
  const uint32_t version = get<uint32_t>(p);
  h->blocks = get<uint32_t>(p);
  h->block_bytes = get<uint64_t>(p);
  const uint64_t sum = get<uint64_t>(p);
  return sum == XXH3_64bits(in, 24) && version == kTransferVersion;
}

void encode_answer(const Answer& a, unsigned char* out) {
  unsigned char* p = out;
  std::memcpy(p, kAnswerMagic, 8);
  p += 8;
  put(p, a.accepted);
  put(p, uint32_t(a.status));
}

bool decode_answer(const unsigned char* in, Answer* a) {
  if (std::memcmp(in, kAnswerMagic, 8) != 0) return false;
  const unsigned char* p = in + 8;
  a->accepted = get<uint32_t>(p);
  const uint32_t st = get<uint32_t>(p);
  if (st > uint32_t(TransferStatus::kInternal)) return false;
  a->status = TransferStatus(st);
  return true;
}

}  // namespace beluga::kv
