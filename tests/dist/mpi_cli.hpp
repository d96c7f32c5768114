// The mpirun and mixprec CLI paths of the tests that start data-parallel runs (from tests/CMakeLists.txt), and
// whether this build has them.
#pragma once
#include <string>

namespace mp::test {

#if defined(MP_MPIEXEC) && defined(MP_CLI_PATH)
inline constexpr bool kHaveMpi = true;
inline const std::string kMpiexec = MP_MPIEXEC;
inline const std::string kMixprec = MP_CLI_PATH;
#else
inline constexpr bool kHaveMpi = false;
inline const std::string kMpiexec, kMixprec;
#endif

}  // namespace mp::test
