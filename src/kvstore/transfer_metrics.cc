#include "kvstore/transfer_metrics.h"

#include <cstdio>

namespace beluga::kv {

std::string render_transfer_metrics(const TransferCounters* sent, const ReceiverCounters* received,
                                    const std::string& model) {
  const std::string m = "model_name=\"" + model + "\"";
  std::string out;
  auto head = [&](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  auto line = [&](const char* name, const std::string& labels, double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    out += std::string(name) + "{" + m + labels + "} " + buf + "\n";
  };
  const auto rel = std::memory_order_relaxed;
  head("beluga_kv_transfers_total", "counter", "KV transfers (batches of one request's blocks), by result.");
  if (sent) {
    line("beluga_kv_transfers_total", ",direction=\"sent\",result=\"ok\"",
         double(sent->transfers.load(rel) - sent->failures.load(rel)));
    line("beluga_kv_transfers_total", ",direction=\"sent\",result=\"failed\"",
         double(sent->failures.load(rel)));
  }
  if (received) {
    line("beluga_kv_transfers_total", ",direction=\"received\",result=\"ok\"",
         double(received->batches.load(rel)));
    line("beluga_kv_transfers_total", ",direction=\"received\",result=\"failed\"",
         double(received->refused.load(rel)));
  }
  head("beluga_kv_transfer_bytes_total", "counter", "KV block payload bytes transferred.");
  if (sent) line("beluga_kv_transfer_bytes_total", ",direction=\"sent\"", double(sent->bytes.load(rel)));
  if (received)
    line("beluga_kv_transfer_bytes_total", ",direction=\"received\"", double(received->bytes.load(rel)));
  head("beluga_kv_transfer_blocks_total", "counter",
       "KV blocks transferred (sent: accepted by the receiver; received: stored or held already).");
  if (sent) line("beluga_kv_transfer_blocks_total", ",direction=\"sent\"", double(sent->blocks.load(rel)));
  if (received)
    line("beluga_kv_transfer_blocks_total", ",direction=\"received\"", double(received->blocks.load(rel)));
  if (sent) {
    head("beluga_kv_transfer_seconds_total", "counter",
         "Time the sent transfers took, connect to answer (over beluga_kv_transfers_total: the mean).");
    line("beluga_kv_transfer_seconds_total", ",direction=\"sent\"", double(sent->micros.load(rel)) * 1e-6);
  }
  if (received) {
    head("beluga_kv_transfer_dropped_blocks_total", "counter",
         "Received blocks dropped because every host slot was in use (recomputed instead).");
    line("beluga_kv_transfer_dropped_blocks_total", "", double(received->no_room.load(rel)));
    head("beluga_kv_transfer_connections", "gauge", "Open KV transfer connections.");
    line("beluga_kv_transfer_connections", "", double(received->connections.load(rel)));
  }
  return out;
}

}  // namespace beluga::kv
