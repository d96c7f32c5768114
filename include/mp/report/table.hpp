#pragma once
// Result tables printed as GitHub markdown (the `mixprec compare` report).
#include <string>
#include <vector>

namespace mp::report {

/// A table of strings printed as GitHub markdown. Columns are padded to a common width (in UTF-8 code
/// points); a column whose body cells are all numbers (optionally followed by "x" or "%", empty cells
/// allowed) is right-aligned ("---:", its header too), others left-aligned. Rows shorter than the header
/// get empty cells; '|' inside a cell is escaped as "\|".
struct Table {
  std::vector<std::string> header;             ///< column titles
  std::vector<std::vector<std::string>> rows;  ///< body cells, row by row
  /// The markdown text: header, separator and one line per row, each ending in '\n'.
  std::string to_markdown() const;
};

}  // namespace mp::report
