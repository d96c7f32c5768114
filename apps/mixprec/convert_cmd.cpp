// `mixprec convert IN OUT --dtype D`.
#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "mp/core/dtype.hpp"
#include "mp/core/error.hpp"
#include "mp/train/convert.hpp"
#include "mp/train/progress.hpp"

namespace mixprec {

void add_convert_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("convert",
                                 "Convert the floating tensors of a safetensors file to f32, f16 or bf16 "
                                 "(round to nearest even); integer tensors are kept");
  struct Args {
    std::string in, out, dtype;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("in", a->in, "input .safetensors file")->required();
  cmd->add_option("out", a->out, "output .safetensors file (may equal the input)")->required();
  cmd->add_option("--dtype", a->dtype, "target dtype: f32, f16 or bf16")->required();
  cmd->callback([a] {
    mp::DType dt;
    if (a->dtype == "f32" || a->dtype == "fp32")
      dt = mp::DType::f32;
    else if (a->dtype == "f16" || a->dtype == "fp16")
      dt = mp::DType::f16;
    else if (a->dtype == "bf16")
      dt = mp::DType::bf16;
    else
      MP_FAIL("--dtype: expected f32, f16 or bf16, got '", a->dtype, "'");
    const mp::train::ConvertStats s = mp::train::convert_safetensors(a->in, a->out, dt);
    std::printf("%s -> %s: %lld tensors, %lld converted to %s; %s -> %s\n", a->in.c_str(), a->out.c_str(),
                static_cast<long long>(s.tensors), static_cast<long long>(s.converted), mp::dtype_name(dt),
                mp::train::format_bytes(s.bytes_in).c_str(), mp::train::format_bytes(s.bytes_out).c_str());
  });
}

}  // namespace mixprec
