// The wire format of a KV transfer over a byte stream (TCP): a batch header, then each block as the
// file tier frames it (block_file.h: header with the model fingerprint, the block key, its class and
// both checksums, then the payload), then the receiver's answer.
//
//   batch:  magic "BLUGKVT1" | version u32 | block count u32 | block bytes u64 | XXH3-64 of the 24
//           bytes before it                                                      (32 bytes)
//   answer: magic "BLUGKVA1" | blocks accepted u32 | status u32                    (16 bytes)
//
// A connection carries any number of batches, one after the other. The receiver answers each batch
// after its last block, or at the first block it refuses (and then closes the connection).
#pragma once

#include <cstddef>
#include <cstdint>

namespace beluga::kv {

inline constexpr uint32_t kTransferVersion = 1;
inline constexpr size_t kBatchHeaderBytes = 32;
inline constexpr size_t kAnswerBytes = 16;
// A batch may carry at most this many blocks (2^20 blocks of 16 tokens: a 16M-token prompt).
inline constexpr uint32_t kMaxBatchBlocks = uint32_t(1) << 20;

enum class TransferStatus : uint32_t {
  kOk = 0,
  kBadBatch = 1,   // the batch header is malformed, of another version, or too large
  kBlockSize = 2,  // the blocks are not of the receiver's size (another model or layout)
  kForeign = 3,    // a block of another model (fingerprint)
  kCorrupt = 4,    // a block header or payload failed its checksum
  kShort = 5,      // the stream ended inside the batch
  kInternal = 6,   // the receiver could not store the blocks
};
const char* transfer_status_name(TransferStatus s);

struct BatchHeader {
  uint32_t blocks = 0;
  uint64_t block_bytes = 0;
};
void encode_batch_header(const BatchHeader& h, unsigned char* out);
// False when the bytes are not a valid batch header of this version.
bool decode_batch_header(const unsigned char* in, BatchHeader* h);

struct Answer {
  uint32_t accepted = 0;
  TransferStatus status = TransferStatus::kOk;
};
void encode_answer(const Answer& a, unsigned char* out);
bool decode_answer(const unsigned char* in, Answer* a);

}  // namespace beluga::kv
