// The KV transfers' /metrics lines (Prometheus text) of a prefill engine (direction="sent") or a
// decode engine (direction="received"): transfers, blocks and bytes, failures or refused batches,
// and the senders' total time (with the count: the mean transfer latency).
#pragma once

#include <string>

#include "kvstore/kv_receiver.h"
#include "kvstore/tcp_kv_transfer.h"

namespace beluga::kv {

// Either may be null (an engine that only sends or only receives).
std::string render_transfer_metrics(const TransferCounters* sent, const ReceiverCounters* received,
                                    const std::string& model);

}  // namespace beluga::kv
