// Error handling: every failure a user can cause (bad file, bad config, bad request) is a beluga::Error
// with a message that names the thing at fault. Programming errors abort via BELUGA_ASSERT.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace beluga {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// The instance cannot run the work right now (a failed expert-parallel rank; a restart follows): not
// the request's fault. A server answers 503, which a router retries on another replica.
class Unavailable : public Error {
 public:
  using Error::Error;
};

// Concatenates any streamable arguments into one string: str("tensor ", name, " has ", n, " dims").
template <typename... Args>
std::string str(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(str(std::forward<Args>(args)...));
}

}  // namespace beluga

// Checks a condition that depends on user input (files, configs, requests); throws beluga::Error.
#define BELUGA_CHECK(cond, ...)               \
  do {                                        \
    if (!(cond)) ::beluga::fail(__VA_ARGS__); \
  } while (0)

// Checks an internal invariant; a failure is a bug in Beluga, not in the input.
#define BELUGA_ASSERT(cond)                                                                  \
  do {                                                                                       \
    if (!(cond)) ::beluga::fail("internal error: ", #cond, " at ", __FILE__, ":", __LINE__); \
  } while (0)
