#include <iomanip>
#include <ostream>
#include <sstream>

#include "mp/tensor/tensor.hpp"

namespace mp {
namespace {

constexpr int64_t kMaxPrint = 6;  // per dim: first and last kMaxPrint/2 when longer

void print_rec(std::ostream& os, const Tensor& t, int64_t d, int indent) {
  if (t.dim() == 0) {
    os << t.item_double();
    return;
  }
  const int64_t n = t.size(d);
  os << "[";
  for (int64_t i = 0; i < n; ++i) {
    if (n > kMaxPrint && i == kMaxPrint / 2) {
      os << (d + 1 == t.dim() ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      i = n - kMaxPrint / 2;
    }
    Tensor s = t.select(d, i);
    if (d + 1 == t.dim()) {
      os << std::setw(10) << s.item_double();
    } else {
      print_rec(os, t.select(d, i).unsqueeze(0), 1, indent + 1);
    }
    if (i + 1 < n) os << (d + 1 == t.dim() ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  os << "]";
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "Tensor(undefined)";
  std::ostringstream body;
  body << std::setprecision(6);
  if (t.numel() > 0)
    print_rec(body, t.detach().to(kCPU), 0, 0);  // device tensors print from a host copy (detached: records nothing)
  os << "Tensor(" << body.str() << ", shape=" << shape_str(t.sizes()) << ", dtype=" << dtype_name(t.dtype())
     << ", device=" << t.device().str() << (t.requires_grad() ? ", requires_grad" : "") << ")";
  return os;
}

}  // namespace mp
