// nn::Dropout.
#include "mp/nn/dropout.hpp"

#include <sstream>

#include "mp/ops/embedding.hpp"

namespace mp::nn {

Dropout::Dropout(const DropoutOptions& options) : UnaryModule("Dropout"), options_(options) {
  MP_CHECK(options.p >= 0.0 && options.p <= 1.0, "Dropout: expected p in [0, 1], got ", options.p);
}

Tensor Dropout::forward(const Tensor& x) { return dropout(x, options_.p, is_training()); }

std::string Dropout::extra_repr() const {
  std::ostringstream os;
  os << "p=" << options_.p;
  return os.str();
}

}  // namespace mp::nn
