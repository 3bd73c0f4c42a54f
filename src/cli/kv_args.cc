#include "cli/kv_args.h"

#include <cmath>

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
  return f;
}

KvOptions open_kv_tiers(const KvFlags& f, const LoadedModel& m, KvEventSink* events) {
  KvOptions o;
  o.retention = f.retention;
  const double host_gb = f.host_gb, disk_gb = f.disk_gb;
  const std::string& disk_dir = f.disk_dir;
  if (host_gb <= 0 && disk_dir.empty()) return o;
  kv::StoreConfig sc;
  sc.block_bytes = m.model->kv_bytes_per_token() * kKvBlockSize;
  sc.fingerprint = kv::model_fingerprint(read_file(m.config_path), m.weights_digest, m.ops->act_dtype(),
                                         m.model->kv_bytes_per_token(), kKvBlockSize);
  sc.host_bytes = size_t(host_gb * double(size_t(1) << 30));
  sc.disk_dir = disk_dir;
  sc.disk_bytes = size_t(disk_gb * double(size_t(1) << 30));
  sc.retention = o.retention;
  sc.events = events;
  Ops* ops = m.ops.get();
  sc.host_alloc = {[ops](size_t n) { return ops->host_alloc(n); }, [ops](void* p) { ops->host_free(p); }};
  o.store = std::make_unique<kv::TieredStore>(std::move(sc));
  return o;
}

}  // namespace beluga::cli
