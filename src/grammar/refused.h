// A constraint Beluga cannot enforce exactly (an unsupported JSON Schema keyword, a grammar too large,
// the compile time limit): the request is refused (HTTP 400, `grammar check` exit 2) instead of being
// enforced loosely. `keyword` names what was refused ("pattern", "compile-time", ...).
#pragma once

#include <string>

#include "util/error.h"

namespace beluga::grammar {

class Refused : public Error {
 public:
  Refused(std::string keyword, const std::string& why) : Error(why), keyword_(std::move(keyword)) {}
  const std::string& keyword() const { return keyword_; }

 private:
  std::string keyword_;
};

}  // namespace beluga::grammar
