// libFuzzer target: JSONL run logs, read by `mixprec plot` (read_run_log) and cut by a resumed run (RunLog's
// resume constructor, Note [a resumed run's log]); the log a resumed run leaves must read back.
#include "fuzz_util.hpp"
#include "mp/train/run_log.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mp::fuzz::write_temp(data, size, "log.jsonl");
  mp::fuzz::expect_accept_or_refuse(path, [&] { (void)mp::train::read_run_log(path); });
  mp::fuzz::expect_accept_or_refuse(path, [&] {
    mp::train::RunLog log(path, mp::train::RunLog::ResumePoint{.global_step = 3, .epochs_done = 1});
    log.write({{"type", std::string("step")}, {"step", int64_t{4}}, {"loss", 0.5}});
  });
  return 0;
}
