#include "kvstore/block_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

namespace beluga::kv {

namespace {

constexpr char kMagic[8] = {'B', 'L', 'U', 'G', 'K', 'V', 'B', '1'};

struct Writer {
  unsigned char* p;
  template <class T>
  void put(const T& v) {
    std::memcpy(p, &v, sizeof(T));
    p += sizeof(T);
  }
};

struct Reader {
  const unsigned char* p;
  template <class T>
  T get() {
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return v;
  }
};

void encode(const BlockFileHeader& h, uint64_t payload_sum, unsigned char* out) {
  Writer w{out};
  std::memcpy(w.p, kMagic, 8);
  w.p += 8;
  w.put(kBlockFileVersion);
  w.put(uint32_t(0));  // reserved
  w.put(h.fingerprint.lo);
  w.put(h.fingerprint.hi);
  w.put(h.key.lo);
  w.put(h.key.hi);
  w.put(h.tokens);
  char cls[kBlockClassMax] = {};
  std::memcpy(cls, h.cls.data(), std::min(h.cls.size(), kBlockClassMax - 1));
  std::memcpy(w.p, cls, kBlockClassMax);
  w.p += kBlockClassMax;
  w.put(h.created);
  w.put(h.last_used);
  w.put(h.payload_bytes);
  w.put(payload_sum);
  w.put(uint64_t(XXH3_64bits(out, size_t(w.p - out))));
}

// Decodes a header; false when it is not a valid header of this format.
bool decode(const unsigned char* in, BlockFileHeader* h, uint64_t* payload_sum, bool* foreign) {
  *foreign = false;
  if (std::memcmp(in, kMagic, 8) != 0) return false;
  Reader r{in + 8};
  const uint32_t version = r.get<uint32_t>();
  r.get<uint32_t>();
  if (XXH3_64bits(in, kBlockFileHeaderBytes - 8) != [&] {
        uint64_t v;
        std::memcpy(&v, in + kBlockFileHeaderBytes - 8, 8);
        return v;
      }())
    return false;
  if (version != kBlockFileVersion) {
    *foreign = true;
    return false;
  }
  h->fingerprint.lo = r.get<uint64_t>();
  h->fingerprint.hi = r.get<uint64_t>();
  h->key.lo = r.get<uint64_t>();
  h->key.hi = r.get<uint64_t>();
  h->tokens = r.get<uint32_t>();
  char cls[kBlockClassMax];
  std::memcpy(cls, r.p, kBlockClassMax);
  r.p += kBlockClassMax;
  cls[kBlockClassMax - 1] = '\0';
  h->cls = cls;
  h->created = r.get<int64_t>();
  h->last_used = r.get<int64_t>();
  h->payload_bytes = r.get<uint64_t>();
  *payload_sum = r.get<uint64_t>();
  return true;
}

bool write_all(int fd, const void* data, size_t n, int* err) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return false;
    }
    p += w;
    n -= size_t(w);
  }
  return true;
}

// Reads exactly n bytes at `off`; returns bytes read (< n at end of file), -1 on error.
ssize_t read_at(int fd, void* data, size_t n, off_t off) {
  auto* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, p + done, n - done, off + off_t(done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) break;
    done += size_t(r);
  }
  return ssize_t(done);
}

std::atomic<uint64_t> g_tmp_counter{0};  // unique temporary names within a process

constexpr const char* kTempTag = ".tmp.";

const std::string& host_name() {
  static const std::string name = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return std::string("unknown");
    return std::string(buf);
  }();
  return name;
}

}  // namespace

bool is_block_temp_name(const std::string& name) {
  return name.find(kTempTag) != std::string::npos;
}

