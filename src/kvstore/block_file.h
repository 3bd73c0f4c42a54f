// The file format of one KV block in the file tier: a fixed header, then the block's host image.
//
//   magic "BLUGKVB1" | format version | model fingerprint | block key | token count | class name
//   (32 bytes, NUL-padded) | created, last used (unix seconds) | payload bytes | payload XXH3-64 |
//   header XXH3-64 (over everything before it)
//
// A file is written to a temporary name in its directory ("<final>.tmp.<pid>.<n>.<host>") and renamed
// over the final one, so a reader sees a whole file or none, even when the writer is killed mid-write; a file
// that is truncated, corrupt (either checksum) or of another model or format is rejected. The file's mtime is
// its last use when that is later than the header's (a hit touches the file instead of rewriting it).
//
// Durability (BlockSync): the checksums make any torn or unwritten file a miss, so syncing is never
// needed for correct output, only for blocks to survive a power loss or a kernel crash (a process
// crash loses nothing once the file is renamed). kData: fdatasync the temporary file before the
// rename (a block that is there after a power loss is whole and stays); kFull: fsync it and, after the
// rename, its directory (the block is on stable storage when the write completes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/block_manager.h"

namespace beluga::kv {

inline constexpr uint32_t kBlockFileVersion = 1;
inline constexpr size_t kBlockClassMax = 32;

struct BlockFileHeader {
  BlockHash fingerprint;
  BlockHash key;
  uint32_t tokens = 0;
  std::string cls;  // retention class, at most kBlockClassMax - 1 bytes
  int64_t created = 0, last_used = 0;
  uint64_t payload_bytes = 0;
};

inline constexpr size_t kBlockFileHeaderBytes = 8 + 4 + 4 + 16 + 16 + 4 + kBlockClassMax + 8 + 8 + 8 + 8 + 8;

enum class BlockFileStatus { kOk, kMissing, kShort, kCorrupt, kForeign, kIoError, kNoSpace };
const char* block_file_status_name(BlockFileStatus s);

enum class BlockSync { kNone, kData, kFull };
const char* block_sync_name(BlockSync s);
// "none", "data" or "full"; false for anything else.
bool parse_block_sync(const std::string& s, BlockSync* out);

// Writes `h` and `payload` (h.payload_bytes) to `path` through a temporary name (removed on failure),
// synced as `sync` asks.
BlockFileStatus write_block_file(const std::string& path, const BlockFileHeader& h, const void* payload,
                                 BlockSync sync = BlockSync::kNone);
// Reads the header of `path`; `mtime` (may be null) gets the file's modification time.
BlockFileStatus read_block_header(const std::string& path, BlockFileHeader* h, int64_t* mtime);
// Rewrites `path` (block `key` of `fingerprint`) with class `cls`: the block is read and verified,
// then written anew through a temporary name, so a reader never sees a half-written header.
BlockFileStatus update_block_class(const std::string& path, const BlockHash& fingerprint,
                                   const BlockHash& key, const std::string& cls,
                                   BlockSync sync = BlockSync::kNone);
// Reads and verifies `path` as block `key` of `fingerprint` with `payload_bytes` into `dst`.
// On any status but kOk, `dst` may hold garbage.
BlockFileStatus read_block_file(const std::string& path, const BlockHash& fingerprint, const BlockHash& key,
                                size_t payload_bytes, void* dst, BlockFileHeader* h);

// The pieces of the two calls above, for I/O paths that issue the system calls themselves
// (io_uring, uring_block_io.h); write_block_file and read_block_file are made of them.
//
// The header bytes a file of `h` starts with (the payload's checksum included).
void encode_block_header(const BlockFileHeader& h, const void* payload, unsigned char* out);
// The other way: verifies the magic and the header checksum (false otherwise; `foreign`: a valid
// header of another format version) and gives the payload's checksum (block_payload_sum). The
// prefill -> decode transfer (transfer_wire.h) frames blocks with these headers too.
bool decode_block_header(const unsigned char* in, BlockFileHeader* h, uint64_t* payload_sum, bool* foreign);
uint64_t block_payload_sum(const void* data, size_t n);  // XXH3-64
// Judges a block file read from its start: `head` (kBlockFileHeaderBytes), then `payload`;
// `bytes_read` of the file were read in all (at most the header plus payload_bytes).
BlockFileStatus check_block_image(const unsigned char* head, size_t bytes_read, const BlockHash& fingerprint,
                                  const BlockHash& key, size_t payload_bytes, const void* payload,
                                  BlockFileHeader* h);
// A new temporary name for a write of `path`, in its directory.
std::string block_temp_path(const std::string& path);
// The status of a write that failed with `err` (ENOSPC, EDQUOT: kNoSpace).
BlockFileStatus write_error_status(int err);

// Whether `name` (a file name, no directory) is a temporary file of write_block_file.
bool is_block_temp_name(const std::string& name);
// Whether the temporary file `path` was left by a writer that is gone: one of this host whose
// process no longer exists, or any whose file is older than kAbandonedTempSeconds by the real clock
// (a writer on another host sharing the directory, whose process cannot be asked about).
inline constexpr int64_t kAbandonedTempSeconds = 600;
bool block_temp_abandoned(const std::string& path);

// The hex spelling of a key (32 digits), as file names use it.
std::string key_hex(const BlockHash& k);
bool key_from_hex(const std::string& s, BlockHash* k);

}  // namespace beluga::kv
