#include "backend/cpu/kernel_path_file.hpp"

#include <fcntl.h>
#include <omp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <oneapi/dnnl/dnnl.hpp>
#include <sstream>

#include "core/json_excerpt.hpp"
#include "mp/core/atomic_file.hpp"
#include "mp/core/cpu_features.hpp"
#include "mp/core/error.hpp"

namespace mp::backend::cpu {

// Note [the kernel-path cache file]
// Timings hold for one machine and software stack only, so the file is keyed by what changes them: the CPU
// model, the OpenMP thread count, the oneDNN and mixprec versions and the file format (the identity). The
// identity's hash names the file, and the file repeats the identity: a file whose identity differs (a hash
// collision, a copied home folder) is foreign and ignored, like a corrupt one; both are measured again and
// rewritten. Writers take an exclusive flock on a lock file beside it, read the current file, merge their
// entries in and rename a complete temporary over it (atomic_write_file), so concurrent processes lose no entry
// and a reader never sees half a file. Bump kFormat when a path's code changes what it measures.
namespace {

constexpr int kFormat = 1;

std::string cache_dir() {
  const char* own = std::getenv("MP_CACHE_DIR");
  if (own != nullptr && *own != '\0') return own;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && *xdg == '/') return std::string(xdg) + "/mixprec";
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != '\0') return std::string(home) + "/.cache/mixprec";
  return "";
}

// mkdir -p; true when the folder exists afterwards.
bool make_dirs(const std::string& dir) {
  if (dir.empty()) return false;
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      const std::string part = dir.substr(0, i);
      if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) return false;
    }
  }
  struct stat st {};
  return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string fnv_hex(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// The entries of a parsed file, or throws std::exception saying what is malformed.
PathTable parse_entries(const nlohmann::json& paths) {
  PathTable t;
  for (const auto& [key, v] : paths.items()) {
    CachedPath c;
    c.path = v.at("path").get<std::string>();
    for (const auto& [name, ms] : v.at("ms").items()) c.ms[name] = ms.get<double>();
    t[key] = std::move(c);
  }
  return t;
}

}  // namespace

std::string path_cache_identity() {
  const dnnl_version_t* v = dnnl_version();
  nlohmann::ordered_json id;
  id["format"] = kFormat;
  id["cpu"] = cpu_features().brand;
  id["threads"] = omp_get_max_threads();
  id["onednn"] = std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) + " " +
                 (v->hash != nullptr ? v->hash : "");
  id["mixprec"] = "0.1.0";
  return id.dump();
}

std::string path_cache_file(const std::string& identity) {
  const std::string dir = cache_dir();
  if (dir.empty()) return "";
  return dir + "/kernel-paths-" + fnv_hex(identity) + ".json";
}

PathTable load_path_cache(const std::string& file, const std::string& identity, std::string& why) {
  why.clear();
  std::ifstream in(file, std::ios::binary);
  if (!in) return {};  // not measured yet
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    const nlohmann::json j = nlohmann::json::parse(ss.str());
    if (j.at("machine") != nlohmann::json::parse(identity)) {  // not dump(): Note [quoting untrusted JSON]
      why = "it was measured on another machine or software stack (" + json_excerpt(j.at("machine"), 200) + ")";
      return {};
    }
    return parse_entries(j.at("paths"));
  } catch (const std::exception& e) {
    why = std::string("it is not a kernel-path cache (") + e.what() + ")";
    return {};
  }
}

std::string store_path_cache(const std::string& file, const std::string& identity, const PathTable& entries) {
  if (file.empty()) return "no cache folder (set MP_CACHE_DIR, XDG_CACHE_HOME or HOME)";
  const std::string dir = file.substr(0, file.find_last_of('/'));
  if (!make_dirs(dir)) return "cannot create the folder " + dir + ": " + std::strerror(errno);
  const std::string lock_path = file + ".lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot open " + lock_path + ": " + std::strerror(errno);
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      const std::string err = "cannot lock " + lock_path + ": " + std::strerror(errno);
      ::close(fd);
      return err;
    }
  }
  std::string result;
  try {
    std::string why;
    PathTable merged = load_path_cache(file, identity, why);  // a foreign or corrupt file is replaced
    for (const auto& [k, v] : entries) merged[k] = v;
    nlohmann::ordered_json j;
    j["machine"] = nlohmann::ordered_json::parse(identity);
    nlohmann::ordered_json paths = nlohmann::ordered_json::object();
    for (const auto& [k, v] : merged) paths[k] = {{"path", v.path}, {"ms", v.ms}};
    j["paths"] = std::move(paths);
    atomic_write_file(file, j.dump(1) + "\n");
  } catch (const std::exception& e) { result = e.what(); }
  ::flock(fd, LOCK_UN);
  ::close(fd);
  return result;
}

}  // namespace mp::backend::cpu
