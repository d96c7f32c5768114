// The op table: its parts joined (tests/ops/op_cases.hpp).
#include "op_cases.hpp"

#include <set>
#include <stdexcept>

namespace mp::op_table {

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> table = [] {
    std::vector<OpCase> all;
    for (auto part :
         {pointwise_cases, linalg_conv_pool_cases, norm_softmax_loss_cases, reduce_index_rnn_cases, optim_amp_cases})
      for (OpCase& c : part()) all.push_back(std::move(c));
    std::set<std::string> names;
    for (const OpCase& c : all)
      if (!names.insert(c.name).second || c.dtypes.empty() || !c.make)
        throw std::logic_error("op table: case '" + c.name + "' is a duplicate or has no dtypes or no make");
    return all;
  }();
  return table;
}

}  // namespace mp::op_table
