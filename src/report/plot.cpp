// Charts through gnuplot: the data (.dat) and script (.gp) are written beside the PNG, then gnuplot runs
// the script in that folder, so the user can edit and re-run the script.
#include "mp/report/plot.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "mp/core/error.hpp"
#include "mp/core/atomic_file.hpp"

namespace mp::report {
namespace {

namespace fs = std::filesystem;

/// `s` as one shell word.
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// `s` as a gnuplot single-quoted string ('' is a quote; newlines become spaces).
std::string gp_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : c == '\n' ? std::string(" ") : std::string(1, c);
  return out + "'";
}

/// Run a shell command, returning its exit status (-1 when it could not run) and its output.
int run_capture(const std::string& cmd, std::string* output) {
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) output->append(buf, n);
  const int st = ::pclose(p);
  return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/// The best PNG terminal of the installed gnuplot ("pngcairo" or "png"), empty when it has none.
const std::string& png_terminal() {
  static const std::string term = [] {
    std::string out;
    run_capture("gnuplot -e 'set terminal' 2>&1", &out);
    bool cairo = false, png = false;
    std::istringstream in(out);
    std::string line, first;
    while (std::getline(in, line)) {
      std::istringstream words(line);
      if (!(words >> first)) continue;
      cairo |= first == "pngcairo";
      png |= first == "png";
    }
    return std::string(cairo ? "pngcairo" : png ? "png" : "");
  }();
  return term;
}

/// A number for a gnuplot data file ("?" = missing, see `set datafile missing`).
std::string num(double v) {
  if (!std::isfinite(v)) return "?";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

/// The files of one chart.
struct ChartFiles {
  fs::path dir, png, dat, gp;
};

ChartFiles chart_files(const char* op, const std::string& png_path) {
  MP_CHECK(!png_path.empty(), op, ": expected an output .png path, got an empty string");
  ChartFiles f;
  f.png = fs::path(png_path);
  MP_CHECK(f.png.has_filename(), op, ": expected an output file path, got the folder '", png_path, "'");
  f.dir = f.png.parent_path();
  if (f.dir.empty()) f.dir = ".";
  std::error_code ec;
  fs::create_directories(f.dir, ec);
  MP_CHECK(!ec, op, ": cannot create the folder '", f.dir.string(), "' for '", png_path, "': ", ec.message());
  f.dat = f.png;
  f.dat.replace_extension(".dat");
  f.gp = f.png;
  f.gp.replace_extension(".gp");
  return f;
}

/// The script's common head: terminal, output, title and labels.
std::string script_head(const ChartFiles& f, const std::string& title, const std::string& xlabel,
                        const std::string& ylabel) {
  const std::string term = png_terminal().empty() ? "pngcairo" : png_terminal();
  std::string s = "# written by mixprec; re-plot with: cd " + shell_quote(f.dir.string()) + " && gnuplot " +
                  shell_quote(f.gp.filename().string()) + "\n";
  s += "set terminal " + term + " size 1000,620 noenhanced\n";
  s += "set output " + gp_quote(f.png.filename().string()) + "\n";
  s += "set title " + gp_quote(title) + "\n";
  if (!xlabel.empty()) s += "set xlabel " + gp_quote(xlabel) + "\n";
  s += "set ylabel " + gp_quote(ylabel) + "\n";
  s += "set grid\nset datafile missing '?'\n";
  return s;
}

/// Write the data and script, then run gnuplot on them in their folder.
void render(const char* op, const ChartFiles& f, const std::string& data, const std::string& script) {
  atomic_write_file(f.dat.string(), data);
  atomic_write_file(f.gp.string(), script);
  MP_CHECK(gnuplot_available(), op,
           ": gnuplot not found; install it with: apt-get install gnuplot-nox (the data and script are in '",
           f.dat.string(), "' and '", f.gp.string(), "')");
  MP_CHECK(!png_terminal().empty(), op,
           ": the installed gnuplot has no PNG terminal (neither pngcairo nor png); install "
           "gnuplot-nox or gnuplot-qt");
  std::string output;
  const int rc = run_capture(
      "cd " + shell_quote(f.dir.string()) + " && gnuplot " + shell_quote(f.gp.filename().string()) + " 2>&1", &output);
  std::error_code ec;
  const bool made = fs::exists(f.png, ec) && fs::file_size(f.png, ec) > 0;
  MP_CHECK(rc == 0 && made, op, ": gnuplot failed on '", f.gp.string(), "' (exit status ", rc, "): ", output,
           "; check the script, or re-run it by hand");
}

}  // namespace

bool gnuplot_available() {
  static const bool ok = [] {
    std::string out;
    return run_capture("gnuplot --version 2>&1", &out) == 0;
  }();
  return ok;
}

void plot_lines(const std::string& png_path, const std::string& title, const std::string& xlabel,
                const std::string& ylabel, const std::vector<Series>& series, bool log_y) {
  const ChartFiles f = chart_files("plot_lines", png_path);
  std::string data;
  std::vector<std::string> plots;
  int index = 0;
  for (const Series& s : series) {
    MP_CHECK(s.x.size() == s.y.size(), "plot_lines: series '", s.title, "' has ", s.x.size(), " x values but ",
             s.y.size(), " y values; expected equal lengths");
    size_t points = 0;
    std::string block = "# " + s.title + "\n";
    for (size_t i = 0; i < s.x.size(); ++i) {
      const bool ok = std::isfinite(s.x[i]) && std::isfinite(s.y[i]) && (!log_y || s.y[i] > 0);
      block += num(s.x[i]) + " " + (ok ? num(s.y[i]) : std::string("?")) + "\n";
      points += ok;
    }
    if (points == 0) continue;
    data += block + "\n\n";  // two blank lines end a data block (gnuplot's `index`)
    plots.push_back(gp_quote(f.dat.filename().string()) + " index " + std::to_string(index++) + " using 1:2 with " +
                    (points <= 30 ? "linespoints pt 7 ps 0.8" : "lines") + " lw 2 title " + gp_quote(s.title));
  }
  MP_CHECK(!plots.empty(), "plot_lines: '", png_path, "': no series has a plottable point",
           log_y ? " (with log_y, y must be > 0)" : "", "; expected at least one finite (x, y)");
  std::string script = script_head(f, title, xlabel, ylabel);
  if (log_y) script += "set logscale y\n";
  script += "set key top right\nplot ";
  for (size_t i = 0; i < plots.size(); ++i) script += (i ? ", \\\n     " : "") + plots[i];
  script += "\n";
  render("plot_lines", f, data, script);
}

void plot_bars(const std::string& png_path, const std::string& title, const std::string& ylabel,
               const std::vector<std::string>& labels, const std::vector<double>& values) {
  MP_CHECK(labels.size() == values.size(), "plot_bars: got ", labels.size(), " labels but ", values.size(),
           " values; expected one value per label");
  MP_CHECK(!labels.empty(), "plot_bars: '", png_path, "': expected at least one bar, got none");
  const ChartFiles f = chart_files("plot_bars", png_path);
  std::string data = "# label value\n";
  for (size_t i = 0; i < labels.size(); ++i) {
    std::string label = labels[i];
    for (char& c : label)
      if (c == '"' || c == '\n') c = c == '"' ? '\'' : ' ';  // gnuplot data strings cannot hold '"'
    data += "\"" + label + "\" " + num(values[i]) + "\n";
  }
  std::string script = script_head(f, title, "", ylabel);
  script += "set style data histograms\nset style histogram clustered gap 1\nset style fill solid 0.8 border -1\n";
  script += "set boxwidth 0.8\nset yrange [0:*]\nset offsets 0, 0, graph 0.08, 0\nset grid noxtics ytics\n";
  if (labels.size() > 6) script += "set xtics rotate by -30\n";
  const std::string dat = gp_quote(f.dat.filename().string());
  script += "plot " + dat + " using 2:xtic(1) notitle lc rgb '#4477aa', \\\n     " + dat +
            " using 0:2:(sprintf('%.3g', $2)) with labels offset 0,0.8 notitle\n";
  render("plot_bars", f, data, script);
}

void plot_heatmap(const std::string& png_path, const std::string& title, const std::string& xlabel,
                  const std::string& cblabel, const std::vector<std::string>& rows, const std::vector<double>& x,
                  const std::vector<std::vector<double>>& values, bool shares) {
  MP_CHECK(!rows.empty() && !x.empty(), "plot_heatmap: '", png_path,
           "': expected at least one row and one column, got ", rows.size(), " rows and ", x.size(), " columns");
  MP_CHECK(values.size() == rows.size(), "plot_heatmap: got ", rows.size(), " row labels but ", values.size(),
           " rows of values; expected one row per label");
  const ChartFiles f = chart_files("plot_heatmap", png_path);
  // Each cell is a box (x, row) half a column and half a row wide each way, coloured by its value: unlike
  // gnuplot's `with image` it draws any number of columns and rows and leaves non-finite cells blank.
  const double half = x.size() > 1 ? (x.back() - x.front()) / static_cast<double>(x.size() - 1) / 2 : 0.5;
  std::string data = "# x row half_width value\n";
  size_t cells = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    MP_CHECK(values[r].size() == x.size(), "plot_heatmap: row '", rows[r], "' has ", values[r].size(),
             " values but there are ", x.size(), " columns; expected one value per column");
    for (size_t i = 0; i < x.size(); ++i) {
      if (!std::isfinite(values[r][i]) || !std::isfinite(x[i])) continue;
      data += num(x[i]) + " " + std::to_string(r) + " " + num(half) + " " + num(values[r][i]) + "\n";
      ++cells;
    }
  }
  MP_CHECK(cells > 0, "plot_heatmap: '", png_path, "': no cell has a finite value; expected at least one");
  std::string script = script_head(f, title, xlabel, "");
  const size_t height = std::max<size_t>(620, 120 + 16 * rows.size());
  script.replace(script.find("size 1000,620"), 13, "size 1000," + std::to_string(height));
  script += "unset grid\nset cblabel " + gp_quote(cblabel) + "\nset palette rgb 33,13,10\n";
  if (shares) script += "set cbrange [0:1]\n";
  // the first row (the model's first layer) on top
  script += "set yrange [" + num(static_cast<double>(rows.size()) - 0.5) + ":-0.5]\nset ytics (";
  for (size_t r = 0; r < rows.size(); ++r) script += (r ? ", " : "") + gp_quote(rows[r]) + " " + std::to_string(r);
  script += ")\nset ytics font ',8'\n";
  script += "plot " + gp_quote(f.dat.filename().string()) +
            " using 1:2:3:(0.5):4 with boxxyerror fs solid 1.0 noborder lc palette notitle\n";
  render("plot_heatmap", f, data, script);
}

}  // namespace mp::report
