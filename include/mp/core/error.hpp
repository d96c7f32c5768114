#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace mp {

/// The one exception type of mixprec: a user error or a failed library call.
/// Its message says what was expected, what was got and what to do.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

/// An Error that says a run failed numerically (a loss scale stuck at its minimum, non-finite values that
/// skipping steps cannot cure), not that its input was wrong: the CLI exits with its own status for it.
class NumericalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
/// Concatenate any streamable arguments into a string.
template <class... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
[[noreturn]] void assert_fail(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace mp

/// User-facing check: throws mp::Error with the streamed message when cond is false.
#define MP_CHECK(cond, ...)                                                              \
  do {                                                                                   \
    if (!(cond)) [[unlikely]]                                                            \
      ::mp::detail::throw_error(__FILE__, __LINE__, ::mp::detail::str_cat(__VA_ARGS__)); \
  } while (0)

/// Throw mp::Error unconditionally with the streamed message.
#define MP_FAIL(...) ::mp::detail::throw_error(__FILE__, __LINE__, ::mp::detail::str_cat(__VA_ARGS__))

/// Internal invariant: a failure is a mixprec bug, reported as mp::Error naming the condition.
#define MP_ASSERT(cond, ...)                                                                                      \
  do {                                                                                                            \
    if (!(cond)) [[unlikely]]                                                                                     \
      ::mp::detail::assert_fail(__FILE__, __LINE__, #cond, ::mp::detail::str_cat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
