// PyTorch interchange: init_from_file (`mixprec train --init_from`), export_state_dict (`mixprec export`).
#include "mp/train/interop.hpp"

#include <sstream>

#include "mp/autograd/node.hpp"
#include "mp/train/checkpoint.hpp"
#include "mp/train/safetensors.hpp"

namespace mp::train {

// Note [torch names]
// A mixprec model's state dict is PyTorch's, name for name, shape for shape and in the same order: the
// ResNets are torchvision's (conv1.weight, bn1.running_mean, bn1.num_batches_tracked, layer1.0.conv1.weight,
// ..., fc.bias), the MLP is a Sequential (layers.0.weight), the word LMs are PyTorch's word_language_model
// example (encoder.weight, rnn.weight_ih_l0, decoder.bias). bench/pytorch/models.py holds the PyTorch twins and
// ctest's ModelsTorchNames.NamesForThePyTorchCheck loads every model's state dict into its twin strictly and
// compares the outputs. So interchange needs no renaming table: a checkpoint's "model." prefix is the only
// difference from the file PyTorch's load_state_dict takes, and a file PyTorch saved loads as it is. Keeping one
// naming (not a mapping to maintain beside it) is the rule; a model whose PyTorch twin names differ must be
// renamed in its module, where the test above catches it.

namespace {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

void describe_list(std::ostringstream& os, const char* what, const std::vector<std::string>& v, size_t max_each) {
  if (v.empty()) return;
  os << "\n  " << v.size() << " " << what << ": ";
  for (size_t i = 0; i < v.size() && i < max_each; ++i) os << (i ? ", " : "") << v[i];
  if (v.size() > max_each) os << ", ... and " << v.size() - max_each << " more";
}

}  // namespace

std::string StateDictDiff::describe(size_t max_each) const {
  std::ostringstream os;
  describe_list(os, "missing from the file (in the model)", missing, max_each);
  describe_list(os, "unexpected in the file (not in the model)", unexpected, max_each);
  describe_list(os, "with another shape", mismatched, max_each);
  return os.str();
}

StateDictDiff diff_state_dict(const nn::Module& model, const nn::StateDict& state) {
  StateDictDiff d;
  const nn::StateDict mine = model.state_dict();
  for (const auto& [name, t] : mine) {
    const Tensor* src = state.find(name);
    if (src == nullptr) {
      d.missing.push_back(name);
    } else if (src->sizes() != t.sizes()) {
      d.mismatched.push_back(name + " (" + shape_str(src->sizes()) + " in the file, " + shape_str(t.sizes()) +
                             " in the model)");
    } else if (is_floating(src->dtype()) != is_floating(t.dtype())) {
      d.mismatched.push_back(name + " (" + dtype_name(src->dtype()) + " in the file, " + dtype_name(t.dtype()) +
                             " in the model)");
    }
  }
  for (const auto& [name, t] : state)
    if (!mine.contains(name)) d.unexpected.push_back(name);
  return d;
}

std::string InitFromReport::describe(const std::string& path) const {
  std::ostringstream os;
  os << "initialised from " << path << ": loaded " << loaded << " of the model's " << model_tensors << " tensors";
  if (!diff.empty()) os << " (--init_from_partial; the others keep their initialisation)" << diff.describe();
  return os.str();
}

InitFromReport init_from_file(nn::Module& model, const std::string& path, bool partial) {
  const nn::StateDict file = read_model_state(path);
  InitFromReport r;
  r.model_tensors = static_cast<int64_t>(model.state_dict().size());
  r.file_tensors = static_cast<int64_t>(file.size());
  r.diff = diff_state_dict(model, file);
  MP_CHECK(partial || r.diff.empty(), "--init_from '", path, "': its ", file.size(),
           " tensors do not match the model's ", r.model_tensors,
           " (names and shapes must all match):", r.diff.describe(),
           "\nload a state dict of the same model (--model and the dataset's channels and classes), or add "
           "--init_from_partial to load only the tensors whose name and shape match");
  if (r.diff.empty()) {
    model.load_state_dict(file, /*strict=*/true);
    r.loaded = r.model_tensors;
    return r;
  }
  // Partial: the matching tensors only (a name in `mismatched` is left out by its described form).
  nn::StateDict fit;
  const nn::StateDict mine = model.state_dict();
  for (const auto& [name, t] : file) {
    const Tensor* dst = mine.find(name);
    if (dst != nullptr && dst->sizes() == t.sizes() && is_floating(dst->dtype()) == is_floating(t.dtype()))
      fit.insert(name, t);
  }
  MP_CHECK(!fit.empty(), "--init_from '", path, "' --init_from_partial: none of its ", file.size(),
           " tensors matches the model by name and shape:", r.diff.describe(),
           "\nis it a state dict of another model? (`mixprec info ", path, "` lists what it holds)");
  model.load_state_dict(fit, /*strict=*/false);
  r.loaded = static_cast<int64_t>(fit.size());
  return r;
}

ExportStats export_state_dict(const std::string& in, const std::string& out, std::optional<DType> dtype) {
  if (dtype)
    MP_CHECK(is_floating(*dtype), "export: --dtype must be floating (f32, f16, bf16, f64), got ", dtype_name(*dtype),
             "; integer buffers such as num_batches_tracked are always kept");
  std::map<std::string, std::string> md;
  nn::StateDict sd = read_model_state(in, &md);
  ExportStats s;
  auto fmt = md.find(kCheckpointFormatKey);
  s.from_checkpoint = fmt != md.end() && fmt->second == kCheckpointFormat;
  MP_CHECK(!sd.empty(), "export: '", in, "' holds no model tensors",
           s.from_checkpoint ? " (its 'model.' section is empty)" : "", "; expected a checkpoint of `mixprec train` ",
           "or a state dict");
  autograd::NoGradGuard no_grad;
  for (const std::string& name : sd.keys()) {
    const Tensor& t = sd.at(name);
    ++s.tensors;
    if (!dtype || !is_floating(t.dtype()) || t.dtype() == *dtype) continue;
    sd.set(name, t.to(*dtype));
    ++s.converted;
  }
  std::map<std::string, std::string> out_md{{kCheckpointFormatKey, "pt"}};  // safetensors.torch's tag
  if (auto c = md.find("config"); c != md.end()) out_md["config"] = c->second;
  save_safetensors(out, sd, out_md);  // atomic (atomic_write_file)
  return s;
}

DType floating_dtype_from_flag(const std::string& value, const char* flag) {
  if (value == "f32" || value == "fp32") return DType::f32;
  if (value == "f16" || value == "fp16") return DType::f16;
  if (value == "bf16") return DType::bf16;
  if (value == "f64" || value == "fp64") return DType::f64;
  MP_FAIL(flag, ": expected f32, f16, bf16 or f64, got '", value, "'");
}

}  // namespace mp::train
