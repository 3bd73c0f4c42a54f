#include "cli/kv_args.h"

#include <cmath>
#include <cstdio>

#include "engine/kv_connector.h"
#include "kvstore/fingerprint.h"
#include "model/batch.h"
#include "util/error.h"
#include "util/file.h"

namespace beluga::cli {

KvFlags parse_kv_flags(const Args& args) {
  KvFlags f;
  f.retention = kv::parse_retention(args.get_or("kv-retention", ""));
  f.host_gb = args.get_double("kv-host-gb", 0);
  BELUGA_CHECK(std::isfinite(f.host_gb) && f.host_gb >= 0, "--kv-host-gb must be a size in GiB >= 0");
  f.disk_dir = args.get_or("kv-disk-dir", "");
  f.disk_gb = args.get_double("kv-disk-gb", 0);
  BELUGA_CHECK(std::isfinite(f.disk_gb) && f.disk_gb >= 0, "--kv-disk-gb must be a size in GiB >= 0");
  BELUGA_CHECK(f.disk_gb == 0 || !f.disk_dir.empty(), "--kv-disk-gb needs --kv-disk-dir");
  const std::string io = args.get_or("kv-disk-io", "auto"), sync = args.get_or("kv-disk-sync", "none");
  BELUGA_CHECK(kv::parse_io_mode(io, &f.disk_io.mode),
               "--kv-disk-io must be auto, io_uring or threads, not '", io, "'");
  BELUGA_CHECK(kv::parse_block_sync(sync, &f.disk_io.sync),
               "--kv-disk-sync must be none, data or full, not '", sync, "'");
  return f;
}

KvOptions open_kv_tiers(const KvFlags& f, const LoadedModel& m, const SpecConfig& spec, KvEventSink* events) {
  KvOptions o;
  o.retention = f.retention;
  const double host_gb = f.host_gb, disk_gb = f.disk_gb;
  const std::string& disk_dir = f.disk_dir;
  if (host_gb <= 0 && disk_dir.empty()) return o;
  kv::StoreConfig sc;
  // With MTP drafting the image carries the MTP layer too: another layout, another fingerprint.
  sc.block_bytes = kv_block_image_bytes(*m.model, spec);
  sc.fingerprint = kv::model_fingerprint(read_file(m.config_path), m.weights_digest, m.ops->act_dtype(),
                                         sc.block_bytes / kKvBlockSize, kKvBlockSize,
                                         m.model->step_peers() ? m.model->step_peers()->cache_shards() : 1);
  sc.host_bytes = size_t(host_gb * double(size_t(1) << 30));
  sc.disk_dir = disk_dir;
  sc.disk_bytes = size_t(disk_gb * double(size_t(1) << 30));
  sc.disk_io = f.disk_io;
  sc.retention = o.retention;
  sc.events = events;
  Ops* ops = m.ops.get();
  sc.host_alloc = {[ops](size_t n) { return ops->host_alloc(n); }, [ops](void* p) { ops->host_free(p); }};
  o.store = std::make_unique<kv::TieredStore>(std::move(sc));
  if (kv::DiskTier* d = o.store->disk())
    std::fprintf(stderr, "beluga: KV file tier in %s: I/O through %s, block files synced: %s\n",
                 disk_dir.c_str(), d->io_description().c_str(), kv::block_sync_name(f.disk_io.sync));
  return o;
}

}  // namespace beluga::cli
