// An outside program built against the installed mixprec package.
#include <mp/mp.hpp>

#include <iostream>

int main() {
  mp::Tensor a = mp::ones({2, 3});
  mp::Tensor b = mp::full({3}, 2.0);
  mp::Tensor c = mp::sum(a * b);
  if (c.item<float>() != 12.0f) return 1;
  std::cout << "consumer ok\n";
  return 0;
}