bool block_temp_abandoned(const std::string& path) {
  const std::string name = path.substr(path.rfind('/') + 1);
  const size_t at = name.find(kTempTag);
  if (at == std::string::npos) return false;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;  // gone already
  if (int64_t(::time(nullptr)) - int64_t(st.st_mtime) > kAbandonedTempSeconds) return true;
  // "<pid>.<n>.<host>": a writer of this host that no longer runs will never rename it.
  const std::string rest = name.substr(at + std::string(kTempTag).size());
  const size_t dot1 = rest.find('.');
  const size_t dot2 = dot1 == std::string::npos ? dot1 : rest.find('.', dot1 + 1);
  if (dot2 == std::string::npos || rest.substr(dot2 + 1) != host_name()) return false;
  char* end = nullptr;
  const long pid = std::strtol(rest.c_str(), &end, 10);
  if (end != rest.c_str() + dot1 || pid <= 0) return false;
  return ::kill(pid_t(pid), 0) != 0 && errno == ESRCH;
}

const char* block_file_status_name(BlockFileStatus s) {
  switch (s) {
    case BlockFileStatus::kOk:
      return "ok";
    case BlockFileStatus::kMissing:
      return "missing";
    case BlockFileStatus::kShort:
      return "truncated";
    case BlockFileStatus::kCorrupt:
      return "corrupt";
    case BlockFileStatus::kForeign:
      return "foreign";
    case BlockFileStatus::kIoError:
      return "i/o error";
    case BlockFileStatus::kNoSpace:
      return "no space";
  }
  return "?";
}

std::string key_hex(const BlockHash& k) {
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(k.hi),
                static_cast<unsigned long long>(k.lo));
  return buf;
}

bool key_from_hex(const std::string& s, BlockHash* k) {
  if (s.size() != 32) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  k->hi = std::stoull(s.substr(0, 16), nullptr, 16);
  k->lo = std::stoull(s.substr(16), nullptr, 16);
  return true;
}

const char* block_sync_name(BlockSync s) {
  switch (s) {
    case BlockSync::kNone:
      return "none";
    case BlockSync::kData:
      return "data";
    case BlockSync::kFull:
      return "full";
  }
  return "?";
}

bool parse_block_sync(const std::string& s, BlockSync* out) {
  for (BlockSync v : {BlockSync::kNone, BlockSync::kData, BlockSync::kFull})
    if (s == block_sync_name(v)) {
      *out = v;
      return true;
    }
  return false;
}

bool decode_block_header(const unsigned char* in, BlockFileHeader* h, uint64_t* payload_sum, bool* foreign) {
  return decode(in, h, payload_sum, foreign);
}

uint64_t block_payload_sum(const void* data, size_t n) {
  return XXH3_64bits(data, n);
}

void encode_block_header(const BlockFileHeader& h, const void* payload, unsigned char* out) {
  encode(h, XXH3_64bits(payload, h.payload_bytes), out);
}

BlockFileStatus check_block_image(const unsigned char* head, size_t bytes_read, const BlockHash& fingerprint,
                                  const BlockHash& key, size_t payload_bytes, const void* payload,
                                  BlockFileHeader* h) {
  if (bytes_read < kBlockFileHeaderBytes) return BlockFileStatus::kShort;
  uint64_t sum = 0;
  bool foreign = false;
  if (!decode(head, h, &sum, &foreign))
    return foreign ? BlockFileStatus::kForeign : BlockFileStatus::kCorrupt;
  if (!(h->fingerprint == fingerprint) || h->payload_bytes != payload_bytes) return BlockFileStatus::kForeign;
  if (!(h->key == key)) return BlockFileStatus::kCorrupt;  // a file under another block's name
  if (bytes_read < kBlockFileHeaderBytes + payload_bytes) return BlockFileStatus::kShort;
  if (XXH3_64bits(payload, payload_bytes) != sum) return BlockFileStatus::kCorrupt;
  return BlockFileStatus::kOk;
}

std::string block_temp_path(const std::string& path) {
  return path + kTempTag + std::to_string(::getpid()) + "." + std::to_string(g_tmp_counter++) + "." +
         host_name();
}

BlockFileStatus write_error_status(int err) {
  return err == ENOSPC || err == EDQUOT ? BlockFileStatus::kNoSpace : BlockFileStatus::kIoError;
}

