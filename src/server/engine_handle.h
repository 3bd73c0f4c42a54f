// The engine as the server sees it: submit / abort / stats. The real Engine is wrapped by
// wrap_engine(); tests substitute a scripted engine. Outputs arrive on the engine's thread through
// EngineRequest::on_output; the server posts them to the connection's strand.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/engine.h"

namespace beluga::server {

class EngineHandle {
 public:
  virtual ~EngineHandle() = default;
  virtual SubmitStatus submit(EngineRequest req, std::string* why) = 0;
  virtual void abort(const std::string& request_id) = 0;
  virtual EngineStats stats() const = 0;
  virtual int max_model_len() const = 0;
  // Why the engine cannot take requests right now (restarting), or nothing: /health and /ready say it.
  virtual std::optional<std::string> unavailable() const { return std::nullopt; }
  // Changes when another engine takes over (a restart): /health judges each engine's steps alone.
  virtual uint64_t generation() const { return 0; }
};

// A handle that forwards to `engine` (which must outlive it).
std::unique_ptr<EngineHandle> wrap_engine(Engine& engine);

}  // namespace beluga::server
