// The io_uring path of BlockIo (block_io.h). One thread owns the ring; each block file is a chain of
// operations on it, one at a time per file, up to queue_depth files at once (more wait, in order):
//   read:  openat, readv of the header and the payload (again for the rest after a short read),
//          close, then block_file.h's checks (check_block_image);
//   write: openat of a temporary name, writev, fdatasync/fsync as BlockSync asks, close, renameat,
//          and with BlockSync::kFull an fsync of the directory; a failed write closes and unlinks
//          its temporary file (the status as write_block_file gives it: ENOSPC is kNoSpace).
// Other threads hand work to the ring's thread through a queue and an eventfd the ring reads.
// Two worker threads run the blocking jobs and a read's checks and callback (its XXH3 over the payload
// would otherwise hold up the ring's thread); a write's callback runs on the ring's thread. Built without
// liburing (BELUGA_HAVE_LIBURING unset), uring_probe says so and open_uring_block_io returns nullptr.
#pragma once

#include <memory>
#include <string>

#include "kvstore/block_io.h"

namespace beluga::kv {

// Whether this process can use io_uring for the file tier; when not, `why` says what refused it.
bool uring_probe(std::string* why);
// The io_uring path, or nullptr (with `why`) when io_uring is unavailable.
std::unique_ptr<BlockIo> open_uring_block_io(int queue_depth, BlockSync sync, std::string* why);

}  // namespace beluga::kv
