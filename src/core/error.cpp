#include "mp/core/error.hpp"

namespace mp::detail {

void throw_error(const char* /*file*/, int /*line*/, const std::string& msg) { throw Error(msg); }

void assert_fail(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(str_cat("mixprec internal error (please report): assertion `", cond, "` failed at ", file, ":", line,
                      msg.empty() ? "" : ": ", msg));
}

}  // namespace mp::detail
