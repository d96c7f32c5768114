// models::MLP: flatten, then Linear+ReLU(+Dropout) per hidden layer and a final Linear.
#include "mp/models/mlp.hpp"

#include "mp/nn/activation.hpp"
#include "mp/nn/dropout.hpp"
#include "mp/nn/linear.hpp"

namespace mp::models {

MLP::MLP(const MLPOptions& o) : nn::UnaryModule("MLP"), options_(o) {
  MP_CHECK(o.in_features > 0 && o.num_classes > 0, "MLP: expected positive in_features and num_classes, got ",
           o.in_features, " and ", o.num_classes);
  MP_CHECK(o.dropout >= 0.0 && o.dropout < 1.0, "MLP: expected dropout in [0, 1), got ", o.dropout);
  layers_ = register_module("layers", std::make_shared<nn::Sequential>());
  int64_t f = o.in_features;
  for (size_t i = 0; i < o.hidden.size(); ++i) {
    MP_CHECK(o.hidden[i] > 0, "MLP: expected positive hidden sizes, got ", o.hidden[i], " for hidden layer ", i);
    layers_->push_back(std::make_shared<nn::Linear>(f, o.hidden[i]));
    layers_->push_back(std::make_shared<nn::ReLU>());
    if (o.dropout > 0.0) layers_->push_back(std::make_shared<nn::Dropout>(o.dropout));
    f = o.hidden[i];
  }
  layers_->push_back(std::make_shared<nn::Linear>(f, o.num_classes));
}

Tensor MLP::forward(const Tensor& x) {
  MP_CHECK(x.defined() && x.dim() >= 2, "MLP::forward: expected a batch [N, ...], got ",
           x.defined() ? x.describe() : std::string("an undefined tensor"),
           "; add a batch dimension with unsqueeze(0)");
  MP_CHECK(x.numel() == x.size(0) * options_.in_features, "MLP::forward: expected ", options_.in_features,
           " elements per sample, got ", x.describe(), "; build the MLP with in_features = the flattened sample size");
  return (*layers_)(x.flatten(1));
}

}  // namespace mp::models
