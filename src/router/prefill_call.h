// PrefillCall: the router's first leg of a disaggregated request. The client's request goes to a
// prefill engine with `x-beluga-prefill-to: <the decode engine's KV address>` (server/disaggregation.h);
// the engine computes the prompt, sends its KV there and answers with a JSON report, from which the
// call takes the prompt-cache hits the decode engine must report (x-beluga-prefill-cached). The
// callback runs exactly once, on the session's executor: with the outcome, or with an error after
// a failure, the timeout or cancel().
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange

#include <boost/asio.hpp>
#include <boost/beast/http.hpp>

#include "router/replica.h"

namespace beluga::router {

struct PrefillOutcome {
  bool ok = false;       // the engine prefilled and every block reached the decode engine
  unsigned status = 0;   // its HTTP status (0: no answer)
  bool reached = false;  // the engine answered at all (a refusal is not a breaker failure)
  std::string cached;    // for x-beluga-prefill-cached (when ok)
  std::string error;
  double seconds = 0;
};

class PrefillCall {
 public:
  using Done = std::function<void(PrefillOutcome)>;
  static std::shared_ptr<PrefillCall> start(
      boost::asio::any_io_executor exec, const std::vector<boost::asio::ip::tcp::endpoint>& endpoints,
      const ReplicaAddress& engine, const boost::beast::http::request<boost::beast::http::string_body>& req,
      const std::string& kv_target, int connect_timeout_ms, int timeout_s, Done done);
  virtual ~PrefillCall() = default;
  virtual void cancel() = 0;  // the client left: the engine's connection closes (it aborts)
};

// The x-beluga-prefill-cached value from a prefill engine's report; false when it is malformed.
bool prefill_cached_of_report(const std::string& body, std::string* cached, std::string* error, bool* ok);

}  // namespace beluga::router
