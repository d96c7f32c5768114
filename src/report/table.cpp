// Table: GitHub markdown output.
#include "mp/report/table.hpp"

#include <algorithm>
#include <cctype>

#include "mp/core/error.hpp"

namespace mp::report {
namespace {

/// Whether a cell reads as a number: [+-]digits[.digits][e[+-]digits] then optionally "x" or "%".
bool is_number(const std::string& s) {
  size_t i = 0;
  const size_t n = s.size();
  auto digits = [&] {
    const size_t b = i;
    while (i < n && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    return i - b;
  };
  if (i < n && (s[i] == '+' || s[i] == '-')) ++i;
  size_t d = digits();
  if (i < n && s[i] == '.') {
    ++i;
    d += digits();
  }
  if (d == 0) return false;
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < n && (s[i] == '+' || s[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  if (i < n && (s[i] == 'x' || s[i] == '%')) ++i;
  return i == n;
}

/// Display width: UTF-8 code points (continuation bytes do not count).
size_t width(const std::string& s) {
  return static_cast<size_t>(
      std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += '\\';
    out += c == '\n' ? ' ' : c;
  }
  return out;
}

}  // namespace

std::string Table::to_markdown() const {
  MP_CHECK(!header.empty(), "Table::to_markdown: expected at least one header column, got none");
  const size_t cols = header.size();
  std::vector<std::vector<std::string>> cells;
  cells.reserve(rows.size() + 1);
  cells.emplace_back();
  for (const auto& h : header) cells.back().push_back(escape(h));
  for (size_t r = 0; r < rows.size(); ++r) {
    MP_CHECK(rows[r].size() <= cols, "Table::to_markdown: row ", r, " has ", rows[r].size(),
             " cells but the header has ", cols, " columns; add header columns or shorten the row");
    cells.emplace_back();
    for (size_t c = 0; c < cols; ++c) cells.back().push_back(c < rows[r].size() ? escape(rows[r][c]) : std::string());
  }
  std::vector<size_t> w(cols, 3);  // "---" is the shortest separator
  std::vector<bool> right(cols, false);
  for (size_t c = 0; c < cols; ++c) {
    bool numeric = false, all = true;
    for (size_t r = 0; r < cells.size(); ++r) {
      w[c] = std::max(w[c], width(cells[r][c]));
      if (r == 0 || cells[r][c].empty()) continue;
      if (is_number(cells[r][c]))
        numeric = true;
      else
        all = false;
    }
    right[c] = numeric && all;
    if (right[c]) w[c] = std::max<size_t>(w[c], 4);  // "---:"
  }
  std::string out;
  auto emit_row = [&](const std::vector<std::string>& row) {
    out += "|";
    for (size_t c = 0; c < cols; ++c) {
      const std::string pad(w[c] - width(row[c]), ' ');
      out.append(" ").append(right[c] ? pad : row[c]).append(right[c] ? row[c] : pad).append(" |");
    }
    out += "\n";
  };
  emit_row(cells[0]);
  out += "|";
  for (size_t c = 0; c < cols; ++c) {
    out.append(" ").append(right[c] ? w[c] - 1 : w[c], '-').append(right[c] ? ":" : "").append(" |");
  }
  out += "\n";
  for (size_t r = 1; r < cells.size(); ++r) emit_row(cells[r]);
  return out;
}

}  // namespace mp::report
