#include "paratrain/base/error.h"

namespace paratrain::detail {

void check_failed(const char* cond, const char* file, int line, const std::string& msg) {
  std::string what = concat("internal error: check '", cond, "' failed at ", file, ":", line);
  if (!msg.empty()) what += concat(": ", msg);
  throw InternalError(what);
}

}  // namespace paratrain::detail
