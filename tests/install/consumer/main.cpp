// An outside program built against the installed mixprec package.
#include <mp/mp.hpp>
#include <mp/report/table.hpp>

#include <iostream>

int main() {
  mp::Tensor a = mp::ones({2, 3});
  mp::Tensor b = mp::full({3}, 2.0);
  mp::Tensor c = mp::sum(a * b);
  if (c.item<float>() != 12.0f) return 1;
  const mp::report::Table t{.header = {"sum"}, .rows = {{"12"}}};  // mixprec::report links too
  if (t.to_markdown().find("12") == std::string::npos) return 2;
  std::cout << "consumer ok\n";
  return 0;
}