namespace {

// fsync of the directory holding `path`, so a rename into it is on stable storage.
bool sync_parent_dir(const std::string& path) {
  const std::string dir = path.substr(0, path.rfind('/'));
  const int fd = ::open(dir.empty() ? "/" : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

BlockFileStatus write_block_file(const std::string& path, const BlockFileHeader& h, const void* payload,
                                 BlockSync sync) {
  const std::string tmp = block_temp_path(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return write_error_status(errno);
  unsigned char head[kBlockFileHeaderBytes];
  encode_block_header(h, payload, head);
  int err = 0;
  bool ok = write_all(fd, head, sizeof(head), &err) && write_all(fd, payload, h.payload_bytes, &err);
  if (ok && sync != BlockSync::kNone && (sync == BlockSync::kData ? ::fdatasync(fd) : ::fsync(fd)) != 0) {
    err = errno;
    ok = false;
  }
  const bool closed = ::close(fd) == 0;
  if (!closed && err == 0) err = errno;
  if (!ok || !closed || ::rename(tmp.c_str(), path.c_str()) != 0) {
    if (err == 0) err = errno;
    ::unlink(tmp.c_str());
    return write_error_status(err);
  }
  // The block is whole under its name; a failed directory sync only leaves its name less durable.
  if (sync == BlockSync::kFull && !sync_parent_dir(path)) return BlockFileStatus::kIoError;
  return BlockFileStatus::kOk;
}

BlockFileStatus read_block_header(const std::string& path, BlockFileHeader* h, int64_t* mtime) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? BlockFileStatus::kMissing : BlockFileStatus::kIoError;
  unsigned char head[kBlockFileHeaderBytes];
  const ssize_t r = read_at(fd, head, sizeof(head), 0);
  struct stat st {};
  const bool have_stat = ::fstat(fd, &st) == 0;
  ::close(fd);
  if (r < 0) return BlockFileStatus::kIoError;
  if (size_t(r) < sizeof(head)) return BlockFileStatus::kShort;
  uint64_t sum = 0;
  bool foreign = false;
  if (!decode(head, h, &sum, &foreign))
    return foreign ? BlockFileStatus::kForeign : BlockFileStatus::kCorrupt;
  if (have_stat && uint64_t(st.st_size) < sizeof(head) + h->payload_bytes) return BlockFileStatus::kShort;
  if (mtime) *mtime = have_stat ? int64_t(st.st_mtime) : 0;
  return BlockFileStatus::kOk;
}

BlockFileStatus update_block_class(const std::string& path, const BlockHash& fingerprint,
                                   const BlockHash& key, const std::string& cls, BlockSync sync) {
  // A whole new file through a temporary name, not a header rewritten in place: readers (this
  // server's scan, other servers on the same directory) treat a torn header as corrupt and remove
  // the file, so an in-place write could lose a good block.
  BlockFileHeader h;
  BlockFileStatus status = read_block_header(path, &h, nullptr);
  if (status != BlockFileStatus::kOk) return status;
  std::vector<unsigned char> payload(h.payload_bytes);
  status = read_block_file(path, fingerprint, key, h.payload_bytes, payload.data(), &h);
  if (status != BlockFileStatus::kOk) return status;
  h.cls = cls;
  return write_block_file(path, h, payload.data(), sync);
}

BlockFileStatus read_block_file(const std::string& path, const BlockHash& fingerprint, const BlockHash& key,
                                size_t payload_bytes, void* dst, BlockFileHeader* h) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? BlockFileStatus::kMissing : BlockFileStatus::kIoError;
  unsigned char head[kBlockFileHeaderBytes];
  ssize_t got = read_at(fd, head, sizeof(head), 0);
  if (got == ssize_t(sizeof(head))) {
    const ssize_t p = read_at(fd, dst, payload_bytes, off_t(sizeof(head)));
    got = p < 0 ? -1 : got + p;
  }
  ::close(fd);
  if (got < 0) return BlockFileStatus::kIoError;
  return check_block_image(head, size_t(got), fingerprint, key, payload_bytes, dst, h);
}

}  // namespace beluga::kv
