// `mixprec convert IN OUT --dtype D` and `mixprec export FILE OUT [--dtype D]`.
#include <cstdio>
#include <memory>
#include <optional>

#include "commands.hpp"
#include "mp/core/dtype.hpp"
#include "mp/core/error.hpp"
#include "mp/train/convert.hpp"
#include "mp/train/interop.hpp"
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

void add_export_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("export",
                                 "Write the model of a checkpoint (or a bare state dict) as the bare state dict "
                                 "PyTorch's load_state_dict takes: torch names, buffers included, stored dtypes");
  struct Args {
    std::string in, out, dtype;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("file", a->in, "a checkpoint of mixprec train, or a bare state dict (.safetensors)")->required();
  cmd->add_option("out", a->out, "the state dict to write (.safetensors; written atomically, may equal the input)")
      ->required();
  cmd->add_option("--dtype", a->dtype,
                  "convert the floating tensors to f32, f16, bf16 or f64 (default: keep each tensor's stored dtype, "
                  "so the round trip is exact); integer buffers are kept");
  cmd->callback([a] {
    std::optional<mp::DType> dt;
    if (!a->dtype.empty()) dt = mp::train::floating_dtype_from_flag(a->dtype);
    const mp::train::ExportStats s = mp::train::export_state_dict(a->in, a->out, dt);
    std::printf("%s -> %s: %lld tensors (the model%s)", a->in.c_str(), a->out.c_str(),
                static_cast<long long>(s.tensors), s.from_checkpoint ? " of the checkpoint" : "");
    if (dt) std::printf(", %lld converted to %s", static_cast<long long>(s.converted), mp::dtype_name(*dt));
    std::printf("; in PyTorch: model.load_state_dict(safetensors.torch.load_file('%s'))\n", a->out.c_str());
  });
}

}  // namespace mixprec
