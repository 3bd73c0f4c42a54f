#include "server/engine_handle.h"

namespace beluga::server {

namespace {

class RealEngine final : public EngineHandle {
 public:
  explicit RealEngine(Engine& e) : e_(e) {}
  SubmitStatus submit(EngineRequest req, std::string* why) override { return e_.submit(std::move(req), why); }
  void abort(const std::string& id) override { e_.abort(id); }
  EngineStats stats() const override { return e_.stats(); }
  int max_model_len() const override { return e_.max_model_len(); }

 private:
  Engine& e_;
};

}  // namespace

std::unique_ptr<EngineHandle> wrap_engine(Engine& engine) {
  return std::make_unique<RealEngine>(engine);
}

}  // namespace beluga::server
