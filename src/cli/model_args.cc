#include "cli/model_args.h"

#include <unistd.h>

#include <chrono>

#include "kvstore/fingerprint.h"
#include "util/error.h"
#ifdef BELUGA_WITH_CUDA
#include "backend/cuda/cuda_ops.h"
#endif
#include "util/file.h"

namespace beluga::cli {

std::string default_model_dir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string exe = n > 0 ? std::string(buf, size_t(n)) : std::string("./beluga");
  std::string dir = exe.substr(0, exe.rfind('/'));
  for (const char* rel :
       {"/../models/beluga-demo-coder", "/models/beluga-demo-coder", "/../../models/beluga-demo-coder"}) {
    if (file_exists(dir + rel + "/config.json")) return dir + rel;
  }
  fail("the built-in model was not found next to ", exe,
       " (expected ../models/beluga-demo-coder); pass --model DIR");
}

LoadedModel load_model_from_args(const Args& args) {
  LoadedModel m;
  std::string path = args.get_or("model", "");
  if (path.empty()) path = default_model_dir();
  const std::string suffix = "config.json";
  std::string config_path = path + "/config.json";
  if (path.size() >= suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0) {
    config_path = path;
    path = path.rfind('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  }
  m.dir = path;
  BELUGA_CHECK(file_exists(config_path), "no config.json at ", config_path);
  m.cfg = ModelConfig::from_file(config_path);

  const std::string fmt = args.get_or("load-format", "auto");
  BELUGA_CHECK(fmt == "auto" || fmt == "dummy" || fmt == "safetensors",
               "--load-format must be auto, safetensors or dummy");
  const std::string dtype = args.get_or("dtype", "float32");
  BELUGA_CHECK(dtype == "float32" || dtype == "bfloat16", "--dtype must be float32 or bfloat16");
  CpuOptions opt;
  opt.threads = int(args.get_int("threads", 0));
  opt.bf16_activations = dtype == "bfloat16";
  const std::string device = args.get_or("device", "cpu");
#ifdef BELUGA_WITH_CUDA
  BELUGA_CHECK(device == "cpu" || device == "cuda", "--device must be cpu or cuda");
#else
  BELUGA_CHECK(device == "cpu", "--device ", device, " is not available in this build (cpu only)");
#endif
  m.device = device;
  const int max_len = int(args.get_int("max-model-len", 0));

  const auto t0 = std::chrono::steady_clock::now();
  if (device == "cpu") {
    auto cpu = std::make_unique<CpuOps>(opt);
    m.cpu = cpu.get();
    m.ops = std::move(cpu);
    if (fmt == "dummy") m.weights = std::make_unique<DummyWeights>();
  } else {
#ifdef BELUGA_WITH_CUDA
    auto cuda = std::make_unique<CudaOps>();
    if (fmt == "dummy") m.weights = std::make_unique<CudaDummyWeights>(*cuda);
    m.ops = std::move(cuda);
#endif
  }
  if (!m.weights) m.weights = std::make_unique<Checkpoint>(path);
  kv::FingerprintingSource recorded(*m.weights);  // the KV tiers' model fingerprint
  m.model = load_model(m.cfg, recorded, *m.ops, max_len);
  m.weights_digest = recorded.digest();
  m.config_path = config_path;
  m.model->set_enforce_eager(args.has("enforce-eager"));
  m.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return m;
}

}  // namespace beluga::cli
