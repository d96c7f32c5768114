#include "mp/amp/initialize.hpp"

#include <cmath>
#include <sstream>

#include "mp/nn/batch_norm.hpp"

namespace mp::amp {

AmpOptions resolve(const AmpOptions& in) {
  AmpOptions o = in;
  MP_CHECK(o.opt_level == OptLevel::O0 || is_low_precision(o.dtype), "amp: dtype must be f16 or bf16 for ",
           opt_level_name(o.opt_level), ", got ", dtype_name(o.dtype));
  const bool f16 = o.dtype == DType::f16;
  switch (o.opt_level) {
    case OptLevel::O0:
      if (!o.loss_scale) o.loss_scale = LossScale{LossScale::Kind::none, 0.0};
      if (!o.keep_batchnorm_fp32) o.keep_batchnorm_fp32 = true;
      if (!o.master_weights) o.master_weights = false;
      break;
    case OptLevel::O1:
      if (!o.loss_scale) o.loss_scale = LossScale{f16 ? LossScale::Kind::dynamic : LossScale::Kind::none, 0.0};
      if (!o.keep_batchnorm_fp32) o.keep_batchnorm_fp32 = true;  // weights stay f32 under autocast
      if (!o.master_weights) o.master_weights = false;           // nothing to master: weights are f32
      break;
    case OptLevel::O2:
      if (!o.loss_scale) o.loss_scale = LossScale{f16 ? LossScale::Kind::dynamic : LossScale::Kind::none, 0.0};
      if (!o.keep_batchnorm_fp32) o.keep_batchnorm_fp32 = true;
      if (!o.master_weights) o.master_weights = true;
      break;
    case OptLevel::O3:
      if (!o.loss_scale) o.loss_scale = LossScale{LossScale::Kind::none, 0.0};  // Apex: scale 1
      if (!o.keep_batchnorm_fp32) o.keep_batchnorm_fp32 = false;
      if (!o.master_weights) o.master_weights = false;
      break;
  }
  MP_CHECK(
      !o.stochastic_rounding || ((o.opt_level == OptLevel::O2 || o.opt_level == OptLevel::O3) && !*o.master_weights),
      "amp: stochastic rounding applies to 16-bit weights without f32 masters (O3, or O2 with master_weights ",
      "off); ", opt_level_name(o.opt_level), *o.master_weights ? " keeps f32 masters" : " keeps f32 weights",
      ", which need none: drop stochastic rounding or use O3");
  switch (o.loss_scale->kind) {
    case LossScale::Kind::dynamic:
      o.scaler.enabled = true;
      o.scaler.dynamic = true;
      break;
    case LossScale::Kind::fixed:
      o.scaler.enabled = true;
      o.scaler.dynamic = false;
      o.scaler.init_scale = o.loss_scale->value;
      break;
    case LossScale::Kind::none: o.scaler.enabled = false; break;
  }
  return o;
}

AmpModel::AmpModel(std::shared_ptr<nn::UnaryModule> module, AmpOptions options)
    : module_(std::move(module)), options_(std::move(options)) {
  MP_CHECK(module_ != nullptr, "AmpModel: got a null module");
}

Tensor AmpModel::forward(const Tensor& x) {
  Tensor y;
  switch (options_.opt_level) {
    case OptLevel::O0: y = (*module_)(x); break;
    case OptLevel::O1: {
      Autocast guard({.dtype = options_.dtype, .enabled = true, .device = x.device().type});
      y = (*module_)(x);
      break;
    }
    case OptLevel::O2:
    case OptLevel::O3: y = (*module_)(is_floating(x.dtype()) ? x.to(options_.dtype) : x); break;
  }
  // The final output is f32 at every level: losses and metrics see f32 values (Note [the autocast policy table]).
  return is_floating(y.dtype()) ? y.to(DType::f32) : y;
}

std::string AmpSetup::describe() const { return amp::describe(options()); }

std::string describe(const AmpOptions& o) {
  std::ostringstream os;
  os << opt_level_name(o.opt_level);
  if (o.opt_level != OptLevel::O0) os << " " << dtype_name(o.dtype);
  if (o.opt_level == OptLevel::O2 || o.opt_level == OptLevel::O3)
    os << (*o.keep_batchnorm_fp32 ? ", batch norm f32" : ", batch norm 16-bit");
  if (*o.master_weights) os << ", f32 master weights";
  if (o.stochastic_rounding) os << ", stochastic rounding";
  os << ", loss scale " << o.loss_scale->str();
  return os.str();
}

AmpOptions prepare(nn::Module& model, optim::Optimizer& optimizer, const AmpOptions& options) {
  const AmpOptions o = resolve(options);
  if (o.opt_level == OptLevel::O2 || o.opt_level == OptLevel::O3) {
    // Remember the f32 parameters, convert the model, then point the optimizer at the new tensors.
    const auto before = model.named_parameters();
    for (const auto& [name, p] : before)
      MP_CHECK(p.dtype() == DType::f32, "amp::initialize: expected an f32 model, parameter '", name, "' is ",
               dtype_name(p.dtype()), "; build the model in f32 and let initialize convert it");
    if (*o.keep_batchnorm_fp32) {
      model.to(o.dtype, [](const nn::Module& m) { return !nn::is_batch_norm(m); });
    } else {
      model.to(o.dtype);
    }
    const auto after = model.named_parameters();
    MP_ASSERT(before.size() == after.size(), "parameter count changed in to()");
    std::vector<Tensor> in_optimizer = optimizer.parameters();
    auto optimized = [&](const Tensor& p) {
      for (const Tensor& q : in_optimizer)
        if (q.impl_ptr() == p.impl_ptr()) return true;
      return false;
    };
    for (size_t i = 0; i < before.size(); ++i) {
      const Tensor& old_p = before[i].second;
      const Tensor& new_p = after[i].second;
      if (old_p.impl_ptr() == new_p.impl_ptr() || !optimized(old_p)) continue;
      optimizer.replace_parameter(old_p, new_p);
      if (*o.master_weights && is_low_precision(new_p.dtype())) optimizer.set_master(new_p, old_p.detach().clone());
    }
  }
  optimizer.set_master_weights(*o.master_weights);
  optimizer.set_stochastic_rounding(o.stochastic_rounding, o.rounding_seed);
  return o;
}

AmpSetup initialize(std::shared_ptr<nn::UnaryModule> model, optim::Optimizer& optimizer, const AmpOptions& options) {
  MP_CHECK(model != nullptr, "amp::initialize: got a null model");
  const AmpOptions o = prepare(*model, optimizer, options);
  return AmpSetup{AmpModel(std::move(model), o), GradScaler(o.scaler)};
}

AmpSetup to_fp16(std::shared_ptr<nn::UnaryModule> model, optim::Optimizer& optimizer) {
  return initialize(std::move(model), optimizer, {.opt_level = OptLevel::O2, .dtype = DType::f16});
}

AmpSetup to_bf16(std::shared_ptr<nn::UnaryModule> model, optim::Optimizer& optimizer) {
  return initialize(std::move(model), optimizer, {.opt_level = OptLevel::O2, .dtype = DType::bf16});
}

}  // namespace mp::amp
