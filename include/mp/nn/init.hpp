#pragma once
#include <string>
#include <utility>

#include "mp/tensor/tensor.hpp"

/// Parameter initialisers with PyTorch's names and formulas (torch.nn.init). Each fills the tensor
/// in place under NoGradGuard from the seeded default generator (mp::manual_seed), drawing in f32
/// and converting to the tensor's dtype, and returns it.
namespace mp::nn::init {

/// Which fan the Kaiming initialisers preserve.
enum class FanMode { fan_in, fan_out };

/// Nonlinearities known to calculate_gain.
enum class Nonlinearity { linear, conv, sigmoid, tanh, relu, leaky_relu, selu };

/// Recommended gain for a nonlinearity (PyTorch's table; `param` is leaky_relu's negative slope).
double calculate_gain(Nonlinearity nonlinearity, double param = 0.01);

/// (fan_in, fan_out) of a weight with at least 2 dims: size(1) * receptive field, size(0) * receptive field.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t);

/// Options of kaiming_uniform_ / kaiming_normal_ (PyTorch's defaults).
struct KaimingOptions {
  double a = 0.0;                                        ///< negative slope of the leaky ReLU after this layer
  FanMode mode = FanMode::fan_in;                        ///< fan to preserve
  Nonlinearity nonlinearity = Nonlinearity::leaky_relu;  ///< for the gain
};

/// Uniform in [a, b).
Tensor uniform_(const Tensor& t, double a = 0.0, double b = 1.0);
/// Normal(mean, std).
Tensor normal_(const Tensor& t, double mean = 0.0, double std = 1.0);
/// Every element = value.
Tensor constant_(const Tensor& t, double value);
/// Every element = 0.
Tensor zeros_(const Tensor& t);
/// Every element = 1.
Tensor ones_(const Tensor& t);
/// Uniform(-bound, bound) with bound = gain * sqrt(3 / fan) (He et al. 2015).
Tensor kaiming_uniform_(const Tensor& t, const KaimingOptions& opt = {});
/// Normal(0, gain / sqrt(fan)).
Tensor kaiming_normal_(const Tensor& t, const KaimingOptions& opt = {});
/// Uniform(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio 2010).
Tensor xavier_uniform_(const Tensor& t, double gain = 1.0);
/// Normal(0, gain * sqrt(2 / (fan_in + fan_out))).
Tensor xavier_normal_(const Tensor& t, double gain = 1.0);

}  // namespace mp::nn::init
